//! The KV cache of one attention layer for a batch of sequences, compressed ([`KvCache`]) or
//! dense f32 ([`DenseKvCache`], the exact baseline), both appended token by token or in chunks.
//!
//! Layout of the compressed cache, per sequence and KV head (logically `[kv_heads, tokens,
//! words]` per sequence): K codes `tokens x words_k` u32 then the contract's [`CODE_PAD`] zero
//! words (so kernels read whole words at any code group without a bounds check; not counted in
//! [`KvCache::bytes`]), K norms `tokens` (f32 or f16), and the same for V.

use deltakv_contract::kv::codebook::codebook;
use deltakv_contract::kv::rotation::Rotation;
use deltakv_contract::kv::{CODE_PAD, KvScheme, NormDType, Quantizer};
use deltakv_contract::tensor::first_non_finite;
use deltakv_contract::{Error, Result};
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

/// Stored norms of one stream.
#[derive(Clone, Debug)]
pub enum Norms {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Norms {
    fn new(dtype: NormDType) -> Self {
        match dtype {
            NormDType::F32 => Norms::F32(Vec::new()),
            NormDType::F16 => Norms::F16(Vec::new()),
        }
    }

    fn push(&mut self, v: f32) {
        match self {
            Norms::F32(n) => n.push(v),
            Norms::F16(n) => n.push(f16::from_f32(v)),
        }
    }

    /// Norm `t` as f32; `None` past the stored tokens.
    #[inline]
    pub fn get(&self, t: usize) -> Option<f32> {
        match self {
            Norms::F32(n) => n.get(t).copied(),
            Norms::F16(n) => n.get(t).map(|x| x.to_f32()),
        }
    }

    /// Number of stored norms.
    pub fn len(&self) -> usize {
        match self {
            Norms::F32(n) => n.len(),
            Norms::F16(n) => n.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// First token at or after `from` whose stored norm is not finite (beyond its storage).
    fn first_overflow(&self, from: usize) -> Option<usize> {
        let offset = match self {
            Norms::F32(n) => n[from..].iter().position(|x| !x.is_finite()),
            Norms::F16(n) => n[from..].iter().position(|x| !x.is_finite()),
        };
        offset.map(|i| from + i)
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Norms::F32(n) => n.truncate(len),
            Norms::F16(n) => n.truncate(len),
        }
    }
}

/// One sequence and KV head of the compressed cache.
#[derive(Clone, Debug)]
pub struct HeadStore {
    pub len: usize,
    pub k_codes: Vec<u32>,
    pub k_norms: Norms,
    pub v_codes: Vec<u32>,
    pub v_norms: Norms,
}

/// The compressed KV cache of one layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    scheme: KvScheme,
    pub(crate) k: Quantizer,
    pub(crate) v: Quantizer,
    /// `[batch][kv_heads]`
    seqs: Vec<Vec<HeadStore>>,
}

/// Validates an append of `k`, `v` chunks to sequence `seq` of a batch of `batch`; returns the
/// token count. Shared by the compressed (contiguous and paged) and the dense cache.
pub(crate) fn check_append(
    seq: usize,
    batch: usize,
    k: &[f32],
    v: &[f32],
    kv_heads: usize,
    dim: usize,
) -> Result<usize> {
    if seq >= batch {
        return Err(Error::InvalidValue(format!(
            "sequence {seq} is out of range (batch {batch})"
        )));
    }
    let n = check_chunk("k", k, kv_heads, dim)?;
    if check_chunk("v", v, kv_heads, dim)? != n {
        return Err(Error::shape(
            "v",
            "k and v chunks hold different token counts",
        ));
    }
    Ok(n)
}

fn check_chunk(name: &str, x: &[f32], kv_heads: usize, dim: usize) -> Result<usize> {
    let row = kv_heads * dim;
    if !x.len().is_multiple_of(row) {
        return Err(Error::shape(
            name,
            format!(
                "{} values is not a whole number of [kv_heads={kv_heads}, d={dim}] tokens",
                x.len()
            ),
        ));
    }
    if let Some(pos) = first_non_finite(x) {
        return Err(Error::InvalidValue(format!(
            "tensor `{name}` holds a non-finite value ({}) at token {}, head {}",
            x[pos],
            pos / row,
            pos % row / dim
        )));
    }
    Ok(x.len() / row)
}

/// Encoding one KV head's new tokens (K and V) onto the end of its store.
struct EncodeJob<'a> {
    kq: &'a Quantizer,
    vq: &'a Quantizer,
    /// `[tokens, heads, d]` new keys and values.
    k: &'a [f32],
    v: &'a [f32],
    heads: usize,
    head: usize,
    tokens: usize,
}

