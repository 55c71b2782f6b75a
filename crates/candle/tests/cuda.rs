//! deltakv's candle ops on candle's CUDA tensors (feature `candle-cuda`), against the contract's f64
//! oracles: prefill at odd shapes (T = 1, 63, 65, 1000, varlen with an initial state, GQA,
//! K != V, f32 and bf16), the whole decode suite, the pool written in place, the Qwen3-Next
//! layer on the GPU against the same layer on the CPU's reference, and errors. A machine
//! without a CUDA GPU prints one "skipped" line per test.
#![cfg(feature = "candle-cuda")]

mod common;

use candle_core::{Device, Tensor};
use common::{candle_backend, tensor_rel_rms, to_candle, to_host};
use deltakv::DType;
use deltakv::gdn::decode::check::{decode_suite, run_decode_check};
use deltakv::gdn::prefill::oracle::gdn_reference;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{DecodeOptions, GdnOptions, PrefillMode};
use deltakv::metrics::rel_rms;
use deltakv_candle::qwen3_next::{GatedDeltaNetLayer, GdnCore, GdnLayerConfig, LayerCache};
use deltakv_candle::{Gates, gdn_decode, gdn_prefill};

/// The CUDA prefill suite's bounds (bf16 products, f32 accumulation and states).
const O_TOLERANCE: f64 = 4.0e-3;
const STATE_TOLERANCE: f64 = 4.0e-3;

/// candle's CUDA device 0, or `None` after one "skipped" line.
fn gpu(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            println!("skipped: {test}: no CUDA device for candle ({e})");
            None
        }
    }
}

/// The address of a CUDA f32 tensor's device memory.
fn device_address(t: &Tensor) -> u64 {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cuda(s) => {
            let slice = s.as_cuda_slice::<f32>().unwrap();
            let stream = s.device.cuda_stream();
            let (address, _guard) = slice.device_ptr(&stream);
            address
        }
        _ => panic!("not a CUDA tensor"),
    }
}

#[test]
fn prefill_on_cuda_tensors_matches_the_oracle() {
    let Some(dev) = gpu("prefill_on_cuda_tensors_matches_the_oracle") else {
        return;
    };
    let mut cases = Vec::new();
    for (tokens, hg, h, k, v) in [(1, 2, 4, 16, 8), (63, 1, 3, 32, 20), (65, 2, 6, 64, 48)] {
        let mut spec = GdnSpec::new(tokens, hg, h, k, v);
        spec.dtype = DType::F32;
        spec.batch = 2;
        spec.with_initial_state = true;
        cases.push(spec);
    }
    let mut varlen = GdnSpec::new(1000, 2, 4, 128, 128);
    varlen.seq_lens = Some(vec![1, 300, 64, 635]);
    varlen.with_initial_state = true;
    varlen.raw_qk = true;
    cases.push(varlen.clone());
    varlen.dtype = DType::F32;
    cases.push(varlen);
    let mut bf16 = GdnSpec::new(1000, 1, 8, 128, 128);
    bf16.raw_qk = true;
    cases.push(bf16);
    for (i, spec) in cases.into_iter().enumerate() {
        let case = GdnCase::random(&spec, 300 + i as u64).unwrap();
        let options = GdnOptions {
            scale: None,
            use_qk_l2norm: spec.raw_qk,
        };
        let reference = gdn_reference(&case.inputs(), &options).unwrap();
        let [q, k, v, g, beta] =
            [&case.q, &case.k, &case.v, &case.g, &case.beta].map(|t| to_candle(t, &dev));
        let initial = case.initial_state.as_ref().map(|t| to_candle(t, &dev));
        let cu = case.cu_seqlens.as_ref().map(|t| to_candle(t, &dev));
        for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
            let (o, state) = gdn_prefill(
                &q,
                &k,
                &v,
                &g,
                &beta,
                initial.as_ref(),
                cu.as_ref(),
                &options,
                mode,
            )
            .unwrap();
            assert!(o.device().is_cuda() && state.device().is_cuda());
            assert_eq!(o.dtype(), v.dtype());
            let o_err = rel_rms(&to_host(&o).to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(
                &to_host(&state).to_f32_vec("s").unwrap(),
                &reference.final_state,
            );
            assert!(
                o_err < O_TOLERANCE,
                "case {i} {mode:?}: o rel_rms {o_err:.3e}"
            );
            assert!(
                s_err < STATE_TOLERANCE,
                "case {i} {mode:?}: state rel_rms {s_err:.3e}"
            );
        }
    }
}

#[test]
fn the_decode_suite_on_cuda_tensors() {
    let Some(dev) = gpu("the_decode_suite_on_cuda_tensors") else {
        return;
    };
    let suite = decode_suite();
    assert!(suite.len() > 40);
    for check in &suite {
        if let Err(e) =
            run_decode_check(check, &|case, options| candle_backend(&dev, case, options))
        {
            panic!("{e}");
        }
    }
}

