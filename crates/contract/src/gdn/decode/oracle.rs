//! The f64 reference for decode: the recurrence of [`recurrence_step`], token by token, on an
//! f64 copy of the pool, serially. Fused gates and the l2 norm are recomputed in f64 from the
//! raw inputs. Slow by design; every decode kernel is tested against it.

use super::validate::prepare_decode;
use super::{DecodeInputs, Gating};
use crate::error::Result;
use crate::gdn::gating::fused_gate_f64;
use crate::gdn::prefill::GdnOptions;
use crate::gdn::recurrence::{l2_normalize, recurrence_step};
use crate::tensor::HostTensor;

/// Oracle results of one decode call.
#[derive(Clone, Debug)]
pub struct DecodeReference {
    /// `[B, T, H, V]`, zeros for skipped rows.
    pub o: Vec<f64>,
    /// `[S, H, K, V]`: the whole pool after the call (untouched slots copied from the input).
    pub state_pool: Vec<f64>,
    /// `[B, T, H, K, V]`, zeros for skipped rows.
    pub intermediate_states: Vec<f64>,
}

/// Runs the f64 recurrence for a decode call on a copy of `state_pool` (which is not changed).
pub fn gdn_decode_reference(
    inputs: &DecodeInputs<'_>,
    state_pool: &HostTensor,
    options: &GdnOptions,
) -> Result<DecodeReference> {
    // Validation is shared; the l2 norm and fused gates are redone here in f64.
    let p = prepare_decode(inputs, state_pool, options)?;
    let d = p.dims;
    let (kd, vd, heads) = (d.key_dim, d.value_dim, d.value_heads);
    let rows = d.batch * d.tokens;
    let (g, beta): (Vec<f64>, Vec<f64>) = match inputs.gating {
        Gating::Direct { .. } => (
            p.g.iter().map(|&x| f64::from(x)).collect(),
            p.beta.iter().map(|&x| f64::from(x)).collect(),
        ),
        Gating::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => {
            let (a, b) = (a.to_f64_vec("a")?, b.to_f64_vec("b")?);
            let (a_log, dt_bias) = (a_log.to_f64_vec("A_log")?, dt_bias.to_f64_vec("dt_bias")?);
            (0..rows * heads)
                .map(|i| fused_gate_f64(a[i], b[i], a_log[i % heads], dt_bias[i % heads]))
                .unzip()
        }
    };
    let mut pool = state_pool.to_f64_vec("state_pool")?;
    let state_len = kd * vd;
    let widen = |src: &[f32]| src.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let mut o = vec![0.0; rows * heads * vd];
    let mut intermediate_states = vec![0.0; rows * heads * state_len];
    // Slots are distinct across rows (validated), so each (row, head) owns its slab.
    for (row, slot) in p.slot_of_row.iter().enumerate() {
        let Some(slot) = *slot else { continue };
        for head in 0..heads {
            let key_head = d.key_head_of(head);
            let slab = &mut pool[(slot * heads + head) * state_len..][..state_len];
            for t in 0..d.tokens {
                let token = row * d.tokens + t;
                let key_row = token * d.key_heads + key_head;
                let mut q = widen(&p.q[key_row * kd..][..kd]);
                let mut k = widen(&p.k[key_row * kd..][..kd]);
                if options.use_qk_l2norm {
                    q = l2_normalize(&q);
                    k = l2_normalize(&k);
                }
                let token_head = token * heads + head;
                let v = widen(&p.v[token_head * vd..][..vd]);
                let out = recurrence_step(
                    slab,
                    &q,
                    &k,
                    &v,
                    g[token_head],
                    beta[token_head],
                    f64::from(p.scale),
                );
                o[token_head * vd..][..vd].copy_from_slice(&out);
                intermediate_states[token_head * state_len..][..state_len].copy_from_slice(slab);
            }
        }
    }
    Ok(DecodeReference {
        o,
        state_pool: pool,
        intermediate_states,
    })
}