impl EncodeJob<'_> {
    /// Encodes into the rows after `store.len` (already sized); norms are pushed.
    #[inline(always)]
    fn run(&self, store: &mut HeadStore) -> Result<()> {
        let d = self.kq.dim();
        let (wk, wv) = (self.kq.words(), self.vq.words());
        let mut scratch = vec![0.0f32; d];
        let mut codes = vec![0u32; d];
        let (old, n) = (store.len, self.tokens);
        let (first, stride) = (self.head * d, self.heads * d);
        let HeadStore {
            k_codes,
            k_norms,
            v_codes,
            v_norms,
            ..
        } = store;
        let out = &mut k_codes[old * wk..][..n * wk];
        let push = |norm| k_norms.push(norm);
        (self.kq).encode_rows(
            self.k,
            first,
            stride,
            n,
            out,
            &mut scratch,
            &mut codes,
            push,
        )?;
        let out = &mut v_codes[old * wv..][..n * wv];
        let push = |norm| v_norms.push(norm);
        (self.vq).encode_rows(
            self.v,
            first,
            stride,
            n,
            out,
            &mut scratch,
            &mut codes,
            push,
        )
    }

    /// [`Self::run`] compiled for AVX-512, so the rotation, level search, packing and norms
    /// (inlined here) vectorise 16 wide. With the vectorised dense rotation and finite check,
    /// `deltakv bench kv` encode went 71-102k -> 114-125k tokens/s at d = 128 and 17k -> 46-48k
    /// at d = 96 (dense rotation), 8 KV heads, in alternating runs.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn run_avx512(&self, store: &mut HeadStore) -> Result<()> {
        self.run(store)
    }
}

impl KvCache {
    /// An empty cache for `batch` sequences.
    pub fn new(scheme: KvScheme, batch: usize) -> Result<Self> {
        scheme.validate()?;
        let rotation = Arc::new(Rotation::new(scheme.dim, scheme.seed)?);
        let k = Quantizer::new(
            codebook(scheme.codebook, scheme.dim, scheme.bits_k)?,
            rotation.clone(),
        );
        let v = Quantizer::new(
            codebook(scheme.codebook, scheme.dim, scheme.bits_v)?,
            rotation,
        );
        let head = HeadStore {
            len: 0,
            k_codes: vec![0; CODE_PAD],
            k_norms: Norms::new(scheme.norm_dtype),
            v_codes: vec![0; CODE_PAD],
            v_norms: Norms::new(scheme.norm_dtype),
        };
        Ok(Self {
            scheme,
            k,
            v,
            seqs: vec![vec![head; scheme.kv_heads]; batch],
        })
    }

    pub fn scheme(&self) -> &KvScheme {
        &self.scheme
    }

    pub fn rotation(&self) -> &Rotation {
        &self.k.rotation
    }

    pub fn key_quantizer(&self) -> &Quantizer {
        &self.k
    }

    pub fn value_quantizer(&self) -> &Quantizer {
        &self.v
    }

