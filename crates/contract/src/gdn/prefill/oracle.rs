//! The f64 reference for prefill: [`recurrence_step`] token by token for every (sequence,
//! value head), serially, from the raw inputs (the l2 norm redone in f64). Slow by design;
//! every prefill kernel is tested against it.

use super::checkpoint::CheckpointPlan;
use super::validate::validate_prefill;
use super::{GdnInputs, GdnOptions};
use crate::error::{Error, Result};
use crate::gdn::recurrence::{l2_normalize, recurrence_step};

/// Oracle outputs for a chosen set of value heads.
#[derive(Clone, Debug)]
pub struct GdnReference {
    /// The value heads computed, in order.
    pub heads: Vec<usize>,
    /// `[B*T, heads.len(), V]`
    pub o: Vec<f64>,
    /// `[N, heads.len(), K, V]`
    pub final_state: Vec<f64>,
    /// `[C, heads.len(), K, V]`: the state at each checkpoint position, in the contract's
    /// layout ([`CheckpointPlan`]); empty unless asked for.
    pub checkpoints: Vec<f64>,
}

/// Runs the f64 recurrence for every value head.
pub fn gdn_reference(inputs: &GdnInputs<'_>, options: &GdnOptions) -> Result<GdnReference> {
    let heads = inputs.v.shape().get(2).copied().unwrap_or(0);
    gdn_reference_heads(inputs, options, &(0..heads).collect::<Vec<_>>())
}

/// Runs the f64 recurrence for the listed value heads only (the full oracle is slow at long T).
pub fn gdn_reference_heads(
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    heads: &[usize],
) -> Result<GdnReference> {
    gdn_reference_checkpointed(inputs, options, heads, None)
}

/// [`gdn_reference_heads`] that also keeps the state every `checkpoint_every` tokens of each
/// sequence (the recurrence's state right after token `c N` of the sequence, see
/// [`super::checkpoint`]).
pub fn gdn_reference_checkpointed(
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    heads: &[usize],
    checkpoint_every: Option<usize>,
) -> Result<GdnReference> {
    let (shapes, gates) = validate_prefill(inputs, options)?;
    let plan = CheckpointPlan::optional(checkpoint_every, &shapes.seqs)?;
    let d = shapes.dims;
    if let Some(&bad) = heads.iter().find(|&&h| h >= d.value_heads) {
        return Err(Error::InvalidValue(format!(
            "oracle head {bad} is out of range (H = {})",
            d.value_heads
        )));
    }
    let (kd, vd) = (d.key_dim, d.value_dim);
    let (q_all, k_all, v_all) = (
        inputs.q.to_f32_vec("q")?,
        inputs.k.to_f32_vec("k")?,
        inputs.v.to_f32_vec("v")?,
    );
    let initial_state = match inputs.initial_state {
        Some(s) => Some(s.to_f32_vec("initial_state")?),
        None => None,
    };
    let widen = |src: &[f32]| src.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let width = heads.len();
    let rows = d.batch * d.tokens;
    let mut o = vec![0.0; rows * width * vd];
    let mut final_state = vec![0.0; shapes.seqs.len() * width * kd * vd];
    let mut checkpoints =
        vec![0.0; plan.as_ref().map_or(0, CheckpointPlan::total) * width * kd * vd];
    for (n, seq) in shapes.seqs.iter().enumerate() {
        for (slot, &h) in heads.iter().enumerate() {
            let key_head = d.key_head_of(h);
            let mut state = match &initial_state {
                Some(s) => widen(&s[(n * d.value_heads + h) * kd * vd..][..kd * vd]),
                None => vec![0.0; kd * vd],
            };
            for row in seq.start..seq.start + seq.len {
                let key_row = (row * d.key_heads + key_head) * kd;
                let mut q = widen(&q_all[key_row..][..kd]);
                let mut k = widen(&k_all[key_row..][..kd]);
                if options.use_qk_l2norm {
                    q = l2_normalize(&q);
                    k = l2_normalize(&k);
                }
                let gate = row * d.value_heads + h;
                let v = widen(&v_all[gate * vd..][..vd]);
                let out = recurrence_step(
                    &mut state,
                    &q,
                    &k,
                    &v,
                    f64::from(gates.g[gate]),
                    f64::from(gates.beta[gate]),
                    f64::from(shapes.scale),
                );
                o[(row * width + slot) * vd..][..vd].copy_from_slice(&out);
                let position = row + 1 - seq.start;
                if let Some(c) = plan.as_ref().and_then(|p| p.row_at(n, position)) {
                    checkpoints[(c * width + slot) * kd * vd..][..kd * vd].copy_from_slice(&state);
                }
            }
            final_state[(n * width + slot) * kd * vd..][..kd * vd].copy_from_slice(&state);
        }
    }
    Ok(GdnReference {
        heads: heads.to_vec(),
        o,
        final_state,
        checkpoints,
    })
}
