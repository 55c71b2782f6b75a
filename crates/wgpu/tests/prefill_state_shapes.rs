//! The chunked prefill's state pass in every shape a [`StatePlan`] selects (column tiles of 16
//! or 32; 8, 16 or 32 row groups; the staged kernel or the general one), not only the
//! default one, against the f64 oracle: K = 128 (one 4-row block per thread at 32 groups) and
//! K = 64 / V = 96 (row groups past K, a partial column tile), with initial states, l2 norm and
//! odd lengths. Likewise both prepare kernels (staged rows for 16-bit inputs, and the general
//! one) at bf16 and f16, varlen with a length-1 sequence, GQA and K != V.

mod common;

use deltakv_contract::DType;
use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_wgpu::gdn::{PrepareKernel, StateKernel, StatePlan, gdn_prefill_planned};

#[test]
fn every_state_tile_and_row_group_count_against_the_oracle() {
    let Some(wgpu) = common::device("state pass shapes") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };
    let cases: Vec<(GdnSpec, u64)> = [(130, 2, 128, 128, 900), (65, 1, 64, 96, 901)]
        .into_iter()
        .map(|(tokens, heads, kd, vd, seed)| {
            let mut spec = GdnSpec::new(tokens, 1, heads, kd, vd);
            spec.raw_qk = true;
            spec.with_initial_state = true;
            (spec, seed)
        })
        .collect();
    let mut worst = [0f64; 2];
    // The tile left to the launcher with 32 row groups asked for: 16-column tiles.
    let plans = [
        (Some(16), 8, StateKernel::Auto),
        (Some(16), 16, StateKernel::Auto),
        (Some(16), 32, StateKernel::General),
        (Some(16), 32, StateKernel::Staged),
        (None, 32, StateKernel::Staged),
        (Some(32), 8, StateKernel::Auto),
        (Some(32), 16, StateKernel::Auto),
    ];
    for (tile, groups, kernel) in plans {
        let plan = StatePlan {
            tile,
            row_groups: Some(groups),
            kernel,
            ..StatePlan::default()
        };
        for (spec, seed) in &cases {
            let case = GdnCase::random(spec, *seed).unwrap();
            let reference = gdn_reference(&case.inputs(), &options).unwrap();
            let out =
                gdn_prefill_planned(wgpu, &case.inputs(), &options, PrefillMode::Chunk, &plan)
                    .unwrap_or_else(|e| panic!("tile {tile:?}, {groups} groups: {e}"));
            let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
            println!(
                "tile {tile:?}, {groups} row groups, kernel {kernel:?}, T={} K={} V={}: o {o_err:.3e}, final_state {s_err:.3e}",
                spec.tokens, spec.key_dim, spec.value_dim
            );
            assert!(
                o_err < 2e-3 && s_err < 1e-4,
                "tile {tile:?}, {groups} groups, K={}: o {o_err:.3e}, state {s_err:.3e}",
                spec.key_dim
            );
            worst = [worst[0].max(o_err), worst[1].max(s_err)];
        }
    }
    let bad = StatePlan {
        tile: Some(32),
        row_groups: Some(32),
        kernel: StateKernel::Auto,
        ..StatePlan::default()
    };
    assert!(
        bad.check().is_err(),
        "32 row groups with 32-column tiles accepted"
    );
    // The staged kernel asked for a shape it does not take: an error, nothing run.
    let wrong_shape = StatePlan {
        tile: Some(32),
        row_groups: Some(16),
        kernel: StateKernel::Staged,
        ..StatePlan::default()
    };
    let case = GdnCase::random(&cases[0].0, 7).unwrap();
    let refused = gdn_prefill_planned(
        wgpu,
        &case.inputs(),
        &options,
        PrefillMode::Chunk,
        &wrong_shape,
    );
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("16-column tiles")),
        "{:?}",
        refused.map(|_| ())
    );
    println!(
        "worst rel_rms: o {:.3e}, final_state {:.3e}",
        worst[0], worst[1]
    );
}

