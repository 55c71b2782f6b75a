//! The prefill's states beyond FLA's call, on wgpu: checkpoints every N tokens, and prefills
//! whose initial states come from, and whose final states go to, slots of a device state pool
//! (the pool `gdn_decode` advances), both as the contract defines them
//! (`deltakv_contract::gdn::prefill::{checkpoint, pool}`).
//!
//! Checkpoints: every checkpoint falls on the end of a 32-token chunk (the spacing is a multiple
//! of 64), so the outputs walk of the chunked state pass stores the state it holds after each
//! chunk that a per-chunk table names (`CKPT = 1` in `chunks_state.wgsl`, the general and staged
//! walks; segments of a split sequence start from their entry states, so the same table serves
//! them). Pipelines of calls without checkpoints are built without that code.
//!
//! Pools: a pooled prefill copies its sequences' slots into the prefill's state buffer on the
//! device, runs, checks the results, and only then copies the final states into the slots, so
//! a call that fails leaves the pool as it was.

use super::chunks::{CHUNK, ChunkCheckpoints};
use super::prefill::{PrefillExtras, PreparedPrefill};
use super::state_plan::StatePlan;
use crate::runtime::Wgpu;
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, PrefillCheckpoints};
use deltakv_contract::gdn::prefill::pool::check_pooled_prefill;
use deltakv_contract::gdn::prefill::validate::SeqSpan;
use deltakv_contract::gdn::{GDN_OVERFLOW_CAUSE, GdnDims, GdnInputs, GdnOptions, PrefillMode};
use deltakv_contract::tensor::check_result_finite;
use deltakv_contract::{DType, HostTensor, Result};

/// The checkpoints of a prepared prefill on the device: the `[C, H, K, V]` result (poisoned
/// first, so a row the walk does not store shows as NaN) and the per-chunk table.
pub(crate) struct DeviceCheckpoints {
    plan: CheckpointPlan,
    states: WgpuTensor,
    table: WgpuTensor,
}

impl DeviceCheckpoints {
    pub(crate) fn new(
        wgpu: &Wgpu,
        plan: CheckpointPlan,
        seqs: &[SeqSpan],
        dims: &GdnDims,
    ) -> Result<Self> {
        let rows = plan.chunk_table(seqs, CHUNK)?;
        let bytes: Vec<u8> = rows.iter().flat_map(|r| r.to_le_bytes()).collect();
        let table = WgpuTensor::upload(
            wgpu,
            &HostTensor::from_le_bytes(vec![rows.len()], DType::I32, &bytes)?,
        )?;
        let states = WgpuTensor::poisoned(wgpu, plan.shape(dims), DType::F32)?;
        Ok(Self {
            plan,
            states,
            table,
        })
    }

    /// Where the outputs walk stores them.
    pub(crate) fn bindings(&self) -> ChunkCheckpoints<'_> {
        ChunkCheckpoints {
            states: &self.states,
            table: &self.table,
        }
    }

    /// The checkpoints on the host, refusing any that overflowed f32.
    pub(crate) fn download(&self, wgpu: &Wgpu) -> Result<PrefillCheckpoints> {
        let states = self.states.download(wgpu)?;
        check_result_finite("checkpoints", &states, "c, h, k, v", GDN_OVERFLOW_CAUSE)?;
        Ok(PrefillCheckpoints {
            states,
            offsets: self.plan.offsets_tensor()?,
            every: self.plan.every,
        })
    }
}

/// Queues one copy per `(from_row, to_row)` of whole `[H, K, V]` f32 states.
fn copy_states(
    wgpu: &Wgpu,
    from: &WgpuTensor,
    to: &WgpuTensor,
    rows: impl Iterator<Item = (usize, usize)>,
    state_bytes: u64,
    what: &str,
) -> Result<()> {
    wgpu.submit_commands(what, |encoder| {
        for (from_row, to_row) in rows {
            encoder.copy_buffer_to_buffer(
                from.buffer(),
                from_row as u64 * state_bytes,
                to.buffer(),
                to_row as u64 * state_bytes,
                state_bytes,
            );
        }
    })
}

