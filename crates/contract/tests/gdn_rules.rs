//! The GDN contract on its own, without a kernel: the two oracles agree with each other, a gate
//! below the reset threshold resets the state, shape checks read only `TensorMeta` (so they
//! serve device tensors), and shape errors come before value errors.

use deltakv_contract::gdn::decode::oracle::gdn_decode_reference;
use deltakv_contract::gdn::decode::validate::check_decode_shapes;
use deltakv_contract::gdn::gating::RESET_GATE;
use deltakv_contract::gdn::prefill::validate::validate_prefill;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{DecodeInputs, Gating, GdnInputs, GdnOptions};
use deltakv_contract::gdn::{MAX_DECODE_TOKENS, oracle::gdn_reference};
use deltakv_contract::{DType, HostTensor, TensorSpec};

/// Rows `from..to` of the token axis of a `[1, T, ...]` tensor.
fn tokens(t: &HostTensor, from: usize, to: usize) -> HostTensor {
    let row: usize = t.shape()[2..].iter().product();
    let values = t.to_f32_vec("t").unwrap()[from * row..to * row].to_vec();
    let mut shape = t.shape().to_vec();
    shape[1] = to - from;
    HostTensor::from_f32_as(shape, &values, t.dtype()).unwrap()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn decode_oracle_continues_the_prefill_oracle() {
    let (t, split) = (12, 9);
    let mut spec = GdnSpec::new(t, 2, 4, 16, 8);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 3).unwrap();
    let options = GdnOptions {
        scale: Some(0.3),
        use_qk_l2norm: true,
    };
    let whole = gdn_reference(&case.inputs(), &options).unwrap();
    let part = |from: usize, to: usize| {
        (
            tokens(&case.q, from, to),
            tokens(&case.k, from, to),
            tokens(&case.v, from, to),
            tokens(&case.g, from, to),
            tokens(&case.beta, from, to),
        )
    };
    let (q, k, v, g, beta) = part(0, split);
    let head = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        initial_state: case.initial_state.as_ref(),
        cu_seqlens: None,
    };
    let prefix = gdn_reference(&head, &options).unwrap();
    let state: Vec<f32> = prefix.final_state.iter().map(|&x| x as f32).collect();
    let pool = HostTensor::from_f32(vec![1, 4, 16, 8], state).unwrap();
    let (q, k, v, g, beta) = part(split, t);
    let slots = HostTensor::from_i32(vec![1], vec![0]).unwrap();
    let tail = DecodeInputs {
        q: &q,
        k: &k,
        v: &v,
        gating: Gating::Direct { g: &g, beta: &beta },
        slot_indices: &slots,
    };
    let decoded = gdn_decode_reference(&tail, &pool, &options).unwrap();
    let row = 4 * 8;
    // The pool went through f32 once, so agreement is to f32 rounding, not bit for bit.
    assert!(max_abs_diff(&decoded.o, &whole.o[split * row..]) < 1e-5);
    assert!(max_abs_diff(&decoded.state_pool, &whole.final_state) < 1e-5);
    let last = &decoded.intermediate_states[(t - split - 1) * 4 * 16 * 8..];
    assert!(max_abs_diff(last, &whole.final_state) < 1e-5);
}

#[test]
fn a_gate_below_the_reset_threshold_resets_the_state() {
    let (t, reset_at) = (8, 3);
    let mut spec = GdnSpec::new(t, 1, 2, 16, 16);
    spec.with_initial_state = true;
    let mut case = GdnCase::random(&spec, 5).unwrap();
    let mut g = case.g.to_f32_vec("g").unwrap();
    g[reset_at * 2..][..2].fill(RESET_GATE - 20.0);
    case.g = HostTensor::from_f32(vec![1, t, 2], g).unwrap();
    let options = GdnOptions::default();
    let whole = gdn_reference(&case.inputs(), &options).unwrap();
    // From the reset on, the sequence is the same as one that starts there from zeros.
    let (q, k, v) = (
        tokens(&case.q, reset_at, t),
        tokens(&case.k, reset_at, t),
        tokens(&case.v, reset_at, t),
    );
    let (g, beta) = (
        tokens(&case.g, reset_at, t),
        tokens(&case.beta, reset_at, t),
    );
    let fresh = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        initial_state: None,
        cu_seqlens: None,
    };
    let restarted = gdn_reference(&fresh, &options).unwrap();
    assert!(max_abs_diff(&whole.o[reset_at * 2 * 16..], &restarted.o) < 1e-12);
    assert!(max_abs_diff(&whole.final_state, &restarted.final_state) < 1e-12);
}

#[test]
fn decode_shapes_are_checked_from_metadata_alone() {
    let (b, t, hg, h, kd, vd, slots) = (3, 2, 2, 4, 32, 16, 5);
    let q = TensorSpec(vec![b, t, hg, kd], DType::BF16);
    let v = TensorSpec(vec![b, t, h, vd], DType::BF16);
    let gate = TensorSpec(vec![b, t, h], DType::F32);
    let pool = TensorSpec(vec![slots, h, kd, vd], DType::F32);
    let indices = TensorSpec(vec![b], DType::I64);
    let inputs = DecodeInputs {
        q: &q,
        k: &q,
        v: &v,
        gating: Gating::Direct {
            g: &gate,
            beta: &gate,
        },
        slot_indices: &indices,
    };
    let shapes = check_decode_shapes(&inputs, &pool).unwrap();
    assert_eq!(
        (shapes.dims.batch, shapes.dims.tokens, shapes.slots),
        (b, t, slots)
    );
    assert_eq!(shapes.dims.key_head_of(3), 1);

    let bf16_pool = TensorSpec(vec![slots, h, kd, vd], DType::F16);
    let err = check_decode_shapes(&inputs, &bf16_pool).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `state_pool` has dtype f16, expected f32 or bf16"
    );
    let long = TensorSpec(vec![b, MAX_DECODE_TOKENS + 1, hg, kd], DType::BF16);
    let err = check_decode_shapes(&DecodeInputs { q: &long, ..inputs }, &pool).unwrap_err();
    assert!(
        err.to_string().contains("at most 16 tokens per row"),
        "{err}"
    );
}

#[test]
fn prefill_shape_errors_come_before_value_errors() {
    let case = GdnCase::random(&GdnSpec::new(4, 1, 1, 8, 8), 1).unwrap();
    let mut q = case.q.to_f32_vec("q").unwrap();
    q[3] = f32::NAN;
    let nan_q = HostTensor::from_f32_as(case.q.shape().to_vec(), &q, case.q.dtype()).unwrap();
    let short_k = tokens(&case.k, 0, 3);
    let inputs = GdnInputs {
        q: &nan_q,
        k: &short_k,
        ..case.inputs()
    };
    let err = validate_prefill(&inputs, &GdnOptions::default()).unwrap_err();
    assert!(
        err.to_string().starts_with("tensor `k`: expected shape"),
        "{err}"
    );
    let inputs = GdnInputs {
        q: &nan_q,
        ..case.inputs()
    };
    let err = validate_prefill(&inputs, &GdnOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `q` holds a non-finite value (NaN) at flat index 3"
    );
}
