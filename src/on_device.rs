//! Ops over [`Tensor`]s: each runs on the device its tensors are on (the state pool's, for
//! decode) and returns its results there. A tensor on another device is an error naming it;
//! nothing is copied behind the caller's back.

use crate::device_tensor::Tensor;
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating};
use deltakv_contract::{Error, Result};

/// The results of [`gdn_decode_on_device`], on the device of the call.
#[derive(Debug)]
pub struct DeviceDecodeOutput {
    /// `[B, T, H, V]` in v's dtype; zeros for skipped rows.
    pub o: Tensor,
    /// `[B, T, H, K, V]` f32, when asked; zeros for skipped rows.
    pub intermediate_states: Option<Tensor>,
}

/// GDN decode on the device where `state_pool` lives (see [`crate::gdn::decode`] for the math
/// and layouts): advances the addressed slots by 1..=16 tokens per row in place, and returns
/// `o` (and the intermediate states, when asked) on that device. Every input must be on the
/// pool's device, else the error names the first one that is not (q, k, v, the gating tensors,
/// slot_indices in that order) and its device, before anything runs.
///
/// On the CPU this is [`crate::gdn::gdn_decode`], which checks every value of the inputs. On
/// CUDA it is [`crate::cuda::gdn::gdn_decode`]: the pool stays on the GPU, shapes, dtypes and
/// slot indices are checked before launch (the B slot indices are copied to the host for
/// that), device values are not scanned for NaN, and nothing else crosses to the host. On
/// wgpu it is `wgpu::gdn::gdn_decode`, with the same rules.
pub fn gdn_decode_on_device(
    inputs: &DecodeInputs<'_, Tensor>,
    state_pool: &mut Tensor,
    options: &DecodeOptions,
) -> Result<DeviceDecodeOutput> {
    let device = state_pool.device();
    let wrong_device = |name: &str, t: &Tensor| Error::WrongDevice {
        name: name.to_string(),
        found: t.device().to_string(),
        expected: device.to_string(),
        anchor: "state_pool".to_string(),
    };
    match state_pool {
        Tensor::Host(pool) => {
            let host_inputs = backend_inputs(inputs, |name, t| {
                t.as_host().ok_or_else(|| wrong_device(name, t))
            })?;
            let out = deltakv_cpu::gdn::gdn_decode(&host_inputs, pool, options)?;
            Ok(DeviceDecodeOutput {
                o: Tensor::Host(out.o),
                intermediate_states: out.intermediate_states.map(Tensor::Host),
            })
        }
        #[cfg(feature = "cuda")]
        Tensor::Cuda(pool) => {
            let gpu_inputs = backend_inputs(inputs, |name, t| {
                t.as_cuda().ok_or_else(|| wrong_device(name, t))
            })?;
            let cuda = deltakv_cuda::Cuda::get()?;
            let out = deltakv_cuda::gdn::gdn_decode(cuda, &gpu_inputs, pool, options)?;
            Ok(DeviceDecodeOutput {
                o: Tensor::Cuda(out.o),
                intermediate_states: out.intermediate_states.map(Tensor::Cuda),
            })
        }
        #[cfg(feature = "wgpu")]
        Tensor::Wgpu(pool) => {
            let device_inputs = backend_inputs(inputs, |name, t| {
                t.as_wgpu().ok_or_else(|| wrong_device(name, t))
            })?;
            let wgpu = deltakv_wgpu::Wgpu::get()?;
            let out = deltakv_wgpu::gdn::gdn_decode(wgpu, &device_inputs, pool, options)?;
            Ok(DeviceDecodeOutput {
                o: Tensor::Wgpu(out.o),
                intermediate_states: out.intermediate_states.map(Tensor::Wgpu),
            })
        }
    }
}

/// The call's inputs as the backend's tensors, `storage` giving each one's storage (or the
/// error for a tensor on another device), in the order q, k, v, gating, slot_indices.
fn backend_inputs<'a, T>(
    inputs: &DecodeInputs<'a, Tensor>,
    storage: impl Fn(&str, &'a Tensor) -> Result<&'a T>,
) -> Result<DecodeInputs<'a, T>> {
    let (q, k, v) = (
        storage("q", inputs.q)?,
        storage("k", inputs.k)?,
        storage("v", inputs.v)?,
    );
    let gating = match inputs.gating {
        Gating::Direct { g, beta } => Gating::Direct {
            g: storage("g", g)?,
            beta: storage("beta", beta)?,
        },
        Gating::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => Gating::Fused {
            a: storage("a", a)?,
            b: storage("b", b)?,
            a_log: storage("A_log", a_log)?,
            dt_bias: storage("dt_bias", dt_bias)?,
        },
    };
    Ok(DecodeInputs {
        q,
        k,
        v,
        gating,
        slot_indices: storage("slot_indices", inputs.slot_indices)?,
    })
}
