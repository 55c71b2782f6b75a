//! Prefill over a state pool: sequence `n` starts from slot `slot_indices[n]` of a
//! `[slots, H, K, V]` f32 pool and its final state is written back to that slot, so a prompt's
//! prefill lands where the decode steps that follow read (no gather or scatter by the caller).
//! Every backend checks a call with [`pool_slots`] before touching the pool (on the host,
//! [`check_pooled_prefill`]: the whole call's shapes first).

use super::validate::{PrefillShapes, check_prefill_shapes};
use super::{GdnInputs, GdnOptions};
use crate::error::{Error, Result};
use crate::gdn::decode::validate::slot_rows;
use crate::gdn::shapes::GdnDims;
use crate::tensor::{DType, HostTensor, TensorMeta};
use crate::view::HostData;

/// Fails when a pooled prefill is also given an `initial_state` (`given`): its sequences start
/// from their slots.
pub fn refuse_initial_state(given: bool) -> Result<()> {
    if given {
        return Err(Error::InvalidValue(
            "initial_state and a state pool were both given: a pooled prefill reads each \
             sequence's initial state from its slot"
                .to_string(),
        ));
    }
    Ok(())
}

/// What a pooled prefill of host inputs checks before anything moves: no `initial_state` beside
/// the pool ([`refuse_initial_state`]), every shape and dtype of the call
/// ([`check_prefill_shapes`]), and the slots ([`pool_slots`]). Returns the call's shapes and the
/// slot of each sequence; the values are left to the prefill's own validation.
pub fn check_pooled_prefill<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
    state_pool: &impl TensorMeta,
    slot_indices: &HostTensor,
) -> Result<(PrefillShapes, Vec<usize>)> {
    refuse_initial_state(inputs.initial_state.is_some())?;
    let shapes = check_prefill_shapes(inputs, options)?;
    let slots = pool_slots(state_pool, slot_indices, &shapes.dims, shapes.seqs.len())?;
    Ok((shapes, slots))
}

/// The pool slot of each of the `sequences` sequences of a call: `state_pool` must be
/// `[slots, H, K, V]` f32 for the call's dims, `slot_indices` `[N]` i32 or i64 with every entry
/// in range, none negative (a pooled prefill gives every sequence a slot) and none repeated.
pub fn pool_slots(
    state_pool: &impl TensorMeta,
    slot_indices: &HostTensor,
    dims: &GdnDims,
    sequences: usize,
) -> Result<Vec<usize>> {
    if state_pool.dtype() != DType::F32 {
        return Err(Error::dtype("state_pool", state_pool.dtype(), "f32"));
    }
    let slots = state_pool.shape().first().copied().unwrap_or(0);
    let expected = [slots, dims.value_heads, dims.key_dim, dims.value_dim];
    if state_pool.shape() != expected {
        return Err(Error::shape(
            "state_pool",
            format!(
                "expected [slots, H, K, V] = [S, {}, {}, {}], got {:?}",
                dims.value_heads,
                dims.key_dim,
                dims.value_dim,
                state_pool.shape()
            ),
        ));
    }
    slot_rows(slot_indices, sequences, slots)?
        .into_iter()
        .enumerate()
        .map(|(n, slot)| {
            slot.ok_or_else(|| {
                Error::InvalidValue(format!(
                    "slot_indices[{n}] is negative: every sequence of a pooled prefill needs a slot"
                ))
            })
        })
        .collect()
}
