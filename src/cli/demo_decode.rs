//! `deltakv demo`, decode part: continue the prefill with 64 single-token decode steps from its
//! final state (a one-slot f32 pool updated in place), timed, and checked against the f64
//! recurrence run from the same state over the same 64 tokens.

use deltakv::gdn::decode::check::{O_TOLERANCE, STATE_TOLERANCE_F32};
use deltakv::gdn::oracle::gdn_reference;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnOptions};
use deltakv::metrics::rel_rms;
use deltakv::{Device, HostTensor, Result, gdn_decode};
use std::time::Instant;

/// Decode steps after the prompt.
const STEPS: usize = 64;

/// Token `t` of a `[1, T, ...]` tensor as a `[1, 1, ...]` tensor of the same dtype.
fn token(t: &HostTensor, values: &[f32], index: usize) -> Result<HostTensor> {
    let inner: usize = t.shape()[2..].iter().product();
    let mut shape = t.shape().to_vec();
    shape[1] = 1;
    HostTensor::from_f32_as(shape, &values[index * inner..][..inner], t.dtype())
}

/// The decode suite's tolerances (bf16 `o`, f32 state), the same on every device.
fn within_tolerance(o_err: f64, state_err: f64) -> bool {
    o_err < O_TOLERANCE && state_err < STATE_TOLERANCE_F32
}

/// One step's decode inputs from its `[q, k, v, g, beta]` and the one-slot index.
fn step_inputs<'a>(tokens: &'a [HostTensor; 5], slots: &'a HostTensor) -> DecodeInputs<'a> {
    let [q, k, v, g, beta] = tokens;
    DecodeInputs {
        q,
        k,
        v,
        gating: Gating::Direct { g, beta },
        slot_indices: slots,
    }
}

/// Runs the decode continuation; prints its lines and returns whether it is within tolerance.
pub fn run(
    prompt: &GdnCase,
    options: &GdnOptions,
    final_state: &HostTensor,
    seed: u64,
) -> Result<bool> {
    let (key_heads, key_dim) = (prompt.q.shape()[2], prompt.q.shape()[3]);
    let (value_heads, value_dim) = (prompt.v.shape()[2], prompt.v.shape()[3]);
    let mut spec = GdnSpec::new(STEPS, key_heads, value_heads, key_dim, value_dim);
    spec.raw_qk = true;
    spec.dtype = prompt.q.dtype();
    let mut next = GdnCase::random(&spec, seed.wrapping_add(1))?;
    let values = [&next.q, &next.k, &next.v, &next.g, &next.beta]
        .map(|t| t.to_f32_vec("token").expect("float tensors"));

    let mut pool = final_state.clone();
    let slots = HostTensor::from_i32(vec![1], vec![0])?;
    let decode_options = DecodeOptions {
        gdn: options.clone(),
        intermediate_states: false,
    };
    let mut o = Vec::with_capacity(STEPS * value_heads * value_dim);
    let mut times = Vec::with_capacity(STEPS);
    let step_tokens = |t: usize| -> Result<[HostTensor; 5]> {
        Ok([&next.q, &next.k, &next.v, &next.g, &next.beta]
            .into_iter()
            .zip(&values)
            .map(|(tensor, vals)| token(tensor, vals, t))
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .expect("five tensors"))
    };
    for t in 0..STEPS {
        let tokens = step_tokens(t)?;
        let inputs = step_inputs(&tokens, &slots);
        let started = Instant::now();
        let out = gdn_decode(Device::Cpu, &inputs, &mut pool, &decode_options)?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
        o.extend(out.o.to_f32_vec("o")?);
    }
    times.sort_by(f64::total_cmp);
    let mut on_devices = Vec::new();
    for device in gpu_devices() {
        let steps = device_steps(device, &step_tokens, final_state, &decode_options)?;
        on_devices.push((device, steps));
    }

    // The oracle: the f64 recurrence over the same 64 tokens from the same starting state.
    next.initial_state = Some(final_state.clone());
    let started = Instant::now();
    let reference = gdn_reference(&next.inputs(), options)?;
    let oracle_s = started.elapsed().as_secs_f64();
    let o_err = rel_rms(&o, &reference.o);
    let state_err = rel_rms(pool.as_f32().expect("f32 pool"), &reference.final_state);
    let ok = within_tolerance(o_err, state_err);

    println!();
    println!(
        "decode: {STEPS} steps of one token from the prefill's final state (one-slot f32 pool, updated in place)"
    );
    println!(
        "  per step: median {:.1} us, min {:.1} us, max {:.1} us",
        times[STEPS / 2],
        times[0],
        times[STEPS - 1]
    );
    println!(
        "  error against the f64 oracle (all {value_heads} heads, oracle took {oracle_s:.2} s): o rel_rms {o_err:.2e}, state rel_rms {state_err:.2e}"
    );
    println!(
        "  decode: {}",
        if ok {
            format!("PASS (o < {O_TOLERANCE:e}, state < {STATE_TOLERANCE_F32:e})")
        } else {
            "FAIL: error above tolerance".to_string()
        }
    );
    let mut ok = ok;
    for (device, steps) in on_devices {
        ok = report_device(device, steps, &reference)? && ok;
    }
    Ok(ok)
}

