//! GDN prefill on wgpu (the chunked and the token-loop kernels) against the f64 oracle on fresh
//! random inputs, with the CPU's tolerances (o within 2e-3, bf16 rounding; final states within 1e-4): odd lengths around the
//! chunk size, varlen with length-1 sequences, GQA ratios, K != V and odd head dims, extreme
//! gates, every input dtype. Shapes stay modest: CI runs them on lavapipe, a CPU.

mod common;

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{BetaFill, GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, HostTensor};
use deltakv_wgpu::Wgpu;
use deltakv_wgpu::gdn::gdn_prefill;

const O_TOLERANCE: f64 = 2.0e-3;
/// o with f32 inputs: nothing is rounded to 16 bits.
const O_TOLERANCE_F32: f64 = 1.0e-5;
const STATE_TOLERANCE: f64 = 1.0e-4;

fn check_case(wgpu: &Wgpu, name: &str, case: &GdnCase, options: &GdnOptions) {
    let reference = gdn_reference(&case.inputs(), options).unwrap();
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill(wgpu, &case.inputs(), options, mode)
            .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
        assert_eq!(out.o.dtype(), case.v.dtype(), "{name}: o dtype");
        assert_eq!(out.o.shape(), case.v.shape(), "{name}: o shape");
        let o = out.o.to_f32_vec("o").unwrap();
        let state = out.final_state.as_f32().unwrap();
        let o_err = rel_rms(&o, &reference.o);
        let s_err = rel_rms(state, &reference.final_state);
        println!("{name} {mode:?}: o {o_err:.3e}, final_state {s_err:.3e}");
        let o_bound = if case.v.dtype() == DType::F32 {
            O_TOLERANCE_F32
        } else {
            O_TOLERANCE
        };
        assert!(
            o_err < o_bound,
            "{name} {mode:?}: o rel_rms {o_err:.3e} (< {o_bound:e})"
        );
        assert!(
            s_err < STATE_TOLERANCE,
            "{name} {mode:?}: final_state rel_rms {s_err:.3e}"
        );
    }
}

fn check(wgpu: &Wgpu, name: &str, spec: &GdnSpec, options: &GdnOptions, seed: u64) {
    check_case(wgpu, name, &GdnCase::random(spec, seed).unwrap(), options);
}

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

#[test]
fn sequence_lengths_around_the_chunk_size() {
    let Some(wgpu) = common::device("prefill lengths") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    for (i, tokens) in [1, 63, 64, 65, 1000].into_iter().enumerate() {
        let spec = GdnSpec::new(tokens, 2, 4, 64, 64);
        let name = format!("T={tokens}");
        check(wgpu, &name, &spec, &options(false), 100 + i as u64);
    }
}

