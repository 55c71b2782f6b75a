//! The paged compressed KV cache resident on the GPU, and the encode that appends to it.
//!
//! The pool, block table and lengths are the contract's paged layout
//! (`deltakv_contract::kv::paged`), byte for byte the CPU's `PagedKvCache`. The host keeps a
//! mirror of the block table and the lengths (B integers each), so every append is checked
//! (page assignment, capacity) before a kernel runs; the codes and norms never leave the GPU.
//!
//! Encode (`kernels/kv_encode.cu`, launches in `encode.rs`): one launch (two where a d 128
//! scheme has one 2-bit stream) appends a chunk `k, v [B, Tn, Hkv, d]` (f32,
//! f16 or bf16; `new_lens[b] <= Tn` tokens of sequence b), encoding each vector (norm,
//! rotation, nearest level, packing, corrected norm) straight into its page row, codes and
//! norms bit for bit those of the CPU codec. [`CudaPagedKvCache::append`] then reads one flag
//! word and refuses (and undoes) an append with a non-finite input or a norm beyond its
//! storage, as the CPU cache does; [`CudaPagedKvCache::append_unchecked`] skips that wait (for
//! a serving loop that checks its inputs upstream, and for timing).

use super::encode::{
    EncodeLaunch, EncodeParams, LANE_SIGNS, LaneSigns, divide_magic, encode_launch,
    lane_encode_signs,
};
use super::{GRID_FLOATS, SOURCE_ENCODE, consts};
use crate::runtime::{Cuda, driver_error};
use crate::tensor::CudaTensor;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use deltakv_contract::kv::NormDType;
use deltakv_contract::kv::book::{Growth, PagedBook, PagedCache, append_refusal};
use deltakv_contract::kv::codec::words_for;
use deltakv_contract::kv::paged::PagedLayout;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// The paged compressed KV cache of one layer, on the GPU: the pool, block table and lengths
/// there, and their bookkeeping on the host ([`PagedCache`]'s accessors read the host's
/// mirror).
pub struct CudaPagedKvCache {
    book: PagedBook,
    /// `[num_pages, page_words]` (u32 words, typed i32).
    pool: CudaTensor,
    /// `[batch, max_pages]` i32.
    table: CudaTensor,
    /// `[batch]` i32.
    lens: CudaTensor,
    /// Codebooks and rotation (`kv::consts`).
    consts: CudaTensor,
    /// `[1]` i32 error bits of the last append.
    flags: CudaTensor,
    /// `[batch]` i32 tokens appended by the current launch.
    new_lens: CudaTensor,
    /// The one-lane encode kernels' sign words, where they serve this scheme
    /// ([`lane_encode_signs`]).
    lane_signs: Option<LaneSigns>,
}

impl std::fmt::Debug for CudaPagedKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPagedKvCache")
            .field("layout", self.layout())
            .field("lens", &self.lens())
            .field("num_pages", &self.num_pages())
            .finish()
    }
}

impl PagedCache for CudaPagedKvCache {
    fn book(&self) -> &PagedBook {
        &self.book
    }
}

fn i32_of(what: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Unsupported(format!("{what} = {x} exceeds i32 on CUDA")))
}

impl CudaPagedKvCache {
    /// An empty cache on the GPU for `batch` sequences of up to `max_pages` pages each, over a
    /// pool of `num_pages` zeroed pages (every block table entry -1). Its buffers are allocated
    /// and filled on `cuda`'s stream, which is waited for before this returns, so later calls
    /// may run on any stream (a handle of [`Cuda::on_stream`]). The buffers are freed on that
    /// first stream when the cache drops: work queued on other streams must be ordered before
    /// it by then.
    pub fn new(
        cuda: &Cuda,
        layout: PagedLayout,
        batch: usize,
        max_pages: usize,
        num_pages: usize,
    ) -> Result<Self> {
        let book = PagedBook::new(layout, batch, max_pages, num_pages)?;
        let table = HostTensor::from_i32(vec![batch, max_pages], book.block_table().to_vec())?;
        let (k, v) = (book.key_quantizer(), book.value_quantizer());
        let cache = Self {
            pool: CudaTensor::zeros(
                cuda,
                vec![num_pages, book.layout().page_words()],
                DType::I32,
            )?,
            table: CudaTensor::upload(cuda, &table)?,
            lens: CudaTensor::zeros(cuda, vec![batch], DType::I32)?,
            consts: CudaTensor::upload(cuda, &consts(k, v)?)?,
            flags: CudaTensor::zeros(cuda, vec![1], DType::I32)?,
            new_lens: CudaTensor::zeros(cuda, vec![batch], DType::I32)?,
            lane_signs: lane_encode_signs(k, v)?,
            book,
        };
        // Stream-ordered allocations and fills are valid on other streams only once the
        // stream that made them has run them.
        cuda.synchronize()?;
        Ok(cache)
    }

