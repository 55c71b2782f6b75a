//! The paged compressed KV cache resident on the wgpu device, and the encode that appends to
//! it.
//!
//! The pool, block table and lengths are the contract's paged layout
//! (`deltakv_contract::kv::paged`), byte for byte the CPU's `PagedKvCache`. The host keeps a
//! mirror of the block table and the lengths (B integers each), so every append is checked
//! (page assignment, capacity) before a shader runs; the codes and norms never leave the
//! device.
//!
//! Encode (`encode.wgsl`): one dispatch appends a chunk `k, v [B, Tn, Hkv, d]` (f32, f16 or
//! bf16; `new_lens[b] <= Tn` tokens of sequence b), encoding each vector (norm, rotation,
//! nearest level, packing, corrected norm) straight into its page row, codes and norms those
//! of the CPU codec bit for bit (see the shader for the one exception). [`WgpuPagedKvCache::append`]
//! then reads one flag word and refuses (and undoes) an append with a non-finite input or a
//! norm beyond its storage, as the CPU cache does; [`WgpuPagedKvCache::append_unchecked`] skips
//! that wait (for a serving loop that checks its inputs upstream, and for timing).

use super::{Dispatch, SOURCE_ENCODE, consts, submit, uniform_bytes, write_i32};
use crate::runtime::{Wgpu, backend_error};
use crate::tensor::WgpuTensor;
use deltakv_contract::kv::NormDType;
use deltakv_contract::kv::book::{BookState, Growth, PagedBook, PagedCache, append_refusal};
use deltakv_contract::kv::codec::words_for;
use deltakv_contract::kv::paged::PagedLayout;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// A prepared encode dispatch (see [`WgpuPagedKvCache::prepare_append`]).
pub struct EncodeLaunch {
    dispatch: Dispatch,
    _uniform: wgpu::Buffer,
}

impl EncodeLaunch {
    /// Queues `repeat` encode dispatches in one submission (without waiting).
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        submit(wgpu, &[&self.dispatch], repeat, "running kv_encode")
    }
}

/// The paged compressed KV cache of one layer, on the wgpu device.
pub struct WgpuPagedKvCache {
    book: PagedBook,
    /// `[num_pages, page_words]` (u32 words, typed i32).
    pool: WgpuTensor,
    /// `[batch, max_pages]` i32.
    table: WgpuTensor,
    /// `[batch]` i32.
    lens: WgpuTensor,
    /// Codebooks and rotation (`kv::consts`).
    consts: WgpuTensor,
    /// `[1]` error bits of the last append.
    flags: WgpuTensor,
    /// `[batch]` i32 tokens appended by the current dispatch.
    new_lens: WgpuTensor,
}

impl std::fmt::Debug for WgpuPagedKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuPagedKvCache")
            .field("layout", self.layout())
            .field("lens", &self.lens())
            .field("num_pages", &self.num_pages())
            .finish()
    }
}

impl PagedCache for WgpuPagedKvCache {
    fn book(&self) -> &PagedBook {
        &self.book
    }
}

/// `x` as a shader index, or an error naming it.
pub(crate) fn u32_of(what: &str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::Unsupported(format!("{what} = {x} exceeds u32 on wgpu")))
}

impl WgpuPagedKvCache {
    /// An empty cache on the device for `batch` sequences of up to `max_pages` pages each,
    /// over a pool of `num_pages` zeroed pages (every block table entry -1).
    pub fn new(
        wgpu: &Wgpu,
        layout: PagedLayout,
        batch: usize,
        max_pages: usize,
        num_pages: usize,
    ) -> Result<Self> {
        let book = PagedBook::new(layout, batch, max_pages, num_pages)?;
        u32_of("pool words", book.pool_words())?;
        let table = HostTensor::from_i32(vec![batch, max_pages], book.block_table().to_vec())?;
        let (k, v) = (book.key_quantizer(), book.value_quantizer());
        Ok(Self {
            pool: WgpuTensor::zeros(
                wgpu,
                vec![num_pages, book.layout().page_words()],
                DType::I32,
            )?,
            table: WgpuTensor::upload(wgpu, &table)?,
            lens: WgpuTensor::zeros(wgpu, vec![batch], DType::I32)?,
            consts: WgpuTensor::upload(wgpu, &consts(k, v)?)?,
            flags: WgpuTensor::zeros(wgpu, vec![1], DType::I32)?,
            new_lens: WgpuTensor::zeros(wgpu, vec![batch], DType::I32)?,
            book,
        })
    }

