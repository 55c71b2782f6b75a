//! GDN decode against the f64 oracle on fresh random inputs, decode continuing a prefill, and
//! every bad-input case.

use deltakv_contract::gdn::decode::check::{
    BackendRun, DecodeCheck, O_TOLERANCE, STATE_TOLERANCE_F32, check_options, check_refusals,
    decode_suite, run_decode_check,
};
use deltakv_contract::gdn::decode::oracle::gdn_decode_reference;
use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating, GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, HostTensor};
use deltakv_cpu::gdn::{gdn_decode, gdn_prefill};

/// `a` and `b` agree to f32 rounding (rel_rms < 1e-6, in their own dtype).
fn assert_close(a: &HostTensor, b: &HostTensor, what: &str) {
    assert_eq!((a.shape(), a.dtype()), (b.shape(), b.dtype()), "{what}");
    let reference: Vec<f64> = b.to_f64_vec("b").unwrap();
    let err = rel_rms(&a.to_f32_vec("a").unwrap(), &reference);
    let tolerance = if a.dtype() == DType::F32 { 1e-6 } else { 1e-2 };
    assert!(err < tolerance, "{what}: rel_rms {err:.3e}");
}

fn options(l2: bool, intermediate: bool) -> DecodeOptions {
    DecodeOptions {
        gdn: GdnOptions {
            scale: None,
            use_qk_l2norm: l2,
        },
        intermediate_states: intermediate,
    }
}

/// Held by tests that switch the process-wide SIMD level, and by tests that compare two
/// calls bit for bit (which a level switch between them would break).
static SIMD_LEVEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs one case of the shared suite on the CPU against the oracle, then checks that the path
/// without intermediate states gives the same o and pool.
fn check(case: &DecodeCheck) {
    let cpu = |c: &DecodeCase, opts: &DecodeOptions| -> deltakv_contract::Result<BackendRun> {
        let mut pool = c.state_pool.clone();
        let output = gdn_decode(&c.inputs()?, &mut pool, opts)?;
        Ok(BackendRun { output, pool })
    };
    let errors = run_decode_check(case, &cpu).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{}: o {:.3e}, intermediate {:.3e}, pool {:.3e}",
        case.name, errors.o, errors.intermediate_states, errors.pool
    );
    // Without intermediate states (T = 1 then takes the copy-free path): the same o and pool.
    // The paths do the same arithmetic in the same order today (so they agree bit for bit),
    // but the shared block step may be retuned, so only near-equality is required here.
    let c = DecodeCase::random(&case.spec, case.seed).unwrap();
    let with = cpu(&c, &check_options(case, true)).unwrap();
    let without = cpu(&c, &check_options(case, false)).unwrap();
    assert!(without.output.intermediate_states.is_none());
    let name = &case.name;
    assert_close(
        &without.output.o,
        &with.output.o,
        &format!("{name}: o without intermediate states"),
    );
    assert_close(
        &without.pool,
        &with.pool,
        &format!("{name}: pool without intermediate states"),
    );
}

/// The shared decode suite (also run on every GPU backend), on the CPU.
#[test]
fn the_decode_suite_against_the_oracle() {
    let suite = decode_suite();
    assert!(suite.len() > 40);
    suite.iter().for_each(check);
}

#[test]
fn large_fused_gate_inputs_use_the_linear_softplus() {
    let spec = {
        let mut s = DecodeSpec::new(2, 4, 1, 2, 32, 32);
        s.fused_gating = true;
        s
    };
    let mut case = DecodeCase::random(&spec, 5000).unwrap();
    for (name, t) in case.gates.iter_mut() {
        if name == "a" {
            let values: Vec<f32> = (0..t.len())
                .map(|i| [25.0, -30.0, 0.0, 19.9][i % 4])
                .collect();
            *t = HostTensor::from_f32(t.shape().to_vec(), values).unwrap();
        }
        if name == "dt_bias" {
            *t = HostTensor::from_f32(vec![2], vec![0.0, 0.5]).unwrap();
        }
        if name == "A_log" {
            *t = HostTensor::from_f32(vec![2], vec![-3.0, -4.0]).unwrap();
        }
    }
    let inputs = case.inputs().unwrap();
    let opts = options(false, false);
    let reference = gdn_decode_reference(&inputs, &case.state_pool, &opts.gdn).unwrap();
    let mut pool = case.state_pool.clone();
    let out = gdn_decode(&inputs, &mut pool, &opts).unwrap();
    let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
    let p_err = rel_rms(&pool.to_f32_vec("pool").unwrap(), &reference.state_pool);
    assert!(o_err < O_TOLERANCE, "o {o_err:.3e}");
    assert!(p_err < STATE_TOLERANCE_F32, "pool {p_err:.3e}");
}

