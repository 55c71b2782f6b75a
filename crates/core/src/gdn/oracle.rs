//! The f64 reference: the GDN recurrence exactly as written in the module docs, one token at a
//! time, with nothing fused or reordered. Slow by design; every kernel is tested against it.

use super::prefill::{GdnInputs, GdnOptions};
use super::validate::{PreparedGdn, prepare_prefill};
use crate::error::{Error, Result};
use rayon::prelude::*;

/// Oracle outputs for a chosen set of value heads.
#[derive(Clone, Debug)]
pub struct GdnReference {
    /// The value heads computed, in order.
    pub heads: Vec<usize>,
    /// `[B*T, heads.len(), V]`
    pub o: Vec<f64>,
    /// `[N, heads.len(), K, V]`
    pub final_state: Vec<f64>,
}

/// `x / sqrt(|x|^2 + 1e-6)` in f64.
pub fn l2_normalize(x: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|v| v * inv).collect()
}

/// One token of the recurrence on a K x V row-major state; returns `o_t` (length V).
/// `q` and `k` are already normalised if the caller wants that.
pub fn recurrence_step(
    state: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: f64,
    beta: f64,
    scale: f64,
) -> Vec<f64> {
    let value_dim = v.len();
    let decay = g.exp();
    state.iter_mut().for_each(|s| *s *= decay);
    let mut new_value = v.to_vec();
    for (i, &ki) in k.iter().enumerate() {
        let row = &state[i * value_dim..(i + 1) * value_dim];
        for (nv, s) in new_value.iter_mut().zip(row) {
            *nv -= s * ki;
        }
    }
    new_value.iter_mut().for_each(|x| *x *= beta);
    for (i, &ki) in k.iter().enumerate() {
        let row = &mut state[i * value_dim..(i + 1) * value_dim];
        for (s, nv) in row.iter_mut().zip(&new_value) {
            *s += ki * nv;
        }
    }
    let mut out = vec![0.0; value_dim];
    for (i, &qi) in q.iter().enumerate() {
        let row = &state[i * value_dim..(i + 1) * value_dim];
        for (o, s) in out.iter_mut().zip(row) {
            *o += s * qi;
        }
    }
    out.iter_mut().for_each(|x| *x *= scale);
    out
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
    // Validation is shared; the l2 norm is redone here in f64 from the raw inputs.
    let raw = GdnOptions {
        use_qk_l2norm: false,
        ..options.clone()
    };
    let p: PreparedGdn<'_> = prepare_prefill(inputs, &raw)?;
    let d = p.dims;
    if let Some(&bad) = heads.iter().find(|&&h| h >= d.value_heads) {
        return Err(Error::InvalidValue(format!(
            "oracle head {bad} is out of range (H = {})",
            d.value_heads
        )));
    }
    let (kd, vd) = (d.key_dim, d.value_dim);
    let rows = d.batch * d.tokens;
    let per_task: Vec<(usize, usize, Vec<f64>, Vec<f64>)> = p
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(n, seq)| {
            heads
                .iter()
                .enumerate()
                .map(move |(slot, &h)| (n, *seq, slot, h))
        })
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|(n, seq, slot, h)| {
            let hk = d.key_head_of(h);
            let mut state: Vec<f64> = match &p.initial_state {
                Some(s) => s[(n * d.value_heads + h) * kd * vd..][..kd * vd]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect(),
                None => vec![0.0; kd * vd],
            };
            let mut outs = Vec::with_capacity(seq.len * vd);
            for row in seq.start..seq.start + seq.len {
                let widen = |src: &[f32]| src.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
                let (mut q32, mut k32, mut v32) = (vec![0.0; kd], vec![0.0; kd], vec![0.0; vd]);
                p.read_q(row, hk, &mut q32);
                p.read_k(row, hk, &mut k32);
                p.read_v(row, h, &mut v32);
                let mut q = widen(&q32);
                let mut k = widen(&k32);
                if options.use_qk_l2norm {
                    q = l2_normalize(&q);
                    k = l2_normalize(&k);
                }
                let v = widen(&v32);
                let gate = row * d.value_heads + h;
                let o = recurrence_step(
                    &mut state,
                    &q,
                    &k,
                    &v,
                    f64::from(p.g[gate]),
                    f64::from(p.beta[gate]),
                    f64::from(p.scale),
                );
                outs.extend(o);
            }
            (n, slot, outs, state)
        })
        .collect();
    let width = heads.len();
    let mut o = vec![0.0; rows * width * vd];
    let mut final_state = vec![0.0; p.seqs.len() * width * kd * vd];
    for (n, slot, outs, state) in per_task {
        let seq = p.seqs[n];
        for (i, out) in outs.chunks_exact(vd).enumerate() {
            let row = seq.start + i;
            o[(row * width + slot) * vd..][..vd].copy_from_slice(out);
        }
        final_state[(n * width + slot) * kd * vd..][..kd * vd].copy_from_slice(&state);
    }
    Ok(GdnReference {
        heads: heads.to_vec(),
        o,
        final_state,
    })
}
