//! Host-tensor entry points of the CUDA backend: copy the inputs to the GPU, run, copy the
//! results back. For files, tests and one-off calls; a serving loop keeps its tensors on the
//! GPU and calls `deltakv::cuda` directly.

use deltakv_core::gdn::{DecodeInputs, DecodeOptions, DecodeOutput};
use deltakv_core::{HostTensor, Result};
use deltakv_cuda::{Cuda, CudaTensor};

/// GDN decode of host tensors on the GPU, with the contract's full check of the inputs'
/// values before launch and of the results after; `state_pool` is replaced by the updated
/// pool (as on the CPU, a result that overflowed is an error and the addressed slots then hold
/// the overflowed states).
pub fn gdn_decode(
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    let cuda = Cuda::get()?;
    let up = |t: &HostTensor| CudaTensor::upload(cuda, t);
    let (q, k, v, slots) = (
        up(inputs.q)?,
        up(inputs.k)?,
        up(inputs.v)?,
        up(inputs.slot_indices)?,
    );
    let gates = (inputs.gating.tensors().into_iter())
        .map(up)
        .collect::<Result<Vec<_>>>()?;
    let gating = inputs.gating.with_tensors(&gates)?;
    let device_inputs = DecodeInputs {
        q: &q,
        k: &k,
        v: &v,
        gating,
        slot_indices: &slots,
    };
    // The contract's value checks run on the host copies, before anything is uploaded twice.
    let shapes = deltakv_core::gdn::decode_validate::check_decode_shapes(inputs, state_pool)?;
    deltakv_core::gdn::decode_validate::prepare_decode_values(
        inputs,
        shapes,
        state_pool.dtype(),
        &options.gdn,
    )?;
    let mut pool = up(state_pool)?;
    let out = deltakv_cuda::gdn::gdn_decode(cuda, &device_inputs, &mut pool, options)?;
    let output = DecodeOutput {
        o: out.o.download(cuda)?,
        intermediate_states: out
            .intermediate_states
            .map(|t| t.download(cuda))
            .transpose()?,
    };
    *state_pool = pool.download(cuda)?;
    // As on the CPU: a result that overflowed f32 from finite inputs is an error.
    output.check_finite()?;
    Ok(output)
}
