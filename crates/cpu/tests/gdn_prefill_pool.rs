//! Prefill over a state pool on the CPU: equal to the prefill from the slots' states, final
//! states written back to those slots only, and bad calls refused with the pool untouched.

use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv_contract::rng::Rng;
use deltakv_contract::{DType, HostTensor};
use deltakv_cpu::gdn::{gdn_prefill, gdn_prefill_into_pool};

fn options() -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    }
}

/// A pool of `slots` random states for the case's heads and dims.
fn random_pool(case: &GdnCase, slots: usize, seed: u64) -> HostTensor {
    let (heads, key_dim, value_dim) = (case.v.shape()[2], case.q.shape()[3], case.v.shape()[3]);
    let values = Rng::new(seed).normal_vec(slots * heads * key_dim * value_dim, 0.3);
    HostTensor::from_f32(vec![slots, heads, key_dim, value_dim], values).unwrap()
}

#[test]
fn pooled_prefill_equals_prefill_from_the_slots() {
    let mut spec = GdnSpec::new(1 + 70 + 130, 2, 4, 64, 48);
    spec.seq_lens = Some(vec![1, 70, 130]);
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 3).unwrap();
    let pool_before = random_pool(&case, 5, 4);
    let slots = [4i64, 0, 2];
    let state_len = 4 * 64 * 48;
    let before = pool_before.as_f32().unwrap().to_vec();

    let mut initial = Vec::new();
    for &s in &slots {
        initial.extend_from_slice(&before[s as usize * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(vec![3, 4, 64, 48], initial).unwrap();
    let expected = gdn_prefill(
        &GdnInputs {
            initial_state: Some(&initial),
            ..case.inputs()
        },
        &options(),
        PrefillMode::Chunk,
    )
    .unwrap();

    let mut pool = pool_before.clone();
    let slot_tensor = HostTensor::from_i64(vec![3], slots.to_vec()).unwrap();
    let o = gdn_prefill_into_pool(
        &case.inputs(),
        &options(),
        PrefillMode::Chunk,
        &mut pool,
        &slot_tensor,
    )
    .unwrap();
    assert_eq!(o.dtype(), DType::BF16);
    assert_eq!(
        o.to_f32_vec("o").unwrap(),
        expected.o.to_f32_vec("o").unwrap()
    );
    let after = pool.as_f32().unwrap();
    let finals = expected.final_state.as_f32().unwrap();
    for (n, &s) in slots.iter().enumerate() {
        assert_eq!(
            &after[s as usize * state_len..][..state_len],
            &finals[n * state_len..][..state_len],
            "slot {s} holds sequence {n}'s final state"
        );
    }
    for untouched in [1usize, 3] {
        assert_eq!(
            &after[untouched * state_len..][..state_len],
            &before[untouched * state_len..][..state_len],
            "slot {untouched} is not addressed and keeps its state"
        );
    }
}

#[test]
fn bad_pooled_calls_are_refused_and_leave_the_pool_alone() {
    let spec = GdnSpec::new(70, 1, 2, 32, 32);
    let mut case = GdnCase::random(&spec, 5).unwrap();
    let pool_before = random_pool(&case, 3, 6);
    let cases: Vec<(&str, HostTensor, &str)> = vec![
        (
            "out of range",
            HostTensor::from_i64(vec![1], vec![3]).unwrap(),
            "out of range",
        ),
        (
            "negative",
            HostTensor::from_i32(vec![1], vec![-1]).unwrap(),
            "negative",
        ),
        (
            "wrong count",
            HostTensor::from_i64(vec![2], vec![0, 1]).unwrap(),
            "slot_indices",
        ),
    ];
    for (what, slots, needle) in cases {
        let mut pool = pool_before.clone();
        let err = gdn_prefill_into_pool(
            &case.inputs(),
            &options(),
            PrefillMode::Chunk,
            &mut pool,
            &slots,
        )
        .unwrap_err();
        assert!(err.to_string().contains(needle), "{what}: {err}");
        assert_eq!(
            pool.as_f32().unwrap(),
            pool_before.as_f32().unwrap(),
            "{what}"
        );
    }
    // A NaN in v fails the prefill itself; the pool is still untouched.
    let mut v = case.v.to_f32_vec("v").unwrap();
    v[17] = f32::NAN;
    case.v = HostTensor::from_f32_as(case.v.shape().to_vec(), &v, case.v.dtype()).unwrap();
    let mut pool = pool_before.clone();
    let slots = HostTensor::from_i64(vec![1], vec![1]).unwrap();
    assert!(
        gdn_prefill_into_pool(
            &case.inputs(),
            &options(),
            PrefillMode::Chunk,
            &mut pool,
            &slots
        )
        .is_err()
    );
    assert_eq!(pool.as_f32().unwrap(), pool_before.as_f32().unwrap());
    // A bf16 pool is refused (the prefill's states are f32).
    let mut bf16_pool = HostTensor::from_f32_as(
        pool_before.shape().to_vec(),
        pool_before.as_f32().unwrap(),
        DType::BF16,
    )
    .unwrap();
    let err = gdn_prefill_into_pool(
        &case.inputs(),
        &options(),
        PrefillMode::Chunk,
        &mut bf16_pool,
        &slots,
    )
    .unwrap_err();
    assert!(err.to_string().contains("state_pool"), "{err}");
}
