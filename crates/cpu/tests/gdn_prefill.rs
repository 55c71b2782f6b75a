//! GDN prefill (chunked and recurrent) against the f64 oracle on fresh random inputs.

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::prefill::check::{prefill_suite, reset_gates_case};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_cpu::gdn::gdn_prefill;

const O_TOLERANCE: f64 = 2.0e-3;
const STATE_TOLERANCE: f64 = 1.0e-4;

fn check(name: &str, spec: &GdnSpec, options: &GdnOptions, seed: u64) {
    let case = GdnCase::random(spec, seed).unwrap();
    let reference = gdn_reference(&case.inputs(), options).unwrap();
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill(&case.inputs(), options, mode).unwrap();
        assert_eq!(out.o.dtype(), spec.dtype);
        let o = out.o.to_f32_vec("o").unwrap();
        let state = out.final_state.as_f32().unwrap();
        let o_err = rel_rms(&o, &reference.o);
        let s_err = rel_rms(state, &reference.final_state);
        eprintln!("{name} {mode:?}: o {o_err:.3e}, final_state {s_err:.3e}");
        assert!(
            o_err < O_TOLERANCE,
            "{name} {mode:?}: o rel_rms {o_err:.3e}"
        );
        assert!(
            s_err < STATE_TOLERANCE,
            "{name} {mode:?}: final_state rel_rms {s_err:.3e}"
        );
    }
}

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

#[test]
fn the_prefill_suite_against_the_oracle() {
    for case in prefill_suite() {
        check(&case.name, &case.spec, &case.options, case.seed);
    }
}

#[test]
fn huge_negative_gates_underflow_to_zero_not_nan() {
    let case = reset_gates_case().unwrap();
    let reference = gdn_reference(&case.inputs(), &options(false)).unwrap();
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill(&case.inputs(), &options(false), mode).unwrap();
        let err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
        assert!(err < O_TOLERANCE, "{mode:?}: {err:.3e}");
    }
}

#[test]
fn every_simd_dispatch_level_matches_the_oracle() {
    use deltakv_cpu::simd::{SimdLimit, set_simd_limit};
    let mut spec = GdnSpec::new(130, 2, 4, 64, 100);
    spec.with_initial_state = true;
    for limit in [SimdLimit::Baseline, SimdLimit::Avx2, SimdLimit::Any] {
        set_simd_limit(limit);
        check(&format!("{limit:?}"), &spec, &options(false), 70);
    }
    set_simd_limit(SimdLimit::Any);
}

/// Replaces the gates of `case` with Qwen3-Next's: `g = -exp(A_log) softplus(a + dt_bias)`,
/// `A_log = ln U(1, 16)` per head, `a, b ~ N(0, 1)`, `beta = sigmoid(b)`, and `dt_bias` either
/// `softplus^-1(dt)` with dt log-uniform in [1e-3, 1e-1] (Mamba's initialisation; mild) or 0
/// (hard: softplus(a) ~ 0.8, so g averages ~ -6 and reaches below -40). Returns the smallest g.
fn with_qwen3_next_gates(case: &mut GdnCase, heads: usize, seed: u64, zero_bias: bool) -> f32 {
    use deltakv_contract::gdn::gating::fused_gates;
    let mut rng = deltakv_contract::rng::Rng::new(seed);
    let rows = case.g.len() / heads;
    let a_log: Vec<f32> = (0..heads)
        .map(|_| rng.uniform_in(1.0, 16.0).ln() as f32)
        .collect();
    let dt_bias: Vec<f32> = (0..heads)
        .map(|_| {
            let dt = rng.uniform_in(1e-3f64.ln(), 1e-1f64.ln()).exp();
            if zero_bias {
                0.0
            } else {
                dt.exp_m1().ln() as f32
            }
        })
        .collect();
    let a = rng.normal_vec(rows * heads, 1.0);
    let b = rng.normal_vec(rows * heads, 1.0);
    let (g, beta) = fused_gates(&a, &b, &a_log, &dt_bias);
    let smallest = g.iter().copied().fold(0.0f32, f32::min);
    let shape = case.g.shape().to_vec();
    case.g = deltakv_contract::HostTensor::from_f32(shape.clone(), g).unwrap();
    case.beta = deltakv_contract::HostTensor::from_f32(shape, beta).unwrap();
    smallest
}

/// Largest (o, final_state) rel_rms of both modes against the f64 oracle.
fn worst_errors(name: &str, case: &GdnCase, options: &GdnOptions) -> (f64, f64) {
    let reference = gdn_reference(&case.inputs(), options).unwrap();
    let mut worst = (0.0f64, 0.0f64);
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill(&case.inputs(), options, mode).unwrap();
        let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
        let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
        eprintln!("{name} {mode:?}: o {o_err:.3e}, final_state {s_err:.3e}");
        worst = (worst.0.max(o_err), worst.1.max(s_err));
    }
    worst
}

#[test]
fn qwen3_next_gates_against_the_oracle() {
    // Qwen3-Next-like heads (K = V = 128, GQA 2), l2 norm, two sequences with initial states.
    let mut spec = GdnSpec::new(1000, 2, 4, 128, 128);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    spec.seq_lens = Some(vec![300, 700]);
    // (input dtype, o bound, final_state bound). Measured, largest of both modes: f32 o 6.2e-7,
    // final_state 2.9e-7; bf16 o 1.66e-3 (the inputs' own rounding), final_state 1.9e-7.
    let bounds = [
        (deltakv_contract::DType::F32, 1.5e-6, 1e-6),
        (deltakv_contract::DType::BF16, O_TOLERANCE, 1e-6),
    ];
    for (i, (dtype, o_bound, s_bound)) in bounds.into_iter().enumerate() {
        for zero_bias in [false, true] {
            spec.dtype = dtype;
            let seed = 80 + 2 * i as u64 + u64::from(zero_bias);
            let mut case = GdnCase::random(&spec, seed).unwrap();
            let smallest = with_qwen3_next_gates(&mut case, 4, seed + 10, zero_bias);
            let name =
                format!("qwen3-next gates {dtype}, dt_bias 0: {zero_bias}, min g {smallest:.1}");
            let (o_err, s_err) = worst_errors(&name, &case, &options(true));
            assert!(o_err < o_bound, "{name}: o rel_rms {o_err:.3e}");
            assert!(s_err < s_bound, "{name}: final_state rel_rms {s_err:.3e}");
        }
    }
}
