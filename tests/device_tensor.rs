//! `deltakv::Tensor` and `gdn_decode_on_device`: a serving loop that keeps its state pool on one
//! device equals the f64 oracle step after step; tensors move between devices only through the
//! explicit copies; a call with tensors on two devices, or with bad inputs, is refused before
//! the pool changes. The CUDA tests print one "skipped (no CUDA device)" line and pass on a
//! machine without a GPU; so do the wgpu tests on a machine without an adapter, except in CI.

use deltakv::gdn::decode::check::{O_TOLERANCE, STATE_TOLERANCE_F32};
use deltakv::gdn::decode::oracle::gdn_decode_reference;
use deltakv::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnOptions};
use deltakv::metrics::rel_rms;
use deltakv::{DType, Device, HostTensor, Result, Tensor, gdn_decode_on_device};

/// One step's inputs copied to `device` (the pool is the serving loop's own).
struct StepInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gates: Vec<(String, Tensor)>,
    slot_indices: Tensor,
}

impl StepInputs {
    fn copy(case: &DecodeCase, device: Device) -> Result<Self> {
        let to = |t: &HostTensor| Tensor::copy_from_host(t, device);
        Ok(Self {
            q: to(&case.q)?,
            k: to(&case.k)?,
            v: to(&case.v)?,
            gates: (case.gates.iter())
                .map(|(name, t)| Ok((name.clone(), to(t)?)))
                .collect::<Result<_>>()?,
            slot_indices: to(&case.slot_indices)?,
        })
    }

    fn gate(&self, name: &str) -> Option<&Tensor> {
        self.gates.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    fn inputs(&self) -> Result<DecodeInputs<'_, Tensor>> {
        Ok(DecodeInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gating: Gating::from_lookup(|name| self.gate(name))?,
            slot_indices: &self.slot_indices,
        })
    }
}

fn options(intermediate_states: bool) -> DecodeOptions {
    DecodeOptions {
        gdn: GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        },
        intermediate_states,
    }
}

/// Eight decode steps on `device` with the pool left there, each against the f64 oracle run
/// from the oracle's own pool; returns the worst `o` error and the final pool's error.
fn serving_loop_matches_the_oracle(device: Device) -> (f64, f64) {
    // Qwen3-Next's head dims at fewer heads, fused gating, l2 norm, a skipped row, T = 2.
    let mut spec = DecodeSpec::new(4, 2, 2, 8, 128, 128);
    spec.fused_gating = true;
    spec.raw_qk = true;
    spec.skipped_rows = vec![1];
    let first = DecodeCase::random(&spec, 500).unwrap();
    let mut pool = Tensor::copy_from_host(&first.state_pool, device).unwrap();
    let mut reference_pool = first.state_pool.clone();
    let mut worst_o: f64 = 0.0;
    for step in 0..8u64 {
        let case = DecodeCase::random(&spec, 500 + step).unwrap();
        let opts = options(step % 2 == 1);
        let reference =
            gdn_decode_reference(&case.inputs().unwrap(), &reference_pool, &opts.gdn).unwrap();
        let values: Vec<f32> = reference.state_pool.iter().map(|&x| x as f32).collect();
        reference_pool = HostTensor::from_f32(first.state_pool.shape().to_vec(), values).unwrap();

        let step_inputs = StepInputs::copy(&case, device).unwrap();
        let out = gdn_decode_on_device(&step_inputs.inputs().unwrap(), &mut pool, &opts).unwrap();
        assert_eq!(out.o.device(), device, "step {step}: o left the device");
        assert_eq!(
            pool.device(),
            device,
            "step {step}: the pool left the device"
        );
        let o = out.o.to_host().unwrap();
        assert_eq!((o.shape(), o.dtype()), (&[4, 2, 8, 128][..], DType::BF16));
        let err = rel_rms(&o.to_f32_vec("o").unwrap(), &reference.o);
        assert!(err < O_TOLERANCE, "step {step}: o rel_rms {err:.3e}");
        worst_o = worst_o.max(err);
        match out.intermediate_states {
            Some(states) => {
                assert!(opts.intermediate_states, "step {step}: unasked states");
                assert_eq!(states.device(), device);
                let states = states.into_host().unwrap().to_f32_vec("states").unwrap();
                let err = rel_rms(&states, &reference.intermediate_states);
                assert!(
                    err < STATE_TOLERANCE_F32,
                    "step {step}: states rel_rms {err:.3e}"
                );
            }
            None => assert!(!opts.intermediate_states, "step {step}: no states"),
        }
    }
    let pool = pool.into_host().unwrap().to_f32_vec("pool").unwrap();
    let pool_err = rel_rms(&pool, &reference_pool.to_f64_vec("pool").unwrap());
    assert!(
        pool_err < STATE_TOLERANCE_F32,
        "pool rel_rms {pool_err:.3e}"
    );
    (worst_o, pool_err)
}

