//! GDN prefill (chunked and recurrent) against the f64 oracle on fresh random inputs.

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{BetaFill, GdnCase, GdnSpec};
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
fn sequence_lengths_around_the_chunk_size() {
    for (i, tokens) in [1, 63, 64, 65, 1000].into_iter().enumerate() {
        let spec = GdnSpec::new(tokens, 2, 4, 64, 64);
        check(
            &format!("T={tokens}"),
            &spec,
            &options(false),
            100 + i as u64,
        );
    }
}

#[test]
fn batch_of_two_with_initial_state_and_l2norm() {
    let mut spec = GdnSpec::new(130, 2, 4, 64, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    spec.raw_qk = true;
    check("B=2 init l2", &spec, &options(true), 7);
}

#[test]
fn varlen_with_a_length_one_sequence() {
    let mut spec = GdnSpec::new(1 + 70 + 1 + 129, 1, 2, 64, 64);
    spec.seq_lens = Some(vec![1, 70, 1, 129]);
    spec.with_initial_state = true;
    check("varlen", &spec, &options(false), 8);
    spec.with_initial_state = false;
    spec.raw_qk = true;
    check("varlen l2", &spec, &options(true), 9);
}

#[test]
fn gqa_ratios() {
    for ratio in [1, 2, 3, 4] {
        let spec = GdnSpec::new(97, 2, 2 * ratio, 32, 40);
        check(
            &format!("GQA {ratio}"),
            &spec,
            &options(false),
            20 + ratio as u64,
        );
    }
}

#[test]
fn unequal_and_odd_head_dims() {
    let spec = GdnSpec::new(150, 1, 2, 64, 256);
    check("K=64 V=256", &spec, &options(false), 30);
    let mut spec = GdnSpec::new(150, 1, 2, 100, 100);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    check("K=V=100", &spec, &options(true), 31);
    let spec = GdnSpec::new(70, 1, 1, 256, 96);
    check("K=256 V=96", &spec, &options(false), 32);
}

#[test]
fn gate_extremes() {
    let mut spec = GdnSpec::new(200, 1, 2, 64, 64);
    spec.gate_scale = 10.0;
    check("strong decay", &spec, &options(false), 40);
    spec.gate_scale = 0.0;
    check("no decay", &spec, &options(false), 41);
    spec.gate_scale = 1.0;
    spec.beta = BetaFill::Constant(0.0);
    spec.with_initial_state = true;
    check("beta 0", &spec, &options(false), 42);
    spec.beta = BetaFill::Constant(1.0);
    check("beta 1", &spec, &options(false), 43);
}

#[test]
fn huge_negative_gates_underflow_to_zero_not_nan() {
    let spec = GdnSpec::new(130, 1, 1, 32, 32);
    let mut case = GdnCase::random(&spec, 50).unwrap();
    let mut g = case.g.to_f32_vec("g").unwrap();
    g[3] = -1.0e4;
    g[100] = -3.0e38;
    case.g = deltakv_contract::HostTensor::from_f32(case.g.shape().to_vec(), g).unwrap();
    let reference = gdn_reference(&case.inputs(), &options(false)).unwrap();
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill(&case.inputs(), &options(false), mode).unwrap();
        let err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
        assert!(err < O_TOLERANCE, "{mode:?}: {err:.3e}");
    }
}

#[test]
fn f32_and_f16_inputs_and_custom_scale() {
    let mut spec = GdnSpec::new(65, 2, 2, 64, 64);
    spec.dtype = deltakv_contract::DType::F32;
    let opts = GdnOptions {
        scale: Some(0.3),
        use_qk_l2norm: false,
    };
    check("f32", &spec, &opts, 60);
    spec.dtype = deltakv_contract::DType::F16;
    check("f16", &spec, &opts, 61);
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
