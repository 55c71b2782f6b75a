//! GDN prefill on the CPU: the public entry point, the recurrent path, and the assembly of
//! outputs. The chunked WY path lives in `chunk.rs`.
//!
//! Work is split over (sequence, value head) with rayon; each task owns its final-state slab and
//! writes its own rows of `o`.

use super::chunk::chunk_head;
use super::recurrent_kernel::{
    BLOCK, StateBlock, TokenStep, dot, load_block, pad_value, step_block, store_block,
};
use super::validate::{PreparedGdn, SeqSpan, prepare_prefill};
use crate::error::Result;
use crate::rows::{OutputBuffer, RowWriter};
use crate::tensor::HostTensor;
use rayon::prelude::*;

/// The tensors of one prefill call (see the module docs of [`crate::gdn`] for shapes).
#[derive(Clone, Copy, Debug)]
pub struct GdnInputs<'a> {
    pub q: &'a HostTensor,
    pub k: &'a HostTensor,
    pub v: &'a HostTensor,
    pub g: &'a HostTensor,
    pub beta: &'a HostTensor,
    pub initial_state: Option<&'a HostTensor>,
    pub cu_seqlens: Option<&'a HostTensor>,
}

/// Scalar options shared by prefill and decode.
#[derive(Clone, Debug, Default)]
pub struct GdnOptions {
    /// Output scale; `None` means `K^-0.5`.
    pub scale: Option<f32>,
    /// Normalise q and k per head before use (FLA's `use_qk_l2norm_in_kernel`).
    pub use_qk_l2norm: bool,
}

/// Which prefill algorithm to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillMode {
    /// The chunked WY algorithm (64-token chunks, matrix products); the fast path.
    #[default]
    Chunk,
    /// Token-by-token recurrence; fine for short sequences, and an independent cross-check.
    Recurrent,
}

/// Prefill results.
#[derive(Clone, Debug)]
pub struct GdnOutput {
    /// `[B, T, H, V]` in v's dtype.
    pub o: HostTensor,
    /// `[N, H, K, V]` f32.
    pub final_state: HostTensor,
}

/// Runs GDN prefill on the CPU.
pub fn gdn_prefill(
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
) -> Result<GdnOutput> {
    let p = prepare_prefill(inputs, options)?;
    let d = p.dims;
    let state_len = d.key_dim * d.value_dim;
    // Poisoned so that any element a kernel forgets to write shows up as NaN.
    let mut o = OutputBuffer::poisoned(
        p.out_dtype,
        d.batch * d.tokens * d.value_heads * d.value_dim,
    );
    let mut final_state = vec![f32::NAN; p.seqs.len() * d.value_heads * state_len];
    {
        let o_writer = o.writer();
        final_state
            .par_chunks_mut(state_len)
            .enumerate()
            .for_each(|(task, state)| {
                let (n, head) = (task / d.value_heads, task % d.value_heads);
                match p.initial_state {
                    Some(init) => state.copy_from_slice(&init[task * state_len..][..state_len]),
                    None => state.fill(0.0),
                }
                match mode {
                    PrefillMode::Chunk => chunk_head(&p, p.seqs[n], head, state, &o_writer),
                    PrefillMode::Recurrent => recurrent_head(&p, p.seqs[n], head, state, &o_writer),
                }
            });
    }
    let o = o.into_tensor(vec![d.batch, d.tokens, d.value_heads, d.value_dim])?;
    let final_state = HostTensor::from_f32(
        vec![p.seqs.len(), d.value_heads, d.key_dim, d.value_dim],
        final_state,
    )?;
    Ok(GdnOutput { o, final_state })
}

/// Tokens gathered (widened, normalised) at a time by the recurrent path, so that each state
/// block is loaded once per group rather than once per token.
const TOKEN_GROUP: usize = 64;

/// The recurrence for one (sequence, value head). `state` holds the initial state on entry and
/// the final state on return.
fn recurrent_head(
    p: &PreparedGdn<'_>,
    seq: SeqSpan,
    head: usize,
    state: &mut [f32],
    o: &RowWriter<'_>,
) {
    let d = p.dims;
    let (kd, vd) = (d.key_dim, d.value_dim);
    let key_head = d.key_head_of(head);
    let mut q = vec![0.0f32; TOKEN_GROUP * kd];
    let mut k = vec![0.0f32; TOKEN_GROUP * kd];
    let mut v = vec![0.0f32; TOKEN_GROUP * vd];
    let mut out = vec![0.0f32; TOKEN_GROUP * vd];
    let mut decay = [0.0f32; TOKEN_GROUP];
    let mut beta = [0.0f32; TOKEN_GROUP];
    let mut key_dot_query = [0.0f32; TOKEN_GROUP];
    let mut block: StateBlock = vec![[0.0; BLOCK]; kd];
    let mut out_block = [0.0f32; BLOCK];
    for group_start in (0..seq.len).step_by(TOKEN_GROUP) {
        let n = TOKEN_GROUP.min(seq.len - group_start);
        let first_row = seq.start + group_start;
        for i in 0..n {
            let row = first_row + i;
            p.read_q(row, key_head, &mut q[i * kd..]);
            p.read_k(row, key_head, &mut k[i * kd..]);
            p.read_v(row, head, &mut v[i * vd..]);
            let gate = row * d.value_heads + head;
            decay[i] = p.g[gate].exp();
            beta[i] = p.beta[gate];
            key_dot_query[i] = dot(&k[i * kd..][..kd], &q[i * kd..][..kd]);
        }
        for col0 in (0..vd).step_by(BLOCK) {
            let width = BLOCK.min(vd - col0);
            load_block(&mut block, state, vd, col0);
            for i in 0..n {
                let value = pad_value(&v[i * vd..][..vd], col0);
                let step = TokenStep {
                    q: &q[i * kd..][..kd],
                    k: &k[i * kd..][..kd],
                    key_dot_query: key_dot_query[i],
                    value: &value,
                    decay: decay[i],
                    beta: beta[i],
                    scale: p.scale,
                };
                step_block(&mut block, &step, &mut out_block);
                out[i * vd + col0..][..width].copy_from_slice(&out_block[..width]);
            }
            store_block(&block, state, vd, col0);
        }
        for i in 0..n {
            // SAFETY: (row, head) belongs to this task alone.
            unsafe {
                o.write(
                    ((first_row + i) * d.value_heads + head) * vd,
                    &out[i * vd..][..vd],
                )
            };
        }
    }
}