/// A device's run: (o of every step, the final pool, per-step wall times), or the reason the
/// device is unavailable.
type DeviceSteps = std::result::Result<(Vec<f32>, HostTensor, Vec<f64>), String>;

/// The GPU backends built into this binary.
fn gpu_devices() -> Vec<Device> {
    [
        (Device::Cuda, cfg!(feature = "cuda")),
        (Device::Wgpu, cfg!(feature = "wgpu")),
    ]
    .into_iter()
    .filter_map(|(device, built)| built.then_some(device))
    .collect()
}

/// The same 64 steps on a GPU backend when its device is present: the pool copied there once
/// and updated in place, each step's q, k, v, g, beta copied there and its o copied back.
fn device_steps(
    device: Device,
    step_tokens: &dyn Fn(usize) -> Result<[HostTensor; 5]>,
    final_state: &HostTensor,
    options: &DecodeOptions,
) -> Result<DeviceSteps> {
    use deltakv::{Tensor, gdn_decode_on_device};
    if let Err(e) = device.ensure_available() {
        return Ok(Err(e.to_string()));
    }
    let mut pool = Tensor::copy_from_host(final_state, device)?;
    let slots = Tensor::copy_from_host(&HostTensor::from_i32(vec![1], vec![0])?, device)?;
    let (mut o, mut times) = (Vec::new(), Vec::new());
    for t in 0..STEPS {
        let started = Instant::now();
        let tokens = step_tokens(t)?
            .iter()
            .map(|x| Tensor::copy_from_host(x, device))
            .collect::<Result<Vec<_>>>()?;
        let [q, k, v, g, beta] = &tokens[..] else {
            unreachable!("five tensors")
        };
        let inputs = DecodeInputs {
            q,
            k,
            v,
            gating: Gating::Direct { g, beta },
            slot_indices: &slots,
        };
        let out = gdn_decode_on_device(&inputs, &mut pool, options)?;
        o.extend(out.o.into_host()?.to_f32_vec("o")?);
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(Ok((o, pool.into_host()?, times)))
}

/// Prints a device run's line; returns whether it is within the CPU's tolerances.
fn report_device(
    device: Device,
    steps: DeviceSteps,
    reference: &deltakv::gdn::oracle::GdnReference,
) -> Result<bool> {
    match steps {
        Err(reason) => {
            println!("  decode on {device}: skipped ({reason})");
            Ok(true)
        }
        Ok((o, pool, times)) => {
            let o_err = rel_rms(&o, &reference.o);
            let state_err = rel_rms(&pool.to_f32_vec("pool")?, &reference.final_state);
            let ok = within_tolerance(o_err, state_err);
            println!(
                "  decode on {device} (pool resident on the device): per step, with the copies of its inputs and o, median {:.1} us; o rel_rms {o_err:.2e}, state rel_rms {state_err:.2e}: {}",
                times[STEPS / 2],
                if ok {
                    "PASS"
                } else {
                    "FAIL: error above tolerance"
                }
            );
            Ok(ok)
        }
    }
}
