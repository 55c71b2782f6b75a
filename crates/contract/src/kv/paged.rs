//! The paged layout of the compressed KV cache: fixed-size pages of packed codes and norms,
//! addressed per sequence through a block table, as serving engines (vLLM, FlashInfer) manage
//! their KV memory, so an engine's own allocator can own the pages. Every backend (the CPU's
//! `PagedKvCache`, the CUDA cache) stores exactly this layout.
//!
//! ```text
//! pool         [num_pages, page_words] u32        (one allocation; a page is page_words words)
//! block_table  [B, max_pages] i32                 (page of sequence b's tokens p*P..(p+1)*P)
//! seq_lens     [B] i32                            (tokens held by each sequence)
//!
//! token t of sequence b lives in page block_table[b, t / P], slot t % P
//!
//! one page, P = page_tokens tokens of one sequence, every KV head, 16-byte aligned sections:
//!   for h in 0..Hkv:                                          (head section: head_words)
//!     K codes   P rows of row_words_k u32                     (row = one vector's codes)
//!     V codes   P rows of row_words_v u32
//!     K norms   P norms (f32, or f16 two per word, low half first), padded to 4 words
//!     V norms   likewise
//! row_words_b = words_for(d, b) rounded up to a multiple of 4 (16 bytes): zero words pad it
//! ```
//!
//! A row holds one vector's codes exactly as the codec packs them (`kv::codec`: LSB first,
//! `bits` per coordinate, a code may straddle two words), so codes and norms are those of
//! [`crate::kv::Quantizer::encode`] bit for bit. Rows and sections are multiples of 16 bytes,
//! so a kernel reads them with 16-byte loads; no section is last in a page's head section
//! except V norms, so a whole-word read past the end of a code row stays inside the page (the
//! contiguous cache's `CODE_PAD` is not needed).
//!
//! Rules (checked by [`validate_block_table`] and [`check_append`]): `P` is a power of two in
//! [`PAGE_TOKENS_RANGE`]; every page a sequence uses (entries `0..ceil(len/P)` of its row) is
//! in `0..num_pages`, and no page is used twice (by two sequences, or twice by one); entries
//! past a sequence's pages are ignored (-1 by convention: "no page yet"). A sequence may hold
//! at most `max_pages * P` tokens.

use super::{KvScheme, NormDType, codec::words_for};
use crate::error::{Error, Result};
use crate::tensor::TensorMeta;

/// Allowed tokens per page (powers of two only).
pub const PAGE_TOKENS_RANGE: std::ops::RangeInclusive<usize> = 16..=1024;
/// Tokens per page unless the caller picks another size.
pub const DEFAULT_PAGE_TOKENS: usize = 64;

/// The paged layout of one layer's cache: the scheme and the page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    pub scheme: KvScheme,
    /// P, tokens per page.
    pub page_tokens: usize,
}

fn round4(words: usize) -> usize {
    words.div_ceil(4) * 4
}

impl PagedLayout {
    /// Checks the scheme and the page size.
    pub fn new(scheme: KvScheme, page_tokens: usize) -> Result<Self> {
        scheme.validate()?;
        if !PAGE_TOKENS_RANGE.contains(&page_tokens) || !page_tokens.is_power_of_two() {
            return Err(Error::InvalidValue(format!(
                "page_tokens = {page_tokens}: a page holds a power of two of tokens in {}..={}",
                PAGE_TOKENS_RANGE.start(),
                PAGE_TOKENS_RANGE.end()
            )));
        }
        Ok(Self {
            scheme,
            page_tokens,
        })
    }

    /// u32 words per key row (one vector's codes, padded to 16 bytes).
    pub fn row_words_k(&self) -> usize {
        round4(words_for(self.scheme.dim, self.scheme.bits_k))
    }

    /// u32 words per value row.
    pub fn row_words_v(&self) -> usize {
        round4(words_for(self.scheme.dim, self.scheme.bits_v))
    }

