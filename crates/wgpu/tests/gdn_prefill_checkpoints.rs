//! Prefill state checkpoints and the prefill over a device state pool on wgpu, against the f64
//! oracle run to each checkpoint position: odd lengths, varlen with sequences shorter than,
//! equal to and longer than the spacing, GQA, K != V, initial states, Qwen3-Next-like gates,
//! spacings 64 and 192, with the staged and the general state kernels, whole and in segments; a
//! sequence that ends on a checkpoint gives its final state exactly; a
//! pooled prefill followed by a decode on the device equals the longer prefill; refusals.
//! Shapes stay modest: CI runs them on lavapipe, a CPU.
//!
//! Tolerance: the wgpu prefill computes in f32, so checkpoints and pool states are held to the
//! suite's final-state bound (1e-4), o to its bf16 bound (2e-3).

mod common;

use deltakv_contract::gdn::oracle::{gdn_reference, gdn_reference_checkpointed};
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, worst_checkpoint_error};
use deltakv_contract::gdn::prefill::validate::check_prefill_shapes;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec, token_range};
use deltakv_contract::gdn::{
    DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions, PrefillMode,
};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::rng::Rng;
use deltakv_contract::{DType, HostTensor};
use deltakv_wgpu::gdn::{
    PreparedPrefill, StateKernel, StatePlan, gdn_decode, gdn_prefill_checkpointed,
    gdn_prefill_host_into_pool, gdn_prefill_into_pool,
};
use deltakv_wgpu::{Wgpu, WgpuTensor};

const STATE_TOLERANCE: f64 = 1.0e-4;
const O_TOLERANCE: f64 = 2.0e-3;

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

/// The state pass's shapes a checkpointed call must serve: the launcher's choice (the staged
/// kernel at these shapes), the general kernel at both column tiles, and sequences split into
/// segments of 1 and 3 chunks (each segment's outputs walk storing its own checkpoints).
fn plans() -> Vec<(&'static str, StatePlan)> {
    let general = |tile| StatePlan {
        kernel: StateKernel::General,
        tile: Some(tile),
        row_groups: Some(8),
        ..StatePlan::default()
    };
    let segments = |n| StatePlan {
        segment_chunks: Some(n),
        ..StatePlan::default()
    };
    vec![
        ("default", StatePlan::default()),
        ("general, 16 columns", general(16)),
        ("general, 32 columns", general(32)),
        ("segments of 1 chunk", segments(1)),
        (
            "general, segments of 3",
            StatePlan {
                segment_chunks: Some(3),
                ..general(16)
            },
        ),
    ]
}

