//! Seeded test and benchmark inputs shaped like real keys: Gaussian, plus a few outlier
//! channels scaled up and an offset shared by every token of a head.

use crate::rng::Rng;

/// What to generate: `q [B, Tq, Hq, D]`, `k, v [B, T, Hkv, D]`.
#[derive(Clone, Copy, Debug)]
pub struct KvSpec {
    pub batch: usize,
    pub tq: usize,
    pub tokens: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Channels of k multiplied by `outlier_scale` (every head).
    pub outlier_channels: usize,
    pub outlier_scale: f32,
    /// Standard deviation of the per-head offset added to every key.
    pub offset_std: f64,
}

impl KvSpec {
    /// Gaussian q, k, v with no outliers or offset.
    pub fn gaussian(
        batch: usize,
        tq: usize,
        tokens: usize,
        hq: usize,
        hkv: usize,
        d: usize,
    ) -> Self {
        Self {
            batch,
            tq,
            tokens,
            hq,
            hkv,
            d,
            outlier_channels: 0,
            outlier_scale: 1.0,
            offset_std: 0.0,
        }
    }

    /// Keys with 4 outlier channels (x8) and a shared offset (std 1), as in real models.
    pub fn outliers(
        batch: usize,
        tq: usize,
        tokens: usize,
        hq: usize,
        hkv: usize,
        d: usize,
    ) -> Self {
        Self {
            outlier_channels: 4,
            outlier_scale: 8.0,
            offset_std: 1.0,
            ..Self::gaussian(batch, tq, tokens, hq, hkv, d)
        }
    }
}

/// Generated tensors (f32, row-major).
#[derive(Clone, Debug)]
pub struct KvCase {
    pub spec: KvSpec,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl KvCase {
    pub fn random(spec: KvSpec, seed: u64) -> Self {
        let KvSpec {
            batch,
            tq,
            tokens,
            hq,
            hkv,
            d,
            ..
        } = spec;
        let mut rng = Rng::new(seed);
        let q = rng.normal_vec(batch * tq * hq * d, 1.0);
        let mut k = rng.normal_vec(batch * tokens * hkv * d, 1.0);
        let v = rng.normal_vec(batch * tokens * hkv * d, 1.0);
        let offset = rng.normal_vec(hkv * d, spec.offset_std);
        let outliers: Vec<usize> = (0..spec.outlier_channels).map(|_| rng.below(d)).collect();
        for (row, x) in k.chunks_exact_mut(d).enumerate() {
            let h = row % hkv;
            for (xi, &o) in x.iter_mut().zip(&offset[h * d..(h + 1) * d]) {
                *xi += o;
            }
            for &c in &outliers {
                x[c] *= spec.outlier_scale;
            }
        }
        Self { spec, q, k, v }
    }

    /// Keys of sequence `b`, `[T, Hkv, D]`.
    pub fn keys(&self, b: usize) -> &[f32] {
        let n = self.spec.tokens * self.spec.hkv * self.spec.d;
        &self.k[b * n..(b + 1) * n]
    }

    /// Values of sequence `b`, `[T, Hkv, D]`.
    pub fn values(&self, b: usize) -> &[f32] {
        let n = self.spec.tokens * self.spec.hkv * self.spec.d;
        &self.v[b * n..(b + 1) * n]
    }
}