    /// u32 words of one norm section (P norms, padded to 16 bytes).
    pub fn norm_words(&self) -> usize {
        round4((self.page_tokens * self.scheme.norm_dtype.bytes()).div_ceil(4))
    }

    /// u32 words of one KV head's section of a page.
    pub fn head_words(&self) -> usize {
        self.page_tokens * (self.row_words_k() + self.row_words_v()) + 2 * self.norm_words()
    }

    /// u32 words of one page.
    pub fn page_words(&self) -> usize {
        self.scheme.kv_heads * self.head_words()
    }

    /// Bytes of one page.
    pub fn page_bytes(&self) -> usize {
        4 * self.page_words()
    }

    /// Word offset, within a page, of KV head `h`'s key rows.
    pub fn k_codes_offset(&self, h: usize) -> usize {
        h * self.head_words()
    }

    /// Word offset of head `h`'s value rows.
    pub fn v_codes_offset(&self, h: usize) -> usize {
        self.k_codes_offset(h) + self.page_tokens * self.row_words_k()
    }

    /// Word offset of head `h`'s key norms.
    pub fn k_norms_offset(&self, h: usize) -> usize {
        self.v_codes_offset(h) + self.page_tokens * self.row_words_v()
    }

    /// Word offset of head `h`'s value norms.
    pub fn v_norms_offset(&self, h: usize) -> usize {
        self.k_norms_offset(h) + self.norm_words()
    }

    /// Pages holding `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }
}

/// K or V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Key,
    Value,
}

/// Where one sequence's pages are: a pool `[num_pages, page_words]`, a block table
/// `[B, max_pages]` and the tokens each sequence holds (host copies of a cache's state).
#[derive(Clone, Copy, Debug)]
pub struct PagedView<'a> {
    pub layout: &'a PagedLayout,
    pub pool: &'a [u32],
    pub table: &'a [i32],
    pub max_pages: usize,
    pub lens: &'a [usize],
}

impl PagedView<'_> {
    /// The packed row (`words_for(d, bits)` words) and stored norm of token `t` of (seq, head).
    pub fn row(&self, stream: Stream, seq: usize, head: usize, t: usize) -> Result<(&[u32], f32)> {
        let l = self.layout;
        let s = l.scheme;
        if seq >= self.lens.len() || head >= s.kv_heads || t >= self.lens[seq] {
            return Err(Error::InvalidValue(format!(
                "(sequence {seq}, head {head}, token {t}) is not held by the cache"
            )));
        }
        let page = self.table[seq * self.max_pages + t / l.page_tokens];
        let base = usize::try_from(page)
            .map_err(|_| Error::InvalidValue(format!("token {t} of sequence {seq} has no page")))?
            * l.page_words();
        let slot = t % l.page_tokens;
        let (codes, stride, words, norms) = match stream {
            Stream::Key => (
                l.k_codes_offset(head),
                l.row_words_k(),
                words_for(s.dim, s.bits_k),
                l.k_norms_offset(head),
            ),
            Stream::Value => (
                l.v_codes_offset(head),
                l.row_words_v(),
                words_for(s.dim, s.bits_v),
                l.v_norms_offset(head),
            ),
        };
        let end = base + l.page_words();
        if end > self.pool.len() {
            return Err(Error::InvalidValue(format!(
                "page {page} lies past the pool's {} words",
                self.pool.len()
            )));
        }
        let row = &self.pool[base + codes + slot * stride..][..words];
        let norm = match s.norm_dtype {
            NormDType::F32 => f32::from_bits(self.pool[base + norms + slot]),
            NormDType::F16 => {
                let word = self.pool[base + norms + slot / 2];
                half::f16::from_bits((word >> (16 * (slot % 2))) as u16).to_f32()
            }
        };
        Ok((row, norm))
    }
}

