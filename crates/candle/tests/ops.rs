//! deltakv's candle ops against the contract's f64 oracles: prefill on random cases (T = 1,
//! 63, 65, 1000, varlen, GQA, K != V, f32 and bf16), the whole decode suite that every backend
//! runs (with its tolerances), the pool updated in place, and errors.

mod common;

use candle_core::{Device, Tensor};
use common::{candle_backend, to_host};
use deltakv::gdn::decode::check::{decode_suite, run_decode_check};
use deltakv::gdn::prefill::oracle::gdn_reference;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{DecodeOptions, GdnOptions, PrefillMode};
use deltakv::metrics::rel_rms;
use deltakv::{DType, HostTensor};
use deltakv_candle::{Gates, gdn_decode, gdn_prefill};

fn to_candle(t: &HostTensor) -> Tensor {
    common::to_candle(t, &Device::Cpu)
}

#[test]
fn prefill_matches_the_oracle() {
    // (spec, o bound, state bound): the CPU prefill tests' bounds.
    let mut cases = Vec::new();
    for (tokens, hg, h, k, v) in [(1, 2, 4, 16, 8), (63, 1, 3, 32, 20), (65, 2, 6, 64, 48)] {
        let mut spec = GdnSpec::new(tokens, hg, h, k, v);
        spec.dtype = DType::F32;
        spec.batch = 2;
        cases.push((spec, 1.5e-6, 1e-6));
    }
    let mut varlen = GdnSpec::new(1000, 2, 4, 128, 128);
    varlen.dtype = DType::F32;
    varlen.seq_lens = Some(vec![1, 300, 64, 635]);
    varlen.with_initial_state = true;
    varlen.raw_qk = true;
    cases.push((varlen.clone(), 1.5e-6, 1e-6));
    varlen.dtype = DType::BF16;
    cases.push((varlen, 2e-3, 1e-6));
    for (i, (spec, o_bound, s_bound)) in cases.into_iter().enumerate() {
        let case = GdnCase::random(&spec, 100 + i as u64).unwrap();
        let options = GdnOptions {
            scale: None,
            use_qk_l2norm: spec.raw_qk,
        };
        let reference = gdn_reference(&case.inputs(), &options).unwrap();
        let [q, k, v, g, beta] = [&case.q, &case.k, &case.v, &case.g, &case.beta].map(to_candle);
        let initial = case.initial_state.as_ref().map(to_candle);
        let cu = case.cu_seqlens.as_ref().map(to_candle);
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
            assert_eq!(o.dtype(), v.dtype());
            let o_err = rel_rms(&to_host(&o).to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(
                &to_host(&state).to_f32_vec("s").unwrap(),
                &reference.final_state,
            );
            assert!(o_err < o_bound, "case {i} {mode:?}: o rel_rms {o_err:.3e}");
            assert!(
                s_err < s_bound,
                "case {i} {mode:?}: state rel_rms {s_err:.3e}"
            );
        }
    }
}

#[test]
fn the_decode_suite_through_candle() {
    let suite = decode_suite();
    assert!(suite.len() > 40);
    for check in &suite {
        if let Err(e) = run_decode_check(check, &|case, options| {
            candle_backend(&Device::Cpu, case, options)
        }) {
            panic!("{e}");
        }
    }
}

#[test]
fn decode_writes_the_pool_in_place_and_refuses_bad_calls() {
    let dev = Device::Cpu;
    let (b, h, kd, vd, slots) = (2, 2, 16, 8, 3);
    let q = Tensor::randn(0f32, 1.0, (b, 1, 1, kd), &dev).unwrap();
    let k = Tensor::randn(0f32, 1.0, (b, 1, 1, kd), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (b, 1, h, vd), &dev).unwrap();
    let g = Tensor::full(-0.5f32, (b, 1, h), &dev).unwrap();
    let beta = Tensor::full(0.5f32, (b, 1, h), &dev).unwrap();
    let pool = Tensor::zeros((slots, h, kd, vd), candle_core::DType::F32, &dev).unwrap();
    let address = |t: &Tensor| match &*t.storage_and_layout().0 {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => v.as_ptr() as usize,
        _ => unreachable!(),
    };
    let before = address(&pool);
    let idx = Tensor::new(&[2i64, -1], &dev).unwrap();
    let gates = Gates::Direct { g: &g, beta: &beta };
    let options = DecodeOptions::default();
    let (o, _) = gdn_decode(&q, &k, &v, gates, &idx, &pool, &options).unwrap();
    assert_eq!(address(&pool), before, "the pool's storage was replaced");
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
    let aliased = pool.flatten_all().unwrap().narrow(0, 0, b * h).unwrap();
    let aliased = aliased.reshape((b, 1, h)).unwrap();
    let err = gdn_decode(
        &q,
        &k,
        &v,
        Gates::Direct {
            g: &aliased,
            beta: &beta,
        },
        &idx,
        &pool,
        &options,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("shares storage with `state_pool`"),
        "{err}"
    );
    let err = gdn_prefill(
        &q,
        &k,
        &v,
        &g.abs().unwrap(),
        &beta,
        None,
        None,
        &GdnOptions::default(),
        PrefillMode::Chunk,
    )
    .unwrap_err();
    assert!(err.to_string().contains("positive log decay"), "{err}");
}
