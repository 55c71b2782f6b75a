//! Prefill over a state pool on the CPU (the contract's rules: `deltakv_contract::gdn::prefill::pool`).

use super::gdn_prefill_checkpointed;
use deltakv_contract::gdn::prefill::checkpoint::PrefillCheckpoints;
use deltakv_contract::gdn::prefill::pool::check_pooled_prefill;
use deltakv_contract::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv_contract::tensor::HostTensor;
use deltakv_contract::{Error, Result};

/// GDN prefill whose initial states are read from, and final states written to, the slots
/// `slot_indices [N]` of `state_pool [slots, H, K, V]` f32; returns `o`. `inputs.initial_state`
/// must be `None`. The pool changes only when the whole call succeeded.
pub fn gdn_prefill_into_pool(
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
) -> Result<HostTensor> {
    gdn_prefill_into_pool_checkpointed(inputs, options, mode, state_pool, slot_indices, None)
        .map(|(o, _)| o)
}

/// [`gdn_prefill_into_pool`] that also returns the state every `checkpoint_every` tokens of each
/// sequence (see [`super::gdn_prefill_checkpointed`]).
pub fn gdn_prefill_into_pool_checkpointed(
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
    checkpoint_every: Option<usize>,
) -> Result<(HostTensor, Option<PrefillCheckpoints>)> {
    let (shapes, slots) = check_pooled_prefill(inputs, options, &*state_pool, slot_indices)?;
    let d = shapes.dims;
    let state_len = d.value_heads * d.key_dim * d.value_dim;
    let pool_dtype = state_pool.dtype();
    let pool = state_pool
        .as_f32_mut()
        .ok_or_else(|| Error::dtype("state_pool", pool_dtype, "f32"))?;
    let mut initial = Vec::with_capacity(slots.len() * state_len);
    for &slot in &slots {
        initial.extend_from_slice(&pool[slot * state_len..][..state_len]);
    }
    let initial = HostTensor::from_f32(
        vec![slots.len(), d.value_heads, d.key_dim, d.value_dim],
        initial,
    )?;
    let out = gdn_prefill_checkpointed(
        &GdnInputs {
            initial_state: Some(&initial),
            ..*inputs
        },
        options,
        mode,
        checkpoint_every,
    )?;
    let finals = out
        .final_state
        .as_f32()
        .ok_or_else(|| Error::dtype("final_state", out.final_state.dtype(), "f32"))?;
    for (n, &slot) in slots.iter().enumerate() {
        pool[slot * state_len..][..state_len]
            .copy_from_slice(&finals[n * state_len..][..state_len]);
    }
    Ok((out.o, out.checkpoints))
}
