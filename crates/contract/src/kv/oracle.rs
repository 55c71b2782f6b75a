//! Exact causal attention in f64, the reference for every KV path.
//!
//! For sequence `b` with `T_b` cached tokens and query `i` of `Tq` (position
//! `p = T_b - Tq + i`), query head `h` reading KV head `h / (Hq / Hkv)`:
//! `o = sum_{t <= p} softmax_t(scale * <q, k_t>) v_t`, all in f64.

use crate::error::{Error, Result};

/// Sizes of an oracle call.
#[derive(Clone, Copy, Debug)]
pub struct OracleDims {
    pub tq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

/// `q [B, Tq, Hq, D]`; `keys[b]`, `values[b]` are `[T_b, Hkv, D]`. Returns `[B, Tq, Hq, D]`.
pub fn attention_reference(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    dims: OracleDims,
    scale: f32,
) -> Result<Vec<f64>> {
    let OracleDims { tq, hq, hkv, d } = dims;
    let batch = keys.len();
    if values.len() != batch || q.len() != batch * tq * hq * d || hkv == 0 || hq % hkv != 0 {
        return Err(Error::InvalidValue("oracle: inconsistent shapes".into()));
    }
    let group = hq / hkv;
    let mut out = vec![0.0f64; q.len()];
    for b in 0..batch {
        let len = keys[b].len() / (hkv * d);
        if len < tq || values[b].len() != keys[b].len() {
            return Err(Error::InvalidValue(
                "oracle: sequence shorter than Tq".into(),
            ));
        }
        for i in 0..tq {
            let pos = len - tq + i;
            for h in 0..hq {
                let kh = h / group;
                let qv = &q[((b * tq + i) * hq + h) * d..][..d];
                let scores: Vec<f64> = (0..=pos)
                    .map(|t| {
                        let k = &keys[b][(t * hkv + kh) * d..][..d];
                        f64::from(scale)
                            * qv.iter()
                                .zip(k)
                                .map(|(&a, &c)| f64::from(a) * f64::from(c))
                                .sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = weights.iter().sum();
                let o = &mut out[((b * tq + i) * hq + h) * d..][..d];
                for (t, w) in weights.iter().enumerate() {
                    let v = &values[b][(t * hkv + kh) * d..][..d];
                    for (x, &c) in o.iter_mut().zip(v) {
                        *x += w / total * f64::from(c);
                    }
                }
            }
        }
    }
    Ok(out)
}