    /// The page pool on the device.
    pub fn pool(&self) -> &WgpuTensor {
        &self.pool
    }

    pub(crate) fn device_table(&self) -> &WgpuTensor {
        &self.table
    }

    pub(crate) fn device_lens(&self) -> &WgpuTensor {
        &self.lens
    }

    pub(crate) fn device_consts(&self) -> &WgpuTensor {
        &self.consts
    }

    /// The pool copied to the host (u32 words), for tests and checks.
    pub fn download_pool(&self, wgpu: &Wgpu) -> Result<Vec<u32>> {
        let host = self.pool.download(wgpu)?;
        Ok(host
            .to_i64_vec("pool")?
            .into_iter()
            .map(|w| w as u32)
            .collect())
    }

    /// Replaces the block table (an engine's allocator choosing the pages), checked against
    /// the tokens each sequence holds.
    pub fn set_block_table(&mut self, wgpu: &Wgpu, table: &[i32]) -> Result<()> {
        if table != self.block_table() {
            self.book.set_block_table(table)?;
            write_i32(wgpu, &self.table, self.block_table())?;
        }
        Ok(())
    }

    /// The book's lengths to the device.
    fn write_lens(&self, wgpu: &Wgpu) -> Result<()> {
        let values: Vec<i32> = self.lens().iter().map(|&n| n as i32).collect();
        write_i32(wgpu, &self.lens, &values)
    }

    /// Appends `new_lens[b]` tokens of `k, v [B, Tn, Hkv, d]` (f32, f16 or bf16, on the
    /// device) to sequence b, for every b; refuses, changing nothing, an append whose input
    /// holds a non-finite value or whose norm exceeds its storage (waits for the device).
    pub fn append(
        &mut self,
        wgpu: &Wgpu,
        k: &WgpuTensor,
        v: &WgpuTensor,
        new_lens: &[usize],
    ) -> Result<()> {
        let before = self.book.state();
        write_i32(wgpu, &self.flags, &[0])?;
        let encoded = self
            .prepare_encode(wgpu, k, v, new_lens)
            .and_then(|prepared| {
                let Some((launch, growth)) = prepared else {
                    return Ok(None);
                };
                launch.submit(wgpu, 1)?;
                let flags = self.flags.download(wgpu)?.to_i64_vec("flags")?[0];
                Ok(Some((growth, flags)))
            });
        let refusal = match encoded {
            Ok(None) => return Ok(()),
            Ok(Some((growth, 0))) => {
                self.book.keep_lens(growth);
                return self.write_lens(wgpu);
            }
            Ok(Some((_, flags))) => append_refusal(flags, self.layout().scheme.norm_dtype),
            Err(e) => e,
        };
        self.give_back(wgpu, before);
        Err(refusal)
    }

    /// [`Self::append`] without waiting for the input check: the dispatch is queued and the
    /// lengths advance. For inputs checked upstream, and for timing.
    pub fn append_unchecked(
        &mut self,
        wgpu: &Wgpu,
        k: &WgpuTensor,
        v: &WgpuTensor,
        new_lens: &[usize],
    ) -> Result<()> {
        let before = self.book.state();
        let queued =
            self.prepare_encode(wgpu, k, v, new_lens)
                .and_then(|prepared| match prepared {
                    Some((launch, growth)) => launch.submit(wgpu, 1).map(|()| Some(growth)),
                    None => Ok(None),
                });
        match queued {
            Ok(Some(growth)) => {
                self.book.keep_lens(growth);
                self.write_lens(wgpu)
            }
            Ok(None) => Ok(()),
            Err(e) => {
                self.give_back(wgpu, before);
                Err(e)
            }
        }
    }

    /// Undoes a refused or failed append: the pages the chunk was given go back, on the host
    /// and in the device's block table.
    fn give_back(&mut self, wgpu: &Wgpu, before: BookState) {
        self.book.restore(before);
        // The caller returns the error that made it give the pages back; a failure to write
        // the table on top of that would say less.
        let _ = write_i32(wgpu, &self.table, self.block_table());
    }