/// Checks a block table `[batch, max_pages]` for sequences of `lens` tokens over a pool of
/// `num_pages` pages: see the module doc for the rules.
pub fn validate_block_table(
    layout: &PagedLayout,
    table: &[i32],
    max_pages: usize,
    lens: &[usize],
    num_pages: usize,
) -> Result<()> {
    let batch = lens.len();
    if table.len() != batch * max_pages {
        return Err(Error::shape(
            "block_table",
            format!(
                "{} entries, expected [B={batch}, max_pages={max_pages}] = {}",
                table.len(),
                batch * max_pages
            ),
        ));
    }
    let mut used = vec![usize::MAX; num_pages];
    for (b, &len) in lens.iter().enumerate() {
        let pages = layout.pages_for(len);
        if pages > max_pages {
            return Err(Error::InvalidValue(format!(
                "sequence {b} holds {len} tokens: {pages} pages of {} tokens, more than max_pages = {max_pages}",
                layout.page_tokens
            )));
        }
        for (p, &page) in table[b * max_pages..][..pages].iter().enumerate() {
            let index = usize::try_from(page)
                .ok()
                .filter(|&i| i < num_pages)
                .ok_or_else(|| {
                    Error::InvalidValue(format!(
                        "block_table[{b}, {p}] = {page} is not a page of the pool (0..{num_pages})"
                    ))
                })?;
            if used[index] != usize::MAX {
                return Err(Error::InvalidValue(format!(
                    "page {index} is used twice (block_table[{b}, {p}] and by sequence {})",
                    used[index]
                )));
            }
            used[index] = b;
        }
    }
    Ok(())
}

/// Checks that sequence `seq` (of `batch`), holding `len` tokens, can take `new_tokens` more
/// within `max_pages` pages; returns the new length.
pub fn check_append(
    layout: &PagedLayout,
    seq: usize,
    batch: usize,
    len: usize,
    new_tokens: usize,
    max_pages: usize,
) -> Result<usize> {
    if seq >= batch {
        return Err(Error::InvalidValue(format!(
            "sequence {seq} is out of range (batch {batch})"
        )));
    }
    let total = len + new_tokens;
    let capacity = max_pages * layout.page_tokens;
    if total > capacity {
        return Err(Error::InvalidValue(format!(
            "sequence {seq}: {len} + {new_tokens} tokens exceed its {max_pages} pages of {} tokens ({capacity})",
            layout.page_tokens
        )));
    }
    Ok(total)
}

/// Checks a chunk appended to the paged caches of `lens.len()` sequences on a device: `k` and
/// `v` of one shape `[B, Tn, Hkv, d]` and one float dtype, `new_lens` B counts of at most Tn, and
/// every sequence's growth within `max_pages` pages ([`check_append`]). Returns Tn and the
/// lengths after the append, or `None` when every count is zero (a valid append that writes
/// nothing).
pub fn check_append_chunk(
    layout: &PagedLayout,
    k: &(impl TensorMeta + ?Sized),
    v: &(impl TensorMeta + ?Sized),
    new_lens: &[usize],
    lens: &[usize],
    max_pages: usize,
) -> Result<Option<(usize, Vec<usize>)>> {
    let s = layout.scheme;
    let batch = lens.len();
    let shape = k.shape();
    if shape.len() != 4 || shape[0] != batch || shape[2] != s.kv_heads || shape[3] != s.dim {
        return Err(Error::shape(
            "k",
            format!(
                "expected [B={batch}, Tn, Hkv={}, D={}], got {shape:?}",
                s.kv_heads, s.dim
            ),
        ));
    }
    if v.shape() != shape || v.dtype() != k.dtype() {
        return Err(Error::shape(
            "v",
            format!("{:?} {} differs from k's", v.shape(), v.dtype()),
        ));
    }
    if !k.dtype().is_float() {
        return Err(Error::dtype("k", k.dtype(), "f32, f16 or bf16"));
    }
    let tokens = shape[1];
    if new_lens.len() != batch || new_lens.iter().any(|&n| n > tokens) {
        return Err(Error::InvalidValue(format!(
            "new_lens must hold B = {batch} counts, each at most Tn = {tokens}"
        )));
    }
    let grown = (lens.iter().zip(new_lens).enumerate())
        .map(|(b, (&len, &n))| check_append(layout, b, batch, len, n, max_pages))
        .collect::<Result<_>>()?;
    Ok(new_lens.iter().any(|&n| n > 0).then_some((tokens, grown)))
}

