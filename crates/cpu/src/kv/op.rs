//! The file-level operation behind `deltakv kv`: validate the inputs (the contract's
//! `deltakv_contract::kv::inputs`), encode k and v into the compressed cache (or a dense f32
//! one), attend causally and return `o` f32.

use super::attention::{AttnOptions, attend_compressed, attend_dense};
use super::cache::{DenseKvCache, KvCache};
use crate::scan::check_result_finite;
use deltakv_contract::Result;
use deltakv_contract::kv::inputs::{KvDims, KvInputs, KvMode, check_held_finite, validate};
use deltakv_contract::kv::paged::attention_scale;
use deltakv_contract::kv::{CodebookKind, KvScheme, NormDType};
use deltakv_contract::tensor::HostTensor;

/// Options of [`kv_attention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvOptions {
    pub mode: KvMode,
    pub seed: u64,
    pub norm_dtype: NormDType,
    pub codebook: CodebookKind,
    pub attn: AttnOptions,
}

impl Default for KvOptions {
    fn default() -> Self {
        Self {
            mode: KvMode::Compressed {
                bits_k: 4,
                bits_v: 2,
            },
            seed: 0,
            norm_dtype: NormDType::F32,
            codebook: CodebookKind::LloydMax,
            attn: AttnOptions::default(),
        }
    }
}

impl KvOptions {
    /// The compressed cache's scheme for the inputs' `dims` at these bit widths, with these
    /// options' norms, codebook and seed.
    pub fn scheme(&self, dims: &KvDims, bits_k: u32, bits_v: u32) -> KvScheme {
        KvScheme {
            dim: dims.d,
            kv_heads: dims.hkv,
            bits_k,
            bits_v,
            norm_dtype: self.norm_dtype,
            codebook: self.codebook,
            seed: self.seed,
        }
    }
}

/// `o [B, Tq, Hq, D]` f32 and the cache size (codes + norms, K and V).
#[derive(Clone, Debug)]
pub struct KvOutput {
    pub o: HostTensor,
    pub cache_bytes: usize,
}

/// Encodes k, v and attends; see the module doc.
pub fn kv_attention(inputs: &KvInputs<'_>, options: &KvOptions) -> Result<KvOutput> {
    let dims = validate(inputs, options.mode)?;
    // q is checked for finite values by the attention call itself.
    check_held_finite(inputs, &dims)?;
    let q = inputs.q.to_f32_vec("q")?;
    let k = inputs.k.to_f32_vec("k")?;
    let v = inputs.v.to_f32_vec("v")?;
    let per_seq = dims.tokens * dims.hkv * dims.d;
    let per_token = dims.hkv * dims.d;
    // The rows each sequence holds; padding past its length is never read.
    let held = |b: usize| b * per_seq..b * per_seq + dims.seq_lens[b] * per_token;
    let scale = attention_scale(inputs.scale, dims.d)?;
    let (o, cache_bytes) = match options.mode {
        KvMode::Compressed { bits_k, bits_v } => {
            let mut cache = KvCache::new(options.scheme(&dims, bits_k, bits_v), dims.batch)?;
            for b in 0..dims.batch {
                cache.append(b, &k[held(b)], &v[held(b)])?;
            }
            let o = attend_compressed(&cache, &q, dims.tq, dims.hq, scale, &options.attn)?;
            (o, cache.bytes())
        }
        KvMode::Exact => {
            let mut cache = DenseKvCache::new(dims.d, dims.hkv, dims.batch)?;
            for b in 0..dims.batch {
                cache.append(b, &k[held(b)], &v[held(b)])?;
            }
            let o = attend_dense(&cache, &q, dims.tq, dims.hq, scale, &options.attn)?;
            (o, cache.bytes())
        }
    };
    let o = HostTensor::from_f32(vec![dims.batch, dims.tq, dims.hq, dims.d], o)?;
    check_attention_output(&o)?;
    Ok(KvOutput { o, cache_bytes })
}

/// Refuses an attention output `o [B, Tq, Hq, D]` with a value that left f32's range (every
/// device's `kv` op checks its `o` this way before it is written anywhere).
pub fn check_attention_output(o: &HostTensor) -> Result<()> {
    check_result_finite(
        "o",
        o,
        "b, tq, hq, d",
        "q or v too large: a score or a weighted sum of values left f32's range",
    )
}
