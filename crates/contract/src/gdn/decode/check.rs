//! The decode test suite, written once for every backend: a list of random cases (token
//! counts, GQA ratios, K != V, odd dims, fused gating, l2 norm, bf16 pools, skipped rows) and
//! one check that runs a backend on a case and compares everything it returns with the f64
//! oracle, with the same tolerances on every device.
//!
//! A backend is a function from a case and options to the host copies of `o`, the updated
//! pool and the intermediate states; the CPU tests pass the CPU's `gdn_decode`, the CUDA tests
//! an upload-run-download wrapper of the CUDA kernel.

use super::oracle::gdn_decode_reference;
use super::random::{DecodeCase, DecodeSpec};
use super::{DecodeOptions, DecodeOutput};
use crate::error::Result;
use crate::gdn::prefill::GdnOptions;
use crate::metrics::rel_rms;
use crate::tensor::{DType, HostTensor};

/// Largest rel_rms of `o` against the oracle (bf16 outputs round at ~1.7e-3).
pub const O_TOLERANCE: f64 = 2.0e-3;
/// Largest rel_rms of f32 states (pool slots and intermediate states).
pub const STATE_TOLERANCE_F32: f64 = 1.0e-5;
/// Largest rel_rms of a bf16 pool's slots (one rounding per call).
pub const STATE_TOLERANCE_BF16: f64 = 4.0e-3;

/// One named case of the suite.
#[derive(Clone, Debug)]
pub struct DecodeCheck {
    pub name: String,
    pub spec: DecodeSpec,
    pub use_qk_l2norm: bool,
    pub seed: u64,
}

/// The errors a check measured.
#[derive(Clone, Copy, Debug)]
pub struct DecodeErrors {
    pub o: f64,
    pub intermediate_states: f64,
    pub pool: f64,
}

/// What a backend returns for one call, copied to the host.
pub struct BackendRun {
    pub output: DecodeOutput,
    pub pool: HostTensor,
}

/// What one attempted call did: `Err` with the error's text when it was refused, and the pool
/// as it was afterwards (copied to the host).
pub type Attempt = (std::result::Result<(), String>, HostTensor);

/// The refusals every backend's decode must make before it runs anything, written once: each
/// edits a valid call (a slot index out of range, two rows on one slot, a tensor of the wrong
/// shape, a NaN that only the full value check reads) and names fragments its error must hold.
/// `attempt` runs the backend on the edited case, with the full value check when its flag
/// says so. Every refusal must leave the pool as it was.
pub fn check_refusals(
    attempt: &dyn Fn(&DecodeCase, bool) -> Attempt,
) -> std::result::Result<(), String> {
    let case = DecodeCase::random(&DecodeSpec::new(3, 2, 1, 2, 32, 32), 8000)
        .map_err(|e| e.to_string())?;
    type Edit = Box<dyn Fn(&mut DecodeCase) -> Result<()>>;
    let slots = |values: Vec<i32>| -> Edit {
        Box::new(move |c: &mut DecodeCase| {
            c.slot_indices = HostTensor::from_i32(vec![3], values.clone())?;
            Ok(())
        })
    };
    let refusals: Vec<(Edit, bool, &[&str])> = vec![
        (
            slots(vec![0, 9, 1]),
            false,
            &["slot_indices[1] = 9 is out of range"],
        ),
        (slots(vec![0, 1, 0]), false, &["both address slot 0"]),
        (
            Box::new(|c: &mut DecodeCase| {
                c.v = HostTensor::from_f32(vec![3, 2, 2, 16], vec![0.5; 192])?;
                Ok(())
            }),
            false,
            &["tensor `v`"],
        ),
        (
            Box::new(|c: &mut DecodeCase| {
                let mut q = c.q.to_f32_vec("q")?;
                q[5] = f32::NAN;
                c.q = HostTensor::from_f32_as(c.q.shape().to_vec(), &q, c.q.dtype())?;
                Ok(())
            }),
            true,
            &["tensor `q`", "non-finite"],
        ),
    ];
    for (i, (edit, checked, needles)) in refusals.iter().enumerate() {
        let mut bad = case.clone();
        edit(&mut bad).map_err(|e| e.to_string())?;
        let (outcome, pool) = attempt(&bad, *checked);
        let text = match outcome {
            Err(text) => text,
            Ok(()) => return Err(format!("refusal {i}: the call ran")),
        };
        if let Some(missing) = needles.iter().find(|n| !text.contains(**n)) {
            return Err(format!(
                "refusal {i}: `{missing}` is not in the error: {text}"
            ));
        }
        if pool != case.state_pool {
            return Err(format!("refusal {i} changed the pool ({text})"));
        }
    }
    Ok(())
}

