//! GDN prefill on the CPU: the entry point, the recurrent path, and the assembly of outputs.
//! The chunked WY path is `chunk.rs`; `prepare.rs` validates and prepares the inputs.
//!
//! Work is split over (sequence, value head) with rayon; each task owns its final-state slab and
//! writes its own rows of `o`.

mod chunk;
mod pool;
pub(crate) mod prepare;

pub use pool::{gdn_prefill_into_pool, gdn_prefill_into_pool_checkpointed};

use super::recurrent::{
    BLOCK, StateBlock, TokenStep, dot, load_block, pad_value, step_block, store_block,
};
use crate::rows::{OutputBuffer, RowWriter};
use crate::scan::check_result_finite;
use chunk::{CHUNK, ChunkScratch, chunk_step};
use deltakv_contract::Result;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, PrefillCheckpoints};
use deltakv_contract::gdn::{GDN_OVERFLOW_CAUSE, GdnInputs, GdnOptions, GdnOutput, PrefillMode};
use deltakv_contract::tensor::HostTensor;
use deltakv_contract::view::HostData;
use prepare::{PreparedGdn, prepare_prefill};
use rayon::prelude::*;

/// Runs GDN prefill on the CPU.
///
/// Sequences advance in lockstep, 64 tokens at a time: at each step every (sequence, value
/// head) task runs its next chunk in parallel. All heads of a step read the same few hundred
/// KiB of token rows, so inputs stream through the cache once instead of once per head at an
/// 8 KiB stride (a TLB miss per row).
///
/// The inputs are read where they are: owned [`HostTensor`]s, or
/// [`deltakv_contract::view::HostView`]s over a caller's memory.
pub fn gdn_prefill<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
    mode: PrefillMode,
) -> Result<GdnOutput> {
    gdn_prefill_checkpointed(inputs, options, mode, None)
}

/// [`gdn_prefill`] that also returns the state every `checkpoint_every` tokens of each
/// sequence (a positive multiple of 64; the layout is the contract's,
/// `deltakv_contract::gdn::prefill::checkpoint`). Checkpoints fall on the ends of the 64-token
/// steps, so they are copies of the state the step leaves.
pub fn gdn_prefill_checkpointed<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
    mode: PrefillMode,
    checkpoint_every: Option<usize>,
) -> Result<GdnOutput> {
    let p = prepare_prefill(inputs, options)?;
    let plan = CheckpointPlan::optional(checkpoint_every, &p.seqs)?;
    let d = p.dims;
    let state_len = d.key_dim * d.value_dim;
    let heads_len = d.value_heads * state_len;
    let mut checkpoints =
        vec![f32::NAN; plan.as_ref().map_or(0, CheckpointPlan::total) * heads_len];
    // Poisoned so that any element a kernel forgets to write shows up as NaN.
    let mut o = OutputBuffer::poisoned(
        p.out_dtype,
        d.batch * d.tokens * d.value_heads * d.value_dim,
    );
    let mut final_state = vec![f32::NAN; p.seqs.len() * d.value_heads * state_len];
    final_state
        .par_chunks_mut(state_len)
        .enumerate()
        .for_each(|(task, state)| match p.initial_state {
            Some(init) => state.copy_from_slice(&init[task * state_len..][..state_len]),
            None => state.fill(0.0),
        });
    let longest = p.seqs.iter().map(|s| s.len).max().unwrap_or(0);
    let o_writer = o.writer();
    for step_start in (0..longest).step_by(CHUNK) {
        final_state
            .par_chunks_mut(state_len)
            .enumerate()
            .for_each(|(task, state)| {
                let (n, head) = (task / d.value_heads, task % d.value_heads);
                let seq = p.seqs[n];
                if step_start >= seq.len {
                    return;
                }
                let tokens = CHUNK.min(seq.len - step_start);
                let first_row = seq.start + step_start;
                WORKSPACE.with_borrow_mut(|ws| match mode {
                    PrefillMode::Chunk => {
                        let scratch = ws.chunk(d.key_dim, d.value_dim);
                        chunk_step(&p, first_row, tokens, head, state, scratch, &o_writer)
                    }
                    PrefillMode::Recurrent => {
                        let scratch = ws.recurrent(d.key_dim, d.value_dim);
                        recurrent_step(&p, first_row, tokens, head, state, scratch, &o_writer)
                    }
                });
            });
        // Every sequence is at the same position after a step; a partial last chunk never
        // ends on a checkpoint (a multiple of 64).
        if let Some(plan) = &plan {
            let position = step_start + CHUNK;
            for n in 0..p.seqs.len() {
                if let Some(row) = plan.row_at(n, position) {
                    checkpoints[row * heads_len..][..heads_len]
                        .copy_from_slice(&final_state[n * heads_len..][..heads_len]);
                }
            }
        }
    }
    let o = o.into_tensor(vec![d.batch, d.tokens, d.value_heads, d.value_dim])?;
    let final_state = HostTensor::from_f32(
        vec![p.seqs.len(), d.value_heads, d.key_dim, d.value_dim],
        final_state,
    )?;
    // Finite inputs can still overflow (huge v and beta, a state driven past f32's range);
    // a NaN-filled result is refused rather than returned.
    check_result_finite("o", &o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
    check_result_finite(
        "final_state",
        &final_state,
        "n, h, k, v",
        GDN_OVERFLOW_CAUSE,
    )?;
    let checkpoints = match plan {
        Some(plan) => {
            let states = HostTensor::from_f32(plan.shape(&d), checkpoints)?;
            check_result_finite("checkpoints", &states, "c, h, k, v", GDN_OVERFLOW_CAUSE)?;
            Some(PrefillCheckpoints {
                states,
                offsets: plan.offsets_tensor()?,
                every: plan.every,
            })
        }
        None => None,
    };
    Ok(GdnOutput {
        o,
        final_state,
        checkpoints,
    })
}

/// Per-thread scratch, kept across steps and calls (rebuilt when head dims change).
#[derive(Default)]
struct Workspace {
    chunk: Option<((usize, usize), ChunkScratch)>,
    recurrent: Option<((usize, usize), RecurrentScratch)>,
}

/// The scratch in `slot` for head dims (kd, vd), built by `make` when absent or for other dims.
fn kept<S>(
    slot: &mut Option<((usize, usize), S)>,
    kd: usize,
    vd: usize,
    make: impl FnOnce(usize, usize) -> S,
) -> &mut S {
    if slot.as_ref().is_none_or(|(dims, _)| *dims != (kd, vd)) {
        *slot = Some(((kd, vd), make(kd, vd)));
    }
    &mut slot.as_mut().expect("just set").1
}

impl Workspace {
    fn chunk(&mut self, kd: usize, vd: usize) -> &mut ChunkScratch {
        kept(&mut self.chunk, kd, vd, ChunkScratch::new)
    }

    fn recurrent(&mut self, kd: usize, vd: usize) -> &mut RecurrentScratch {
        kept(&mut self.recurrent, kd, vd, RecurrentScratch::new)
    }
}

thread_local! {
    static WORKSPACE: std::cell::RefCell<Workspace> = std::cell::RefCell::new(Workspace::default());
}

/// Gathered (widened, normalised) inputs of up to [`CHUNK`] tokens for the recurrent path, so
/// that each state block is loaded once per group of tokens rather than once per token.
struct RecurrentScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
    decay: [f32; CHUNK],
    beta: [f32; CHUNK],
    key_dot_query: [f32; CHUNK],
    block: StateBlock,
}