#[test]
fn cpu_serving_loop_matches_the_oracle() {
    let (o, pool) = serving_loop_matches_the_oracle(Device::Cpu);
    println!("8 steps on cpu: worst o rel_rms {o:.3e}, pool rel_rms {pool:.3e}");
}

#[test]
fn tensors_move_between_devices_only_through_explicit_copies() {
    let host = HostTensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, 7.0, -0.5]).unwrap();
    let t = Tensor::from_host(host.clone());
    assert_eq!(t.device(), Device::Cpu);
    assert_eq!((t.shape(), t.dtype()), (&[2, 3][..], DType::F32));
    assert_eq!(t.as_host(), Some(&host));
    let copy = t.to_device(Device::Cpu).unwrap();
    assert_eq!(copy.to_host().unwrap(), host);
    assert_eq!(copy.into_host().unwrap(), host);
    // Without the `wgpu` feature, or without an adapter, the copy is refused with the reason.
    match Device::Wgpu.ensure_available() {
        Err(unavailable) => {
            let err = t.to_device(Device::Wgpu).unwrap_err().to_string();
            assert_eq!(err, unavailable.to_string());
            if !cfg!(feature = "wgpu") {
                assert_eq!(
                    err,
                    "device `wgpu` is not available: deltakv was built without wgpu (cargo feature `wgpu`)"
                );
            }
        }
        Ok(()) => {
            let on_device = t.to_device(Device::Wgpu).unwrap();
            assert_eq!(on_device.device(), Device::Wgpu);
            assert!(on_device.as_host().is_none());
            let again = on_device.to_device(Device::Wgpu).unwrap();
            assert_eq!(again.into_host().unwrap(), host);
        }
    }
    // Without the `cuda` feature, or without a GPU, the copy is refused with the reason.
    if let Err(unavailable) = Device::Cuda.ensure_available() {
        let err = Tensor::copy_from_host(&host, Device::Cuda).unwrap_err();
        assert_eq!(err.to_string(), unavailable.to_string());
    }
}

/// The pool is unchanged after `edit`'s bad input is refused with a message containing
/// `expected`.
fn refused_before_the_pool_changes(edit: impl Fn(&mut DecodeCase), expected: &str) {
    let spec = DecodeSpec::new(3, 1, 1, 2, 64, 64);
    let mut case = DecodeCase::random(&spec, 77).unwrap();
    edit(&mut case);
    let step_inputs = StepInputs::copy(&case, Device::Cpu).unwrap();
    let mut pool = Tensor::from_host(case.state_pool.clone());
    let err = match step_inputs.inputs() {
        Ok(inputs) => gdn_decode_on_device(&inputs, &mut pool, &options(false)).unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().contains(expected), "{err}");
    assert_eq!(pool.as_host(), Some(&case.state_pool), "the pool changed");
}