/// Token range `t0..t1` of a `[B, T, ...]` tensor, as a new tensor in the same dtype.
fn tokens_of(t: &HostTensor, t0: usize, t1: usize) -> HostTensor {
    let shape = t.shape();
    let inner: usize = shape[2..].iter().product();
    let values = t.to_f32_vec("x").unwrap();
    let mut picked = Vec::new();
    for b in 0..shape[0] {
        picked.extend_from_slice(&values[(b * shape[1] + t0) * inner..(b * shape[1] + t1) * inner]);
    }
    let mut new_shape = shape.to_vec();
    new_shape[1] = t1 - t0;
    HostTensor::from_f32_as(new_shape, &picked, t.dtype()).unwrap()
}

#[test]
fn decode_continuing_a_prefill_equals_the_longer_prefill() {
    // Two sequences of 70 + 9 tokens: prefill 70, then decode 4 + 1 + 4 tokens from its
    // final state; the result must match prefilling all 79 tokens at once.
    let (prompt, total) = (70, 79);
    let mut spec = GdnSpec::new(total, 2, 4, 64, 64);
    spec.batch = 2;
    spec.dtype = DType::F32;
    spec.raw_qk = true;
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 6000).unwrap();
    let gdn = GdnOptions {
        scale: Some(0.2),
        use_qk_l2norm: true,
    };
    let full = gdn_prefill(&case.inputs(), &gdn, PrefillMode::Chunk).unwrap();
    let head =
        |t0, t1| [&case.q, &case.k, &case.v, &case.g, &case.beta].map(|x| tokens_of(x, t0, t1));
    let [q, k, v, g, beta] = head(0, prompt);
    let mut prompt_inputs = case.inputs();
    (
        prompt_inputs.q,
        prompt_inputs.k,
        prompt_inputs.v,
        prompt_inputs.g,
        prompt_inputs.beta,
    ) = (&q, &k, &v, &g, &beta);
    let prefix = gdn_prefill(&prompt_inputs, &gdn, PrefillMode::Chunk).unwrap();

    // The pool holds the two sequences in slots 2 and 0 of 3 (slot 1 is someone else's).
    let (heads, state_len) = (4, 64 * 64);
    let finals = prefix.final_state.as_f32().unwrap();
    let mut pool_values = vec![7.0f32; 3 * heads * state_len];
    pool_values[2 * heads * state_len..].copy_from_slice(&finals[..heads * state_len]);
    pool_values[..heads * state_len].copy_from_slice(&finals[heads * state_len..]);
    let mut pool = HostTensor::from_f32(vec![3, heads, 64, 64], pool_values).unwrap();
    let slots = HostTensor::from_i32(vec![2], vec![2, 0]).unwrap();
    let full_o = full.o.to_f32_vec("o").unwrap();
    let mut t0 = prompt;
    for step in [4, 1, 4] {
        let [q, k, v, g, beta] = head(t0, t0 + step);
        let inputs = DecodeInputs {
            q: &q,
            k: &k,
            v: &v,
            gating: Gating::Direct { g: &g, beta: &beta },
            slot_indices: &slots,
        };
        let out = gdn_decode(
            &inputs,
            &mut pool,
            &DecodeOptions {
                gdn: gdn.clone(),
                intermediate_states: false,
            },
        )
        .unwrap();
        let expected = tokens_of(&full.o, t0, t0 + step).to_f32_vec("o").unwrap();
        let got = out.o.to_f32_vec("o").unwrap();
        let err = got
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "o at tokens {t0}..: max diff {err:.3e}");
        t0 += step;
    }
    assert_eq!(full_o.len(), 2 * total * heads * 64);
    let pool = pool.as_f32().unwrap();
    let full_state = full.final_state.as_f32().unwrap();
    let pairs = [(2, 0), (0, 1)];
    for (slot, seq) in pairs {
        let got = &pool[slot * heads * state_len..][..heads * state_len];
        let expected = &full_state[seq * heads * state_len..][..heads * state_len];
        let err = got
            .iter()
            .zip(expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "state of sequence {seq}: max diff {err:.3e}");
    }
    assert!(
        pool[heads * state_len..2 * heads * state_len]
            .iter()
            .all(|&x| x == 7.0)
    );
}

