//! GDN prefill on the GPU against the f64 oracle: the shapes of the CPU suite (odd T, varlen
//! with length-1 sequences, GQA ratios, K != V, strong and zero decay, beta 0 and 1, resets,
//! f32/f16 inputs), every case run whole, split into forced segments (the two-level scan) and relayed,
//! plus the pooled prefill followed by decode. On a machine without a CUDA device every test
//! prints one "skipped (no CUDA device)" line and passes.
//!
//! Tolerances: the tensor-core products take bf16 operands, so o (stored in bf16) and the
//! f32 final state carry bf16-level error; FLA measures 2.9e-3 to 4.5e-3 on o with bf16 inputs.

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::prefill::check::{prefill_suite, reset_gates_case};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec, token_range};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, HostTensor};
use deltakv_cuda::gdn::{
    PrefillStates, Split, gdn_decode, gdn_prefill_checkpointed, gdn_prefill_host,
};
use deltakv_cuda::{Cuda, CudaTensor};
use std::io::Write;

const O_TOLERANCE: f64 = 4.0e-3;
const STATE_TOLERANCE: f64 = 4.0e-3;

/// The GPU, with scratch memory poisoned so a kernel that reads an element no kernel wrote
/// shows it as NaN in the results.
fn device(test: &str) -> Option<&'static Cuda> {
    match Cuda::get() {
        Ok(cuda) => {
            deltakv_cuda::tensor::poison_scratch(true);
            Some(cuda)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
            None
        }
    }
}

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

/// Runs `case` whole, with forced scan segments of 1 and 3 chunks and relayed after 1, 2 and 9
/// chunks (the lead walking several chunks through both of its stages); returns the worst
/// errors.
fn check(cuda: &Cuda, name: &str, case: &GdnCase, options: &GdnOptions) -> (f64, f64) {
    let reference = gdn_reference(&case.inputs(), options).unwrap();
    let mut worst = (0.0f64, 0.0f64);
    let splits = [
        Split::Auto,
        Split::Scan(1),
        Split::Scan(3),
        Split::Relay(1),
        Split::Relay(2),
        Split::Relay(9),
    ];
    for split in splits {
        let out = gdn_prefill_host(cuda, &case.inputs(), options, split)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(out.o.dtype(), case.v.dtype());
        let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
        let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
        eprintln!("{name} segments {split:?}: o {o_err:.3e}, final_state {s_err:.3e}");
        assert!(
            o_err < O_TOLERANCE,
            "{name} {split:?}: o rel_rms {o_err:.3e}"
        );
        assert!(
            s_err < STATE_TOLERANCE,
            "{name} {split:?}: final_state rel_rms {s_err:.3e}"
        );
        worst = (worst.0.max(o_err), worst.1.max(s_err));
    }
    worst
}

fn check_spec(cuda: &Cuda, name: &str, spec: &GdnSpec, options: &GdnOptions, seed: u64) {
    let case = GdnCase::random(spec, seed).unwrap();
    check(cuda, name, &case, options);
}

#[test]
fn the_prefill_suite_against_the_oracle_on_the_gpu() {
    let Some(cuda) = device("the_prefill_suite_against_the_oracle_on_the_gpu") else {
        return;
    };
    for case in prefill_suite() {
        check_spec(cuda, &case.name, &case.spec, &case.options, case.seed);
    }
    check(
        cuda,
        "resets",
        &reset_gates_case().unwrap(),
        &options(false),
    );
}

#[test]
fn long_sequences_do_not_drift() {
    let Some(cuda) = device("long_sequences_do_not_drift") else {
        return;
    };
    let mut errors = Vec::new();
    for tokens in [4096, 32768] {
        let mut spec = GdnSpec::new(tokens, 1, 2, 128, 128);
        spec.raw_qk = true;
        spec.with_initial_state = true;
        let case = GdnCase::random(&spec, 70).unwrap();
        errors.push(check(cuda, &format!("T={tokens}"), &case, &options(true)));
    }
    let (short, long) = (errors[0], errors[1]);
    eprintln!(
        "drift: o {:.3e} -> {:.3e}, state {:.3e} -> {:.3e}",
        short.0, long.0, short.1, long.1
    );
    assert!(long.0 <= 1.5 * short.0 && long.1 <= 1.5 * short.1 + 1e-4);
}

