//! Inputs that are finite but push an op past f32's range, and caller indices out of range:
//! each gives an `Err` that names what is wrong, never a NaN-filled or silently wrong result
//! and never a panic.

use deltakv_contract::HostTensor;
use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{DecodeOptions, GdnOptions, PrefillMode};
use deltakv_contract::kv::{KvInputs, KvMode, KvScheme, NormDType};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::rng::Rng;
use deltakv_cpu::gdn::{gdn_decode, gdn_prefill};
use deltakv_cpu::kv::{DenseKvCache, KvCache, KvOptions, kv_attention};

fn set_value(t: &HostTensor, flat: usize, value: f32) -> HostTensor {
    let mut values = t.to_f32_vec("x").unwrap();
    values[flat] = value;
    HostTensor::from_f32_as(t.shape().to_vec(), &values, t.dtype()).unwrap()
}

fn fill(t: &HostTensor, value: f32) -> HostTensor {
    HostTensor::from_f32_as(t.shape().to_vec(), &vec![value; t.len()], t.dtype()).unwrap()
}

#[test]
fn prefill_refuses_a_positive_log_decay_naming_its_position() {
    // B = 1, T = 10, H = 4: flat index 5 * 4 + 3 is token 5, head 3.
    let mut case = GdnCase::random(&GdnSpec::new(10, 2, 4, 32, 32), 1).unwrap();
    case.g = set_value(&case.g, 5 * 4 + 3, 80.0);
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let err = gdn_prefill(&case.inputs(), &GdnOptions::default(), mode).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `g` holds a positive log decay (80) at [b, t, h] = [0, 5, 3]: g must be <= 0 (the state is multiplied by exp(g) at every token, so g > 0 grows it without bound)"
        );
    }
    // g = 0 (no decay) stays accepted.
    case.g = fill(&case.g, 0.0);
    gdn_prefill(&case.inputs(), &GdnOptions::default(), PrefillMode::Chunk).unwrap();
}

#[test]
fn prefill_that_overflows_f32_is_an_error_not_nan() {
    let mut spec = GdnSpec::new(70, 2, 4, 32, 32);
    spec.dtype = deltakv_contract::DType::F32;
    let mut case = GdnCase::random(&spec, 2).unwrap();
    case.beta = fill(&case.beta, 1e30);
    case.v = fill(&case.v, 1e30);
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let err = gdn_prefill(&case.inputs(), &GdnOptions::default(), mode)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("the result `o` holds a non-finite value ("),
            "{mode:?}: {err}"
        );
        assert!(
            err.contains("at [b, t, h, v] = [0, 0, 0, 0] although every input was finite: an intermediate overflowed f32 (v, beta, k or the initial state too large"),
            "{mode:?}: {err}"
        );
    }
}

fn replace_gate(case: &mut DecodeCase, name: &str, tensor: HostTensor) {
    let slot = case.gates.iter_mut().find(|(n, _)| n == name).unwrap();
    slot.1 = tensor;
}

#[test]
fn decode_refuses_a_positive_log_decay_before_touching_the_pool() {
    let mut case = DecodeCase::random(&DecodeSpec::new(2, 3, 2, 4, 32, 32), 3).unwrap();
    let g = set_value(case.gate("g").unwrap(), (3 + 2) * 4 + 1, 0.5);
    replace_gate(&mut case, "g", g);
    let mut pool = case.state_pool.clone();
    let err = gdn_decode(
        &case.inputs().unwrap(),
        &mut pool,
        &DecodeOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("tensor `g` holds a positive log decay (0.5) at [b, t, h] = [1, 2, 1]"),
        "{err}"
    );
    assert_eq!(pool, case.state_pool);
}

#[test]
fn decode_that_overflows_f32_is_an_error_not_nan() {
    let mut case = DecodeCase::random(&DecodeSpec::new(2, 2, 2, 4, 32, 32), 4).unwrap();
    let beta = fill(case.gate("beta").unwrap(), 1e30);
    replace_gate(&mut case, "beta", beta);
    case.v = fill(&case.v, 1e30);
    let mut pool = case.state_pool.clone();
    let err = gdn_decode(
        &case.inputs().unwrap(),
        &mut pool,
        &DecodeOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("the result `o` holds a non-finite value ("),
        "{err}"
    );
    assert!(err.contains("although every input was finite"), "{err}");
}

