//! Compressed KV cache (AURA / TurboQuant family) and flash-decoding attention over it: the
//! scheme, the codec and the math every backend computes.
//!
//! Per cached vector `x` in R^d (d = head dim, 64..=256), with a fixed per-layer rotation Pi
//! (randomised Hadamard `H diag(s) / sqrt(d)` for power-of-two d, else a seeded dense
//! orthogonal matrix) and a Lloyd-Max codebook `c` for one coordinate of a random unit vector:
//!
//! ```text
//! r = |x|,  y = Pi x / r,  idx_i = argmin_j |y_i - c_j|       (boundaries = midpoints)
//! codes:  idx packed LSB-first into little-endian u32 words, `bits` per coordinate
//! norm:   r / |c(idx)|                         (decoded vector norm * Pi^T c(idx) keeps |x|)
//! ```
//!
//! Attention for a query q (softmax scale `scale`, the caller's):
//!
//! ```text
//! q' = scale * Pi q                                           (once per query)
//! s_t = norm_k[t] * <q', c(idx_k[t])>                          (read from the packed codes)
//! o'  = sum_t softmax(s)_t * norm_v[t] * c(idx_v[t]),   o = Pi^T o'
//! ```
//!
//! computed as split-K flash-decoding: per block of tokens an online softmax (max, sum,
//! un-normalised output), then a merge across blocks ([`merge`]). Keys and values may use
//! different bit widths (2, 3, 4 or 8). [`oracle`] is exact attention in f64.
//!
//! * [`codebook`]: Lloyd-Max levels per (d, bits), cached; [`aura`]: AURA's published tables.
//! * [`rotation`]: the seeded rotation.
//! * [`codec`]: encode / decode / bit packing, and the padding after each code stream.
//! * [`merge`]: the split-K softmax merge.
//! * [`inputs`]: the file-level op's inputs and their validation.
//! * [`paged`]: the paged cache layout (pages, block table) every backend stores.
//! * [`case`]: random paged cases and the oracle over a cache's decoded rows (for tests).
//! * [`oracle`]: exact causal attention in f64; [`random`]: seeded keys like real ones.

pub mod aura;
pub mod book;
pub mod case;
pub mod codebook;
pub mod codec;
pub mod inputs;
pub mod merge;
pub mod oracle;
pub mod paged;
pub mod random;
pub mod rotation;

pub use codebook::{Codebook, CodebookKind};
pub use codec::{CODE_PAD, Quantizer};
pub use inputs::{KvDims, KvInputs, KvMode};
pub use merge::{merge_partial, normalize_partial};
pub use paged::PagedLayout;

use crate::error::{Error, Result};

/// Supported head dimensions.
pub const HEAD_DIM_RANGE: std::ops::RangeInclusive<usize> = 64..=256;
/// Supported bit widths for keys and values.
pub const SUPPORTED_BITS: [u32; 4] = [2, 3, 4, 8];

/// How per-vector norms are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NormDType {
    #[default]
    F32,
    F16,
}

impl NormDType {
    /// Bytes per stored norm.
    pub fn bytes(self) -> usize {
        match self {
            NormDType::F32 => 4,
            NormDType::F16 => 2,
        }
    }
}

/// The quantization scheme of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvScheme {
    /// d, the head dimension.
    pub dim: usize,
    /// Hkv, KV heads.
    pub kv_heads: usize,
    pub bits_k: u32,
    pub bits_v: u32,
    pub norm_dtype: NormDType,
    pub codebook: CodebookKind,
    /// Seed of the layer's rotation.
    pub seed: u64,
}

impl KvScheme {
    /// A scheme with f32 norms, Lloyd-Max codebooks and seed 0.
    pub fn new(dim: usize, kv_heads: usize, bits_k: u32, bits_v: u32) -> Self {
        Self {
            dim,
            kv_heads,
            bits_k,
            bits_v,
            norm_dtype: NormDType::F32,
            codebook: CodebookKind::LloydMax,
            seed: 0,
        }
    }

    /// Checks d, Hkv and the bit widths.
    pub fn validate(&self) -> Result<()> {
        check_head_dim(self.dim)?;
        if self.kv_heads == 0 {
            return Err(Error::InvalidValue("kv_heads must be at least 1".into()));
        }
        check_bits("bits-k", self.bits_k)?;
        check_bits("bits-v", self.bits_v)
    }

    /// Bytes of codes plus norms per token and KV head, K and V together.
    pub fn bytes_per_token_head(&self) -> usize {
        4 * (codec::words_for(self.dim, self.bits_k) + codec::words_for(self.dim, self.bits_v))
            + 2 * self.norm_dtype.bytes()
    }
}

/// Errors unless `d` is a supported head dimension.
pub fn check_head_dim(d: usize) -> Result<()> {
    if HEAD_DIM_RANGE.contains(&d) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "head dim D = {d} (the compressed KV cache supports 64..=256)"
        )))
    }
}

/// Errors unless `bits` is a supported width; `what` names the parameter.
pub fn check_bits(what: &str, bits: u32) -> Result<()> {
    if SUPPORTED_BITS.contains(&bits) {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "{what} = {bits} (supported bit widths: 2, 3, 4, 8)"
        )))
    }
}
