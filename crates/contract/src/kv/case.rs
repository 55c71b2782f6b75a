//! Random paged-attention cases and their references, shared by every backend's tests: a
//! ragged batch of keys and values, queries, and the f64 oracle over the vectors a cache
//! actually stores (decoded from its pool), which is what a kernel over the packed codes must
//! equal within f32 rounding.

use super::Quantizer;
use super::oracle::{OracleDims, attention_reference};
use super::paged::{PagedView, Stream};
use crate::error::Result;
use crate::rng::Rng;

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