    pub fn batch(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens cached for sequence `seq`.
    pub fn seq_len(&self, seq: usize) -> Result<usize> {
        check_seq(seq, self.batch())?;
        Ok(self.len_of(seq))
    }

    /// [`Self::seq_len`] for a sequence index the caller has checked.
    pub(crate) fn len_of(&self, seq: usize) -> usize {
        self.seqs[seq].first().map_or(0, |h| h.len)
    }

    /// The store of sequence `seq`, KV head `head`.
    pub fn head(&self, seq: usize, head: usize) -> Result<&HeadStore> {
        check_seq(seq, self.batch())?;
        check_head(head, self.scheme.kv_heads)?;
        Ok(self.store(seq, head))
    }

    /// [`Self::head`] for indices the caller has checked.
    pub(crate) fn store(&self, seq: usize, head: usize) -> &HeadStore {
        &self.seqs[seq][head]
    }

    /// Appends `n` tokens to sequence `seq`: `k`, `v` are `[n, kv_heads, d]` f32.
    pub fn append(&mut self, seq: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (heads, d) = (self.scheme.kv_heads, self.scheme.dim);
        let n = check_append(seq, self.seqs.len(), k, v, heads, d)?;
        let (kq, vq) = (&self.k, &self.v);
        let (wk, wv) = (kq.words(), vq.words());
        let old = self.len_of(seq);
        let encoded = self.seqs[seq]
            .par_iter_mut()
            .enumerate()
            .try_for_each(|(h, store)| {
                let old = store.len;
                store.k_codes.resize((old + n) * wk + CODE_PAD, 0);
                store.v_codes.resize((old + n) * wv + CODE_PAD, 0);
                let job = EncodeJob {
                    kq,
                    vq,
                    k,
                    v,
                    heads,
                    head: h,
                    tokens: n,
                };
                #[cfg(target_arch = "x86_64")]
                if crate::simd::has_avx512() {
                    // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked by `has_avx512`).
                    unsafe { job.run_avx512(store) }?;
                    store.len = old + n;
                    return Ok(());
                }
                job.run(store)?;
                store.len = old + n;
                Ok(())
            });
        if let Err(e) = encoded {
            self.truncate(seq, old);
            return Err(e);
        }
        self.undo_on_norm_overflow(seq, n)
    }

    /// Drops the tokens of sequence `seq` from `len` on (codes, norms), keeping the pad.
    fn truncate(&mut self, seq: usize, len: usize) {
        let (wk, wv) = (self.k.words(), self.v.words());
        for store in self.seqs[seq].iter_mut() {
            store.len = len;
            store.k_codes.truncate(len * wk + CODE_PAD);
            store.v_codes.truncate(len * wv + CODE_PAD);
            store.k_codes[len * wk..].fill(0);
            store.v_codes[len * wv..].fill(0);
            store.k_norms.truncate(len);
            store.v_norms.truncate(len);
        }
    }

    /// A norm beyond its storage (above 65504 in f16, above f32's range in f32) is stored as
    /// infinity, which would turn its scores into NaN. Such an append is undone (the cache is
    /// left as before) and refused.
    fn undo_on_norm_overflow(&mut self, seq: usize, n: usize) -> Result<()> {
        let stores = &self.seqs[seq];
        let old = stores.first().map_or(0, |h| h.len) - n;
        let overflow = stores.iter().enumerate().find_map(|(h, store)| {
            let key = store.k_norms.first_overflow(old).map(|t| ("k", t, h));
            key.or_else(|| store.v_norms.first_overflow(old).map(|t| ("v", t, h)))
        });
        let Some((name, t, head)) = overflow else {
            return Ok(());
        };
        self.truncate(seq, old);
        let limit = match self.scheme.norm_dtype {
            NormDType::F16 => "the f16 norm storage (at most 65504); use f32 norms",
            _ => "the f32 norm storage",
        };
        Err(Error::InvalidValue(format!(
            "tensor `{name}`: the vector at token {}, head {head} has a norm beyond {limit}",
            t - old
        )))
    }

    /// Bytes of codes plus norms, K and V together, over every sequence and head.
    pub fn bytes(&self) -> usize {
        let tokens: usize = (0..self.batch()).map(|s| self.len_of(s)).sum();
        tokens * self.scheme.kv_heads * self.scheme.bytes_per_token_head()
    }

    /// Decoded key `t` of (seq, head) in the original basis.
    pub fn decode_key(&self, seq: usize, head: usize, t: usize) -> Result<Vec<f32>> {
        let store = self.head(seq, head)?;
        check_token(t, store.len, seq)?;
        let w = self.k.words();
        let mut out = vec![0.0; self.scheme.dim];
        let norm = store.k_norms.get(t).unwrap_or(0.0);
        self.k
            .decode(&store.k_codes[t * w..][..w], norm, &mut out)?;
        Ok(out)
    }

    /// Decoded value `t` of (seq, head) in the original basis.
    pub fn decode_value(&self, seq: usize, head: usize, t: usize) -> Result<Vec<f32>> {
        let store = self.head(seq, head)?;
        check_token(t, store.len, seq)?;
        let w = self.v.words();
        let mut out = vec![0.0; self.scheme.dim];
        let norm = store.v_norms.get(t).unwrap_or(0.0);
        self.v
            .decode(&store.v_codes[t * w..][..w], norm, &mut out)?;
        Ok(out)
    }
}

fn check_seq(seq: usize, batch: usize) -> Result<()> {
    if seq < batch {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "sequence {seq} is out of range (batch {batch})"
        )))
    }
}

