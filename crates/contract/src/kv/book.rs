//! The bookkeeping of a paged cache, the same on every backend: the layout, the quantizers of
//! both streams, the pool's size, and the block table and lengths as the host holds them. The
//! CPU's cache keeps its pool beside a [`PagedBook`]; a device cache keeps its pool, table and
//! lengths on the device and the book as their host mirror, so every append is checked (page
//! assignment, capacity) before a kernel runs. [`PagedCache`] gives every cache the book's
//! accessors.
//!
//! The book's table is always valid for its lengths ([`validate_block_table`]'s rules): it
//! changes only through [`PagedBook::set_block_table`] (checked), [`PagedBook::keep_table`] and
//! [`PagedBook::keep_lens`] (a [`Growth`] the book planned), and [`PagedBook::restore`] (a state
//! it held before).

use super::codebook::codebook;
use super::paged::{self, PagedLayout, validate_block_table};
use super::rotation::Rotation;
use super::{NormDType, Quantizer};
use crate::error::{Error, Result};
use crate::tensor::TensorMeta;
use std::sync::Arc;

/// A paged cache's host-side state (see the module docs).
#[derive(Clone, Debug)]
pub struct PagedBook {
    layout: PagedLayout,
    k: Quantizer,
    v: Quantizer,
    num_pages: usize,
    max_pages: usize,
    /// `[batch, max_pages]`, -1 where no page is assigned.
    table: Vec<i32>,
    lens: Vec<usize>,
}

/// The table and lengths of a book after an append it planned, not yet kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    table: Vec<i32>,
    lens: Vec<usize>,
    tokens: usize,
}

impl Growth {
    /// The block table with the pages the appended tokens land in.
    pub fn table(&self) -> &[i32] {
        &self.table
    }

    /// Every sequence's length after the append.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Tokens per sequence of the appended chunk (Tn; for a single sequence's append, its
    /// count).
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// A book's table and lengths at one moment ([`PagedBook::state`]), to return to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BookState {
    table: Vec<i32>,
    lens: Vec<usize>,
}

impl BookState {
    /// The block table then.
    pub fn table(&self) -> &[i32] {
        &self.table
    }
}

impl PagedBook {
    /// An empty book for `batch` sequences of up to `max_pages` pages each over a pool of
    /// `num_pages` pages (every block table entry -1). Refuses zero sizes, and sizes the layout's
    /// 32-bit integers cannot index (pages and lengths are i32 in the block table and on the
    /// devices).
    pub fn new(
        layout: PagedLayout,
        batch: usize,
        max_pages: usize,
        num_pages: usize,
    ) -> Result<Self> {
        let layout = PagedLayout::new(layout.scheme, layout.page_tokens)?;
        let s = layout.scheme;
        if batch == 0 || max_pages == 0 || num_pages == 0 {
            return Err(Error::InvalidValue(
                "a cache needs batch, max_pages and num_pages of at least 1".into(),
            ));
        }
        let fits_i32 = |x: Option<usize>| x.is_some_and(|x| x <= i32::MAX as usize);
        if !fits_i32(Some(num_pages)) {
            return Err(Error::Unsupported(format!(
                "num_pages = {num_pages}: a block table entry is an i32"
            )));
        }
        if !fits_i32(max_pages.checked_mul(layout.page_tokens)) {
            return Err(Error::Unsupported(format!(
                "max_pages x page_tokens = {max_pages} x {}: a sequence's length is an i32",
                layout.page_tokens
            )));
        }
        let words = num_pages.checked_mul(layout.page_words());
        if words.is_none_or(|w| w > isize::MAX as usize / 4) {
            return Err(Error::InvalidValue(format!(
                "a pool of {num_pages} pages is too large"
            )));
        }
        let table_len = batch
            .checked_mul(max_pages)
            .ok_or_else(|| Error::InvalidValue("the block table's size overflows".into()))?;
        let rotation = Arc::new(Rotation::new(s.dim, s.seed)?);
        let k = Quantizer::new(codebook(s.codebook, s.dim, s.bits_k)?, rotation.clone());
        let v = Quantizer::new(codebook(s.codebook, s.dim, s.bits_v)?, rotation);
        Ok(Self {
            layout,
            k,
            v,
            num_pages,
            max_pages,
            table: vec![-1; table_len],
            lens: vec![0; batch],
        })
    }

