//! The prefill's states beyond FLA's call, on wgpu: checkpoints every N tokens, and prefills
//! whose initial states come from, and whose final states go to, slots of a device state pool
//! (the pool `gdn_decode` advances), both as the contract defines them
//! (`deltakv_contract::gdn::prefill::{checkpoint, pool}`).
//!
//! Checkpoints: the chunked state pass cuts each sequence into segments at its checkpoint
//! positions (`Segmenting::Every`), so the combine's entry state of segment `i` is the state
//! after `i N` tokens: checkpoint `i` of that sequence. A copy on the device takes those rows
//! (one contiguous range per sequence) into the `[C, H, K, V]` result, and the final state
//! where a sequence ends on a checkpoint. The cost is the two-level scan's: the transition walk
//! and the combine run before the outputs walk.
//!
//! Pools: a pooled prefill copies its sequences' slots into the prefill's state buffer on the
//! device, runs, checks the results, and only then copies the final states into the slots, so
//! a call that fails leaves the pool as it was.

use super::chunks::EntryStates;
use super::prefill::{PrefillExtras, PreparedPrefill};
use super::state_plan::StatePlan;
use crate::runtime::Wgpu;
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, PrefillCheckpoints};
use deltakv_contract::gdn::prefill::pool::pool_slots;
use deltakv_contract::gdn::prefill::validate::validate_prefill;
use deltakv_contract::gdn::{GDN_OVERFLOW_CAUSE, GdnDims, GdnInputs, GdnOptions, PrefillMode};
use deltakv_contract::tensor::check_result_finite;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// One copy into the checkpoint tensor: `rows` states from `source`, to row `row` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CheckpointCopy {
    source: StateSource,
    row: usize,
    rows: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StateSource {
    /// Entry states of the segment states buffer from this slot on.
    Entry(usize),
    /// The final state of this sequence.
    Final(usize),
}

/// The checkpoints of a prepared prefill: where they go and where each comes from.
pub(crate) struct DeviceCheckpoints {
    plan: CheckpointPlan,
    states: WgpuTensor,
    copies: Vec<CheckpointCopy>,
    /// Bytes of one `[H, K, V]` f32 state.
    state_bytes: u64,
}

/// The copies that fill the checkpoint rows of `plan`: per sequence, its segments' entry
/// states after the first (`split_slots`, see [`EntryStates`]), then its final state when it
/// ends on a checkpoint. Fails (an internal error) if the segments do not match the plan.
fn checkpoint_copies(
    plan: &CheckpointPlan,
    split_slots: &[Option<(usize, usize)>],
) -> Result<Vec<CheckpointCopy>> {
    let mut copies = Vec::new();
    for (n, rows) in plan.offsets.windows(2).enumerate() {
        let (first_row, count) = (rows[0], rows[1] - rows[0]);
        let from_entries = match split_slots.get(n).copied().flatten() {
            Some((first_slot, segments)) => {
                let from_entries = count.min(segments - 1);
                if from_entries > 0 {
                    copies.push(CheckpointCopy {
                        source: StateSource::Entry(first_slot + 1),
                        row: first_row,
                        rows: from_entries,
                    });
                }
                from_entries
            }
            None => 0,
        };
        match count - from_entries {
            0 => {}
            1 => copies.push(CheckpointCopy {
                source: StateSource::Final(n),
                row: first_row + from_entries,
                rows: 1,
            }),
            missing => {
                return Err(launcher_defect(format!(
                    "sequence {n} has {count} checkpoints but its segments give {from_entries} \
                     and its end one ({missing} unplaced)"
                )));
            }
        }
    }
    Ok(copies)
}

/// An error for a launch whose segments do not match its checkpoints (never expected).
fn launcher_defect(what: String) -> Error {
    Error::Backend {
        device: "wgpu".to_string(),
        message: format!("prefill checkpoints: {what} (a launcher defect)"),
    }
}

