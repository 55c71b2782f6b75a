//! GDN prefill on wgpu (the chunked and the token-loop kernels) against the f64 oracle on fresh
//! random inputs, with the CPU's tolerances (o within 2e-3, bf16 rounding; final states within 1e-4): odd lengths around the
//! chunk size, varlen with length-1 sequences, GQA ratios, K != V and odd head dims, extreme
//! gates, every input dtype. Shapes stay modest: CI runs them on lavapipe, a CPU.

mod common;

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::prefill::check::{prefill_suite, reset_gates_case};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
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
fn the_prefill_suite_against_the_oracle() {
    let Some(wgpu) = common::device("prefill suite") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    for case in prefill_suite() {
        check(wgpu, &case.name, &case.spec, &case.options, case.seed);
    }
    check_case(
        wgpu,
        "huge negative gates",
        &reset_gates_case().unwrap(),
        &options(false),
    );
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