/// The suite: every case the CPU decode tests run, for every backend.
pub fn decode_suite() -> Vec<DecodeCheck> {
    let mut cases = Vec::new();
    let mut push = |name: String, spec: DecodeSpec, l2: bool, seed: u64| {
        cases.push(DecodeCheck {
            name,
            spec,
            use_qk_l2norm: l2,
            seed,
        })
    };
    let mut seed = 1000;
    for (kd, vd) in [(128, 128), (64, 256)] {
        for ratio in [1, 4] {
            for tokens in [1, 3, 16] {
                for fused in [false, true] {
                    let mut spec = DecodeSpec::new(3, tokens, 1, ratio, kd, vd);
                    spec.fused_gating = fused;
                    spec.skipped_rows = vec![1];
                    seed += 1;
                    let name = format!("K={kd} V={vd} GQA {ratio} T={tokens} fused={fused}");
                    push(name, spec, false, seed);
                }
            }
        }
    }
    for tokens in 1..=16 {
        let mut spec = DecodeSpec::new(2, tokens, 2, 4, 64, 48);
        spec.raw_qk = true;
        spec.fused_gating = tokens % 2 == 0;
        push(format!("T={tokens} l2"), spec, true, 2000 + tokens as u64);
    }
    for (tokens, fused) in [(1, false), (7, true), (16, false)] {
        let mut spec = DecodeSpec::new(3, tokens, 1, 4, 128, 128);
        spec.pool_dtype = DType::BF16;
        spec.fused_gating = fused;
        spec.skipped_rows = vec![0];
        let name = format!("bf16 pool T={tokens} fused={fused}");
        push(name, spec, false, 3000 + tokens as u64);
    }
    let mut spec = DecodeSpec::new(4, 5, 2, 2, 100, 40);
    spec.dtype = DType::F32;
    spec.slots = 9;
    push("f32 K=100 V=40".to_string(), spec, false, 4001);
    let mut spec = DecodeSpec::new(2, 2, 1, 2, 32, 32);
    spec.skipped_rows = vec![0, 1];
    push("all skipped".to_string(), spec, false, 4002);
    let mut spec = DecodeSpec::new(1, 1, 1, 1, 256, 256);
    spec.slots = 1;
    push("K=V=256 one slot".to_string(), spec, false, 4003);
    let mut spec = DecodeSpec::new(3, 2, 1, 2, 37, 30);
    spec.raw_qk = true;
    spec.dtype = DType::F16;
    push("f16 K=37 V=30 l2".to_string(), spec, true, 4004);
    cases
}

/// The options of a check: the case's l2 norm, default scale.
pub fn check_options(check: &DecodeCheck, intermediate_states: bool) -> DecodeOptions {
    DecodeOptions {
        gdn: GdnOptions {
            scale: None,
            use_qk_l2norm: check.use_qk_l2norm,
        },
        intermediate_states,
    }
}