/// Checkpoints every `every` tokens against the oracle in every plan of [`plans`]; a
/// checkpoint at a sequence's end must equal its final state exactly, and o and the final
/// states must still be right.
fn check(wgpu: &Wgpu, name: &str, case: &GdnCase, options: &GdnOptions, every: usize) {
    let inputs = case.inputs();
    let heads: Vec<usize> = (0..case.v.shape()[2]).collect();
    let reference = gdn_reference_checkpointed(&inputs, options, &heads, Some(every)).unwrap();
    let seqs = check_prefill_shapes(&inputs, options).unwrap().seqs;
    let plan = CheckpointPlan::new(every, &seqs).unwrap();
    let (h, k, v) = (case.v.shape()[2], case.q.shape()[3], case.v.shape()[3]);
    for (plan_name, state_plan) in plans() {
        let what = format!("{name} every {every} ({plan_name})");
        let prepared = PreparedPrefill::checkpointed(
            wgpu,
            &inputs,
            options,
            PrefillMode::Chunk,
            &state_plan,
            Some(every),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        prepared.submit(wgpu, 1).unwrap();
        let out = prepared
            .outputs(wgpu)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let checkpoints = out.checkpoints.expect("checkpoints were asked for");
        assert_eq!(checkpoints.every, every);
        assert_eq!(checkpoints.states.dtype(), DType::F32);
        assert_eq!(checkpoints.states.shape(), &[plan.total(), h, k, v]);
        let want: Vec<i64> = plan.offsets.iter().map(|&x| x as i64).collect();
        assert_eq!(checkpoints.offsets.to_i64_vec("offsets").unwrap(), want);
        let states = checkpoints.states.as_f32().unwrap();
        let worst = worst_checkpoint_error(states, &reference.checkpoints, plan.total());
        let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
        let finals = out.final_state.as_f32().unwrap();
        let s_err = rel_rms(finals, &reference.final_state);
        eprintln!(
            "{what}: {} checkpoints, worst {worst:.3e}; o {o_err:.3e}, final_state {s_err:.3e}",
            plan.total()
        );
        assert!(worst < STATE_TOLERANCE, "{what}: checkpoint {worst:.3e}");
        assert!(o_err < O_TOLERANCE, "{what}: o {o_err:.3e}");
        assert!(s_err < STATE_TOLERANCE, "{what}: final_state {s_err:.3e}");
        assert_eq!(
            plan.first_end_mismatch(&seqs, states, finals),
            None,
            "{what}: a sequence's end checkpoint is not its final state"
        );
    }
}

#[test]
fn checkpoints_at_odd_lengths_and_spacings_64_and_192() {
    let Some(wgpu) = common::device("checkpoints_at_odd_lengths_and_spacings_64_and_192") else {
        return;
    };
    for (i, tokens) in [1, 63, 64, 65, 192, 450].into_iter().enumerate() {
        let mut spec = GdnSpec::new(tokens, 2, 4, 32, 32);
        spec.batch = 2;
        spec.with_initial_state = true;
        let case = GdnCase::random(&spec, 500 + i as u64).unwrap();
        for every in [64, 192] {
            check(
                wgpu,
                &format!("B=2 T={tokens}"),
                &case,
                &options(false),
                every,
            );
        }
    }
}

#[test]
fn checkpoints_of_varlen_sequences_shorter_equal_and_longer_than_the_spacing() {
    let Some(wgpu) = common::device("checkpoints_of_varlen_sequences") else {
        return;
    };
    let lens = vec![1, 70, 200, 64, 383, 384, 5];
    let mut spec = GdnSpec::new(lens.iter().sum(), 1, 2, 32, 48);
    spec.seq_lens = Some(lens);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 510).unwrap();
    for every in [64, 192] {
        check(wgpu, "varlen init l2", &case, &options(true), every);
    }
}

#[test]
fn checkpoints_with_gqa_unequal_dims_and_model_gates() {
    let Some(wgpu) = common::device("checkpoints_with_gqa_unequal_dims_and_model_gates") else {
        return;
    };
    let mut spec = GdnSpec::new(300, 2, 6, 32, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 520).unwrap();
    check(wgpu, "GQA 3 K=32 V=48", &case, &options(false), 128);

    // Gates as Qwen3-Next computes them (g averages about -6).
    let heads = 4;
    let mut spec = GdnSpec::new(330, 2, heads, 64, 64);
    spec.seq_lens = Some(vec![130, 200]);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let mut case = GdnCase::random(&spec, 521).unwrap();
    case.with_model_gates(522).unwrap();
    check(wgpu, "qwen3-next gates", &case, &options(true), 64);
}

#[test]
fn spacings_off_the_granule_and_other_kernels_are_refused() {
    let Some(wgpu) = common::device("spacings_off_the_granule_and_other_kernels_are_refused")
    else {
        return;
    };
    let case = GdnCase::random(&GdnSpec::new(100, 1, 2, 32, 32), 530).unwrap();
    for bad in [0, 32, 100] {
        let err = gdn_prefill_checkpointed(
            wgpu,
            &case.inputs(),
            &options(false),
            PrefillMode::Chunk,
            Some(bad),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("multiple of 64"), "{bad}: {err}");
    }
    let err = gdn_prefill_checkpointed(
        wgpu,
        &case.inputs(),
        &options(false),
        PrefillMode::Recurrent,
        Some(64),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("chunked prefill"), "{err}");
    // Calls that would run another kernel than the two passes' outputs walk.
    let one_pass = StatePlan {
        kernel: StateKernel::OnePass,
        ..StatePlan::default()
    };
    let too_large = StatePlan {
        scratch_limit: Some(1),
        ..StatePlan::default()
    };
    for plan in [one_pass, too_large] {
        let err = PreparedPrefill::checkpointed(
            wgpu,
            &case.inputs(),
            &options(false),
            PrefillMode::Chunk,
            &plan,
            Some(64),
        )
        .map(drop)
        .unwrap_err()
        .to_string();
        assert!(err.contains("two-pass chunked kernels"), "{plan:?}: {err}");
    }
    // The coop walk stores none, on any adapter (refused before the inputs are uploaded).
    let coop = StatePlan {
        kernel: StateKernel::Coop,
        ..StatePlan::default()
    };
    let err = PreparedPrefill::checkpointed(
        wgpu,
        &case.inputs(),
        &options(false),
        PrefillMode::Chunk,
        &coop,
        Some(64),
    )
    .map(drop)
    .unwrap_err()
    .to_string();
    assert!(err.contains("stores no state checkpoints"), "{err}");
}