/// GDN prefill of host inputs whose initial states are read from, and final states written to,
/// the slots `slot_indices [N]` (i32 or i64, in range, distinct) of `state_pool [slots, H, K,
/// V]` f32 on the device, the pool `gdn_decode` advances: a prompt's states land where its
/// decode steps read them. Returns `o` (v's dtype) and, with `checkpoint_every`, the
/// checkpoints, on the host. `inputs.initial_state` must be `None`. The slots change only when
/// the call succeeded (a result that overflowed f32 is an error and leaves the pool as it was).
pub fn gdn_prefill_into_pool(
    wgpu: &Wgpu,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut WgpuTensor,
    slot_indices: &HostTensor,
    checkpoint_every: Option<usize>,
) -> Result<(HostTensor, Option<PrefillCheckpoints>)> {
    // Shapes and slots here; the values are checked once, by the prefill's own validation,
    // before anything is written to the pool.
    let (shapes, slots) = check_pooled_prefill(inputs, options, &*state_pool, slot_indices)?;
    let d = shapes.dims;
    let state_bytes = (4 * d.value_heads * d.key_dim * d.value_dim) as u64;
    let initial = WgpuTensor::zeros(
        wgpu,
        vec![slots.len(), d.value_heads, d.key_dim, d.value_dim],
        DType::F32,
    )?;
    copy_states(
        wgpu,
        state_pool,
        &initial,
        slots.iter().enumerate().map(|(n, &slot)| (slot, n)),
        state_bytes,
        "reading the pool's slots",
    )?;
    let extras = PrefillExtras {
        initial_state: Some(initial),
        checkpoint_every,
    };
    let prepared = PreparedPrefill::build(
        wgpu,
        inputs,
        options,
        mode,
        &StatePlan::from_env_once()?,
        extras,
    )?;
    prepared.submit(wgpu, 1)?;
    let out = prepared.outputs(wgpu)?;
    copy_states(
        wgpu,
        prepared.final_states(),
        state_pool,
        slots.iter().enumerate().map(|(n, &slot)| (n, slot)),
        state_bytes,
        "writing the final states into the pool's slots",
    )?;
    Ok((out.o, out.checkpoints))
}

/// [`gdn_prefill_into_pool`] over a host pool: the pool travels to the device and back (a
/// convenience for files and tests; a serving loop keeps its pool on the device).
pub fn gdn_prefill_host_into_pool(
    wgpu: &Wgpu,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
    checkpoint_every: Option<usize>,
) -> Result<(HostTensor, Option<PrefillCheckpoints>)> {
    // A call refused on its shapes or slots never copies the pool.
    check_pooled_prefill(inputs, options, &*state_pool, slot_indices)?;
    let mut pool = WgpuTensor::upload(wgpu, state_pool)?;
    let out = gdn_prefill_into_pool(
        wgpu,
        inputs,
        options,
        mode,
        &mut pool,
        slot_indices,
        checkpoint_every,
    )?;
    *state_pool = pool.download(wgpu)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::chunks::NO_CHECKPOINT;
    use super::*;

    fn spans(lens: &[usize]) -> Vec<SeqSpan> {
        SeqSpan::back_to_back(lens)
    }

    #[test]
    fn each_chunk_names_the_checkpoint_taken_after_it() {
        // Every 64 tokens (two chunks of 32): 150 tokens -> 5 chunks, checkpoints after
        // chunks 1 and 3 (tokens 64, 128; rows 0, 1); 64 tokens -> 2 chunks ending on row 2;
        // 5 tokens -> one chunk, none.
        let seqs = spans(&[150, 64, 5]);
        let plan = CheckpointPlan::new(64, &seqs).unwrap();
        let none = NO_CHECKPOINT;
        assert_eq!(
            plan.chunk_table(&seqs, CHUNK).unwrap(),
            [none, 0, none, 1, none, none, 2, none]
        );
    }
}