/// The queries of one attention call over a cache: Tq new tokens of Hq query heads for each
/// sequence, `group` = Hq / Hkv query heads sharing each KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryHeads {
    pub tq: usize,
    pub hq: usize,
    pub group: usize,
}

/// Checks an attention call's queries against a cache of `kv_heads` KV heads whose sequences
/// hold `lens` tokens: Hq a positive multiple of Hkv, Tq >= 1, and every sequence holding at
/// least Tq tokens (the new queries' own keys and values are in the cache).
pub fn check_query_heads(
    tq: usize,
    hq: usize,
    kv_heads: usize,
    lens: &[usize],
) -> Result<QueryHeads> {
    if hq == 0 || kv_heads == 0 || !hq.is_multiple_of(kv_heads) {
        return Err(Error::shape(
            "q",
            format!(
                "Hq = {hq} query heads is not a positive multiple of Hkv = {kv_heads} KV heads"
            ),
        ));
    }
    if tq == 0 {
        return Err(Error::shape("q", "Tq must be at least 1"));
    }
    if let Some((b, &len)) = lens.iter().enumerate().find(|&(_, &len)| len < tq) {
        return Err(Error::shape(
            "q",
            format!("Tq = {tq} new queries but sequence {b} has only {len} cached tokens"),
        ));
    }
    Ok(QueryHeads {
        tq,
        hq,
        group: hq / kv_heads,
    })
}

/// [`check_query_heads`] for q given as a tensor `[B, Tq, Hq, D]` of a float dtype on a device,
/// against a paged cache with `layout` whose sequences hold `lens` tokens.
pub fn check_query_tensor(
    layout: &PagedLayout,
    q: &(impl TensorMeta + ?Sized),
    lens: &[usize],
) -> Result<QueryHeads> {
    let s = layout.scheme;
    let batch = lens.len();
    let shape = q.shape();
    if shape.len() != 4 || shape[0] != batch || shape[3] != s.dim {
        return Err(Error::shape(
            "q",
            format!("expected [B={batch}, Tq, Hq, D={}], got {shape:?}", s.dim),
        ));
    }
    if !q.dtype().is_float() {
        return Err(Error::dtype("q", q.dtype(), "f32, f16 or bf16"));
    }
    check_query_heads(shape[1], shape[2], s.kv_heads, lens)
}

/// The attention's scale: `scale`, or D^-1/2 where `None`; an error where it is not finite.
pub fn attention_scale(scale: Option<f32>, dim: usize) -> Result<f32> {
    let scale = scale.unwrap_or(1.0 / (dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidValue(format!("scale {scale} is not finite")));
    }
    Ok(scale)
}