/// Runs `backend` on `check`'s case (with intermediate states) and compares it with the f64
/// oracle: o and the addressed slots within the tolerances above, skipped rows exactly zero,
/// unaddressed slots bit-identical. `Err` says what failed.
pub fn run_decode_check(
    check: &DecodeCheck,
    backend: &dyn Fn(&DecodeCase, &DecodeOptions) -> Result<BackendRun>,
) -> std::result::Result<DecodeErrors, String> {
    let name = &check.name;
    let spec = &check.spec;
    let fail = |what: String| format!("{name}: {what}");
    let case = DecodeCase::random(spec, check.seed).map_err(|e| fail(e.to_string()))?;
    let inputs = case.inputs().map_err(|e| fail(e.to_string()))?;
    let opts = check_options(check, true);
    let reference = gdn_decode_reference(&inputs, &case.state_pool, &opts.gdn)
        .map_err(|e| fail(e.to_string()))?;
    let run = backend(&case, &opts).map_err(|e| fail(e.to_string()))?;
    let (out, pool) = (run.output, run.pool);
    if out.o.dtype() != spec.dtype || pool.dtype() != spec.pool_dtype {
        return Err(fail(format!(
            "dtypes o {} pool {}, expected {} and {}",
            out.o.dtype(),
            pool.dtype(),
            spec.dtype,
            spec.pool_dtype
        )));
    }
    let (heads, kd, vd) = (spec.value_heads, spec.key_dim, spec.value_dim);
    let slab = heads * kd * vd;
    let slots = case
        .slot_indices
        .to_i64_vec("slots")
        .map_err(|e| fail(e.to_string()))?;
    let o = out.o.to_f32_vec("o").map_err(|e| fail(e.to_string()))?;
    let states = out
        .intermediate_states
        .as_ref()
        .ok_or_else(|| fail("no intermediate states".to_string()))?;
    if states.shape() != [spec.batch, spec.tokens, heads, kd, vd] {
        return Err(fail(format!(
            "intermediate states shape {:?}",
            states.shape()
        )));
    }
    let states = states
        .to_f32_vec("states")
        .map_err(|e| fail(e.to_string()))?;
    let (mut o_got, mut o_ref, mut st_got, mut st_ref) = (vec![], vec![], vec![], vec![]);
    let o_row = spec.tokens * heads * vd;
    let st_row = spec.tokens * slab;
    for (row, &slot) in slots.iter().enumerate() {
        let o_part = &o[row * o_row..][..o_row];
        let st_part = &states[row * st_row..][..st_row];
        if slot < 0 {
            if !o_part.iter().all(|&x| x.to_bits() == 0) {
                return Err(fail(format!("skipped row {row}: o not all zeros")));
            }
            if !st_part.iter().all(|&x| x.to_bits() == 0) {
                return Err(fail(format!("skipped row {row}: states not all zeros")));
            }
        } else {
            o_got.extend_from_slice(o_part);
            o_ref.extend_from_slice(&reference.o[row * o_row..][..o_row]);
            st_got.extend_from_slice(st_part);
            st_ref.extend_from_slice(&reference.intermediate_states[row * st_row..][..st_row]);
        }
    }
    let before = case
        .state_pool
        .to_f32_vec("pool")
        .map_err(|e| fail(e.to_string()))?;
    let after = pool.to_f32_vec("pool").map_err(|e| fail(e.to_string()))?;
    let (mut pool_got, mut pool_ref) = (vec![], vec![]);
    for s in 0..spec.slots {
        let range = s * slab..(s + 1) * slab;
        if slots.contains(&(s as i64)) {
            pool_got.extend_from_slice(&after[range.clone()]);
            pool_ref.extend_from_slice(&reference.state_pool[range]);
        } else if !before[range.clone()]
            .iter()
            .zip(&after[range])
            .all(|(a, b)| a.to_bits() == b.to_bits())
        {
            return Err(fail(format!("slot {s} is not addressed but changed")));
        }
    }
    let errors = DecodeErrors {
        o: rel_rms(&o_got, &o_ref),
        intermediate_states: rel_rms(&st_got, &st_ref),
        pool: rel_rms(&pool_got, &pool_ref),
    };
    let pool_tolerance = if spec.pool_dtype == DType::BF16 {
        STATE_TOLERANCE_BF16
    } else {
        STATE_TOLERANCE_F32
    };
    // rel_rms of nothing (every row skipped) is NaN; those cases check zeros above.
    let within = |err: f64, tolerance: f64| o_got.is_empty() || err < tolerance;
    if !within(errors.o, O_TOLERANCE)
        || !within(errors.intermediate_states, STATE_TOLERANCE_F32)
        || !within(errors.pool, pool_tolerance)
    {
        return Err(fail(format!(
            "rel_rms o {:.3e} (< {O_TOLERANCE:e}), intermediate {:.3e} (< {STATE_TOLERANCE_F32:e}), pool {:.3e} (< {pool_tolerance:e})",
            errors.o, errors.intermediate_states, errors.pool
        )));
    }
    Ok(errors)
}

