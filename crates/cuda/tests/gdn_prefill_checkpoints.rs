//! Prefill state checkpoints on the GPU against the f64 oracle run to each checkpoint
//! position: odd lengths, varlen with sequences shorter than the spacing, GQA, K != V, K = 256,
//! initial states and Qwen3-Next-like gates, every case whole and split into forced segments
//! of 1 and 3 chunks (the two-level scan), spacings 64 and 192; plus the pooled prefill and
//! refused spacings. On a machine without a CUDA device every test prints one
//! "skipped (no CUDA device)" line and passes.
//!
//! Tolerance: the states carry the bf16-operand error of the final state (the prefill suite's
//! 4e-3 bound), per checkpoint.

use deltakv_contract::gdn::oracle::gdn_reference_checkpointed;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, worst_checkpoint_error};
use deltakv_contract::gdn::prefill::validate::check_prefill_shapes;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnInputs, GdnOptions};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::rng::Rng;
use deltakv_contract::{DType, HostTensor};
use deltakv_cuda::Cuda;
use deltakv_cuda::gdn::{
    Split, gdn_prefill_host_checkpointed, gdn_prefill_host_into_pool_checkpointed,
};
use std::io::Write;

const STATE_TOLERANCE: f64 = 4.0e-3;
const SPLITS: [Split; 5] = [
    Split::Auto,
    Split::Scan(1),
    Split::Scan(3),
    Split::Relay(1),
    Split::Relay(2),
];

/// The GPU, with scratch memory poisoned so a kernel that reads an element no kernel wrote
/// shows it as NaN in the results.
fn device(test: &str) -> Option<&'static Cuda> {
    match Cuda::get() {
        Ok(cuda) => {
            deltakv_cuda::tensor::poison_scratch(true);
            Some(cuda)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
            None
        }
    }
}

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

/// Checkpoints every `every` tokens, whole and with forced segments, against the oracle; a
/// checkpoint at a sequence's end must equal its final state exactly.
fn check(cuda: &Cuda, name: &str, case: &GdnCase, options: &GdnOptions, every: usize) {
    let inputs = case.inputs();
    let heads: Vec<usize> = (0..case.v.shape()[2]).collect();
    let reference = gdn_reference_checkpointed(&inputs, options, &heads, Some(every)).unwrap();
    let seqs = check_prefill_shapes(&inputs, options).unwrap().seqs;
    let plan = CheckpointPlan::new(every, &seqs).unwrap();
    let (h, k, v) = (case.v.shape()[2], case.q.shape()[3], case.v.shape()[3]);
    for split in SPLITS {
        let what = format!("{name} every {every} segments {split:?}");
        let out = gdn_prefill_host_checkpointed(cuda, &inputs, options, split, Some(every))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let checkpoints = out.checkpoints.expect("checkpoints were asked for");
        assert_eq!(checkpoints.states.dtype(), DType::F32);
        assert_eq!(checkpoints.states.shape(), &[plan.total(), h, k, v]);
        let want: Vec<i64> = plan.offsets.iter().map(|&x| x as i64).collect();
        assert_eq!(checkpoints.offsets.to_i64_vec("offsets").unwrap(), want);
        let states = checkpoints.states.as_f32().unwrap();
        let worst = worst_checkpoint_error(states, &reference.checkpoints, plan.total());
        let whole = rel_rms(states, &reference.checkpoints);
        eprintln!(
            "{what}: {} checkpoints, worst {worst:.3e}, all {whole:.3e}",
            plan.total()
        );
        assert!(
            worst < STATE_TOLERANCE,
            "{what}: checkpoint rel_rms {worst:.3e}"
        );
        let finals = out.final_state.as_f32().unwrap();
        assert_eq!(
            plan.first_end_mismatch(&seqs, states, finals),
            None,
            "{what}: a sequence's end checkpoint is not its final state"
        );
    }
}

#[test]
fn checkpoints_at_odd_lengths_and_spacings_64_and_192() {
    let Some(cuda) = device("checkpoints_at_odd_lengths_and_spacings_64_and_192") else {
        return;
    };
    for (i, tokens) in [1, 63, 64, 65, 192, 1000].into_iter().enumerate() {
        let mut spec = GdnSpec::new(tokens, 2, 4, 64, 64);
        spec.batch = 2;
        spec.with_initial_state = true;
        let case = GdnCase::random(&spec, 300 + i as u64).unwrap();
        for every in [64, 192] {
            check(
                cuda,
                &format!("B=2 T={tokens}"),
                &case,
                &options(false),
                every,
            );
        }
    }
}