#[test]
fn batch_of_two_with_initial_state_and_l2norm() {
    let Some(wgpu) = common::device("prefill batch") else {
        return;
    };
    let mut spec = GdnSpec::new(130, 2, 4, 64, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    spec.raw_qk = true;
    check(wgpu, "B=2 init l2", &spec, &options(true), 7);
}

#[test]
fn enough_heads_for_the_wide_state_tiles() {
    let Some(wgpu) = common::device("prefill wide tiles") else {
        return;
    };
    // 4 x 16 heads x 4 tiles of 32 columns: the state pass takes 32-column tiles.
    let mut spec = GdnSpec::new(70, 4, 16, 64, 128);
    spec.batch = 4;
    spec.with_initial_state = true;
    check(wgpu, "wide tiles", &spec, &options(false), 10);
}

#[test]
fn varlen_with_length_one_sequences() {
    let Some(wgpu) = common::device("prefill varlen") else {
        return;
    };
    let mut spec = GdnSpec::new(1 + 70 + 1 + 129, 1, 2, 64, 64);
    spec.seq_lens = Some(vec![1, 70, 1, 129]);
    spec.with_initial_state = true;
    check(wgpu, "varlen", &spec, &options(false), 8);
    spec.with_initial_state = false;
    spec.raw_qk = true;
    check(wgpu, "varlen l2", &spec, &options(true), 9);
}

#[test]
fn gqa_ratios() {
    let Some(wgpu) = common::device("prefill GQA") else {
        return;
    };
    for ratio in [1, 2, 3, 4] {
        let spec = GdnSpec::new(97, 2, 2 * ratio, 32, 40);
        let name = format!("GQA {ratio}");
        check(wgpu, &name, &spec, &options(false), 20 + ratio as u64);
    }
}

#[test]
fn unequal_and_odd_head_dims() {
    let Some(wgpu) = common::device("prefill head dims") else {
        return;
    };
    let spec = GdnSpec::new(150, 1, 2, 64, 256);
    check(wgpu, "K=64 V=256", &spec, &options(false), 30);
    let mut spec = GdnSpec::new(150, 1, 2, 100, 100);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    check(wgpu, "K=V=100", &spec, &options(true), 31);
    let spec = GdnSpec::new(70, 1, 1, 256, 96);
    check(wgpu, "K=256 V=96", &spec, &options(false), 32);
    // Odd V with bf16 o: neighbouring heads' outputs share 4-byte words.
    let mut spec = GdnSpec::new(65, 1, 3, 37, 31);
    spec.with_initial_state = true;
    check(wgpu, "K=37 V=31", &spec, &options(false), 33);
}

#[test]
fn gate_extremes() {
    let Some(wgpu) = common::device("prefill gates") else {
        return;
    };
    let mut spec = GdnSpec::new(200, 1, 2, 64, 64);
    spec.gate_scale = 10.0;
    check(wgpu, "strong decay", &spec, &options(false), 40);
    spec.gate_scale = 0.0;
    check(wgpu, "no decay", &spec, &options(false), 41);
    spec.gate_scale = 1.0;
    spec.beta = BetaFill::Constant(0.0);
    spec.with_initial_state = true;
    check(wgpu, "beta 0", &spec, &options(false), 42);
    spec.beta = BetaFill::Constant(1.0);
    check(wgpu, "beta 1", &spec, &options(false), 43);
    // Huge negative gates reset the state (exp underflows to 0, never NaN).
    let spec = GdnSpec::new(130, 1, 1, 32, 32);
    let mut case = GdnCase::random(&spec, 50).unwrap();
    let mut g = case.g.to_f32_vec("g").unwrap();
    g[3] = -1.0e4;
    g[100] = -3.0e38;
    case.g = HostTensor::from_f32(case.g.shape().to_vec(), g).unwrap();
    check_case(wgpu, "huge negative gates", &case, &options(false));
}

#[test]
fn f32_and_f16_inputs_f16_gates_and_custom_scale() {
    let Some(wgpu) = common::device("prefill dtypes") else {
        return;
    };
    let mut spec = GdnSpec::new(65, 2, 2, 64, 64);
    spec.dtype = DType::F32;
    let opts = GdnOptions {
        scale: Some(0.3),
        use_qk_l2norm: false,
    };
    check(wgpu, "f32", &spec, &opts, 60);
    spec.dtype = DType::F16;
    check(wgpu, "f16", &spec, &opts, 61);
    // beta in q's dtype (bf16) and an odd number of gates.
    let spec = GdnSpec::new(63, 1, 1, 32, 32);
    let mut case = GdnCase::random(&spec, 62).unwrap();
    let beta = case.beta.to_f32_vec("beta").unwrap();
    case.beta = HostTensor::from_f32_as(case.beta.shape().to_vec(), &beta, DType::BF16).unwrap();
    check_case(wgpu, "bf16 beta", &case, &options(false));
}

#[test]
fn bad_inputs_are_refused_before_anything_runs() {
    let Some(wgpu) = common::device("prefill bad inputs") else {
        return;
    };
    let spec = GdnSpec::new(10, 1, 2, 32, 32);
    let mut case = GdnCase::random(&spec, 70).unwrap();
    let mut g = case.g.to_f32_vec("g").unwrap();
    g[4] = f32::NAN;
    case.g = HostTensor::from_f32(case.g.shape().to_vec(), g).unwrap();
    let err = gdn_prefill(wgpu, &case.inputs(), &options(false), PrefillMode::Chunk)
        .unwrap_err()
        .to_string();
    assert!(err.contains('g'), "{err}");
}

#[test]
fn the_kept_scratch_serves_calls_of_other_sizes() {
    let Some(wgpu) = common::device("prefill scratch") else {
        return;
    };
    // The runtime keeps the chunked prefill's scratch between calls: a long call, a short one
    // (reusing the long one's buffer and its leftovers), the long one again. Each matches the
    // oracle, and the repeat is bit-identical to the first.
    let long = GdnCase::random(&GdnSpec::new(300, 2, 4, 64, 64), 500).unwrap();
    let short = GdnCase::random(&GdnSpec::new(40, 1, 2, 32, 48), 501).unwrap();
    let run = |case: &GdnCase| {
        gdn_prefill(wgpu, &case.inputs(), &options(true), PrefillMode::Chunk).unwrap()
    };
    let first = run(&long);
    check_case(wgpu, "short after long", &short, &options(true));
    let again = run(&long);
    assert_eq!(first.o, again.o, "o of the repeated call");
    assert_eq!(
        first.final_state, again.final_state,
        "final state of the repeated call"
    );
    check_case(wgpu, "long again", &long, &options(true));
}