/// What a replayed decode launch must have written after its slot indices were rewritten on
/// the device, written once for every backend: row `past` (an index at or past the pool's slot
/// count) all NaN, row `skipped` (a negative index) all zeros, and every other batch row of `o`
/// bit for bit `reference`'s, the same kernel's output for the call with both rows skipped.
/// (The pools are compared by the caller: the row past the pool must touch none.)
pub fn check_refused_slot_rows(
    o: &HostTensor,
    reference: &HostTensor,
    past: usize,
    skipped: usize,
) -> std::result::Result<(), String> {
    let got = o.to_f32_vec("o").map_err(|e| e.to_string())?;
    let want = reference
        .to_f32_vec("reference o")
        .map_err(|e| e.to_string())?;
    let batch = o.shape().first().copied().unwrap_or(0);
    if o.shape() != reference.shape()
        || got.is_empty()
        || past == skipped
        || batch <= past.max(skipped)
    {
        return Err(format!(
            "o {:?} and reference {:?} must match, hold elements and have rows {past} and \
             {skipped} (two different ones)",
            o.shape(),
            reference.shape()
        ));
    }
    let row = got.len() / batch;
    for (b, (got, want)) in got.chunks(row).zip(want.chunks(row)).enumerate() {
        let (fine, what) = match b {
            _ if b == past => (
                got.iter().all(|x| x.is_nan()),
                ", whose slot is past the pool, is not all NaN",
            ),
            _ if b == skipped => (
                got.iter().all(|&x| x == 0.0),
                ", whose slot is negative, is not all zero",
            ),
            _ => (
                got.iter()
                    .zip(want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                " differs from the call with the refused rows skipped",
            ),
        };
        if !fine {
            return Err(format!("row {b}{what}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_that_runs_a_bad_call_or_touches_the_pool_fails_the_refusals() {
        let ran = check_refusals(&|case, _| (Ok(()), case.state_pool.clone()));
        assert!(ran.unwrap_err().contains("the call ran"));
        let vague = check_refusals(&|case, _| (Err("bad".into()), case.state_pool.clone()));
        assert!(vague.unwrap_err().contains("is not in the error"));
        let every = "slot_indices[1] = 9 is out of range, both address slot 0, tensor `v`, \
                     tensor `q` non-finite";
        let touched = check_refusals(&|case, _| {
            let mut pool = case.state_pool.to_f32_vec("pool").unwrap();
            pool[0] += 1.0;
            let shape = case.state_pool.shape().to_vec();
            (
                Err(every.into()),
                HostTensor::from_f32(shape, pool).unwrap(),
            )
        });
        assert!(touched.unwrap_err().contains("changed the pool"));
        assert!(check_refusals(&|case, _| (Err(every.into()), case.state_pool.clone())).is_ok());
    }

    #[test]
    fn refused_slot_rows_must_be_nan_zero_and_otherwise_the_references() {
        let reference: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 + 1.0).collect();
        type Edit<'a> = &'a dyn Fn(&mut Vec<f32>);
        let written = |edit: Edit| {
            let mut o = reference.clone();
            o[3..6].fill(0.0);
            o[6..9].fill(f32::NAN);
            edit(&mut o);
            HostTensor::from_f32(vec![4, 1, 1, 3], o).unwrap()
        };
        let want = HostTensor::from_f32(vec![4, 1, 1, 3], reference.clone()).unwrap();
        let check = |o: &HostTensor| check_refused_slot_rows(o, &want, 2, 1);
        assert!(check(&written(&|_| {})).is_ok());
        let cases: [(Edit, &str); 3] = [
            (&|o| o[7] = 0.0, "past the pool"),
            (&|o| o[4] = 1.0, "negative"),
            (
                &|o| o[10] = f32::from_bits(o[10].to_bits() + 1),
                "row 3 differs",
            ),
        ];
        for (edit, fragment) in cases {
            let err = check(&written(edit)).unwrap_err();
            assert!(err.contains(fragment), "{err}");
        }
    }
}