#[test]
fn checkpoints_of_varlen_sequences_shorter_and_longer_than_the_spacing() {
    let Some(cuda) = device("checkpoints_of_varlen_sequences_shorter_and_longer_than_the_spacing")
    else {
        return;
    };
    let lens = vec![1, 70, 200, 64, 383, 384, 5];
    let mut spec = GdnSpec::new(lens.iter().sum(), 1, 2, 64, 64);
    spec.seq_lens = Some(lens);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 310).unwrap();
    for every in [64, 192] {
        check(cuda, "varlen init l2", &case, &options(true), every);
    }
}

#[test]
fn checkpoints_with_gqa_unequal_dims_and_k256() {
    let Some(cuda) = device("checkpoints_with_gqa_unequal_dims_and_k256") else {
        return;
    };
    let mut spec = GdnSpec::new(400, 2, 6, 32, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 320).unwrap();
    check(cuda, "GQA 3 K=32 V=48", &case, &options(false), 128);
    let mut spec = GdnSpec::new(260, 1, 2, 256, 96);
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 321).unwrap();
    check(cuda, "K=256 V=96", &case, &options(false), 64);
    let mut spec = GdnSpec::new(450, 1, 2, 256, 256);
    spec.seq_lens = Some(vec![130, 320]);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 322).unwrap();
    check(cuda, "K=V=256 varlen l2", &case, &options(true), 64);
}

#[test]
fn checkpoints_with_model_gates() {
    let Some(cuda) = device("checkpoints_with_model_gates") else {
        return;
    };
    let mut spec = GdnSpec::new(700, 2, 4, 128, 128);
    spec.seq_lens = Some(vec![300, 400]);
    spec.with_initial_state = true;
    spec.raw_qk = true;
    let mut case = GdnCase::random(&spec, 330).unwrap();
    case.with_model_gates(331).unwrap();
    for every in [64, 192] {
        check(cuda, "qwen3-next gates", &case, &options(true), every);
    }
}

#[test]
fn pooled_prefill_checkpoints_equal_those_from_the_slots() {
    let Some(cuda) = device("pooled_prefill_checkpoints_equal_those_from_the_slots") else {
        return;
    };
    let mut spec = GdnSpec::new(130 + 256, 2, 4, 64, 48);
    spec.seq_lens = Some(vec![130, 256]);
    let case = GdnCase::random(&spec, 340).unwrap();
    let state_len = 4 * 64 * 48;
    let values = Rng::new(341).normal_vec(3 * state_len, 0.3);
    let pool_before = HostTensor::from_f32(vec![3, 4, 64, 48], values.clone()).unwrap();
    let slots = [2i64, 0];
    let mut initial = Vec::new();
    for &s in &slots {
        initial.extend_from_slice(&values[s as usize * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(vec![2, 4, 64, 48], initial).unwrap();
    let slot_tensor = HostTensor::from_i64(vec![2], slots.to_vec()).unwrap();
    for split in SPLITS {
        let expected = gdn_prefill_host_checkpointed(
            cuda,
            &GdnInputs {
                initial_state: Some(&initial),
                ..case.inputs()
            },
            &options(false),
            split,
            Some(64),
        )
        .unwrap()
        .checkpoints
        .unwrap();
        let mut pool = pool_before.clone();
        let (_, checkpoints) = gdn_prefill_host_into_pool_checkpointed(
            cuda,
            &case.inputs(),
            &options(false),
            &mut pool,
            &slot_tensor,
            Some(64),
            split,
        )
        .unwrap();
        let checkpoints = checkpoints.unwrap();
        assert_eq!(checkpoints.states.shape(), &[2 + 4, 4, 64, 48]);
        let err = rel_rms(
            checkpoints.states.as_f32().unwrap(),
            &expected.states.to_f64_vec("states").unwrap(),
        );
        eprintln!("pooled checkpoints {split:?}: {err:.3e} from the separate call");
        assert!(
            err < 1e-6,
            "{split:?}: pooled checkpoints differ: {err:.3e}"
        );
    }
    for bad in [0, 32, 100] {
        let mut pool = pool_before.clone();
        let err = gdn_prefill_host_into_pool_checkpointed(
            cuda,
            &case.inputs(),
            &options(false),
            &mut pool,
            &slot_tensor,
            Some(bad),
            Split::Auto,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("multiple of 64"), "{bad}: {err}");
        assert_eq!(pool.as_f32().unwrap(), pool_before.as_f32().unwrap());
    }
}
