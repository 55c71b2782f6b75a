//! The workgroup-memory path of the shaders (adapters without subgroup operations), forced with
//! `DELTAKV_WGPU_SUBGROUPS=0` on whatever adapter is present: the contract's decode suite (the
//! default kernels: the bands kernel, and the column-pair one where V is not a multiple of 4)
//! and prefill cases at odd shapes against the f64 oracles, and the compressed-KV attention
//! (its tile maxima by one workgroup atomic per thread) against the CPU path. Its own test
//! binary, so the variable is set before the process opens the device.

mod common;

use deltakv_contract::gdn::decode::check::{BackendRun, decode_suite, run_decode_check};
use deltakv_contract::gdn::decode::random::DecodeCase;
use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, GdnOptions, PrefillMode};
use deltakv_contract::kv::case::PagedCase;
use deltakv_contract::kv::{KvScheme, PagedLayout};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{HostTensor, Result};
use deltakv_cpu::kv::{AttnOptions, PagedKvCache, attend_paged};
use deltakv_wgpu::WgpuTensor;
use deltakv_wgpu::gdn::gdn_decode_host;
use deltakv_wgpu::gdn::gdn_prefill;
use deltakv_wgpu::kv::{WgpuPagedKvCache, attend};
use deltakv_wgpu::runtime::SUBGROUPS_ENV;

#[test]
fn decode_and_prefill_without_subgroups() {
    // SAFETY: the only test of this binary sets the variable before any thread reads it.
    unsafe { std::env::set_var(SUBGROUPS_ENV, "0") };
    let Some(wgpu) = common::device("workgroup-memory path") else {
        return;
    };
    assert!(!wgpu.has_subgroups(), "{SUBGROUPS_ENV}=0 left subgroups on");
    println!("device: {}", wgpu.describe());
    let backend = |case: &DecodeCase, opts: &DecodeOptions| -> Result<BackendRun> {
        let mut pool: HostTensor = case.state_pool.clone();
        let inputs: DecodeInputs<'_> = case.inputs()?;
        let output: DecodeOutput = gdn_decode_host(wgpu, &inputs, &mut pool, opts)?;
        Ok(BackendRun { output, pool })
    };
    let mut worst = [0f64; 3];
    for case in decode_suite() {
        let e = run_decode_check(&case, &backend).unwrap_or_else(|e| panic!("{e}"));
        for (w, x) in worst.iter_mut().zip([e.o, e.intermediate_states, e.pool]) {
            if x.is_finite() {
                *w = w.max(x);
            }
        }
    }
    println!(
        "decode suite, worst rel_rms: o {:.3e}, intermediate {:.3e}, pool {:.3e}",
        worst[0], worst[1], worst[2]
    );
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };
    for (i, (tokens, heads, kd, vd, lens)) in [
        (65, 2, 64, 64, None),
        (1 + 70 + 1, 3, 37, 31, Some(vec![1, 70, 1])),
        (40, 1, 256, 96, None),
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = GdnSpec::new(tokens, 1, heads, kd, vd);
        spec.seq_lens = lens;
        spec.raw_qk = true;
        spec.with_initial_state = true;
        let case = GdnCase::random(&spec, 500 + i as u64).unwrap();
        let reference = gdn_reference(&case.inputs(), &options).unwrap();
        for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
            let out = gdn_prefill(wgpu, &case.inputs(), &options, mode).unwrap();
            let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
            println!(
                "prefill {mode:?} T={tokens} K={kd} V={vd}: o {o_err:.3e}, final_state {s_err:.3e}"
            );
            assert!(
                o_err < 2e-3 && s_err < 1e-4,
                "{mode:?}: o {o_err:.3e}, state {s_err:.3e}"
            );
        }
    }

    // Compressed-KV attention (the tile maxima without subgroup operations) against the CPU
    // path over the same cache, at lengths around a tile and GQA 4.
    let lens = [1usize, 130, 300];
    let case = PagedCase::new(&lens, 1, 8, 2, 128, 77);
    let layout = PagedLayout::new(KvScheme::new(128, 2, 4, 2), 64).unwrap();
    let max_pages = layout.pages_for(300) + 1;
    let mut gpu =
        WgpuPagedKvCache::new(wgpu, layout, lens.len(), max_pages, 3 * max_pages).unwrap();
    let mut cpu = PagedKvCache::new(layout, lens.len(), max_pages, 3 * max_pages).unwrap();
    let (row, tn) = (2 * 128, 300);
    let mut k = vec![0.0f32; lens.len() * tn * row];
    let mut v = vec![0.0f32; lens.len() * tn * row];
    for (b, &len) in lens.iter().enumerate() {
        k[b * tn * row..][..len * row].copy_from_slice(&case.keys[b]);
        v[b * tn * row..][..len * row].copy_from_slice(&case.values[b]);
        cpu.append(b, &case.keys[b], &case.values[b]).unwrap();
    }
    let up = |x: &[f32]| {
        WgpuTensor::upload(
            wgpu,
            &HostTensor::from_f32(vec![lens.len(), tn, 2, 128], x.to_vec()).unwrap(),
        )
        .unwrap()
    };
    gpu.append(wgpu, &up(&k), &up(&v), &lens).unwrap();
    let q = WgpuTensor::upload(
        wgpu,
        &HostTensor::from_f32(vec![lens.len(), 1, 8, 128], case.q.clone()).unwrap(),
    )
    .unwrap();
    let o = attend(wgpu, &gpu, &q, Some(case.scale))
        .unwrap()
        .download(wgpu)
        .unwrap()
        .to_f32_vec("o")
        .unwrap();
    let on_cpu = attend_paged(&cpu, &case.q, 1, 8, case.scale, &AttnOptions::default()).unwrap();
    let on_cpu: Vec<f64> = on_cpu.iter().map(|&x| f64::from(x)).collect();
    let err = rel_rms(&o, &on_cpu);
    println!("kv attention without subgroups: rel_rms against the CPU {err:.3e}");
    assert!(err < 1e-5, "kv attention: {err:.3e}");
}
