//! Random paged-attention cases and their references, shared by every backend's tests: a
//! ragged batch of keys and values, queries, and the f64 oracle over the vectors a cache
//! actually stores (decoded from its pool), which is what a kernel over the packed codes must
//! equal within f32 rounding.

use super::Quantizer;
use super::oracle::{OracleDims, attention_reference};
use super::paged::{PagedView, Stream};
use crate::error::Result;
use crate::rng::Rng;
use crate::tensor::{DType, HostTensor};

/// One device append of a [`PagedCase`] ([`PagedCase::chunks`]): every sequence's next tokens
/// in one `[B, Tn, Hkv, D]` batch, zero past each sequence's count.
#[derive(Clone, Debug)]
pub struct CaseChunk {
    /// Tokens appended to each sequence (at most Tn).
    pub counts: Vec<usize>,
    /// Tn: the largest count.
    pub tokens: usize,
    /// The first token of each sequence's part.
    pub starts: Vec<usize>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// A ragged batch: per-sequence keys and values `[T_b, Hkv, D]` (key-like, with outlier
/// channels, and Gaussian values) and queries `[B, Tq, Hq, D]`.
#[derive(Clone, Debug)]
pub struct PagedCase {
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    pub q: Vec<f32>,
    pub dims: OracleDims,
    pub scale: f32,
}

impl PagedCase {
    /// Fresh random inputs for sequences of `lens` tokens.
    pub fn new(lens: &[usize], tq: usize, hq: usize, hkv: usize, d: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        // Keys with two outlier channels (x8) and a shared offset, as real keys have.
        let keys = lens
            .iter()
            .map(|&t| {
                let mut k = rng.normal_vec(t * hkv * d, 1.0);
                for row in k.chunks_exact_mut(d) {
                    row[1] *= 8.0;
                    row[d / 2] *= 8.0;
                    row.iter_mut().for_each(|x| *x += 0.5);
                }
                k
            })
            .collect();
        let values = lens
            .iter()
            .map(|&t| rng.normal_vec(t * hkv * d, 1.0))
            .collect();
        let q = rng.normal_vec(lens.len() * tq * hq * d, 1.0);
        Self {
            keys,
            values,
            q,
            dims: OracleDims { tq, hq, hkv, d },
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    /// Tokens of each sequence.
    pub fn lens(&self) -> Vec<usize> {
        let row = self.dims.hkv * self.dims.d;
        self.keys.iter().map(|k| k.len() / row).collect()
    }

    /// The case with its keys and values rounded to `dtype` (what a device encodes from a
    /// tensor of that dtype, so the CPU cache is filled with the same numbers).
    pub fn rounded(mut self, dtype: DType) -> Result<Self> {
        for x in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *x = HostTensor::from_f32_as(vec![x.len()], x, dtype)?.to_f32_vec("x")?;
        }
        Ok(self)
    }

    /// The case as device appends of up to `chunk` tokens per sequence each (a device appends
    /// every sequence in one launch, each its own count), in order.
    pub fn chunks(&self, chunk: usize) -> Vec<CaseChunk> {
        let lens = self.lens();
        let row = self.dims.hkv * self.dims.d;
        let mut at = vec![0usize; lens.len()];
        let mut chunks = Vec::new();
        while at.iter().zip(&lens).any(|(a, l)| a < l) {
            let counts: Vec<usize> = (at.iter().zip(&lens))
                .map(|(&a, &l)| chunk.max(1).min(l - a))
                .collect();
            let tokens = counts.iter().copied().max().unwrap_or(0);
            let mut k = vec![0.0f32; lens.len() * tokens * row];
            let mut v = vec![0.0f32; lens.len() * tokens * row];
            for b in 0..lens.len() {
                let src = at[b] * row..(at[b] + counts[b]) * row;
                k[b * tokens * row..][..counts[b] * row]
                    .copy_from_slice(&self.keys[b][src.clone()]);
                v[b * tokens * row..][..counts[b] * row].copy_from_slice(&self.values[b][src]);
            }
            chunks.push(CaseChunk {
                counts: counts.clone(),
                tokens,
                starts: at.clone(),
                k,
                v,
            });
            for (a, c) in at.iter_mut().zip(&counts) {
                *a += c;
            }
        }
        chunks
    }

    /// Sequence `b`'s keys and values of `chunk` (for a cache that appends one sequence at a
    /// time).
    pub fn chunk_rows(&self, chunk: &CaseChunk, b: usize) -> (&[f32], &[f32]) {
        let row = self.dims.hkv * self.dims.d;
        let part = chunk.starts[b] * row..(chunk.starts[b] + chunk.counts[b]) * row;
        (&self.keys[b][part.clone()], &self.values[b][part])
    }

    /// Exact f64 attention over the inputs (the scheme's own loss included).
    pub fn reference(&self) -> Result<Vec<f64>> {
        let k: Vec<&[f32]> = self.keys.iter().map(|x| x.as_slice()).collect();
        let v: Vec<&[f32]> = self.values.iter().map(|x| x.as_slice()).collect();
        attention_reference(&self.q, &k, &v, self.dims, self.scale)
    }

    /// Exact f64 attention over the vectors a paged cache stores (decoded with the cache's
    /// quantizers from `view`): the reference for a kernel over the packed codes.
    pub fn decoded_reference(
        &self,
        view: &PagedView<'_>,
        kq: &Quantizer,
        vq: &Quantizer,
    ) -> Result<Vec<f64>> {
        let (hkv, d) = (self.dims.hkv, self.dims.d);
        let mut dk = Vec::new();
        let mut dv = Vec::new();
        let mut x = vec![0.0f32; d];
        for (b, &len) in view.lens.iter().enumerate() {
            let (mut kb, mut vb) = (Vec::new(), Vec::new());
            for t in 0..len {
                for h in 0..hkv {
                    let (row, norm) = view.row(Stream::Key, b, h, t)?;
                    kq.decode(row, norm, &mut x)?;
                    kb.extend_from_slice(&x);
                    let (row, norm) = view.row(Stream::Value, b, h, t)?;
                    vq.decode(row, norm, &mut x)?;
                    vb.extend_from_slice(&x);
                }
            }
            dk.push(kb);
            dv.push(vb);
        }
        let k: Vec<&[f32]> = dk.iter().map(|x| x.as_slice()).collect();
        let v: Vec<&[f32]> = dv.iter().map(|x| x.as_slice()).collect();
        attention_reference(&self.q, &k, &v, self.dims, self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_token_once_in_order() {
        let case = PagedCase::new(&[1, 5, 0, 12], 1, 2, 1, 4, 9);
        let chunks = case.chunks(4);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].counts, vec![1, 4, 0, 4]);
        assert_eq!(chunks[2].counts, vec![0, 0, 0, 4]);
        let row = 4;
        for b in 0..4 {
            let mut keys = Vec::new();
            for c in &chunks {
                let (k, v) = case.chunk_rows(c, b);
                keys.extend_from_slice(k);
                // The batch holds the same rows at b's place, zeros after its count.
                let at = b * c.tokens * row;
                assert_eq!(&c.k[at..at + k.len()], k);
                assert_eq!(&c.v[at..at + v.len()], v);
                assert!(
                    c.k[at + k.len()..at + c.tokens * row]
                        .iter()
                        .all(|&x| x == 0.0)
                );
            }
            assert_eq!(keys, case.keys[b]);
        }
    }

    #[test]
    fn rounding_keeps_the_shape_and_rounds_every_value() {
        let case = PagedCase::new(&[3, 2], 1, 2, 1, 8, 1);
        let bf16 = case.clone().rounded(DType::BF16).unwrap();
        assert_eq!(bf16.lens(), case.lens());
        for (a, b) in bf16.keys.iter().flatten().zip(case.keys.iter().flatten()) {
            assert_eq!(a.to_bits() & 0xffff, 0, "bf16 values");
            assert!((a - b).abs() <= b.abs() / 128.0);
        }
    }
}