    /// The page pool on the GPU.
    pub fn pool(&self) -> &CudaTensor {
        &self.pool
    }

    pub(crate) fn device_table(&self) -> &CudaTensor {
        &self.table
    }

    pub(crate) fn device_lens(&self) -> &CudaTensor {
        &self.lens
    }

    pub(crate) fn device_consts(&self) -> &CudaTensor {
        &self.consts
    }

    /// The pool copied to the host (u32 words), for tests and checks.
    pub fn download_pool(&self, cuda: &Cuda) -> Result<Vec<u32>> {
        let host = self.pool.download(cuda)?;
        Ok(host
            .to_i64_vec("pool")?
            .into_iter()
            .map(|w| w as u32)
            .collect())
    }

    /// Replaces the block table (an engine's allocator choosing the pages), checked against
    /// the tokens each sequence holds.
    pub fn set_block_table(&mut self, cuda: &Cuda, table: &[i32]) -> Result<()> {
        if table != self.block_table() {
            let planned = self.book.plan_table(table)?;
            self.write_table(cuda, planned.table())?;
            self.book.keep_table(&planned);
        }
        Ok(())
    }

    /// `table` to the GPU's block table (the book keeps it only once the copy succeeded, so the
    /// two never disagree).
    fn write_table(&mut self, cuda: &Cuda, table: &[i32]) -> Result<()> {
        let host = HostTensor::from_i32(vec![self.batch(), self.max_pages()], table.to_vec())?;
        self.table.copy_from_host(cuda, &host)
    }

    /// Appends `new_lens[b]` tokens of `k, v [B, Tn, Hkv, d]` (f32, f16 or bf16, on the GPU)
    /// to sequence b, for every b; refuses, changing nothing, an append whose input holds a
    /// non-finite value or whose norm exceeds its storage (waits for the GPU to know).
    pub fn append(
        &mut self,
        cuda: &Cuda,
        k: &CudaTensor,
        v: &CudaTensor,
        new_lens: &[usize],
    ) -> Result<()> {
        let before = self.book.state();
        self.flags
            .copy_from_host(cuda, &HostTensor::from_i32(vec![1], vec![0])?)?;
        if !self.launch_append(cuda, k, v, new_lens, false)? {
            return Ok(());
        }
        let flags = self.flags.download(cuda)?.to_i64_vec("flags")?[0];
        if flags == 0 {
            return self.advance(cuda);
        }
        // The book returns to its state either way: a failed copy leaves the GPU's table naming
        // pages past the held tokens, which no launch reads and the next append rewrites.
        let written = self.write_table(cuda, before.table());
        self.book.restore(before);
        written?;
        Err(append_refusal(flags, self.layout().scheme.norm_dtype))
    }

    /// [`Self::append`] without waiting for the input check: the launches are queued and the
    /// lengths advance on the GPU. For inputs checked upstream, and for timing.
    pub fn append_unchecked(
        &mut self,
        cuda: &Cuda,
        k: &CudaTensor,
        v: &CudaTensor,
        new_lens: &[usize],
    ) -> Result<()> {
        self.launch_append(cuda, k, v, new_lens, true).map(|_| ())
    }

    /// Checks the chunk, assigns pages, queues the encode (and, when `advance`, the length
    /// update) and moves the host's lengths forward; false when there was nothing to append.
    fn launch_append(
        &mut self,
        cuda: &Cuda,
        k: &CudaTensor,
        v: &CudaTensor,
        new_lens: &[usize],
        advance: bool,
    ) -> Result<bool> {
        let Some((launch, growth)) = self.prepare_encode(cuda, k, v, new_lens)? else {
            return Ok(false);
        };
        // SAFETY: launched at once, under this cache's `&mut` borrow and the chunks' borrows.
        unsafe { launch.launch(cuda) }?;
        self.book.keep_lens(growth);
        if advance {
            self.advance(cuda)?;
        }
        Ok(true)
    }

    /// Checks a chunk, assigns the pages it lands in (the block table on the GPU is updated)
    /// and prepares its encode launch, without moving any length: each launch encodes the
    /// chunk into the same rows after the tokens held now (for timing the encode alone; an
    /// append is [`Self::append`]). `None` when every count is zero.
    pub fn prepare_append(
        &mut self,
        cuda: &Cuda,
        k: &CudaTensor,
        v: &CudaTensor,
        new_lens: &[usize],
    ) -> Result<Option<EncodeLaunch>> {
        Ok(self
            .prepare_encode(cuda, k, v, new_lens)?
            .map(|(launch, _)| launch))
    }

