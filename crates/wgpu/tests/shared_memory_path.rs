//! The workgroup-memory path of the shaders (adapters without subgroup operations), forced with
//! `DELTAKV_WGPU_SUBGROUPS=0` on whatever adapter is present: the contract's decode suite (the
//! default kernels: the bands kernel, and the column-pair one where V is not a multiple of 4)
//! and prefill cases at odd shapes against the f64
//! oracles. Its own test binary, so the variable is set before the process opens the device.

mod common;

use deltakv_contract::gdn::decode::check::{BackendRun, decode_suite, run_decode_check};
use deltakv_contract::gdn::decode::random::DecodeCase;
use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{HostTensor, Result};
use deltakv_wgpu::gdn::gdn_decode_host;
use deltakv_wgpu::gdn::gdn_prefill;
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
}
