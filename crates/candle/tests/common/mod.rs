//! What the candle tests share: host tensors as candle tensors on a device and back, and the
//! decode suite's backend through the candle op.

// Each test file uses a part of this module.
#![allow(dead_code)]

use candle_core::{Device, Tensor};
use deltakv::gdn::DecodeOptions;
use deltakv::gdn::decode::check::BackendRun;
use deltakv::gdn::decode::random::DecodeCase;
use deltakv::{HostTensor, TensorData};
use deltakv_candle::{Gates, gdn_decode};

/// A host tensor as a candle tensor on `dev` (one copy, test setup only).
pub fn to_candle(t: &HostTensor, dev: &Device) -> Tensor {
    let shape = t.shape().to_vec();
    match t.data() {
        TensorData::F32(v) => Tensor::from_vec(v.clone(), shape, dev),
        TensorData::F16(v) => Tensor::from_vec(v.clone(), shape, dev),
        TensorData::BF16(v) => Tensor::from_vec(v.clone(), shape, dev),
        TensorData::I32(v) => Tensor::from_vec(v.clone(), shape, dev),
        TensorData::I64(v) => Tensor::from_vec(v.clone(), shape, dev),
    }
    .unwrap()
}

/// A candle tensor (any device) as a host tensor.
pub fn to_host(t: &Tensor) -> HostTensor {
    let shape = t.dims().to_vec();
    let flat = t.flatten_all().unwrap();
    let data = match t.dtype() {
        candle_core::DType::F32 => TensorData::F32(flat.to_vec1().unwrap()),
        candle_core::DType::F16 => TensorData::F16(flat.to_vec1().unwrap()),
        candle_core::DType::BF16 => TensorData::BF16(flat.to_vec1().unwrap()),
        other => panic!("unexpected dtype {other:?}"),
    };
    HostTensor::new(shape, data).unwrap()
}

/// The decode suite's backend on `dev`: the case's tensors as candle tensors, the candle op,
/// the results back as host tensors.
pub fn candle_backend(
    dev: &Device,
    case: &DecodeCase,
    options: &DecodeOptions,
) -> deltakv::Result<BackendRun> {
    let pool = to_candle(&case.state_pool, dev);
    let [q, k, v, slots] =
        [&case.q, &case.k, &case.v, &case.slot_indices].map(|t| to_candle(t, dev));
    let gate = |name: &str| case.gate(name).map(|t| to_candle(t, dev));
    let (g, beta, a, b, a_log, dt_bias) = (
        gate("g"),
        gate("beta"),
        gate("a"),
        gate("b"),
        gate("A_log"),
        gate("dt_bias"),
    );
    let gates = match (&g, &beta, &a, &b, &a_log, &dt_bias) {
        (Some(g), Some(beta), ..) => Gates::Direct { g, beta },
        (_, _, Some(a), Some(b), Some(a_log), Some(dt_bias)) => Gates::Fused {
            a,
            b,
            a_log,
            dt_bias,
        },
        _ => panic!("case without gates"),
    };
    let (o, states) = gdn_decode(&q, &k, &v, gates, &slots, &pool, options)
        .map_err(|e| deltakv::Error::InvalidValue(e.to_string()))?;
    Ok(BackendRun {
        output: deltakv::gdn::DecodeOutput {
            o: to_host(&o),
            intermediate_states: states.as_ref().map(to_host),
        },
        pool: to_host(&pool),
    })
}

/// Relative RMS error of `x` against `reference`, in f64.
pub fn tensor_rel_rms(x: &Tensor, reference: &Tensor) -> f64 {
    let x = x.to_dtype(candle_core::DType::F64).unwrap();
    let r = reference.to_dtype(candle_core::DType::F64).unwrap();
    let diff: f64 = (x - &r)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    let norm: f64 = r.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
    (diff / norm).sqrt()
}
