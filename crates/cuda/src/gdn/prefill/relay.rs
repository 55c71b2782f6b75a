//! The relay (see `plan`): a long sequence's first segment walked with its outputs on a
//! second stream while the lead walk carries its state to the segment's end on the call's
//! stream, where the second segment's outputs start.
//!
//! ```text
//! call's stream:  prepare ─┬─ first segments (and whole sequences) with outputs ────┬─ copies
//! side stream:             └─ lead (first segments, no outputs) ── second segments ─┘
//! ```
//!
//! The first segments' walk, the longer of the two paths, is the prepare's programmatic
//! dependent on the call's stream ([`Kernel::launch_dependent`]).
//!
//! The second segments store their final states into a scratch buffer, copied to the caller's
//! rows after the join: a final state that shares memory with an initial state (a state pool,
//! whose slots are both) must not be written while the side stream may still be reading it.

use super::kernels::{PrefillParams, walk_grid};
use super::launch::LoadedKernel;
use super::plan::SEGMENT_FIELDS;
use crate::runtime::{Cuda, driver_error};
use deltakv_contract::Result;

/// What the relay launches beside the call's other kernels.
pub(super) struct RelayLaunch {
    /// The lead's kernel.
    pub lead: LoadedKernel,
    /// The first segments and whole sequences (table records 0 .. N): entry states from the
    /// initial states. The lead reads the same parameters (its records are the first R).
    pub first: PrefillParams,
    /// The second segments (records N .. N + R): entry states from the lead's hand-over,
    /// final states into the scratch rows of their sequences.
    pub second: PrefillParams,
    /// (destination, source, bytes) of each relayed sequence's final state, when asked.
    pub final_copies: Vec<(u64, u64, usize)>,
    /// N: the first segments' launch walks a segment record per sequence (grid z).
    pub sequences: u32,
    /// R: the lead's and the second segments' launches walk one per relayed sequence.
    pub relayed: u32,
}

/// Where the relayed sequences' final states are staged and where they go.
pub(super) struct FinalStaging {
    /// `[N, H, K, V]` f32 scratch, row n for sequence n.
    pub scratch: u64,
    /// (sequence, destination row) of each relayed sequence: its slot in a pool, else itself.
    pub rows: Vec<(usize, u64)>,
    /// Bytes of one `[H, K, V]` f32 state.
    pub state_bytes: usize,
}

impl RelayLaunch {
    /// The parameters of both launches from the call's: `table` is the segment table's device
    /// address, `sequences` N, `relayed` R, `hand_over` the lead's states `[R, H, KP, VP]`;
    /// `staging` when the call writes final states.
    pub fn new(
        lead: LoadedKernel,
        params: &PrefillParams,
        table: u64,
        (sequences, relayed): (usize, usize),
        hand_over: u64,
        staging: Option<FinalStaging>,
    ) -> Self {
        let first = PrefillParams {
            use_segment_states: 0,
            segment_states: hand_over,
            ..*params
        };
        let second = PrefillParams {
            segments: table + (sequences * SEGMENT_FIELDS * 4) as u64,
            use_segment_states: 1,
            segment_states: hand_over,
            final_state: staging.as_ref().map_or(0, |s| s.scratch),
            // The scratch's rows are the sequences (no pool slots).
            state_rows: 0,
            ..*params
        };
        // Staging exists only where the call writes final states (params.final_state is set).
        let final_copies = staging.map_or_else(Vec::new, |staging| {
            let bytes = staging.state_bytes;
            let rows = staging.rows.into_iter();
            rows.map(|(n, row)| {
                let to = params.final_state + row * bytes as u64;
                (to, staging.scratch + (n * bytes) as u64, bytes)
            })
            .collect()
        });
        Self {
            lead,
            first,
            second,
            final_copies,
            sequences: sequences as u32,
            relayed: relayed as u32,
        }
    }

    /// Queues the state pass of a relayed call after its prepare: `state` is the pass that
    /// writes the outputs, over `heads` and `tiles` column tiles (`walk_grid`).
    pub fn launch(&self, cuda: &Cuda, state: &LoadedKernel, heads: u32, tiles: u32) -> Result<()> {
        let (sequences, relayed) = (self.sequences, self.relayed);
        let pass = |params, grid| state.with(params, grid, "gdn_prefill_state (relay)");
        let side = cuda.fork_side()?;
        let lead = self.lead.with(
            &self.first,
            walk_grid(relayed, heads, tiles),
            "gdn_prefill_lead",
        );
        let queued = lead
            .launch(&side)
            .and_then(|()| pass(&self.second, walk_grid(relayed, heads, tiles)).launch(&side))
            .and_then(|()| {
                pass(&self.first, walk_grid(sequences, heads, tiles))
                    .launch_dependent(cuda, cuda.stream())
            });
        // Joined whatever failed: the call's buffers are freed on its stream, after the work
        // queued there, so the side stream's work must be part of that work.
        let joined = cuda.join_side(&side);
        queued?;
        joined?;
        for &(to, from, bytes) in &self.final_copies {
            // SAFETY: both ranges lie inside live f32 buffers of [*, H, K, V] states (the
            // caller's final states or pool, and the scratch sized for every sequence).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    to,
                    from,
                    bytes,
                    cuda.stream().cu_stream(),
                )
            }
            .map_err(|e| driver_error("copying a relayed final state", e))?;
        }
        Ok(())
    }
}
