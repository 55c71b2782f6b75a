//! The paged compressed KV cache on the CPU: the contract's layout
//! (`deltakv_contract::kv::paged`: a pool of fixed-size pages of packed codes and norms, a
//! block table `[B, max_pages]` i32 and per-sequence lengths), the same bytes the CUDA cache
//! keeps on the GPU, and flash-decoding attention over it with the contiguous cache's kernels.
//!
//! Pages are assigned when a sequence grows into them: an entry of the block table that names
//! a page (set by an engine's allocator through [`PagedKvCache::set_block_table`]) is used as
//! is, and a `-1` entry takes the lowest free page of the pool.
//!
//! Attention is [`super::attention`]'s split-K flash-decoding with each block cut at page
//! boundaries: a block reads one page's rows of one KV head, through the same pass-1 kernels.

use super::attention::{AttnOptions, Plan, check_call, run};
use super::cache::check_append;
use super::kernel::{CodeStream, HeadSource, NormSlice};
use deltakv_contract::kv::NormDType;
use deltakv_contract::kv::book::{PagedBook, PagedCache};
use deltakv_contract::kv::paged::{PagedLayout, PagedView};
use deltakv_contract::{Error, Result};
use half::f16;
use rayon::prelude::*;

/// The paged compressed KV cache of one layer for a batch of sequences: the pool beside its
/// bookkeeping (the layout, quantizers, block table and lengths: [`PagedCache`]'s accessors).
#[derive(Clone, Debug)]
pub struct PagedKvCache {
    book: PagedBook,
    /// `[num_pages, page_words]`.
    pool: Vec<u32>,
}

/// One KV head's encoded new tokens: codes `[n, words]` and norms, for K and V.
struct Encoded {
    k_codes: Vec<u32>,
    k_norms: Vec<f32>,
    v_codes: Vec<u32>,
    v_norms: Vec<f32>,
}

impl PagedCache for PagedKvCache {
    fn book(&self) -> &PagedBook {
        &self.book
    }
}

impl PagedKvCache {
    /// An empty cache for `batch` sequences of up to `max_pages` pages each, over a pool of
    /// `num_pages` pages (every block table entry -1).
    pub fn new(
        layout: PagedLayout,
        batch: usize,
        max_pages: usize,
        num_pages: usize,
    ) -> Result<Self> {
        let book = PagedBook::new(layout, batch, max_pages, num_pages)?;
        Ok(Self {
            pool: vec![0; book.pool_words()],
            book,
        })
    }

    /// The page pool `[num_pages, page_words]`.
    pub fn pool(&self) -> &[u32] {
        &self.pool
    }

    /// Replaces the block table (an engine's allocator choosing the pages); checked against
    /// the tokens each sequence holds. The pages' contents are the caller's to have moved.
    pub fn set_block_table(&mut self, table: &[i32]) -> Result<()> {
        self.book.set_block_table(table)
    }

    /// Appends `n` tokens to sequence `seq`: `k`, `v` are `[n, kv_heads, d]` f32. A failed
    /// append (non-finite input, a norm beyond its storage, no free page) changes nothing.
    pub fn append(&mut self, seq: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let s = self.layout().scheme;
        let (heads, d) = (s.kv_heads, s.dim);
        let n = check_append(seq, self.batch(), k, v, heads, d)?;
        let growth = self.book.plan_append(seq, n)?;
        let old = self.lens()[seq];
        let (kq, vq) = (self.key_quantizer(), self.value_quantizer());
        let encoded: Vec<Encoded> = (0..heads)
            .into_par_iter()
            .map(|h| -> Result<Encoded> {
                let mut scratch = vec![0.0f32; d];
                let mut codes = vec![0u32; d];
                let mut out = Encoded {
                    k_codes: vec![0; n * kq.words()],
                    k_norms: Vec::with_capacity(n),
                    v_codes: vec![0; n * vq.words()],
                    v_norms: Vec::with_capacity(n),
                };
                let (first, stride) = (h * d, heads * d);
                let norms = &mut out.k_norms;
                kq.encode_rows(
                    k,
                    first,
                    stride,
                    n,
                    &mut out.k_codes,
                    &mut scratch,
                    &mut codes,
                    |x| norms.push(x),
                )?;
                let norms = &mut out.v_norms;
                vq.encode_rows(
                    v,
                    first,
                    stride,
                    n,
                    &mut out.v_codes,
                    &mut scratch,
                    &mut codes,
                    |x| norms.push(x),
                )?;
                Ok(out)
            })
            .collect::<Result<_>>()?;
        self.check_norms(&encoded)?;
        let (l, pw, max_pages) = (*self.layout(), self.layout().page_words(), self.max_pages());
        let (rwk, rwv) = (l.row_words_k(), l.row_words_v());
        let (wk, wv) = (kq.words(), vq.words());
        for (h, e) in encoded.iter().enumerate() {
            for i in 0..n {
                let t = old + i;
                let page = growth.table()[seq * max_pages + t / l.page_tokens] as usize;
                let (base, slot) = (page * pw, t % l.page_tokens);
                let row = &mut self.pool[base + l.k_codes_offset(h) + slot * rwk..][..rwk];
                row[..wk].copy_from_slice(&e.k_codes[i * wk..][..wk]);
                row[wk..].fill(0);
                let row = &mut self.pool[base + l.v_codes_offset(h) + slot * rwv..][..rwv];
                row[..wv].copy_from_slice(&e.v_codes[i * wv..][..wv]);
                row[wv..].fill(0);
                let dtype = s.norm_dtype;
                store_norm(
                    &mut self.pool[base + l.k_norms_offset(h)..],
                    slot,
                    e.k_norms[i],
                    dtype,
                );
                store_norm(
                    &mut self.pool[base + l.v_norms_offset(h)..],
                    slot,
                    e.v_norms[i],
                    dtype,
                );
            }
        }
        self.book.keep_lens(growth);
        Ok(())
    }