    /// Words of the pool, `[num_pages, page_words]`.
    pub fn pool_words(&self) -> usize {
        self.num_pages * self.layout.page_words()
    }

    /// Plans a new block table (an engine's allocator choosing the pages), checked against the
    /// tokens each sequence holds (the rules of [`validate_block_table`]): a [`Growth`] of no
    /// tokens, kept by [`Self::keep_table`] (a device cache copies it to the device first).
    pub fn plan_table(&self, table: &[i32]) -> Result<Growth> {
        validate_block_table(
            &self.layout,
            table,
            self.max_pages,
            &self.lens,
            self.num_pages,
        )?;
        Ok(Growth {
            table: table.to_vec(),
            lens: self.lens.clone(),
            tokens: 0,
        })
    }

    /// Replaces the block table ([`Self::plan_table`], then kept).
    pub fn set_block_table(&mut self, table: &[i32]) -> Result<()> {
        let planned = self.plan_table(table)?;
        self.keep_table(&planned);
        Ok(())
    }

    /// Plans the append of `n` tokens to sequence `seq` (`n` may be 0): the new length, and
    /// pages for it ([`paged::assign_pages`]).
    pub fn plan_append(&self, seq: usize, n: usize) -> Result<Growth> {
        let new_len = paged::check_append(
            &self.layout,
            seq,
            self.batch(),
            self.lens[seq.min(self.lens.len() - 1)],
            n,
            self.max_pages,
        )?;
        let mut lens = self.lens.clone();
        lens[seq] = new_len;
        self.grow(lens, n)
    }

    /// Plans the append of a chunk `k, v [B, Tn, Hkv, d]` on a device, `new_lens[b]` tokens to
    /// sequence b ([`paged::check_append_chunk`]); `None` when every count is zero.
    pub fn plan_chunk(
        &self,
        k: &(impl TensorMeta + ?Sized),
        v: &(impl TensorMeta + ?Sized),
        new_lens: &[usize],
    ) -> Result<Option<Growth>> {
        let planned =
            paged::check_append_chunk(&self.layout, k, v, new_lens, &self.lens, self.max_pages)?;
        planned
            .map(|(tokens, lens)| self.grow(lens, tokens))
            .transpose()
    }

    fn grow(&self, lens: Vec<usize>, tokens: usize) -> Result<Growth> {
        let table = paged::assign_pages(
            &self.layout,
            &self.table,
            self.max_pages,
            &self.lens,
            &lens,
            self.num_pages,
        )?;
        Ok(Growth {
            table,
            lens,
            tokens,
        })
    }

    /// Keeps a planned growth's table (it names every page the held lengths use, as before,
    /// so it is valid for them too): a device cache writes it before its encode runs.
    pub fn keep_table(&mut self, growth: &Growth) {
        self.table.clone_from(&growth.table);
    }

    /// Keeps a planned growth's lengths and table: the append happened.
    pub fn keep_lens(&mut self, growth: Growth) {
        self.table = growth.table;
        self.lens = growth.lens;
    }

    /// The table and lengths now, for [`Self::restore`].
    pub fn state(&self) -> BookState {
        BookState {
            table: self.table.clone(),
            lens: self.lens.clone(),
        }
    }

    /// Returns to a state this book held (an append refused after its table was kept).
    pub fn restore(&mut self, state: BookState) {
        self.table = state.table;
        self.lens = state.lens;
    }
}

/// What every paged cache answers from its [`PagedBook`].
pub trait PagedCache {
    /// The cache's bookkeeping.
    fn book(&self) -> &PagedBook;

    fn layout(&self) -> &PagedLayout {
        &self.book().layout
    }

    fn key_quantizer(&self) -> &Quantizer {
        &self.book().k
    }

    fn value_quantizer(&self) -> &Quantizer {
        &self.book().v
    }

    /// The rotation both streams share.
    fn rotation(&self) -> &Rotation {
        &self.book().k.rotation
    }

    /// Sequences of the cache.
    fn batch(&self) -> usize {
        self.book().lens.len()
    }

    fn max_pages(&self) -> usize {
        self.book().max_pages
    }

    fn num_pages(&self) -> usize {
        self.book().num_pages
    }

