//! Prefill of host tensors on the GPU: the contract's full check on the host (values
//! included), the copies to the device, the kernels and the copies back. The CLI and the
//! facade's host-tensor entry points use these; a serving loop calls [`super::gdn_prefill`]
//! with tensors that stay on the GPU.

use super::{PrefillExtras, PrefillLaunch, PrefillStates, Split, gdn_prefill_checkpointed};
use crate::runtime::Cuda;
use crate::tensor::CudaTensor;
use deltakv_contract::gdn::prefill::checkpoint::PrefillCheckpoints;
use deltakv_contract::gdn::prefill::validate::validate_prefill;
use deltakv_contract::gdn::{GDN_OVERFLOW_CAUSE, GdnInputs, GdnOptions, GdnOutput};
use deltakv_contract::tensor::check_result_finite;
use deltakv_contract::{DType, HostTensor, Result};

/// The tensors of a host prefill call, copied to the GPU.
struct UploadedPrefill {
    tensors: [CudaTensor; 5],
    initial_state: Option<CudaTensor>,
    cu_seqlens: Option<CudaTensor>,
}

impl UploadedPrefill {
    fn new(cuda: &Cuda, inputs: &GdnInputs<'_>) -> Result<Self> {
        let up = |t: &HostTensor| CudaTensor::upload(cuda, t);
        Ok(Self {
            tensors: [
                up(inputs.q)?,
                up(inputs.k)?,
                up(inputs.v)?,
                up(inputs.g)?,
                up(inputs.beta)?,
            ],
            initial_state: inputs.initial_state.map(up).transpose()?,
            cu_seqlens: inputs.cu_seqlens.map(up).transpose()?,
        })
    }

    fn inputs(&self) -> GdnInputs<'_, CudaTensor> {
        let [q, k, v, g, beta] = &self.tensors;
        GdnInputs {
            q,
            k,
            v,
            g,
            beta,
            initial_state: self.initial_state.as_ref(),
            cu_seqlens: self.cu_seqlens.as_ref(),
        }
    }
}

/// Prefill of host tensors on the GPU: the contract's full check (values included) on the
/// host, upload, the kernels, and the results copied back. `split` says how long sequences are
/// split for the state pass ([`Split::Auto`]: from the GPU's size).
pub fn gdn_prefill_host(
    cuda: &Cuda,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    split: Split,
) -> Result<GdnOutput> {
    gdn_prefill_host_checkpointed(cuda, inputs, options, split, None)
}

/// [`gdn_prefill_host`] that also returns the state every `checkpoint_every` tokens of each
/// sequence (a positive multiple of 64; see [`super::gdn_prefill_checkpointed`]).
pub fn gdn_prefill_host_checkpointed(
    cuda: &Cuda,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    split: Split,
    checkpoint_every: Option<usize>,
) -> Result<GdnOutput> {
    validate_prefill(inputs, options)?;
    let uploaded = UploadedPrefill::new(cuda, inputs)?;
    let device_inputs = uploaded.inputs();
    let mut o = CudaTensor::poisoned(cuda, inputs.v.shape().to_vec(), inputs.v.dtype())?;
    let sequences = match inputs.cu_seqlens {
        Some(cu) => cu.len().saturating_sub(1),
        None => inputs.q.shape()[0],
    };
    let mut final_state = CudaTensor::poisoned(
        cuda,
        vec![
            sequences,
            inputs.v.shape()[2],
            inputs.q.shape()[3],
            inputs.v.shape()[3],
        ],
        DType::F32,
    )?;
    let launch = PrefillLaunch::new(
        cuda,
        &device_inputs,
        options,
        &mut PrefillStates::Separate {
            output_final_state: true,
        },
        &mut o,
        Some(&mut final_state),
        PrefillExtras {
            checkpoint_every,
            split,
        },
    )?;
    // SAFETY: launched at once, while this function holds every tensor it was prepared from.
    unsafe { launch.launch(cuda) }?;
    let checkpoints = launch.into_checkpoints();
    let o = o.download(cuda)?;
    let final_state = final_state.download(cuda)?;
    check_result_finite("o", &o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
    check_result_finite(
        "final_state",
        &final_state,
        "n, h, k, v",
        GDN_OVERFLOW_CAUSE,
    )?;
    Ok(GdnOutput {
        o,
        final_state,
        checkpoints: download_checkpoints(cuda, checkpoints.as_ref())?,
    })
}

/// Checkpoints copied to the host, refused when one overflowed.
fn download_checkpoints(
    cuda: &Cuda,
    checkpoints: Option<&super::CudaCheckpoints>,
) -> Result<Option<PrefillCheckpoints>> {
    let Some(checkpoints) = checkpoints else {
        return Ok(None);
    };
    let host = checkpoints.download(cuda)?;
    check_result_finite(
        "checkpoints",
        &host.states,
        "c, h, k, v",
        GDN_OVERFLOW_CAUSE,
    )?;
    Ok(Some(host))
}

/// Pooled prefill of host tensors on the GPU: the contract's full check on the host, the pool
/// and inputs uploaded, the kernels (each sequence from and back to its slot), `o` returned and
/// the pool copied back into `state_pool` (changed only when the call succeeded).
pub fn gdn_prefill_host_into_pool(
    cuda: &Cuda,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
) -> Result<HostTensor> {
    gdn_prefill_host_into_pool_checkpointed(
        cuda,
        inputs,
        options,
        state_pool,
        slot_indices,
        None,
        Split::Auto,
    )
    .map(|(o, _)| o)
}

/// [`gdn_prefill_host_into_pool`] that also returns the state every `checkpoint_every` tokens
/// of each sequence, and may force how long sequences are split (`split`).
pub fn gdn_prefill_host_into_pool_checkpointed(
    cuda: &Cuda,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
    checkpoint_every: Option<usize>,
    split: Split,
) -> Result<(HostTensor, Option<PrefillCheckpoints>)> {
    validate_prefill(inputs, options)?;
    let uploaded = UploadedPrefill::new(cuda, inputs)?;
    let device_inputs = uploaded.inputs();
    let mut pool = CudaTensor::upload(cuda, state_pool)?;
    let slots = CudaTensor::upload(cuda, slot_indices)?;
    let out = gdn_prefill_checkpointed(
        cuda,
        &device_inputs,
        options,
        PrefillStates::Pool {
            pool: &mut pool,
            slot_indices: &slots,
        },
        checkpoint_every,
        split,
    )?;
    let o = out.o.download(cuda)?;
    check_result_finite("o", &o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
    let checkpoints = download_checkpoints(cuda, out.checkpoints.as_ref())?;
    let pool = pool.download(cuda)?;
    check_result_finite("state_pool", &pool, "s, h, k, v", GDN_OVERFLOW_CAUSE)?;
    *state_pool = pool;
    Ok((o, checkpoints))
}
