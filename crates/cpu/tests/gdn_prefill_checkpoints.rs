//! Prefill state checkpoints on the CPU (both modes, and the pooled prefill) against the f64
//! oracle run to each checkpoint position, at odd lengths, varlen with sequences shorter than
//! the spacing, GQA, K != V, initial states and Qwen3-Next-like gates.

use deltakv_contract::gdn::oracle::gdn_reference_checkpointed;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, worst_checkpoint_error};
use deltakv_contract::gdn::prefill::validate::check_prefill_shapes;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::rng::Rng;
use deltakv_contract::{DType, HostTensor};
use deltakv_cpu::gdn::{gdn_prefill_checkpointed, gdn_prefill_into_pool_checkpointed};

/// Measured: at most 1.8e-7 (chunked, model gates), 1.0e-7 (recurrent).
const STATE_TOLERANCE: f64 = 1.0e-6;

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

/// Runs both modes with checkpoints every `every` tokens and checks them (and that the last one
/// equals the final state where a sequence ends on a checkpoint) against the oracle.
fn check(name: &str, case: &GdnCase, options: &GdnOptions, every: usize) {
    let inputs = case.inputs();
    let heads: Vec<usize> = (0..case.v.shape()[2]).collect();
    let reference = gdn_reference_checkpointed(&inputs, options, &heads, Some(every)).unwrap();
    let seqs = check_prefill_shapes(&inputs, options).unwrap().seqs;
    let plan = CheckpointPlan::new(every, &seqs).unwrap();
    for mode in [PrefillMode::Chunk, PrefillMode::Recurrent] {
        let out = gdn_prefill_checkpointed(&inputs, options, mode, Some(every)).unwrap();
        let checkpoints = out.checkpoints.expect("checkpoints were asked for");
        assert_eq!(checkpoints.every, every);
        assert_eq!(checkpoints.states.dtype(), DType::F32);
        let (h, k, v) = (case.v.shape()[2], case.q.shape()[3], case.v.shape()[3]);
        assert_eq!(checkpoints.states.shape(), &[plan.total(), h, k, v]);
        let offsets = checkpoints.offsets.to_i64_vec("offsets").unwrap();
        let want: Vec<i64> = plan.offsets.iter().map(|&x| x as i64).collect();
        assert_eq!(offsets, want, "{name}: offsets");
        let states = checkpoints.states.as_f32().unwrap();
        let err = worst_checkpoint_error(states, &reference.checkpoints, plan.total());
        let whole = rel_rms(states, &reference.checkpoints);
        eprintln!(
            "{name} every {every} {mode:?}: {} checkpoints, worst {err:.3e}, all {whole:.3e}",
            plan.total()
        );
        assert!(
            err < STATE_TOLERANCE,
            "{name} {mode:?}: checkpoint rel_rms {err:.3e}"
        );
        // A checkpoint at a sequence's end is its final state, bit for bit.
        let finals = out.final_state.as_f32().unwrap();
        assert_eq!(
            plan.first_end_mismatch(&seqs, states, finals),
            None,
            "{name} {mode:?}: a sequence's end checkpoint is not its final state"
        );
    }
}

#[test]
fn odd_lengths_at_spacings_64_and_192() {
    for (i, tokens) in [1, 63, 64, 65, 191, 192, 1000].into_iter().enumerate() {
        let mut spec = GdnSpec::new(tokens, 2, 4, 64, 64);
        spec.batch = 2;
        let case = GdnCase::random(&spec, 200 + i as u64).unwrap();
        for every in [64, 192] {
            check(&format!("B=2 T={tokens}"), &case, &options(false), every);
        }
    }
}

#[test]
fn varlen_with_sequences_shorter_than_the_spacing() {
    let lens = vec![1, 70, 200, 64, 383, 384, 5];
    let mut spec = GdnSpec::new(lens.iter().sum(), 1, 2, 64, 64);
    spec.seq_lens = Some(lens);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 210).unwrap();
    for every in [64, 192] {
        check("varlen init l2", &case, &options(true), every);
    }
}

#[test]
fn gqa_and_unequal_head_dims_with_initial_states() {
    let mut spec = GdnSpec::new(400, 2, 6, 32, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 220).unwrap();
    check("GQA 3 K=32 V=48", &case, &options(false), 128);
    let mut spec = GdnSpec::new(260, 1, 2, 256, 96);
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 221).unwrap();
    check("K=256 V=96", &case, &options(false), 64);
}

#[test]
fn model_gates_with_initial_states() {
    let mut spec = GdnSpec::new(700, 2, 4, 128, 128);
    spec.seq_lens = Some(vec![300, 400]);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let mut case = GdnCase::random(&spec, 230).unwrap();
    case.with_model_gates(231).unwrap();
    for every in [64, 192] {
        check("qwen3-next gates", &case, &options(true), every);
    }
}

#[test]
fn pooled_prefill_checkpoints_equal_those_from_the_slots() {
    let mut spec = GdnSpec::new(130 + 256, 2, 4, 64, 48);
    spec.seq_lens = Some(vec![130, 256]);
    let case = GdnCase::random(&spec, 240).unwrap();
    let state_len = 4 * 64 * 48;
    let values = Rng::new(241).normal_vec(3 * state_len, 0.3);
    let pool_before = HostTensor::from_f32(vec![3, 4, 64, 48], values.clone()).unwrap();
    let slots = [2i64, 0];
    let mut initial = Vec::new();
    for &s in &slots {
        initial.extend_from_slice(&values[s as usize * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(vec![2, 4, 64, 48], initial).unwrap();
    let expected = gdn_prefill_checkpointed(
        &GdnInputs {
            initial_state: Some(&initial),
            ..case.inputs()
        },
        &options(false),
        PrefillMode::Chunk,
        Some(64),
    )
    .unwrap()
    .checkpoints
    .unwrap();
    let mut pool = pool_before.clone();
    let slot_tensor = HostTensor::from_i64(vec![2], slots.to_vec()).unwrap();
    let (_, checkpoints) = gdn_prefill_into_pool_checkpointed(
        &case.inputs(),
        &options(false),
        PrefillMode::Chunk,
        &mut pool,
        &slot_tensor,
        Some(64),
    )
    .unwrap();
    let checkpoints = checkpoints.unwrap();
    assert_eq!(checkpoints.states.shape(), &[2 + 4, 4, 64, 48]);
    assert_eq!(
        checkpoints.states.as_f32().unwrap(),
        expected.states.as_f32().unwrap()
    );
    // Bad spacings are refused before the pool is touched.
    for bad in [0, 32, 100] {
        let mut pool = pool_before.clone();
        let err = gdn_prefill_into_pool_checkpointed(
            &case.inputs(),
            &options(false),
            PrefillMode::Chunk,
            &mut pool,
            &slot_tensor,
            Some(bad),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("multiple of 64"), "{bad}: {err}");
        assert_eq!(pool.as_f32().unwrap(), pool_before.as_f32().unwrap());
    }
}

#[test]
fn no_checkpoints_unless_asked() {
    let case = GdnCase::random(&GdnSpec::new(200, 1, 1, 32, 32), 250).unwrap();
    let out = gdn_prefill_checkpointed(&case.inputs(), &options(false), PrefillMode::Chunk, None)
        .unwrap();
    assert!(out.checkpoints.is_none());
}