    /// Tokens held by each sequence.
    fn lens(&self) -> &[usize] {
        &self.book().lens
    }

    /// The block table `[batch, max_pages]`, -1 where no page is assigned.
    fn block_table(&self) -> &[i32] {
        &self.book().table
    }
}

impl PagedCache for PagedBook {
    fn book(&self) -> &PagedBook {
        self
    }
}

/// The refusal of a device append whose encode raised `flags` (bit 0: an input held a
/// non-finite value; bit 2, wgpu's: a token whose page is not in the pool; any other bit: a norm
/// beyond its `norm` storage); nothing was appended.
pub fn append_refusal(flags: i64, norm: NormDType) -> Error {
    Error::InvalidValue(if flags & 1 != 0 {
        "tensor `k` or `v` holds a non-finite value; nothing was appended".to_string()
    } else if flags & 4 != 0 {
        "a token's page is not in the pool (the block table moved after the encode was \
         prepared); nothing was appended"
            .to_string()
    } else if norm == NormDType::F16 {
        "a vector's norm is beyond the f16 norm storage (at most 65504); use f32 norms; nothing \
         was appended"
            .to_string()
    } else {
        "a vector's norm is beyond the f32 norm storage; nothing was appended".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvScheme;

    fn book(batch: usize, max_pages: usize, num_pages: usize) -> Result<PagedBook> {
        let scheme = KvScheme::new(64, 2, 4, 2);
        PagedBook::new(PagedLayout::new(scheme, 16)?, batch, max_pages, num_pages)
    }

    #[test]
    fn appends_plan_pages_and_keep_them_only_when_asked() {
        let mut b = book(2, 4, 6).unwrap();
        assert_eq!(b.block_table(), &[-1; 8]);
        let before = b.state();
        let growth = b.plan_append(1, 20).unwrap();
        assert_eq!(growth.lens(), &[0, 20]);
        assert_eq!(growth.table(), &[-1, -1, -1, -1, 0, 1, -1, -1]);
        assert_eq!(b.lens(), &[0, 0], "planning keeps nothing");
        b.keep_table(&growth);
        assert_eq!(b.block_table(), growth.table());
        b.restore(before.clone());
        assert_eq!(b.state(), before);
        b.keep_lens(growth);
        assert_eq!(b.lens(), &[0, 20]);
        // The next append fills the second sequence's page and takes a new one for the first.
        let growth = b.plan_append(0, 1).unwrap();
        assert_eq!(growth.table(), &[2, -1, -1, -1, 0, 1, -1, -1]);
        // More than max_pages pages, a sequence past the batch: refused.
        assert!(b.plan_append(0, 4 * 16 + 1).is_err());
        assert!(b.plan_append(2, 1).is_err());
    }

    #[test]
    fn tables_are_checked_against_the_held_lengths() {
        let mut b = book(2, 2, 3).unwrap();
        let growth = b.plan_append(0, 17).unwrap();
        b.keep_lens(growth);
        assert!(b.set_block_table(&[2, 1, -1, -1]).is_ok());
        assert_eq!(b.block_table(), &[2, 1, -1, -1]);
        // A page twice, a page outside the pool, a wrong size: refused, the table unchanged.
        for bad in [&[1, 1, -1, -1][..], &[3, 1, -1, -1], &[2, 1, -1]] {
            assert!(b.set_block_table(bad).is_err());
            assert_eq!(b.block_table(), &[2, 1, -1, -1]);
        }
    }

    #[test]
    fn sizes_the_layout_cannot_index_are_refused() {
        assert!(book(0, 1, 1).is_err());
        assert!(book(1, 0, 1).is_err());
        assert!(book(1, 1, 0).is_err());
        assert!(book(1, 1, i32::MAX as usize + 1).is_err());
        assert!(book(1, i32::MAX as usize / 16 + 1, 1).is_err());
        assert!(book(1, 1, 1).is_ok());
    }

    #[test]
    fn refusals_name_their_cause() {
        let text = |flags, norm| append_refusal(flags, norm).to_string();
        assert!(text(1, NormDType::F32).contains("non-finite"));
        assert!(text(2, NormDType::F16).contains("65504"));
        assert!(text(2, NormDType::F32).contains("f32 norm storage"));
    }
}