    /// [`Self::prepare_append`], also returning the planned growth (the table kept, the
    /// lengths not yet).
    fn prepare_encode(
        &mut self,
        cuda: &Cuda,
        k: &CudaTensor,
        v: &CudaTensor,
        new_lens: &[usize],
    ) -> Result<Option<(EncodeLaunch, Growth)>> {
        let s = self.layout().scheme;
        let batch = self.batch();
        let Some(growth) = self.book.plan_chunk(k, v, new_lens)? else {
            return Ok(None);
        };
        let tokens = growth.tokens();
        if growth.table() != self.block_table() {
            self.write_table(cuda, growth.table())?;
            self.book.keep_table(&growth);
        }
        let counts: Vec<i32> = new_lens.iter().map(|&n| n as i32).collect();
        self.new_lens
            .copy_from_host(cuda, &HostTensor::from_i32(vec![batch], counts)?)?;
        let l = *self.layout();
        let (heads_magic, heads_shift) = divide_magic(s.kv_heads as u32);
        let (tokens_magic, tokens_shift) = divide_magic(tokens as u32);
        // One lane per vector needs 16-byte-aligned vectors (whole-row 16-byte loads).
        let aligned = (k.device_address(cuda) | v.device_address(cuda)).is_multiple_of(16);
        let lane_signs = self.lane_signs.filter(|_| aligned);
        let lane = lane_signs.is_some();
        let params = EncodeParams {
            k: k.device_address(cuda),
            v: v.device_address(cuda),
            pool: self.pool.device_address_mut(cuda),
            block_table: self.table.device_address(cuda),
            seq_lens: self.lens.device_address(cuda),
            new_lens: self.new_lens.device_address(cuda),
            consts: self.consts.device_address(cuda),
            flags: self.flags.device_address_mut(cuda),
            batch: i32_of("B", batch)?,
            tokens: i32_of("Tn", tokens)?,
            kv_heads: s.kv_heads as i32,
            dim: s.dim as i32,
            in_dtype: crate::gdn::decode::dtype_code(k.dtype()),
            norm_f16: i32::from(s.norm_dtype == NormDType::F16),
            bits_k: s.bits_k as i32,
            bits_v: s.bits_v as i32,
            words_k: words_for(s.dim, s.bits_k) as i32,
            words_v: words_for(s.dim, s.bits_v) as i32,
            page_tokens: l.page_tokens as i32,
            max_pages: self.max_pages() as i32,
            page_words: i32_of("page_words", l.page_words())?,
            head_words: l.head_words() as i32,
            row_words_k: l.row_words_k() as i32,
            row_words_v: l.row_words_v() as i32,
            norm_words: l.norm_words() as i32,
            hadamard_norm: 1.0 / (s.dim as f32).sqrt(),
            // The grids are the constants' last 2 x GRID_FLOATS floats.
            grid: i32_of("grid offset", self.consts.shape()[0] - 2 * GRID_FLOATS)?,
            heads_magic,
            heads_shift,
            tokens_magic,
            tokens_shift,
            page_shift: l.page_tokens.trailing_zeros() as i32,
            first_stream: 0,
            signs: lane_signs.map_or([0; LANE_SIGNS], |signs| signs.words(k.dtype())),
        };
        let vectors = batch * tokens * s.kv_heads;
        // The Hadamard kernels index vectors in 32 bits (four per warp, the last pass past the
        // end): refuse a chunk that could wrap.
        if 4 * (vectors + 4 * 64 * cuda.multiprocessors()) >= 1 << 31 {
            return Err(Error::Unsupported(format!(
                "a chunk of B {batch} x Tn {tokens} x Hkv {} vectors is too large for one \
                 append on CUDA: split it (at most {} vectors per append)",
                s.kv_heads,
                (1usize << 29) - 4 * 64 * cuda.multiprocessors() - 1
            )));
        }
        let launch = encode_launch(
            cuda,
            params,
            &s,
            k.dtype(),
            lane,
            self.rotation().is_hadamard(),
            vectors,
        )?;
        Ok(Some((launch, growth)))
    }

    /// Queues `seq_lens += new_lens` on the GPU.
    fn advance(&mut self, cuda: &Cuda) -> Result<()> {
        let function = cuda.function(&SOURCE_ENCODE, "kv_advance_lens")?;
        let batch = self.batch() as i32;
        let (lens, new_lens) = (
            self.lens.device_address_mut(cuda),
            self.new_lens.device_address(cuda),
        );
        let mut builder = cuda.stream().launch_builder(&function);
        builder.arg(&lens).arg(&new_lens).arg(&batch);
        let config = LaunchConfig {
            grid_dim: ((batch as u32).div_ceil(128), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: both buffers hold `batch` i32.
        unsafe { builder.launch(config) }
            .map_err(|e| driver_error("launching kv_advance_lens", e))?;
        Ok(())
    }
}
