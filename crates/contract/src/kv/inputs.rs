//! The inputs of compressed-KV attention as a file holds them, and their validation:
//! `q [B, Tq, Hq, D]`, `k, v [B, T, Hkv, D]` (f32, f16 or bf16) and optional `seq_lens [B]`.
//! Sequence b holds `L_b = seq_lens[b]` tokens (T when `seq_lens` is absent; rows past `L_b`
//! are padding, never read) and its query i sits at position `L_b - Tq + i`.

use super::{check_bits, check_head_dim};
use crate::error::{Error, Result};
use crate::tensor::{HostTensor, non_finite_input};

/// The input tensors and the optional softmax scale (default D^-0.5).
#[derive(Clone, Copy, Debug)]
pub struct KvInputs<'a> {
    pub q: &'a HostTensor,
    pub k: &'a HostTensor,
    pub v: &'a HostTensor,
    /// `[B]` i32 or i64, each in `Tq..=T`: a ragged batch padded to T. `None`: every
    /// sequence holds T tokens.
    pub seq_lens: Option<&'a HostTensor>,
    pub scale: Option<f32>,
}

/// Compressed with the given bit widths, or exact over f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvMode {
    Compressed { bits_k: u32, bits_v: u32 },
    Exact,
}

/// Validated sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvDims {
    pub batch: usize,
    pub tq: usize,
    /// T, the padded token axis of k and v.
    pub tokens: usize,
    /// Tokens held by each sequence (all T without `seq_lens`).
    pub seq_lens: Vec<usize>,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

fn rank4(name: &str, t: &HostTensor, layout: &str) -> Result<[usize; 4]> {
    if !t.dtype().is_float() {
        return Err(Error::dtype(name, t.dtype(), "f32, f16 or bf16"));
    }
    t.shape().try_into().map_err(|_| {
        Error::shape(
            name,
            format!("expected 4 dims {layout}, got shape {:?}", t.shape()),
        )
    })
}

/// Reads `seq_lens [B]` (i32 or i64) and checks every length is in `Tq..=T`.
fn ragged_lengths(lens: &HostTensor, batch: usize, tq: usize, t: usize) -> Result<Vec<usize>> {
    if lens.shape() != [batch] {
        return Err(Error::shape(
            "seq_lens",
            format!("expected [B] = [{batch}], got shape {:?}", lens.shape()),
        ));
    }
    lens.to_i64_vec("seq_lens")?
        .into_iter()
        .enumerate()
        .map(|(b, len)| match usize::try_from(len) {
            Ok(len) if (tq..=t).contains(&len) => Ok(len),
            _ => Err(Error::InvalidValue(format!(
                "seq_lens[{b}] = {len} is outside Tq..=T = {tq}..={t} (a sequence holds at least its Tq new queries and at most the T rows of k and v)"
            ))),
        })
        .collect()
}

/// Refuses a NaN or infinity among the k and v rows the sequences hold (`dims` from
/// [`validate`]); the padding past a sequence's length is never read, so never checked. The
/// error names the tensor and the flat index, as for any input.
pub fn check_held_finite(inputs: &KvInputs<'_>, dims: &KvDims) -> Result<()> {
    let row = dims.hkv * dims.d;
    for (name, t) in [("k", inputs.k), ("v", inputs.v)] {
        for (b, &len) in dims.seq_lens.iter().enumerate() {
            let start = b * dims.tokens * row;
            if let Some((i, x)) = t.data().first_non_finite_in(start..start + len * row) {
                return Err(non_finite_input(name, i, x));
            }
        }
    }
    Ok(())
}

/// Checks shapes, dtypes, head counts, Tq <= T (and `seq_lens`), D, the bit widths of `mode`
/// and a finite scale. Values are the backend's to scan (only the rows a sequence holds: the
/// padding of a ragged batch is never read).
pub fn validate(inputs: &KvInputs<'_>, mode: KvMode) -> Result<KvDims> {
    let [b, tq, hq, d] = rank4("q", inputs.q, "[B, Tq, Hq, D]")?;
    let [bk, t, hkv, dk] = rank4("k", inputs.k, "[B, T, Hkv, D]")?;
    let vs = rank4("v", inputs.v, "[B, T, Hkv, D]")?;
    if vs != [bk, t, hkv, dk] {
        return Err(Error::shape(
            "v",
            format!(
                "shape {:?} differs from k's {:?}",
                inputs.v.shape(),
                inputs.k.shape()
            ),
        ));
    }
    if bk != b || dk != d {
        return Err(Error::shape(
            "k",
            format!(
                "shape {:?} disagrees with q {:?} (B and D must match)",
                inputs.k.shape(),
                inputs.q.shape()
            ),
        ));
    }
    if b == 0 || tq == 0 || t == 0 || hq == 0 || hkv == 0 {
        return Err(Error::shape(
            "q",
            "B, Tq, T, Hq and Hkv must all be at least 1",
        ));
    }
    if !hq.is_multiple_of(hkv) {
        return Err(Error::shape(
            "q",
            format!("Hq = {hq} query heads is not a multiple of Hkv = {hkv} KV heads"),
        ));
    }
    if tq > t {
        return Err(Error::shape(
            "q",
            format!("Tq = {tq} new queries exceeds the T = {t} cached tokens"),
        ));
    }
    check_head_dim(d)?;
    if let KvMode::Compressed { bits_k, bits_v } = mode {
        check_bits("bits-k", bits_k)?;
        check_bits("bits-v", bits_v)?;
    }
    if let Some(s) = inputs.scale
        && !s.is_finite()
    {
        return Err(Error::InvalidValue(format!("scale {s} is not finite")));
    }
    let seq_lens = match inputs.seq_lens {
        None => vec![t; b],
        Some(lens) => ragged_lengths(lens, b, tq, t)?,
    };
    Ok(KvDims {
        batch: b,
        tq,
        tokens: t,
        seq_lens,
        hq,
        hkv,
        d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn only_the_rows_a_sequence_holds_are_scanned() {
        // B 2, T 3, Hkv 1, D 64: sequence 0 holds 3 tokens, sequence 1 holds 2.
        let (b, t, d) = (2, 3, 64);
        let q = HostTensor::from_f32(vec![b, 1, 2, d], vec![0.5; b * 2 * d]).unwrap();
        let lens = HostTensor::from_i32(vec![b], vec![3, 2]).unwrap();
        let kv = |poison: Option<usize>| {
            let mut x = vec![1.0f32; b * t * d];
            if let Some(i) = poison {
                x[i] = f32::NAN;
            }
            HostTensor::from_f32_as(vec![b, t, 1, d], &x, DType::BF16).unwrap()
        };
        let clean = kv(None);
        let check = |k: &HostTensor, v: &HostTensor| {
            let inputs = KvInputs {
                q: &q,
                k,
                v,
                seq_lens: Some(&lens),
                scale: None,
            };
            let dims = validate(&inputs, KvMode::Exact).unwrap();
            check_held_finite(&inputs, &dims)
        };
        assert!(check(&clean, &clean).is_ok());
        // Sequence 1's padding row (its third token) is never read.
        assert!(check(&kv(Some(5 * d + 7)), &clean).is_ok());
        let err = check(&clean, &kv(Some(4 * d + 3))).unwrap_err().to_string();
        assert!(err.contains("`v`") && err.contains("index 259"), "{err}");
        let err = check(&kv(Some(2 * d)), &clean).unwrap_err().to_string();
        assert!(err.contains("`k`") && err.contains("index 128"), "{err}");
    }
}