#[test]
fn bad_inputs_are_refused_before_the_pool_changes() {
    refused_before_the_pool_changes(
        |c| c.slot_indices = HostTensor::from_i32(vec![3], vec![0, 9, 1]).unwrap(),
        "slot_indices[1] = 9 is out of range for a state pool of 5 slots",
    );
    refused_before_the_pool_changes(
        |c| c.slot_indices = HostTensor::from_i32(vec![3], vec![2, 0, 2]).unwrap(),
        "rows 0 and 2 both address slot 2",
    );
    refused_before_the_pool_changes(
        |c| {
            let mut v = c.v.to_f32_vec("v").unwrap();
            v[5] = f32::INFINITY;
            c.v = HostTensor::from_f32_as(c.v.shape().to_vec(), &v, c.v.dtype()).unwrap();
        },
        "tensor `v` holds a non-finite value (inf) at flat index 5",
    );
    refused_before_the_pool_changes(
        |c| {
            let g = &mut c.gates.iter_mut().find(|(n, _)| n == "g").unwrap().1;
            *g = HostTensor::from_f32(g.shape().to_vec(), vec![0.25; g.len()]).unwrap();
        },
        "tensor `g` holds a positive log decay (0.25) at [b, t, h] = [0, 0, 0]",
    );
    refused_before_the_pool_changes(
        |c| c.k = HostTensor::from_f32_as(vec![3, 1, 1, 32], &[0.0; 96], DType::BF16).unwrap(),
        "tensor `k`: expected shape [3, 1, 1, 64]",
    );
    refused_before_the_pool_changes(
        |c| c.gates.retain(|(n, _)| n != "beta"),
        "gating needs both g and beta, but `beta` missing",
    );
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use deltakv::cuda::CudaTensor;
    use std::io::Write;

    /// True when a CUDA device is present; otherwise prints why the test is skipped.
    fn present(test: &str) -> bool {
        match Device::Cuda.ensure_available() {
            Ok(()) => true,
            Err(e) => {
                // Written to stderr directly, past the test harness's capture, so it shows.
                let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
                false
            }
        }
    }

    /// A tensor that claims to be on the GPU at an address nothing may read: every call here
    /// must refuse it before touching the device (which this machine may not have).
    fn unreadable_gpu_tensor(like: &HostTensor) -> Tensor {
        // SAFETY: the view is refused by the device check before any use of the address.
        let view =
            unsafe { CudaTensor::from_device_ptr(0x1000, like.shape().to_vec(), like.dtype()) };
        Tensor::from(view.unwrap())
    }

    #[test]
    fn mixed_devices_are_refused_naming_the_tensor() {
        let spec = DecodeSpec::new(2, 1, 1, 2, 64, 64);
        let case = DecodeCase::random(&spec, 91).unwrap();
        let mut step = StepInputs::copy(&case, Device::Cpu).unwrap();
        step.k = unreadable_gpu_tensor(&case.k);
        let mut pool = Tensor::from_host(case.state_pool.clone());
        let err =
            gdn_decode_on_device(&step.inputs().unwrap(), &mut pool, &options(false)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `k` is on cuda, but the call runs on cpu (the device of `state_pool`); copy it there first"
        );
        assert_eq!(pool.as_host(), Some(&case.state_pool));

        let step = StepInputs::copy(&case, Device::Cpu).unwrap();
        let mut gpu_pool = unreadable_gpu_tensor(&case.state_pool);
        let err = gdn_decode_on_device(&step.inputs().unwrap(), &mut gpu_pool, &options(false))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `q` is on cpu, but the call runs on cuda (the device of `state_pool`); copy it there first"
        );
    }

    #[test]
    fn gpu_serving_loop_matches_the_oracle() {
        if !present("gpu serving loop") {
            return;
        }
        let (o, pool) = serving_loop_matches_the_oracle(Device::Cuda);
        println!("8 steps on cuda: worst o rel_rms {o:.3e}, pool rel_rms {pool:.3e}");
    }

    #[test]
    fn gpu_tensors_copy_to_the_host_and_within_the_gpu() {
        if !present("gpu copies") {
            return;
        }
        let host = HostTensor::from_f32_as(vec![3, 5], &[0.5; 15], DType::BF16).unwrap();
        let gpu = Tensor::copy_from_host(&host, Device::Cuda).unwrap();
        assert_eq!(
            (gpu.device(), gpu.shape(), gpu.dtype()),
            (Device::Cuda, &[3, 5][..], DType::BF16)
        );
        assert!(gpu.as_host().is_none() && gpu.as_cuda().is_some());
        let copy = gpu.to_device(Device::Cuda).unwrap();
        drop(gpu);
        assert_eq!(copy.device(), Device::Cuda);
        assert_eq!(copy.to_device(Device::Cpu).unwrap().as_host(), Some(&host));
        assert_eq!(copy.into_host().unwrap(), host);
    }
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;

    /// True when wgpu has an adapter here; else prints one "skipped" line (and fails in CI,
    /// where lavapipe is installed).
    fn present(test: &str) -> bool {
        match Device::Wgpu.ensure_available() {
            Ok(()) => true,
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("{test}: no wgpu adapter in CI: {e}")
            }
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{test}: skipped (no wgpu adapter): {e}");
                false
            }
        }
    }

    #[test]
    fn wgpu_serving_loop_matches_the_oracle() {
        if !present("wgpu serving loop") {
            return;
        }
        let (o, pool) = serving_loop_matches_the_oracle(Device::Wgpu);
        println!("8 steps on wgpu: worst o rel_rms {o:.3e}, pool rel_rms {pool:.3e}");
    }

    #[test]
    fn mixed_devices_are_refused_naming_the_tensor() {
        if !present("wgpu mixed devices") {
            return;
        }
        let case = DecodeCase::random(&DecodeSpec::new(2, 1, 1, 2, 32, 32), 5).unwrap();
        let step = StepInputs::copy(&case, Device::Cpu).unwrap();
        let mut pool = Tensor::copy_from_host(&case.state_pool, Device::Wgpu).unwrap();
        let err =
            gdn_decode_on_device(&step.inputs().unwrap(), &mut pool, &options(false)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `q` is on cpu, but the call runs on wgpu (the device of `state_pool`); copy it there first"
        );
        assert_eq!(pool.into_host().unwrap(), case.state_pool);
    }
}