impl DeviceCheckpoints {
    /// The checkpoint tensor (poisoned, so a row no copy writes shows as NaN) and its copies.
    pub(crate) fn new(
        wgpu: &Wgpu,
        plan: CheckpointPlan,
        dims: &GdnDims,
        entries: Option<EntryStates<'_>>,
    ) -> Result<Self> {
        let no_splits = vec![None; plan.offsets.len().saturating_sub(1)];
        let split_slots = entries.as_ref().map_or(&no_splits[..], |e| e.split_slots);
        let copies = checkpoint_copies(&plan, split_slots)?;
        let states = WgpuTensor::poisoned(wgpu, plan.shape(dims), DType::F32)?;
        let state_bytes = (4 * dims.value_heads * dims.key_dim * dims.value_dim) as u64;
        Ok(Self {
            plan,
            states,
            copies,
            state_bytes,
        })
    }

    /// Queues the copies from a submitted launch's entry states and final states.
    pub(crate) fn copy(
        &self,
        wgpu: &Wgpu,
        entries: Option<EntryStates<'_>>,
        final_states: &WgpuTensor,
    ) -> Result<()> {
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let bytes = self.state_bytes;
        for copy in &self.copies {
            let (buffer, offset) = match (copy.source, &entries) {
                (StateSource::Entry(slot), Some(e)) => (e.buffer, e.offset + slot as u64 * bytes),
                (StateSource::Final(n), _) => (final_states.buffer(), n as u64 * bytes),
                (StateSource::Entry(_), None) => {
                    return Err(launcher_defect(
                        "a checkpoint copy has no segment states".to_string(),
                    ));
                }
            };
            encoder.copy_buffer_to_buffer(
                buffer,
                offset,
                self.states.buffer(),
                copy.row as u64 * bytes,
                copy.rows as u64 * bytes,
            );
        }
        wgpu.queue().submit([encoder.finish()]);
        wgpu.check("copying the prefill's state checkpoints")
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
    let mut encoder = wgpu
        .device()
        .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    for (from_row, to_row) in rows {
        encoder.copy_buffer_to_buffer(
            from.buffer(),
            from_row as u64 * state_bytes,
            to.buffer(),
            to_row as u64 * state_bytes,
            state_bytes,
        );
    }
    wgpu.queue().submit([encoder.finish()]);
    wgpu.check(what)
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
    if inputs.initial_state.is_some() {
        return Err(Error::InvalidValue(
            "initial_state and a state pool were both given: a pooled prefill reads each \
             sequence's initial state from its slot"
                .to_string(),
        ));
    }
    let (shapes, _) = validate_prefill(inputs, options)?;
    let d = shapes.dims;
    let slots = pool_slots(&*state_pool, slot_indices, &d, shapes.seqs.len())?;
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
    let (shapes, _) = validate_prefill(inputs, options)?;
    pool_slots(&*state_pool, slot_indices, &shapes.dims, shapes.seqs.len())?;
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
    use super::*;
    use deltakv_contract::gdn::prefill::validate::SeqSpan;

    fn spans(lens: &[usize]) -> Vec<SeqSpan> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let s = SeqSpan { start, len };
                start += len;
                s
            })
            .collect()
    }

    #[test]
    fn checkpoints_come_from_segment_entries_then_the_final_state() {
        // Every 128 tokens (4 chunks of 32): 300 tokens -> 3 segments, checkpoints at 128 and
        // 256 (entries of slots 1 and 2); 128 tokens -> one unit ending on its checkpoint;
        // 512 tokens -> 4 segments (slots 3..7), checkpoints at 128, 256, 384 from entries and
        // 512 from the final state; 5 tokens -> none.
        let plan = CheckpointPlan::new(128, &spans(&[300, 128, 512, 5])).unwrap();
        let split = [Some((0, 3)), None, Some((3, 4)), None];
        let copies = checkpoint_copies(&plan, &split).unwrap();
        let entry = |slot, row, rows| CheckpointCopy {
            source: StateSource::Entry(slot),
            row,
            rows,
        };
        let last = |n, row| CheckpointCopy {
            source: StateSource::Final(n),
            row,
            rows: 1,
        };
        assert_eq!(
            copies,
            [entry(1, 0, 2), last(1, 2), entry(4, 3, 3), last(2, 6)]
        );
        // A plan the segments cannot fill is a defect, not a silent hole.
        let err = checkpoint_copies(&plan, &[None, None, None, None]).unwrap_err();
        assert!(err.to_string().contains("launcher defect"), "{err}");
    }
}
