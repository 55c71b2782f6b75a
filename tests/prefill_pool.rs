//! `deltakv::gdn_prefill_into_pool` on every device built in: the CPU against the prefill from
//! the slots' states, and CUDA and wgpu (where present) against the CPU within the GPU suite's
//! tolerance; a device that is missing prints one "skipped" line.

use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv::metrics::rel_rms;
use deltakv::{Device, HostTensor, gdn_prefill, gdn_prefill_into_pool};
use std::io::Write;

fn setup() -> (GdnCase, HostTensor, HostTensor) {
    let mut spec = GdnSpec::new(3 + 64 + 100, 2, 4, 64, 64);
    spec.seq_lens = Some(vec![3, 64, 100]);
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 11).unwrap();
    let values = deltakv::rng::Rng::new(12).normal_vec(4 * 4 * 64 * 64, 0.3);
    let pool = HostTensor::from_f32(vec![4, 4, 64, 64], values).unwrap();
    let slots = HostTensor::from_i32(vec![3], vec![2, 3, 0]).unwrap();
    (case, pool, slots)
}

fn options() -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    }
}

#[test]
fn pooled_prefill_on_the_cpu_equals_prefill_from_the_slots() {
    let (case, pool_before, slots) = setup();
    let state_len = 4 * 64 * 64;
    let before = pool_before.as_f32().unwrap();
    let mut initial = Vec::new();
    for s in [2usize, 3, 0] {
        initial.extend_from_slice(&before[s * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(vec![3, 4, 64, 64], initial).unwrap();
    let expected = gdn_prefill(
        Device::Cpu,
        &GdnInputs {
            initial_state: Some(&initial),
            ..case.inputs()
        },
        &options(),
        PrefillMode::Chunk,
    )
    .unwrap();
    let mut pool = pool_before.clone();
    let o = gdn_prefill_into_pool(
        Device::Cpu,
        &case.inputs(),
        &options(),
        PrefillMode::Chunk,
        &mut pool,
        &slots,
    )
    .unwrap();
    assert_eq!(
        o.to_f32_vec("o").unwrap(),
        expected.o.to_f32_vec("o").unwrap()
    );
    let after = pool.as_f32().unwrap();
    let finals = expected.final_state.as_f32().unwrap();
    for (n, s) in [2usize, 3, 0].into_iter().enumerate() {
        assert_eq!(
            &after[s * state_len..][..state_len],
            &finals[n * state_len..][..state_len]
        );
    }
    assert_eq!(
        &after[state_len..][..state_len],
        &before[state_len..][..state_len]
    );
}

#[test]
fn pooled_prefill_on_cuda_equals_the_cpu() {
    pooled_prefill_on_the_device_equals_the_cpu(Device::Cuda);
}

#[test]
fn pooled_prefill_on_wgpu_equals_the_cpu() {
    pooled_prefill_on_the_device_equals_the_cpu(Device::Wgpu);
}

fn pooled_prefill_on_the_device_equals_the_cpu(device: Device) {
    if let Err(e) = device.ensure_available() {
        let _ = writeln!(
            std::io::stderr(),
            "pooled_prefill_on_{device}_equals_the_cpu: skipped ({e})"
        );
        return;
    }
    let (case, pool_before, slots) = setup();
    let mut cpu_pool = pool_before.clone();
    let cpu_o = gdn_prefill_into_pool(
        Device::Cpu,
        &case.inputs(),
        &options(),
        PrefillMode::Chunk,
        &mut cpu_pool,
        &slots,
    )
    .unwrap();
    let mut gpu_pool = pool_before.clone();
    let gpu_o = gdn_prefill_into_pool(
        device,
        &case.inputs(),
        &options(),
        PrefillMode::Chunk,
        &mut gpu_pool,
        &slots,
    )
    .unwrap();
    let cpu_o64: Vec<f64> = cpu_o
        .to_f32_vec("o")
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let cpu_pool64: Vec<f64> = cpu_pool
        .as_f32()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();
    let o_err = rel_rms(&gpu_o.to_f32_vec("o").unwrap(), &cpu_o64);
    let pool_err = rel_rms(gpu_pool.as_f32().unwrap(), &cpu_pool64);
    eprintln!("pooled prefill, {device} against cpu: o {o_err:.2e}, pool {pool_err:.2e}");
    assert!(o_err < 4e-3 && pool_err < 4e-3);
}