    /// Refuses norms beyond their storage (infinity would turn scores into NaN).
    fn check_norms(&self, encoded: &[Encoded]) -> Result<()> {
        let f16_storage = self.layout().scheme.norm_dtype == NormDType::F16;
        let fits = |x: f32| {
            if f16_storage {
                f16::from_f32(x).is_finite()
            } else {
                x.is_finite()
            }
        };
        for (h, e) in encoded.iter().enumerate() {
            for (name, norms) in [("k", &e.k_norms), ("v", &e.v_norms)] {
                if let Some(t) = norms.iter().position(|&x| !fits(x)) {
                    let limit = if f16_storage {
                        "the f16 norm storage (at most 65504); use f32 norms"
                    } else {
                        "the f32 norm storage"
                    };
                    return Err(Error::InvalidValue(format!(
                        "tensor `{name}`: the vector at token {t}, head {h} has a norm beyond {limit}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Bytes of codes plus norms, K and V together, of the tokens held (rows unpadded).
    pub fn bytes(&self) -> usize {
        let s = self.layout().scheme;
        self.lens().iter().sum::<usize>() * s.kv_heads * s.bytes_per_token_head()
    }

    /// The cache's pool, block table and lengths, to read rows with
    /// ([`PagedView::row`]).
    pub fn view(&self) -> PagedView<'_> {
        PagedView {
            layout: self.layout(),
            pool: &self.pool,
            table: self.block_table(),
            max_pages: self.max_pages(),
            lens: self.lens(),
        }
    }
}

fn store_norm(section: &mut [u32], slot: usize, norm: f32, dtype: NormDType) {
    match dtype {
        NormDType::F32 => section[slot] = norm.to_bits(),
        NormDType::F16 => {
            let (word, shift) = (slot / 2, 16 * (slot % 2));
            let bits = u32::from(f16::from_f32(norm).to_bits());
            section[word] = (section[word] & !(0xFFFF << shift)) | bits << shift;
        }
    }
}

fn norm_slice(words: &[u32], dtype: NormDType) -> NormSlice<'_> {
    match dtype {
        NormDType::F32 => NormSlice::F32Words(words),
        NormDType::F16 => NormSlice::F16Words(words),
    }
}

/// Attention over the paged cache: `q [B, Tq, Hq, D]` f32 → `o [B, Tq, Hq, D]` f32, the
/// same math and kernels as [`super::attend_compressed`].
pub fn attend_paged(
    cache: &PagedKvCache,
    q: &[f32],
    tq: usize,
    hq: usize,
    scale: f32,
    opts: &AttnOptions,
) -> Result<Vec<f32>> {
    let l = *cache.layout();
    let s = l.scheme;
    let lens = cache.lens().to_vec();
    check_call(q, &lens, tq, hq, s.kv_heads, s.dim, scale, opts)?;
    let plan = Plan {
        batch: lens.len(),
        tq,
        hq,
        hkv: s.kv_heads,
        d: s.dim,
        dim: s.dim.div_ceil(8) * 8,
        group: hq / s.kv_heads,
    };
    let rotation = cache.rotation();
    let pw = l.page_words();
    let dtype = s.norm_dtype;
    run(
        plan,
        &lens,
        q,
        scale,
        opts,
        |seq, head, t0| {
            let p = t0 / l.page_tokens;
            let page =
                &cache.pool[cache.block_table()[seq * cache.max_pages() + p] as usize * pw..][..pw];
            let source = HeadSource::Compressed {
                k: CodeStream {
                    codes: &page[l.k_codes_offset(head)..],
                    stride: l.row_words_k(),
                    norms: norm_slice(&page[l.k_norms_offset(head)..], dtype),
                },
                v: CodeStream {
                    codes: &page[l.v_codes_offset(head)..],
                    stride: l.row_words_v(),
                    norms: norm_slice(&page[l.v_norms_offset(head)..], dtype),
                },
                kq: cache.key_quantizer(),
                vq: cache.value_quantizer(),
                origin: p * l.page_tokens,
            };
            (source, (p + 1) * l.page_tokens)
        },
        |x, y| {
            rotation.forward(x, y)?;
            y[plan.d..].iter_mut().for_each(|v| *v = 0.0);
            Ok(())
        },
        |y, x| rotation.inverse(&y[..plan.d], x),
    )
}