#[test]
fn pooled_prefill_then_decode_on_the_device_equals_the_longer_prefill() {
    let Some(wgpu) = common::device("pooled_prefill_then_decode_equals_the_longer_prefill") else {
        return;
    };
    // Three sequences of 200 + 1 tokens (the last one decoded), a pool of 5 slots on the device
    // whose other slots must not change.
    let (heads, key_heads, dim, prompt) = (4, 2, 64, 200);
    let mut spec = GdnSpec::new(prompt + 1, key_heads, heads, dim, dim);
    spec.batch = 3;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 540).unwrap();
    let opts = options(true);
    let reference = gdn_reference(&case.inputs(), &opts).unwrap();
    let head = [&case.q, &case.k, &case.v, &case.g, &case.beta]
        .map(|t| token_range(t, 0..prompt).unwrap());
    let tail = [&case.q, &case.k, &case.v, &case.g, &case.beta]
        .map(|t| WgpuTensor::upload(wgpu, &token_range(t, prompt..prompt + 1).unwrap()).unwrap());
    let slots = [4i64, 0, 2];
    let slot_tensor = HostTensor::from_i64(vec![3], slots.to_vec()).unwrap();
    let per_state = heads * dim * dim;
    let untouched = Rng::new(541).normal_vec(5 * per_state, 0.3);
    let mut pool_values = untouched.clone();
    for &slot in &slots {
        pool_values[slot as usize * per_state..][..per_state].fill(0.0);
    }
    let pool_host = HostTensor::from_f32(vec![5, heads, dim, dim], pool_values).unwrap();
    let mut pool = WgpuTensor::upload(wgpu, &pool_host).unwrap();
    let prompt_inputs = GdnInputs {
        q: &head[0],
        k: &head[1],
        v: &head[2],
        g: &head[3],
        beta: &head[4],
        initial_state: None,
        cu_seqlens: None,
    };
    let (o, checkpoints) = gdn_prefill_into_pool(
        wgpu,
        &prompt_inputs,
        &opts,
        PrefillMode::Chunk,
        &mut pool,
        &slot_tensor,
        None,
    )
    .unwrap();
    assert!(checkpoints.is_none());
    assert_eq!(o.shape(), &[3, prompt, heads, dim]);
    let decode_slots = WgpuTensor::upload(wgpu, &slot_tensor).unwrap();
    let decode_inputs = DecodeInputs {
        q: &tail[0],
        k: &tail[1],
        v: &tail[2],
        gating: Gating::Direct {
            g: &tail[3],
            beta: &tail[4],
        },
        slot_indices: &decode_slots,
    };
    let decode_options = DecodeOptions {
        gdn: opts.clone(),
        ..DecodeOptions::default()
    };
    let out = gdn_decode(wgpu, &decode_inputs, &mut pool, &decode_options).unwrap();
    let o = out.o.download(wgpu).unwrap().to_f32_vec("o").unwrap();
    let per_row = heads * dim;
    let expected_o: Vec<f64> = (0..3)
        .flat_map(|b| reference.o[(b * (prompt + 1) + prompt) * per_row..][..per_row].to_vec())
        .collect();
    let o_err = rel_rms(&o, &expected_o);
    let pool = pool.download(wgpu).unwrap();
    let pool = pool.as_f32().unwrap();
    let mut got = Vec::new();
    let mut expected = Vec::new();
    for (n, &slot) in slots.iter().enumerate() {
        got.extend_from_slice(&pool[slot as usize * per_state..][..per_state]);
        expected.extend_from_slice(&reference.final_state[n * per_state..][..per_state]);
    }
    let s_err = rel_rms(&got, &expected);
    eprintln!("pooled prefill + decode on wgpu: o {o_err:.3e}, pool {s_err:.3e}");
    assert!(o_err < O_TOLERANCE, "o {o_err:.3e}");
    assert!(s_err < STATE_TOLERANCE, "pool {s_err:.3e}");
    for slot in [1usize, 3] {
        assert_eq!(
            &pool[slot * per_state..][..per_state],
            &untouched[slot * per_state..][..per_state],
            "slot {slot} is not the call's and must not change"
        );
    }
}