impl RecurrentScratch {
    fn new(kd: usize, vd: usize) -> Self {
        Self {
            q: vec![0.0; CHUNK * kd],
            k: vec![0.0; CHUNK * kd],
            v: vec![0.0; CHUNK * vd],
            out: vec![0.0; CHUNK * vd],
            decay: [0.0; CHUNK],
            beta: [0.0; CHUNK],
            key_dot_query: [0.0; CHUNK],
            block: vec![[0.0; BLOCK]; kd],
        }
    }
}

/// The recurrence for value head `head` over `n <= CHUNK` tokens at flattened rows
/// `first_row..first_row + n`; `state` is updated in place.
fn recurrent_step(
    p: &PreparedGdn<'_>,
    first_row: usize,
    n: usize,
    head: usize,
    state: &mut [f32],
    s: &mut RecurrentScratch,
    o: &RowWriter<'_>,
) {
    let d = p.dims;
    let (kd, vd) = (d.key_dim, d.value_dim);
    let key_head = d.key_head_of(head);
    for i in 0..n {
        let row = first_row + i;
        p.read_q(row, key_head, &mut s.q[i * kd..]);
        p.read_k(row, key_head, &mut s.k[i * kd..]);
        p.read_v(row, head, &mut s.v[i * vd..]);
        let gate = row * d.value_heads + head;
        s.decay[i] = p.g[gate].exp();
        s.beta[i] = p.beta[gate];
        s.key_dot_query[i] = dot(&s.k[i * kd..][..kd], &s.q[i * kd..][..kd]);
    }
    let mut out_block = [0.0f32; BLOCK];
    for col0 in (0..vd).step_by(BLOCK) {
        let width = BLOCK.min(vd - col0);
        load_block(&mut s.block, state, vd, col0);
        for i in 0..n {
            let value = pad_value(&s.v[i * vd..][..vd], col0);
            let step = TokenStep {
                q: &s.q[i * kd..][..kd],
                k: &s.k[i * kd..][..kd],
                key_dot_query: s.key_dot_query[i],
                value: &value,
                decay: s.decay[i],
                beta: s.beta[i],
                scale: p.scale,
            };
            step_block(&mut s.block, &step, &mut out_block);
            s.out[i * vd + col0..][..width].copy_from_slice(&out_block[..width]);
        }
        store_block(&s.block, state, vd, col0);
    }
    for i in 0..n {
        // SAFETY: (row, head) belongs to this task alone.
        unsafe {
            o.write(
                ((first_row + i) * d.value_heads + head) * vd,
                &s.out[i * vd..][..vd],
            )
        };
    }
}