#[test]
fn both_prepare_kernels_against_the_oracle() {
    let Some(wgpu) = common::device("prepare kernels") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };
    let spec = |tokens, key_heads, value_heads, kd, vd, dtype, lens: Option<Vec<usize>>| {
        let mut spec = GdnSpec::new(tokens, key_heads, value_heads, kd, vd);
        spec.dtype = dtype;
        spec.raw_qk = true;
        spec.with_initial_state = true;
        spec.seq_lens = lens;
        spec
    };
    let cases = [
        (spec(130, 1, 2, 128, 128, DType::BF16, None), 910),
        (spec(97, 2, 4, 64, 96, DType::F16, None), 911),
        (
            spec(100, 1, 2, 128, 62, DType::BF16, Some(vec![1, 33, 66])),
            912,
        ),
        (spec(63, 1, 1, 126, 128, DType::BF16, None), 913),
    ];
    let mut worst = [0f64; 2];
    for (spec, seed) in cases {
        let (tokens, key_heads, value_heads) = (spec.tokens, spec.key_heads, spec.value_heads);
        let (kd, vd, dtype) = (spec.key_dim, spec.value_dim, spec.dtype);
        let case = GdnCase::random(&spec, seed).unwrap();
        let reference = gdn_reference(&case.inputs(), &options).unwrap();
        let mut results: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
        for prepare in [PrepareKernel::Staged, PrepareKernel::General] {
            let plan = StatePlan {
                prepare,
                ..StatePlan::default()
            };
            let out =
                gdn_prefill_planned(wgpu, &case.inputs(), &options, PrefillMode::Chunk, &plan)
                    .unwrap_or_else(|e| panic!("{prepare:?}, K={kd} V={vd}: {e}"));
            let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
            println!(
                "prepare {prepare:?}, {dtype:?}, T={tokens} Hg={key_heads} H={value_heads} K={kd} V={vd}: o {o_err:.3e}, final_state {s_err:.3e}"
            );
            assert!(
                o_err < 2e-3 && s_err < 1e-4,
                "prepare {prepare:?}, K={kd} V={vd}: o {o_err:.3e}, state {s_err:.3e}"
            );
            worst = [worst[0].max(o_err), worst[1].max(s_err)];
            results.push((
                out.o.to_f32_vec("o").unwrap(),
                out.final_state.as_f32().unwrap().to_vec(),
            ));
        }
        // The two kernels sum in the same order: their results agree to f32 rounding.
        let o_apart = rel_rms(
            &results[0].0,
            &results[1]
                .0
                .iter()
                .map(|&x| f64::from(x))
                .collect::<Vec<_>>(),
        );
        let s_apart = rel_rms(
            &results[0].1,
            &results[1]
                .1
                .iter()
                .map(|&x| f64::from(x))
                .collect::<Vec<_>>(),
        );
        println!("staged against general: o {o_apart:.3e}, final_state {s_apart:.3e}");
        assert!(
            o_apart < 1e-5 && s_apart < 1e-6,
            "K={kd} V={vd}: the prepare kernels differ: o {o_apart:.3e}, state {s_apart:.3e}"
        );
    }
    // The staged kernel asked for inputs it does not take (f32): an error, nothing run.
    let mut spec = GdnSpec::new(40, 1, 1, 64, 64);
    spec.dtype = DType::F32;
    let case = GdnCase::random(&spec, 914).unwrap();
    let plan = StatePlan {
        prepare: PrepareKernel::Staged,
        ..StatePlan::default()
    };
    let refused = gdn_prefill_planned(wgpu, &case.inputs(), &options, PrefillMode::Chunk, &plan);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("staged prepare")),
        "{:?}",
        refused.map(|_| ())
    );
    println!(
        "worst rel_rms: o {:.3e}, final_state {:.3e}",
        worst[0], worst[1]
    );
}