#[test]
fn pooled_checkpoints_equal_those_from_the_slots_and_bad_calls_leave_the_pool() {
    let Some(wgpu) = common::device("pooled_checkpoints_equal_those_from_the_slots") else {
        return;
    };
    let (heads, k, v) = (4, 32, 48);
    let mut spec = GdnSpec::new(130 + 256, 2, heads, k, v);
    spec.seq_lens = Some(vec![130, 256]);
    let case = GdnCase::random(&spec, 550).unwrap();
    let state_len = heads * k * v;
    let values = Rng::new(551).normal_vec(3 * state_len, 0.3);
    let pool_before = HostTensor::from_f32(vec![3, heads, k, v], values.clone()).unwrap();
    let slots = [2i64, 0];
    let mut initial = Vec::new();
    for &s in &slots {
        initial.extend_from_slice(&values[s as usize * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(vec![2, heads, k, v], initial).unwrap();
    let slot_tensor = HostTensor::from_i64(vec![2], slots.to_vec()).unwrap();
    let expected = gdn_prefill_checkpointed(
        wgpu,
        &GdnInputs {
            initial_state: Some(&initial),
            ..case.inputs()
        },
        &options(false),
        PrefillMode::Chunk,
        Some(64),
    )
    .unwrap();
    let mut pool = pool_before.clone();
    let (o, checkpoints) = gdn_prefill_host_into_pool(
        wgpu,
        &case.inputs(),
        &options(false),
        PrefillMode::Chunk,
        &mut pool,
        &slot_tensor,
        Some(64),
    )
    .unwrap();
    // The same kernels from the same states: equal, bit for bit.
    assert_eq!(
        o.to_f32_vec("o").unwrap(),
        expected.o.to_f32_vec("o").unwrap()
    );
    let checkpoints = checkpoints.unwrap();
    assert_eq!(checkpoints.states.shape(), &[2 + 4, heads, k, v]);
    assert_eq!(
        checkpoints.states.as_f32().unwrap(),
        expected.checkpoints.unwrap().states.as_f32().unwrap()
    );
    let finals = expected.final_state.as_f32().unwrap();
    let after = pool.as_f32().unwrap();
    for (n, &slot) in slots.iter().enumerate() {
        assert_eq!(
            &after[slot as usize * state_len..][..state_len],
            &finals[n * state_len..][..state_len]
        );
    }
    assert_eq!(
        &after[state_len..][..state_len],
        &values[state_len..][..state_len]
    );

    // Refused before anything runs, the pool as it was: a bad spacing, a repeated slot, an
    // initial state beside the pool, a slot out of range.
    let repeated = HostTensor::from_i64(vec![2], vec![1, 1]).unwrap();
    let out_of_range = HostTensor::from_i64(vec![2], vec![0, 3]).unwrap();
    let with_initial = GdnInputs {
        initial_state: Some(&initial),
        ..case.inputs()
    };
    let plain = case.inputs();
    let calls: [(&GdnInputs<'_>, &HostTensor, Option<usize>, &str); 4] = [
        (&plain, &slot_tensor, Some(100), "multiple of 64"),
        (&plain, &repeated, None, "slot_indices"),
        (&with_initial, &slot_tensor, None, "initial_state"),
        (&plain, &out_of_range, None, "slot_indices"),
    ];
    for (inputs, slots, every, expect) in calls {
        let mut pool = pool_before.clone();
        let err = gdn_prefill_host_into_pool(
            wgpu,
            inputs,
            &options(false),
            PrefillMode::Chunk,
            &mut pool,
            slots,
            every,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(expect), "{expect}: {err}");
        assert_eq!(
            pool.as_f32().unwrap(),
            &values[..],
            "{expect}: pool changed"
        );
    }
}