    /// Checks a chunk, assigns the pages it lands in (the block table on the device is
    /// updated) and prepares its encode dispatch, without moving any length: each submission
    /// encodes the chunk into the same rows after the tokens held now (for timing the encode
    /// alone; an append is [`Self::append`]). `None` when every count is zero. The launch reads
    /// the cache's lengths and block table when it is submitted: after any other append to the
    /// cache it must not be submitted again (it would write where the tables now point; a token
    /// whose page is then not in the table is refused by the shader and written nowhere).
    pub fn prepare_append(
        &mut self,
        wgpu: &Wgpu,
        k: &WgpuTensor,
        v: &WgpuTensor,
        new_lens: &[usize],
    ) -> Result<Option<EncodeLaunch>> {
        // A preparation that fails gives the pages it assigned back.
        let before = self.book.state();
        match self.prepare_encode(wgpu, k, v, new_lens) {
            Ok(prepared) => Ok(prepared.map(|(launch, _)| launch)),
            Err(e) => {
                self.give_back(wgpu, before);
                Err(e)
            }
        }
    }

    /// The chunk's pages assigned (host and device tables), its counts written and its
    /// dispatch built, with the planned growth (the table kept, the lengths not yet). On an
    /// error the caller gives the pages back.
    fn prepare_encode(
        &mut self,
        wgpu: &Wgpu,
        k: &WgpuTensor,
        v: &WgpuTensor,
        new_lens: &[usize],
    ) -> Result<Option<(EncodeLaunch, Growth)>> {
        let s = self.layout().scheme;
        let batch = self.batch();
        let Some(growth) = self.book.plan_chunk(k, v, new_lens)? else {
            return Ok(None);
        };
        let tokens = growth.tokens();
        u32_of("k's elements", k.shape().iter().product())?;
        if growth.table() != self.block_table() {
            self.book.keep_table(&growth);
            write_i32(wgpu, &self.table, self.block_table())?;
        }
        let counts: Vec<i32> = new_lens.iter().map(|&n| n as i32).collect();
        write_i32(wgpu, &self.new_lens, &counts)?;
        let l = *self.layout();
        let vectors = u32_of("B x Tn x Hkv", batch * tokens * s.kv_heads)?;
        let max_groups = wgpu.device().limits().max_compute_workgroups_per_dimension;
        // One vector per workgroup and iteration; the workgroups loop over the rest.
        let groups = vectors.min(max_groups).min(16384);
        let params = [
            batch as u32,
            tokens as u32,
            s.kv_heads as u32,
            s.dim as u32,
            crate::gdn::recurrent::dtype_code(k.dtype()),
            u32::from(s.norm_dtype == NormDType::F16),
            s.bits_k,
            s.bits_v,
            words_for(s.dim, s.bits_k) as u32,
            words_for(s.dim, s.bits_v) as u32,
            l.page_tokens as u32,
            self.max_pages() as u32,
            l.page_words() as u32,
            l.head_words() as u32,
            l.row_words_k() as u32,
            l.row_words_v() as u32,
            l.norm_words() as u32,
            u32::from(self.rotation().is_hadamard()),
            (1.0 / (s.dim as f32).sqrt()).to_bits(),
            0,
            groups,
            // The shader refuses a table entry outside the pool (flag bit 2) instead of
            // writing the page wgpu's clamped indexing would pick.
            u32_of("pages", self.num_pages())?,
            0,
            0,
        ];
        let uniform = wgpu.buffer_with(
            "kv_encode params",
            &uniform_bytes(&params),
            wgpu::BufferUsages::UNIFORM,
        )?;
        // Built without wgpu's loop bounding, whose counters keep the driver from unrolling the
        // encode's loops (its sums, butterflies and level search; docs/wgpu.md, "KV encode on
        // the H100").
        // SAFETY: every loop of encode.wgsl ends: over the vectors by `groups` steps (at least
        // one wherever a workgroup runs), over d (checked at most 256) by the workgroup's 64
        // threads or by doubling, over fixed counts (limbs, lanes, rounding steps), and over a
        // code's bits by halving.
        let pipeline = unsafe { wgpu.pipeline_without_loop_bounding(&SOURCE_ENCODE, &[])? };
        let dispatch = Dispatch::new(
            wgpu,
            pipeline,
            &[
                ("params", &uniform),
                ("k", k.buffer()),
                ("v", v.buffer()),
                ("pool", self.pool.buffer()),
                ("block table", self.table.buffer()),
                ("sequence lengths", self.lens.buffer()),
                ("appended lengths", self.new_lens.buffer()),
                ("codebooks and rotation", self.consts.buffer()),
                ("flags", self.flags.buffer()),
            ],
            (groups, 2, 1),
        )
        .map_err(|e| backend_error("preparing kv_encode", e))?;
        Ok(Some((
            EncodeLaunch {
                dispatch,
                _uniform: uniform,
            },
            growth,
        )))
    }
}
