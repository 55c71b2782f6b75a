//! The chunked prefill's state pass in every shape a [`StatePlan`] selects (column tiles of 16
//! or 32; 8, 16 or 32 row groups; the staged kernel or the general one), not only the
//! default one, against the f64 oracle: K = 128 (one 4-row block per thread at 32 groups) and
//! K = 64 / V = 96 (row groups past K, a partial column tile), with initial states, l2 norm and
//! odd lengths. Likewise both prepare kernels (staged rows for 16-bit inputs, and the general
//! one) at bf16 and f16, varlen with a length-1 sequence, GQA and K != V. And sequences split
//! into segments (the two-level scan) with either state kernel, against the oracle and against
//! the same call walked whole.

mod common;

use deltakv_contract::DType;
use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_wgpu::Wgpu;
use deltakv_wgpu::gdn::{
    PrepareKernel, PreparedPrefill, StateKernel, StatePlan, gdn_prefill_planned,
};

const OPTIONS: GdnOptions = GdnOptions {
    scale: None,
    use_qk_l2norm: true,
};

/// One planned prefill of `case` against the f64 oracle (o within 2e-3, the final state within
/// 1e-4), printed under `label`; returns o and the final state, and folds the errors into
/// `worst`.
fn checked_run(
    wgpu: &Wgpu,
    case: &GdnCase,
    plan: &StatePlan,
    label: &str,
    worst: &mut [f64; 2],
) -> (Vec<f32>, Vec<f32>) {
    let reference = gdn_reference(&case.inputs(), &OPTIONS).unwrap();
    let out = gdn_prefill_planned(wgpu, &case.inputs(), &OPTIONS, PrefillMode::Chunk, plan)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let o = out.o.to_f32_vec("o").unwrap();
    let state = out.final_state.as_f32().unwrap().to_vec();
    let o_err = rel_rms(&o, &reference.o);
    let s_err = rel_rms(&state, &reference.final_state);
    println!("{label}: o {o_err:.3e}, final_state {s_err:.3e}");
    assert!(
        o_err < 2e-3 && s_err < 1e-4,
        "{label}: o {o_err:.3e}, state {s_err:.3e}"
    );
    *worst = [worst[0].max(o_err), worst[1].max(s_err)];
    (o, state)
}

/// A problem of `tokens` tokens (`lens`: varlen sequence lengths), raw q and k (the kernels
/// normalise them) and initial states.
fn spec(
    tokens: usize,
    key_heads: usize,
    value_heads: usize,
    kd: usize,
    vd: usize,
    dtype: DType,
    lens: Option<Vec<usize>>,
) -> GdnSpec {
    let mut spec = GdnSpec::new(tokens, key_heads, value_heads, kd, vd);
    spec.dtype = dtype;
    spec.raw_qk = true;
    spec.with_initial_state = true;
    spec.seq_lens = lens;
    spec
}

/// A plan the launcher must refuse for `case`, before anything runs, with `reason` in its error.
fn assert_refused(wgpu: &Wgpu, case: &GdnCase, plan: &StatePlan, reason: &str) {
    let refused = gdn_prefill_planned(wgpu, &case.inputs(), &OPTIONS, PrefillMode::Chunk, plan);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains(reason)),
        "{:?}",
        refused.map(|_| ())
    );
}