#[test]
fn pooled_prefill_then_decode_equals_the_longer_prefill() {
    let Some(cuda) = device("pooled_prefill_then_decode_equals_the_longer_prefill") else {
        return;
    };
    // Three sequences of 200 + 1 tokens (the last token decoded), pool of 5 slots.
    let (heads, key_heads, dim, prompt) = (4, 2, 128, 200);
    let mut spec = GdnSpec::new(prompt + 1, key_heads, heads, dim, dim);
    spec.batch = 3;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 80).unwrap();
    let opts = options(true);
    let reference = gdn_reference(&case.inputs(), &opts).unwrap();

    // The first `prompt` tokens of each row, and the last one, as separate tensors.
    let split = |t: &HostTensor, keep_first: bool| -> HostTensor {
        let range = if keep_first {
            0..prompt
        } else {
            prompt..prompt + 1
        };
        token_range(t, range).unwrap()
    };
    let up = |t: &HostTensor| CudaTensor::upload(cuda, t).unwrap();
    let head = [&case.q, &case.k, &case.v, &case.g, &case.beta].map(|t| up(&split(t, true)));
    let tail = [&case.q, &case.k, &case.v, &case.g, &case.beta].map(|t| up(&split(t, false)));
    let slots = [4i64, 0, 2];
    let slot_tensor = up(&HostTensor::from_i64(vec![3], slots.to_vec()).unwrap());
    // Whole and relayed (the relay stores its final states through scratch: a pool's slot is
    // both the initial and the final state).
    for schedule in [Split::Auto, Split::Relay(2)] {
        // Slots start as zero states (the prefill reads them as its initial states).
        let mut pool = CudaTensor::zeros(cuda, vec![5, heads, dim, dim], DType::F32).unwrap();
        let inputs = GdnInputs {
            q: &head[0],
            k: &head[1],
            v: &head[2],
            g: &head[3],
            beta: &head[4],
            initial_state: None,
            cu_seqlens: None,
        };
        let states = PrefillStates::Pool {
            pool: &mut pool,
            slot_indices: &slot_tensor,
        };
        gdn_prefill_checkpointed(cuda, &inputs, &opts, states, None, schedule).unwrap();
        let decode_inputs = DecodeInputs {
            q: &tail[0],
            k: &tail[1],
            v: &tail[2],
            gating: Gating::Direct {
                g: &tail[3],
                beta: &tail[4],
            },
            slot_indices: &slot_tensor,
        };
        let decode_options = DecodeOptions {
            gdn: opts.clone(),
            ..DecodeOptions::default()
        };
        let out = gdn_decode(cuda, &decode_inputs, &mut pool, &decode_options).unwrap();
        // The decoded token's output against the oracle's last token of the longer prefill.
        let o = out.o.download(cuda).unwrap().to_f32_vec("o").unwrap();
        let per_row = heads * dim;
        let expected_o: Vec<f64> = (0..3)
            .flat_map(|b| reference.o[(b * (prompt + 1) + prompt) * per_row..][..per_row].to_vec())
            .collect();
        let o_err = rel_rms(&o, &expected_o);
        // Each slot against the oracle's final state of its sequence.
        let pool = pool.download(cuda).unwrap();
        let pool = pool.as_f32().unwrap();
        let per_state = heads * dim * dim;
        let mut got = Vec::new();
        let mut expected = Vec::new();
        for (n, &slot) in slots.iter().enumerate() {
            got.extend_from_slice(&pool[slot as usize * per_state..][..per_state]);
            expected.extend_from_slice(&reference.final_state[n * per_state..][..per_state]);
        }
        let s_err = rel_rms(&got, &expected);
        eprintln!("pooled prefill ({schedule:?}) + decode: o {o_err:.3e}, pool {s_err:.3e}");
        assert!(o_err < O_TOLERANCE && s_err < STATE_TOLERANCE);
    }
}

#[test]
fn bad_calls_are_refused_before_launch() {
    let Some(cuda) = device("bad_calls_are_refused_before_launch") else {
        return;
    };
    let spec = GdnSpec::new(10, 1, 2, 64, 64);
    let mut case = GdnCase::random(&spec, 90).unwrap();
    let mut g = case.g.to_f32_vec("g").unwrap();
    g[4] = f32::NAN;
    case.g = HostTensor::from_f32(case.g.shape().to_vec(), g).unwrap();
    let err = gdn_prefill_host(cuda, &case.inputs(), &options(false), Split::Auto).unwrap_err();
    assert!(err.to_string().contains("g"), "{err}");
}