/// B = 1, T = 64, Tq = 1, Hq = 4, Hkv = 2, d = 128; key `hot` carries one channel at 3e19 and
/// the query's channel 0 is positive, so that key takes all the attention in exact arithmetic.
fn overflowing_keys(hot: usize) -> (HostTensor, HostTensor, HostTensor) {
    let (t, hq, hkv, d) = (64, 4, 2, 128);
    let mut rng = Rng::new(9);
    let mut q = rng.normal_vec(hq * d, 1.0);
    for head in 0..hq {
        q[head * d] = 1.0;
    }
    let mut k = rng.normal_vec(t * hkv * d, 1.0);
    for head in 0..hkv {
        k[(hot * hkv + head) * d] = 3e19;
    }
    let v = rng.normal_vec(t * hkv * d, 1.0);
    (
        HostTensor::from_f32(vec![1, 1, hq, d], q).unwrap(),
        HostTensor::from_f32(vec![1, t, hkv, d], k).unwrap(),
        HostTensor::from_f32(vec![1, t, hkv, d], v).unwrap(),
    )
}

#[test]
fn compressed_attention_over_keys_whose_square_overflows_f32_is_right() {
    let (q, k, v) = overflowing_keys(17);
    let inputs = KvInputs {
        q: &q,
        k: &k,
        v: &v,
        seq_lens: None,
        scale: None,
    };
    let exact = KvOptions {
        mode: KvMode::Exact,
        ..KvOptions::default()
    };
    let exact_o = kv_attention(&inputs, &exact).unwrap().o;
    let reference: Vec<f64> = exact_o
        .as_f32()
        .unwrap()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    for (bits_v, limit) in [(8, 0.02), (2, 0.5)] {
        let options = KvOptions {
            mode: KvMode::Compressed { bits_k: 4, bits_v },
            ..KvOptions::default()
        };
        let o = kv_attention(&inputs, &options).unwrap().o;
        let err = rel_rms(o.as_f32().unwrap(), &reference);
        // The hot key takes all the weight, so the error is the value codec's own.
        assert!(
            err < limit,
            "4/{bits_v} bits: rel_rms {err:.4} against exact"
        );
    }
}

#[test]
fn f16_norms_refuse_a_vector_beyond_their_range_and_keep_the_cache() {
    let (heads, d) = (2, 64);
    let mut scheme = KvScheme::new(d, heads, 4, 2);
    scheme.norm_dtype = NormDType::F16;
    let mut cache = KvCache::new(scheme, 1).unwrap();
    let good = vec![0.5f32; 3 * heads * d];
    cache.append(0, &good, &good).unwrap();
    let mut big = vec![0.5f32; 2 * heads * d];
    big[(heads + 1) * d + 3] = 1e5; // token 1, head 1
    let err = cache.append(0, &big, &good[..2 * heads * d]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `k`: the vector at token 1, head 1 has a norm beyond the f16 norm storage (at most 65504); use f32 norms"
    );
    assert_eq!(cache.seq_len(0).unwrap(), 3);
    assert_eq!(cache.bytes(), 3 * heads * scheme.bytes_per_token_head());
    cache.append(0, &good, &good).unwrap();
    assert_eq!(cache.seq_len(0).unwrap(), 6);
}

#[test]
fn cache_accessors_refuse_indices_out_of_range() {
    let (heads, d) = (2, 64);
    let mut cache = KvCache::new(KvScheme::new(d, heads, 4, 2), 2).unwrap();
    let x = vec![0.25f32; 3 * heads * d];
    cache.append(1, &x, &x).unwrap();
    assert_eq!(cache.decode_key(1, 1, 2).unwrap().len(), d);
    let cases = [
        (
            cache.decode_key(2, 0, 0).unwrap_err(),
            "sequence 2 is out of range (batch 2)",
        ),
        (
            cache.decode_value(1, 2, 0).unwrap_err(),
            "KV head 2 is out of range (kv_heads 2)",
        ),
        (
            cache.decode_key(1, 0, 3).unwrap_err(),
            "token 3 is out of range (sequence 1 holds 3 tokens)",
        ),
        (
            cache.decode_value(0, 0, 0).unwrap_err(),
            "token 0 is out of range (sequence 0 holds 0 tokens)",
        ),
        (
            cache.seq_len(5).unwrap_err(),
            "sequence 5 is out of range (batch 2)",
        ),
        (
            cache.head(0, 9).unwrap_err(),
            "KV head 9 is out of range (kv_heads 2)",
        ),
    ];
    for (err, expected) in cases {
        assert_eq!(err.to_string(), expected);
    }
    let dense = DenseKvCache::new(d, heads, 1).unwrap();
    assert_eq!(
        dense.head(1, 0).unwrap_err().to_string(),
        "sequence 1 is out of range (batch 1)"
    );
    assert_eq!(dense.seq_len(0).unwrap(), 0);
}