// ---- bad input: one clear error, and the pool untouched ----

/// Runs decode on `case` with `edit` applied and returns the error message; also checks the
/// pool was not modified.
fn error_of(spec: &DecodeSpec, edit: impl FnOnce(&mut DecodeCase)) -> String {
    let mut case = DecodeCase::random(spec, 7000).unwrap();
    edit(&mut case);
    let mut pool = case.state_pool.clone();
    let result = case
        .inputs()
        .and_then(|inputs| gdn_decode(&inputs, &mut pool, &options(false, true)));
    assert_eq!(pool, case.state_pool, "the pool changed on an error");
    result.expect_err("expected an error").to_string()
}

fn set_gate(case: &mut DecodeCase, name: &str, tensor: Option<HostTensor>) {
    case.gates.retain(|(n, _)| n != name);
    if let Some(t) = tensor {
        case.gates.push((name.to_string(), t));
    }
}

fn assert_contains(message: &str, needle: &str) {
    assert!(message.contains(needle), "`{message}` lacks `{needle}`");
}

#[test]
fn the_refusals_every_backend_makes() {
    // The CPU checks every value on every call, so the full check's flag changes nothing here.
    check_refusals(&|case, _checked| {
        let mut pool = case.state_pool.clone();
        let outcome = (case.inputs())
            .and_then(|inputs| gdn_decode(&inputs, &mut pool, &options(false, false)))
            .map(|_| ())
            .map_err(|e| e.to_string());
        (outcome, pool)
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn bad_slot_indices() {
    let spec = DecodeSpec::new(3, 2, 1, 2, 32, 32);
    let err = error_of(&spec, |c| {
        c.slot_indices = HostTensor::from_i32(vec![3], vec![0, 5, -1]).unwrap();
    });
    assert_contains(
        &err,
        "slot_indices[1] = 5 is out of range for a state pool of 5 slots",
    );
    let err = error_of(&spec, |c| {
        c.slot_indices = HostTensor::from_i64(vec![3], vec![4, -1, 4]).unwrap();
    });
    assert_contains(&err, "rows 0 and 2 both address slot 4");
    let err = error_of(&spec, |c| {
        c.slot_indices = HostTensor::from_i32(vec![2], vec![0, 1]).unwrap();
    });
    assert_contains(&err, "tensor `slot_indices`: expected shape [3]");
    let err = error_of(&spec, |c| {
        c.slot_indices = HostTensor::from_f32(vec![3], vec![0.0, 1.0, 2.0]).unwrap();
    });
    assert_contains(
        &err,
        "tensor `slot_indices` has dtype f32, expected i32 or i64",
    );
}

#[test]
fn too_many_tokens() {
    let spec = DecodeSpec::new(1, 17, 1, 1, 16, 16);
    let err = error_of(&spec, |_| {});
    assert_contains(&err, "decode takes at most 16 tokens per row, got T = 17");
}

#[test]
fn gating_half_given() {
    let spec = DecodeSpec::new(2, 1, 1, 2, 16, 16);
    let err = error_of(&spec, |c| set_gate(c, "beta", None));
    assert_contains(&err, "gating needs both g and beta, but `beta` missing");
    let mut fused = spec.clone();
    fused.fused_gating = true;
    let err = error_of(&fused, |c| {
        set_gate(c, "A_log", None);
        set_gate(c, "dt_bias", None);
    });
    assert_contains(
        &err,
        "fused gating needs a, b, A_log and dt_bias, but `A_log`, `dt_bias` missing",
    );
    let err = error_of(&fused, |c| {
        let g = HostTensor::from_f32(vec![2, 1, 2], vec![-0.1; 4]).unwrap();
        set_gate(c, "g", Some(g));
    });
    assert_contains(&err, "give either g and beta or fused gating");
    let err = error_of(&spec, |c| {
        set_gate(c, "g", None);
        set_gate(c, "beta", None);
    });
    assert_contains(&err, "missing tensor `g and beta");
}

#[test]
fn shape_and_dtype_mismatches() {
    let spec = DecodeSpec::new(2, 3, 1, 2, 16, 16);
    let err = error_of(&spec, |c| {
        c.state_pool = HostTensor::from_f32(vec![4, 3, 16, 16], vec![0.0; 4 * 3 * 256]).unwrap();
    });
    assert_contains(
        &err,
        "tensor `state_pool`: expected shape [4, 2, 16, 16] [S, H, K, V]",
    );
    let err = error_of(&spec, |c| {
        c.state_pool =
            HostTensor::from_f32_as(vec![4, 2, 16, 16], &[0.0; 4 * 2 * 256], DType::F16).unwrap();
    });
    assert_contains(
        &err,
        "tensor `state_pool` has dtype f16, expected f32 or bf16",
    );
    let err = error_of(&spec, |c| {
        c.v = HostTensor::from_f32_as(vec![2, 2, 2, 16], &[0.0; 128], DType::BF16).unwrap();
    });
    assert_contains(&err, "tensor `v`: expected shape [2, 3, 2, 16]");
    let err = error_of(&spec, |c| {
        c.k = HostTensor::from_f32_as(vec![2, 3, 1, 16], &[0.0; 96], DType::F32).unwrap();
    });
    assert_contains(
        &err,
        "tensor `k` has dtype f32, expected bf16 (the dtype of q)",
    );
    let err = error_of(&spec, |c| {
        let g = HostTensor::from_f32(vec![2, 3, 1], vec![-0.1; 6]).unwrap();
        set_gate(c, "g", Some(g));
    });
    assert_contains(&err, "tensor `g`: expected shape [2, 3, 2]");
    let mut fused = spec.clone();
    fused.fused_gating = true;
    let err = error_of(&fused, |c| {
        set_gate(
            c,
            "A_log",
            Some(HostTensor::from_f32(vec![3], vec![0.0; 3]).unwrap()),
        );
    });
    assert_contains(&err, "tensor `A_log`: expected shape [2] [H]");
}

#[test]
fn non_finite_inputs() {
    let spec = DecodeSpec::new(2, 2, 1, 2, 16, 16);
    let nan_at = |t: &HostTensor, i: usize| {
        let mut values = t.to_f32_vec("x").unwrap();
        values[i] = f32::NAN;
        HostTensor::from_f32_as(t.shape().to_vec(), &values, t.dtype()).unwrap()
    };
    let err = error_of(&spec, |c| c.q = nan_at(&c.q, 5));
    assert_contains(
        &err,
        "tensor `q` holds a non-finite value (NaN) at flat index 5",
    );
    let err = error_of(&spec, |c| {
        let g = nan_at(c.gate("g").unwrap(), 3);
        set_gate(c, "g", Some(g));
    });
    assert_contains(
        &err,
        "tensor `g` holds a non-finite value (NaN) at flat index 3",
    );
    let mut fused = spec.clone();
    fused.fused_gating = true;
    let err = error_of(&fused, |c| {
        let b = nan_at(c.gate("b").unwrap(), 1);
        set_gate(c, "b", Some(b));
    });
    assert_contains(
        &err,
        "tensor `b` holds a non-finite value (NaN) at flat index 1",
    );
}

#[test]
fn calls_from_inside_rayon_tasks_and_sequential_steps_agree() {
    // Four independent decode calls run concurrently from rayon workers (as an engine serving
    // several layers might); each must equal the same call made alone, bit for bit, so no
    // other test may switch the SIMD level meanwhile.
    let _simd = SIMD_LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    use rayon::prelude::*;
    let spec = DecodeSpec::new(2, 2, 1, 2, 64, 64);
    let cases: Vec<DecodeCase> = (0..4)
        .map(|i| DecodeCase::random(&spec, 8000 + i).unwrap())
        .collect();
    let alone: Vec<HostTensor> = cases
        .iter()
        .map(|c| {
            let mut pool = c.state_pool.clone();
            gdn_decode(&c.inputs().unwrap(), &mut pool, &options(false, false)).unwrap();
            pool
        })
        .collect();
    let together: Vec<HostTensor> = cases
        .par_iter()
        .map(|c| {
            let mut pool = c.state_pool.clone();
            gdn_decode(&c.inputs().unwrap(), &mut pool, &options(false, false)).unwrap();
            pool
        })
        .collect();
    assert_eq!(alone, together);

    // Two calls of one token each equal one call of two tokens (the first call's pool is the
    // second's input).
    let case = &cases[0];
    let mut two = case.state_pool.clone();
    let joint = gdn_decode(&case.inputs().unwrap(), &mut two, &options(false, true)).unwrap();
    let mut one = case.state_pool.clone();
    for t in 0..2 {
        let (q, k, v) = (
            tokens_of(&case.q, t, t + 1),
            tokens_of(&case.k, t, t + 1),
            tokens_of(&case.v, t, t + 1),
        );
        let (g, beta) = (
            tokens_of(case.gate("g").unwrap(), t, t + 1),
            tokens_of(case.gate("beta").unwrap(), t, t + 1),
        );
        let inputs = DecodeInputs {
            q: &q,
            k: &k,
            v: &v,
            gating: Gating::Direct { g: &g, beta: &beta },
            slot_indices: &case.slot_indices,
        };
        let out = gdn_decode(&inputs, &mut one, &options(false, false)).unwrap();
        assert_close(
            &out.o,
            &tokens_of(&joint.o, t, t + 1),
            &format!("o of token {t}"),
        );
    }
    assert_close(&one, &two, "pool after two single-token calls");
}

#[test]
fn decode_into_caller_buffers_equals_decode() {
    // Bit-for-bit comparison: no other test may switch the SIMD level meanwhile.
    let _simd = SIMD_LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    use deltakv_cpu::gdn::gdn_decode_into;
    let mut spec = DecodeSpec::new(3, 3, 1, 2, 64, 96);
    spec.dtype = DType::F32;
    spec.skipped_rows = vec![1];
    spec.pool_dtype = DType::BF16;
    let case = DecodeCase::random(&spec, 9000).unwrap();
    let inputs = case.inputs().unwrap();
    let mut pool = case.state_pool.clone();
    let expected = gdn_decode(&inputs, &mut pool, &options(false, true)).unwrap();
    // Garbage-filled buffers: every element must be overwritten.
    let mut o = vec![f32::NAN; 3 * 3 * 2 * 96];
    let mut states = vec![f32::NAN; 3 * 3 * 2 * 64 * 96];
    let mut pool_into = case.state_pool.clone();
    let dims = gdn_decode_into(
        &inputs,
        &mut pool_into,
        &options(false, false).gdn,
        &mut o,
        Some(&mut states),
    )
    .unwrap();
    assert_eq!((dims.batch, dims.tokens), (3, 3));
    assert_eq!(o, expected.o.to_f32_vec("o").unwrap());
    assert_eq!(
        states,
        expected
            .intermediate_states
            .unwrap()
            .to_f32_vec("s")
            .unwrap()
    );
    assert_eq!(pool_into, pool);

    let mut short = vec![0.0f32; 10];
    let mut untouched = case.state_pool.clone();
    let err = gdn_decode_into(
        &inputs,
        &mut untouched,
        &options(false, false).gdn,
        &mut short,
        None,
    )
    .unwrap_err()
    .to_string();
    assert_contains(&err, "output buffer `o` holds 10 values, expected 1728");
    assert_eq!(untouched, case.state_pool);
}

#[test]
fn every_simd_dispatch_level_matches_the_oracle() {
    // The portable build (no AVX2/FMA) and the AVX2 build of every decode path: T = 1 in place
    // (f32 and bf16 pools), and the block path (T > 1, intermediate states).
    use deltakv_cpu::simd::{SimdLimit, set_simd_limit};
    let _simd = SIMD_LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    for limit in [SimdLimit::Baseline, SimdLimit::Avx2, SimdLimit::Any] {
        set_simd_limit(limit);
        // V = 112 and 48 exercise the AVX-512 step's 64-, 32- and 16-column blocks, in place
        // (f32, any T) and through a contiguous block (bf16, T > 1).
        for (tokens, pool_dtype, value_dim) in [
            (1, DType::F32, 64),
            (1, DType::F32, 112),
            (1, DType::F32, 48),
            (1, DType::BF16, 64),
            (5, DType::F32, 64),
            (5, DType::F32, 112),
            (3, DType::BF16, 112),
        ] {
            let mut spec = DecodeSpec::new(3, tokens, 1, 2, 64, value_dim);
            spec.pool_dtype = pool_dtype;
            spec.skipped_rows = vec![2];
            check(&DecodeCheck {
                name: format!("{limit:?} T={tokens} V={value_dim} pool {pool_dtype}"),
                spec,
                use_qk_l2norm: false,
                seed: 9100 + tokens as u64,
            });
        }
    }
    set_simd_limit(SimdLimit::Any);
}