#[test]
fn decode_on_cuda_writes_the_pool_in_place_and_refuses_bad_calls() {
    let Some(dev) = gpu("decode_on_cuda_writes_the_pool_in_place_and_refuses_bad_calls") else {
        return;
    };
    let (b, h, kd, vd, slots) = (2, 2, 16, 8, 3);
    let q = Tensor::randn(0f32, 1.0, (b, 1, 1, kd), &dev).unwrap();
    let k = Tensor::randn(0f32, 1.0, (b, 1, 1, kd), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (b, 1, h, vd), &dev).unwrap();
    let g = Tensor::full(-0.5f32, (b, 1, h), &dev).unwrap();
    let beta = Tensor::full(0.5f32, (b, 1, h), &dev).unwrap();
    let pool = Tensor::zeros((slots, h, kd, vd), candle_core::DType::F32, &dev).unwrap();
    let before = device_address(&pool);
    let idx = Tensor::new(&[2i64, -1], &dev).unwrap();
    let gates = Gates::Direct { g: &g, beta: &beta };
    let options = DecodeOptions::default();
    let (o, _) = gdn_decode(&q, &k, &v, gates, &idx, &pool, &options).unwrap();
    assert_eq!(
        device_address(&pool),
        before,
        "the pool's memory was replaced"
    );
    let norms: Vec<f32> = pool
        .sqr()
        .unwrap()
        .sum((1, 2, 3))
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(
        norms[2] > 0.0 && norms[0] == 0.0 && norms[1] == 0.0,
        "{norms:?}"
    );
    let o_rows: Vec<f32> = o.abs().unwrap().sum((1, 2, 3)).unwrap().to_vec1().unwrap();
    assert!(o_rows[0] > 0.0 && o_rows[1] == 0.0, "{o_rows:?}");

    let dup = Tensor::new(&[1i64, 1], &dev).unwrap();
    let err = gdn_decode(&q, &k, &v, gates, &dup, &pool, &options).unwrap_err();
    assert!(err.to_string().contains("both address slot 1"), "{err}");
    let out_of_range = Tensor::new(&[0i64, 3], &dev).unwrap();
    let err = gdn_decode(&q, &k, &v, gates, &out_of_range, &pool, &options).unwrap_err();
    assert!(err.to_string().contains("slot"), "{err}");
    // A gate left on the CPU.
    let cpu_g = g.to_device(&Device::Cpu).unwrap();
    let gates = Gates::Direct {
        g: &cpu_g,
        beta: &beta,
    };
    let err = gdn_decode(&q, &k, &v, gates, &idx, &pool, &options).unwrap_err();
    assert!(
        err.to_string()
            .contains("not on the CUDA device of q, k and v"),
        "{err}"
    );
    let err = gdn_prefill(
        &q,
        &k,
        &v,
        &cpu_g,
        &beta,
        None,
        None,
        &GdnOptions::default(),
        PrefillMode::Chunk,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("not on the CUDA device of q, k and v"),
        "{err}"
    );
    // A shape error from the contract's check, as on the CPU.
    let short_v = v.narrow(3, 0, vd - 1).unwrap();
    let err = gdn_decode(
        &q,
        &k,
        &short_v,
        Gates::Direct { g: &g, beta: &beta },
        &idx,
        &pool,
        &options,
    )
    .unwrap_err();
    assert!(!err.to_string().is_empty());
}

#[test]
fn the_qwen3_next_layer_on_cuda_matches_the_cpu_reference() {
    let Some(dev) = gpu("the_qwen3_next_layer_on_cuda_matches_the_cpu_reference") else {
        return;
    };
    let config = GdnLayerConfig {
        hidden: 64,
        key_heads: 2,
        value_heads: 4,
        key_dim: 128,
        value_dim: 128,
        conv_kernel: 4,
        rms_eps: 1e-6,
    };
    let layer = GatedDeltaNetLayer::random(config, 11).unwrap();
    let gpu_layer = layer.to_device(&dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (2, 133, 64), &Device::Cpu).unwrap();
    let slots = [3i64, 1];
    let mut reference = LayerCache::new(&config, &slots, 5).unwrap();
    let mut ours = LayerCache::new_on(&config, &slots, 5, &dev).unwrap();
    let mut outputs = Vec::new();
    let mut expected = Vec::new();
    for (start, len) in [(0, 130), (130, 1), (131, 1), (132, 1)] {
        let chunk = x.narrow(1, start, len).unwrap();
        let y = gpu_layer
            .forward(&chunk.to_device(&dev).unwrap(), &mut ours, GdnCore::Deltakv)
            .unwrap();
        assert!(y.device().is_cuda());
        let y = y.to_device(&Device::Cpu).unwrap();
        let y_ref = layer
            .forward(&chunk, &mut reference, GdnCore::Reference)
            .unwrap();
        let err = tensor_rel_rms(&y, &y_ref);
        assert!(err < 5e-3, "tokens {start}..+{len}: rel_rms {err:.3e}");
        outputs.push(y);
        expected.push(y_ref);
    }
    let pool = ours.state_pool.to_device(&Device::Cpu).unwrap();
    let err = tensor_rel_rms(&pool, &reference.state_pool);
    assert!(err < 5e-3, "pool rel_rms {err:.3e}");
    // One prefill of all 133 tokens on the GPU gives the same outputs.
    let mut whole = LayerCache::new_on(&config, &slots, 5, &dev).unwrap();
    let y_whole = gpu_layer
        .forward(&x.to_device(&dev).unwrap(), &mut whole, GdnCore::Deltakv)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    let stepped = Tensor::cat(&outputs, 1).unwrap();
    let err = tensor_rel_rms(&stepped, &y_whole);
    assert!(
        err < 5e-3,
        "prompt + decode vs one prefill: rel_rms {err:.3e}"
    );
    println!(
        "qwen3-next layer on CUDA: outputs within {:.3e} of the CPU reference",
        tensor_rel_rms(
            &Tensor::cat(&outputs, 1).unwrap(),
            &Tensor::cat(&expected, 1).unwrap()
        )
    );
}