fn check_head(head: usize, kv_heads: usize) -> Result<()> {
    if head < kv_heads {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "KV head {head} is out of range (kv_heads {kv_heads})"
        )))
    }
}

fn check_token(t: usize, len: usize, seq: usize) -> Result<()> {
    if t < len {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "token {t} is out of range (sequence {seq} holds {len} tokens)"
        )))
    }
}

/// A dense f32 KV cache with the same interface (the exact baseline).
#[derive(Clone, Debug)]
pub struct DenseKvCache {
    dim: usize,
    kv_heads: usize,
    /// `[batch][kv_heads]` of (k `[tokens, d]`, v `[tokens, d]`).
    seqs: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
}

impl DenseKvCache {
    pub fn new(dim: usize, kv_heads: usize, batch: usize) -> Result<Self> {
        if dim == 0 || kv_heads == 0 {
            return Err(Error::InvalidValue(
                "dense cache needs d >= 1 and kv_heads >= 1".into(),
            ));
        }
        Ok(Self {
            dim,
            kv_heads,
            seqs: vec![vec![(Vec::new(), Vec::new()); kv_heads]; batch],
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn batch(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens cached for sequence `seq`.
    pub fn seq_len(&self, seq: usize) -> Result<usize> {
        check_seq(seq, self.batch())?;
        Ok(self.len_of(seq))
    }

    /// [`Self::seq_len`] for a sequence index the caller has checked.
    pub(crate) fn len_of(&self, seq: usize) -> usize {
        self.seqs[seq].first().map_or(0, |h| h.0.len() / self.dim)
    }

    /// (keys `[tokens, d]`, values `[tokens, d]`) of (seq, head).
    pub fn head(&self, seq: usize, head: usize) -> Result<(&[f32], &[f32])> {
        check_seq(seq, self.batch())?;
        check_head(head, self.kv_heads)?;
        Ok(self.store(seq, head))
    }

    /// [`Self::head`] for indices the caller has checked.
    pub(crate) fn store(&self, seq: usize, head: usize) -> (&[f32], &[f32]) {
        let (k, v) = &self.seqs[seq][head];
        (k, v)
    }

    /// Appends `n` tokens: `k`, `v` are `[n, kv_heads, d]` f32.
    pub fn append(&mut self, seq: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (heads, d) = (self.kv_heads, self.dim);
        let n = check_append(seq, self.seqs.len(), k, v, heads, d)?;
        for (h, (ks, vs)) in self.seqs[seq].iter_mut().enumerate() {
            for t in 0..n {
                ks.extend_from_slice(&k[(t * heads + h) * d..][..d]);
                vs.extend_from_slice(&v[(t * heads + h) * d..][..d]);
            }
        }
        Ok(())
    }

    /// Bytes of K and V (f32).
    pub fn bytes(&self) -> usize {
        let tokens: usize = (0..self.batch()).map(|s| self.len_of(s)).sum();
        tokens * self.kv_heads * self.dim * 8
    }
}