/// The block table after sequence `b` grows from `lens[b]` to `new_lens[b]` tokens, for every
/// `b`: entries that already name a page are kept (an engine's allocator chose them), and each
/// `-1` entry a sequence grows into takes the lowest page no sequence uses. The result is
/// checked ([`validate_block_table`]) against the new lengths.
pub fn assign_pages(
    layout: &PagedLayout,
    table: &[i32],
    max_pages: usize,
    lens: &[usize],
    new_lens: &[usize],
    num_pages: usize,
) -> Result<Vec<i32>> {
    validate_block_table(layout, table, max_pages, lens, num_pages)?;
    if new_lens.len() != lens.len() {
        return Err(Error::InvalidValue(format!(
            "{} new lengths for a batch of {}",
            new_lens.len(),
            lens.len()
        )));
    }
    let mut table = table.to_vec();
    let mut in_use = vec![false; num_pages];
    for (b, &len) in lens.iter().enumerate() {
        for &p in &table[b * max_pages..][..layout.pages_for(len)] {
            in_use[p as usize] = true;
        }
    }
    // Pages named by entries a sequence grows into are taken before any -1 entry is filled.
    for (b, (&len, &new_len)) in lens.iter().zip(new_lens).enumerate() {
        let need = layout.pages_for(new_len).min(max_pages);
        for &p in &table[b * max_pages..][layout.pages_for(len)..need] {
            if let Some(u) = usize::try_from(p).ok().and_then(|i| in_use.get_mut(i)) {
                *u = true;
            }
        }
    }
    for (b, (&len, &new_len)) in lens.iter().zip(new_lens).enumerate() {
        let need = layout.pages_for(new_len).min(max_pages);
        for p in layout.pages_for(len)..need {
            let entry = &mut table[b * max_pages + p];
            if *entry >= 0 {
                continue;
            }
            let free = in_use.iter().position(|&u| !u).ok_or_else(|| {
                Error::InvalidValue(format!(
                    "the pool's {num_pages} pages are all in use (sequence {b} needs page {p})"
                ))
            })?;
            in_use[free] = true;
            *entry = free as i32;
        }
    }
    validate_block_table(layout, &table, max_pages, new_lens, num_pages)?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, TensorSpec};

    #[test]
    fn queries_are_checked_against_the_cache() {
        let lens = [5, 3];
        let heads = check_query_heads(3, 8, 2, &lens).unwrap();
        assert_eq!(
            heads,
            QueryHeads {
                tq: 3,
                hq: 8,
                group: 4
            }
        );
        for (tq, hq, kv_heads, says) in [
            (1, 6, 4, "positive multiple"),
            (1, 0, 2, "positive multiple"),
            (1, 2, 0, "positive multiple"),
            (0, 8, 2, "at least 1"),
            (4, 8, 2, "sequence 1 has only 3 cached tokens"),
        ] {
            let err = check_query_heads(tq, hq, kv_heads, &lens).unwrap_err();
            assert!(
                err.to_string().contains(says),
                "{tq} {hq} {kv_heads}: {err}"
            );
        }
    }

    #[test]
    fn a_query_tensor_needs_the_cache_shape_and_a_float_dtype() {
        let layout = PagedLayout::new(KvScheme::new(64, 2, 4, 2), 16).unwrap();
        let lens = [4, 4];
        let q = |shape: Vec<usize>, dtype| TensorSpec(shape, dtype);
        let heads = check_query_tensor(&layout, &q(vec![2, 1, 6, 64], DType::BF16), &lens);
        assert_eq!(heads.unwrap().group, 3);
        for (shape, dtype) in [
            (vec![1, 1, 6, 64], DType::F32),
            (vec![2, 1, 6, 32], DType::F32),
            (vec![2, 6, 64], DType::F32),
            (vec![2, 1, 6, 64], DType::I32),
            (vec![2, 5, 6, 64], DType::F32),
        ] {
            let err = check_query_tensor(&layout, &q(shape.clone(), dtype), &lens);
            assert!(err.is_err(), "{shape:?} {dtype}");
        }
    }

    #[test]
    fn the_scale_defaults_to_the_inverse_root_of_d_and_must_be_finite() {
        assert_eq!(attention_scale(None, 64).unwrap(), 0.125);
        assert_eq!(attention_scale(Some(0.5), 64).unwrap(), 0.5);
        assert!(attention_scale(Some(f32::NAN), 64).is_err());
        assert!(attention_scale(Some(f32::INFINITY), 64).is_err());
    }

    #[test]
    fn sections_are_aligned_and_disjoint() {
        for (d, bk, bv) in [
            (128, 4, 2),
            (96, 3, 3),
            (100, 8, 2),
            (256, 8, 8),
            (64, 2, 3),
        ] {
            for p in [16, 64, 1024] {
                let layout = PagedLayout::new(KvScheme::new(d, 3, bk, bv), p).unwrap();
                assert_eq!(layout.head_words() % 4, 0);
                for h in 0..3 {
                    let offsets = [
                        layout.k_codes_offset(h),
                        layout.v_codes_offset(h),
                        layout.k_norms_offset(h),
                        layout.v_norms_offset(h),
                        layout.k_codes_offset(h + 1),
                    ];
                    assert!(offsets.windows(2).all(|w| w[0] < w[1] && w[0] % 4 == 0));
                }
                assert!(layout.row_words_k() >= words_for(d, bk));
            }
        }
        assert!(PagedLayout::new(KvScheme::new(128, 8, 4, 2), 48).is_err());
        assert!(PagedLayout::new(KvScheme::new(128, 8, 4, 2), 8).is_err());
    }

    #[test]
    fn block_tables_are_checked() {
        let layout = PagedLayout::new(KvScheme::new(128, 2, 4, 2), 16).unwrap();
        // Two sequences of 20 and 16 tokens: two pages and one.
        let good = [0, 3, -1, 1, -1, -1];
        validate_block_table(&layout, &good, 3, &[20, 16], 4).unwrap();
        assert!(validate_block_table(&layout, &good, 3, &[20, 17], 4).is_err()); // -1 used
        assert!(validate_block_table(&layout, &[0, 3, -1, 3, -1, -1], 3, &[20, 16], 4).is_err());
        assert!(validate_block_table(&layout, &[0, 4, -1, 1, -1, -1], 3, &[20, 16], 4).is_err());
        assert!(validate_block_table(&layout, &good, 3, &[49, 16], 4).is_err());
        assert!(validate_block_table(&layout, &good[..5], 3, &[20, 16], 4).is_err());
        assert_eq!(check_append(&layout, 1, 2, 16, 32, 3).unwrap(), 48);
        assert!(check_append(&layout, 1, 2, 16, 33, 3).is_err());
        assert!(check_append(&layout, 2, 2, 0, 1, 3).is_err());
    }

    #[test]
    fn appended_chunks_are_checked_against_the_cache() {
        use crate::DType;
        use crate::tensor::HostTensor;
        let layout = PagedLayout::new(KvScheme::new(64, 2, 4, 2), 16).unwrap();
        let chunk = |shape: Vec<usize>, dtype| {
            let n = shape.iter().product();
            HostTensor::from_f32_as(shape, &vec![0.5; n], dtype).unwrap()
        };
        let k = chunk(vec![2, 5, 2, 64], DType::BF16);
        // Sequences holding 3 and 20 tokens in 2 pages of 16 each.
        let appended = check_append_chunk(&layout, &k, &k, &[5, 2], &[3, 20], 2).unwrap();
        assert_eq!(appended, Some((5, vec![8, 22])));
        // Nothing to write: checked all the same, then `None`.
        assert_eq!(
            check_append_chunk(&layout, &k, &k, &[0, 0], &[3, 20], 2).unwrap(),
            None
        );
        let message = |v: &HostTensor, new_lens: &[usize], lens: &[usize]| {
            check_append_chunk(&layout, &k, v, new_lens, lens, 2)
                .unwrap_err()
                .to_string()
        };
        assert!(message(&k, &[5, 2], &[3, 31]).contains("exceed its 2 pages"));
        assert!(message(&k, &[6, 2], &[3, 20]).contains("at most Tn = 5"));
        assert!(message(&k, &[5], &[3, 20]).contains("B = 2 counts"));
        assert!(message(&chunk(vec![2, 5, 2, 64], DType::F32), &[5, 2], &[3, 20]).contains("v"));
        let wrong = chunk(vec![2, 5, 3, 64], DType::BF16);
        let err = check_append_chunk(&layout, &wrong, &wrong, &[5, 2], &[3, 20], 2).unwrap_err();
        assert!(err.to_string().contains("Hkv=2"), "{err}");
        let ints = HostTensor::from_i32(vec![2, 1, 2, 64], vec![1; 256]).unwrap();
        assert!(check_append_chunk(&layout, &ints, &ints, &[1, 1], &[3, 20], 2).is_err());
    }
}