#[test]
fn every_state_tile_and_row_group_count_against_the_oracle() {
    let Some(wgpu) = common::device("state pass shapes") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let cases: Vec<GdnCase> = [(130, 2, 128, 128, 900), (65, 1, 64, 96, 901)]
        .into_iter()
        .map(|(tokens, heads, kd, vd, seed)| {
            let mut spec = GdnSpec::new(tokens, 1, heads, kd, vd);
            spec.raw_qk = true;
            spec.with_initial_state = true;
            GdnCase::random(&spec, seed).unwrap()
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
        for case in &cases {
            let (t, kd, vd) = (case.q.shape()[1], case.q.shape()[3], case.v.shape()[3]);
            let label = format!(
                "tile {tile:?}, {groups} row groups, kernel {kernel:?}, T={t} K={kd} V={vd}"
            );
            checked_run(wgpu, case, &plan, &label, &mut worst);
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
    assert_refused(wgpu, &cases[0], &wrong_shape, "16-column tiles");
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
        let case = GdnCase::random(&spec, seed).unwrap();
        let run = |prepare: PrepareKernel, worst: &mut [f64; 2]| {
            let plan = StatePlan {
                prepare,
                ..StatePlan::default()
            };
            let label = format!(
                "prepare {prepare:?}, {:?}, T={} Hg={} H={} K={} V={}",
                spec.dtype,
                spec.tokens,
                spec.key_heads,
                spec.value_heads,
                spec.key_dim,
                spec.value_dim
            );
            checked_run(wgpu, &case, &plan, &label, worst)
        };
        let staged = run(PrepareKernel::Staged, &mut worst);
        let general = run(PrepareKernel::General, &mut worst);
        // The two kernels sum in the same order: their results agree to f32 rounding.
        let widened = |x: &[f32]| x.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let o_apart = rel_rms(&staged.0, &widened(&general.0));
        let s_apart = rel_rms(&staged.1, &widened(&general.1));
        println!("staged against general: o {o_apart:.3e}, final_state {s_apart:.3e}");
        assert!(
            o_apart < 1e-5 && s_apart < 1e-6,
            "K={} V={}: the prepare kernels differ: o {o_apart:.3e}, state {s_apart:.3e}",
            spec.key_dim,
            spec.value_dim
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
    assert_refused(wgpu, &case, &plan, "staged prepare");
    println!(
        "worst rel_rms: o {:.3e}, final_state {:.3e}",
        worst[0], worst[1]
    );
}

#[test]
fn segmented_walks_against_the_oracle_and_the_whole_walk() {
    let Some(wgpu) = common::device("segmented state pass") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    // Slow decay (gates of -0.014 .. -0.0002 per token), so that a segment's entry state still
    // weighs on its outputs hundreds of tokens on, beside the generator's usual gates.
    let slow = |mut spec: GdnSpec| {
        spec.gate_scale = 0.02;
        spec
    };
    // Long sequences beside short ones (a length-1 sequence, one of exactly one chunk), GQA,
    // K != V with partial column tiles (V = 80: the identity columns start at 80 with 16-column
    // tiles, at 96 with 32), f32 and 16-bit inputs.
    let cases = [
        (slow(spec(1000, 1, 2, 128, 128, DType::BF16, None)), 920),
        (
            slow(spec(
                400,
                2,
                4,
                64,
                80,
                DType::F32,
                Some(vec![1, 300, 32, 67]),
            )),
            921,
        ),
        (slow(spec(263, 1, 1, 128, 62, DType::F16, None)), 922),
    ];
    let mut worst = [0f64; 2];
    for (spec, seed) in cases {
        let case = GdnCase::random(&spec, seed).unwrap();
        let label = |what: &str| {
            format!(
                "{what}, {:?}, T={} Hg={} H={} K={} V={} lens {:?}",
                spec.dtype,
                spec.tokens,
                spec.key_heads,
                spec.value_heads,
                spec.key_dim,
                spec.value_dim,
                spec.seq_lens
            )
        };
        let whole = checked_run(
            wgpu,
            &case,
            &StatePlan::default(),
            &label("whole"),
            &mut worst,
        );
        // Segments of 1, 3 and 7 chunks, with the launcher's kernel (the staged one, 16-column
        // tiles here), the general one, and 32-column tiles (V past a tile's end).
        for (segment_chunks, kernel, tile) in [
            (1, StateKernel::Auto, None),
            (3, StateKernel::Auto, None),
            (7, StateKernel::Auto, None),
            (3, StateKernel::General, None),
            (3, StateKernel::Auto, Some(32)),
        ] {
            let plan = StatePlan {
                segment_chunks: Some(segment_chunks),
                kernel,
                tile,
                ..StatePlan::default()
            };
            let what =
                format!("segments of {segment_chunks} chunks, kernel {kernel:?}, tile {tile:?}");
            // The launch really walks the segments: one unit per segment.
            let lens = spec.seq_lens.clone().unwrap_or(vec![spec.tokens]);
            let expected: usize = lens
                .iter()
                .map(|&len| len.div_ceil(32).div_ceil(segment_chunks).max(1))
                .sum();
            let prepared =
                PreparedPrefill::planned(wgpu, &case.inputs(), &OPTIONS, PrefillMode::Chunk, &plan)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(prepared.walk_units(), Some(expected), "{what}");
            let split = checked_run(wgpu, &case, &plan, &label(&what), &mut worst);
            // The same sums in another order (the entry states through M S + D): f32 rounding.
            let widened = |x: &[f32]| x.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let o_apart = rel_rms(&split.0, &widened(&whole.0));
            let s_apart = rel_rms(&split.1, &widened(&whole.1));
            println!("  against the whole walk: o {o_apart:.3e}, final_state {s_apart:.3e}");
            assert!(
                o_apart < 1e-3 && s_apart < 1e-5,
                "{what}: apart from the whole walk: o {o_apart:.3e}, state {s_apart:.3e}"
            );
        }
    }
    let zero = StatePlan {
        segment_chunks: Some(0),
        ..StatePlan::default()
    };
    let case = GdnCase::random(&spec(40, 1, 1, 64, 64, DType::F32, None), 923).unwrap();
    assert_refused(wgpu, &case, &zero, "at least one chunk");
    println!(
        "worst rel_rms: o {:.3e}, final_state {:.3e}",
        worst[0], worst[1]
    );
}
