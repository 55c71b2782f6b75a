//! Flash-decoding over the GPU's paged compressed cache (`kernels/kv_attend.cu`): pass 1 per
//! (split, KV head x row chunk, sequence) over the packed codes, pass 2 merging the splits and
//! rotating back. Decode (Tq = 1) and the causal-chunk form (Tq > 1: query i of sequence b at
//! position `len_b - Tq + i`) are one kernel: the rows of a block are (query, head of the GQA
//! group) pairs, each with its causal limit.
//!
//! Pass 1 on tensor cores comes in two forms (`kernels/kv_attend_block.cu`,
//! `kernels/kv_attend_pages.cu`, over the tile math of `kernels/kv_attend_mma.cu`): tiles (each warp loads 16-token tiles from global memory into
//! registers) and pages (each warp streams whole page sections into shared memory by bulk
//! copies), the same math; see [`AttnKernel`].
//!
//! Splits: one full wave of resident blocks (the occupancy the driver reports for the launch:
//! three per SM on the H100 for the pages form at d = 128, so 396 blocks over 132 SMs: 49
//! splits at B = 1 with 8 KV heads, 6 at B = 8), never more than the longest sequence has
//! tiles (pages, for the pages form). Sequences of different lengths
//! share a launch: a block reads its sequence's length on the GPU and takes its share of that
//! sequence's tiles, so a prepared launch (or a CUDA graph of it) stays valid as the cache
//! grows, as long as no sequence outgrows `max_tokens` given at preparation.

use super::cache::CudaPagedKvCache;
use super::{SOURCE_ATTEND, SOURCES_ATTEND_MMA};
use crate::compile::KernelSource;
use crate::runtime::{Cuda, driver_error};
use crate::tensor::CudaTensor;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use deltakv_contract::env;
use deltakv_contract::kv::NormDType;
use deltakv_contract::kv::book::PagedCache;
use deltakv_contract::kv::paged::{QueryHeads, attention_scale, check_query_tensor};
use deltakv_contract::{DType, Error, Result};
use std::sync::OnceLock;

/// Mirrors `struct KvAttnParams` in `kernels/kv_attend.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AttnParams {
    q: u64,
    pool: u64,
    block_table: u64,
    seq_lens: u64,
    consts: u64,
    part_ml: u64,
    part_acc: u64,
    o: u64,
    batch: i32,
    tq: i32,
    hq: i32,
    kv_heads: i32,
    dim: i32,
    dim_pad: i32,
    group: i32,
    rows: i32,
    row_chunks: i32,
    q_dtype: i32,
    bits_k: i32,
    bits_v: i32,
    norm_f16: i32,
    hadamard: i32,
    page_tokens: i32,
    max_pages: i32,
    page_words: i32,
    head_words: i32,
    row_words_k: i32,
    row_words_v: i32,
    norm_words: i32,
    splits: i32,
    tile: i32,
    stages: i32,
    stage_words: i32,
    lanes_per_token: i32,
    scale: f32,
    hadamard_norm: f32,
    level_scale_k: f32,
    level_scale_v: f32,
    ml_log2: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for AttnParams {}

/// Which pass 1 runs (results agree to f32 rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnKernel {
    /// Tensor cores for 2-, 4- and 8-bit codes (the pages form where two of its blocks fit an
    /// SM, the tiles form otherwise), the scalar kernel for other widths. The environment
    /// variable `DELTAKV_KV_ATTEND` overrides it for comparisons: `scalar` everywhere, `tiles`
    /// or `pages` for the tensor-core form where it applies.
    #[default]
    Auto,
    /// `kv_attend_rows4` / `kv_attend_rows8`: f32 FMAs on CUDA cores, any bit width.
    Scalar,
    /// `kv_attend_mma_*`: `mma.sync` with f16 hi/lo pairs (2-, 4- or 8-bit codes only), each
    /// warp loading its 16-token tiles from global memory into registers.
    Mma,
    /// `kv_attend_pages_*`: the same math, each warp streaming whole pages into a
    /// shared-memory ring by bulk copies (2-, 4- or 8-bit codes whose ring fits the SM).
    MmaPages,
}

/// The pass-1 form a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Scalar,
    Tiles,
    Pages,
}

/// The form `DELTAKV_KV_ATTEND` asks for (where it serves the scheme; unset or `auto`: none),
/// read once per process.
fn asked_form() -> Result<Option<Form>> {
    static ASKED: OnceLock<std::result::Result<Option<Form>, String>> = OnceLock::new();
    ASKED
        .get_or_init(|| {
            env::choice(
                "DELTAKV_KV_ATTEND",
                &[
                    ("auto", None),
                    ("scalar", Some(Form::Scalar)),
                    ("pages", Some(Form::Pages)),
                    ("tiles", Some(Form::Tiles)),
                ],
                None,
            )
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(Error::InvalidValue)
}

/// Warps of a tensor-core block and the pages form's ring stages (`KVM_WARPS`, `KVP_STAGES`).
const MMA_WARPS: usize = 4;
const PAGE_STAGES: usize = 2;
/// An upper bound of the pages kernels' static shared memory (tables, weights, mbarriers).
const PAGES_STATIC_SMEM: usize = 4096;

/// The most shared memory a block may take on this GPU, and an SM holds.
fn shared_limits(cuda: &Cuda) -> Result<(usize, usize)> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let read = |attribute| {
        cuda.context()
            .attribute(attribute)
            .map(|bytes| bytes.max(0) as usize)
            .map_err(|e| driver_error("reading the shared-memory limits", e))
    };
    Ok((
        read(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        read(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
    ))
}

/// Pass 2's thread groups per output row at most (`KV_MERGE_GROUPS` in `kernels/kv_attend.cu`),
/// and the splits each group's loads cover at a time (a group per run of at least that many).
const MERGE_GROUPS: usize = 4;
const MERGE_LOADS: usize = 8;

/// The most splits a launch takes: pass 2 holds one merge weight per split in shared memory
/// (32 KB at this bound).
pub const MAX_SPLITS: usize = 8192;

/// Tuning of the attention launch (results do not depend on it beyond f32 rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaAttnOptions {
    /// Splits of each sequence's tokens (at most [`MAX_SPLITS`] and one per tile of the
    /// pass-1 form: 16 tokens, or a page for the pages form); `None`: one full wave of
    /// resident blocks.
    pub splits: Option<usize>,
    /// The longest sequence the launch must serve (splits are planned for it); `None`: the
    /// cache's longest sequence now.
    pub max_tokens: Option<usize>,
    /// The pass-1 kernel.
    pub kernel: AttnKernel,
}

/// The power of two that brings the largest |level| into [1, 2) (1 for an all-zero table).
fn level_scale(levels: &[f32]) -> f32 {
    let largest = levels.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if !(largest.is_normal()) {
        return 1.0;
    }
    let exponent = ((largest.to_bits() >> 23) & 0xff) as i32 - 127;
    2.0f32.powi(-exponent)
}

/// A validated attention call over a cache, ready to launch any number of times (a CUDA
/// graph captures [`AttendLaunch::launch`]); its output stays on the GPU.
pub struct AttendLaunch {
    params: AttnParams,
    pass1: CudaFunction,
    pass1_config: LaunchConfig,
    merge: CudaFunction,
    merge_config: LaunchConfig,
    // The partial buffers the parameters point into, kept alive with the launch.
    _part_ml: CudaTensor,
    _part_acc: CudaTensor,
    o: CudaTensor,
    splits: usize,
    kernel_name: &'static str,
}

impl AttendLaunch {
    /// Queues both passes on deltakv's stream.
    ///
    /// # Safety
    ///
    /// The launch holds device addresses, not borrows. When it is called, the
    /// cache and the query it was prepared from must be alive, and the cache's block table
    /// and lengths must be ones its own methods wrote (appends through them are followed:
    /// each launch reads the lengths the GPU holds when it runs).
    /// Dropping a tensor after the call is fine: deltakv frees device memory in its stream's
    /// order, after the work queued here.
    pub unsafe fn launch(&self, cuda: &Cuda) -> Result<()> {
        let mut builder = cuda.stream().launch_builder(&self.pass1);
        builder.arg(&self.params);
        // SAFETY: the parameters were built from buffers of the sizes the kernels index
        // (checked at preparation); the caller keeps the cache and the query alive and the
        // cache's table valid (this function's contract).
        unsafe { builder.launch(self.pass1_config) }
            .map_err(|e| driver_error("launching kv_attend (pass 1)", e))?;
        self.launch_merge(cuda)
    }

    /// Queues pass 2 as pass 1's programmatic dependent (`cuLaunchKernelEx` with programmatic
    /// stream serialization, kept by CUDA graph capture): its launch overlaps pass 1's last
    /// blocks, whose `griddepcontrol.launch_dependents` releases it, and its blocks wait in
    /// `griddepcontrol.wait` for pass 1's completion before reading the partial results.
    fn launch_merge(&self, cuda: &Cuda) -> Result<()> {
        // SAFETY: the one kernel argument is the parameter struct the merge takes, built from
        // live buffers as for pass 1 (see `launch`).
        unsafe {
            cuda.launch_programmatic_dependent(
                cuda.stream(),
                &self.merge,
                self.merge_config,
                &self.params,
            )
        }
        .map_err(|e| driver_error("launching kv_attend_merge", e))
    }

    /// `o [B, Tq, Hq, D]` f32, written by each launch.
    pub fn output(&self) -> &CudaTensor {
        &self.o
    }

    /// Splits of each sequence's tokens.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The pass-1 kernel's name.
    pub fn kernel_name(&self) -> &'static str {
        self.kernel_name
    }
}

/// Validates `q [B, Tq, Hq, D]` (f32, f16 or bf16, on the GPU) against the cache and prepares
/// the attention launch (`scale` defaults to D^-0.5). Every sequence must hold at least Tq
/// tokens. The launch reads the cache's buffers at their current addresses: launch it only
/// while the cache lives (appends keep the addresses). q's values are not scanned for NaN.
pub fn prepare_attend(
    cuda: &Cuda,
    cache: &CudaPagedKvCache,
    q: &CudaTensor,
    scale: Option<f32>,
    options: &CudaAttnOptions,
) -> Result<AttendLaunch> {
    let l = *cache.layout();
    let s = l.scheme;
    let batch = cache.batch();
    let QueryHeads { tq, hq, group } = check_query_tensor(&l, q, cache.lens())?;
    let scale = attention_scale(scale, s.dim)?;
    let rows = tq * group;
    let dim_pad = s.dim.next_power_of_two().max(64);
    let mma_bits = matches!(s.bits_k, 2 | 4 | 8) && matches!(s.bits_v, 2 | 4 | 8);
    // The pages form's rings (two page sections per warp) and q, its scratch and fragments.
    let pages_smem = 4 * MMA_WARPS * PAGE_STAGES * l.head_words() + 64 * dim_pad;
    let (per_block, per_sm) = shared_limits(cuda)?;
    let pages_block = pages_smem + PAGES_STATIC_SMEM;
    let pages_fit = pages_block <= per_block;
    // Auto takes the pages form where two of its blocks share an SM (the H100 at d <= 128 with
    // 4/2 bits and pages of 64: three); with one block per SM its 4 warps cannot hide the
    // math's latency and the tiles form is kept.
    let pages_auto = mma_bits && 2 * pages_block <= per_sm;
    let form = match options.kernel {
        AttnKernel::Auto => match asked_form()? {
            Some(Form::Scalar) => Form::Scalar,
            Some(Form::Pages) if mma_bits && pages_fit => Form::Pages,
            Some(Form::Tiles) if mma_bits => Form::Tiles,
            _ if pages_auto => Form::Pages,
            _ if mma_bits => Form::Tiles,
            _ => Form::Scalar,
        },
        AttnKernel::Scalar => Form::Scalar,
        AttnKernel::Mma | AttnKernel::MmaPages => {
            if !mma_bits {
                return Err(Error::Unsupported(format!(
                    "the tensor-core attention takes 2-, 4- or 8-bit codes, not {}/{}",
                    s.bits_k, s.bits_v
                )));
            }
            if options.kernel == AttnKernel::Mma {
                Form::Tiles
            } else if pages_fit {
                Form::Pages
            } else {
                return Err(Error::Unsupported(format!(
                    "the pages form's ring ({pages_smem} bytes) exceeds the GPU's shared memory per block"
                )));
            }
        }
    };
    let use_mma = form != Form::Scalar;
    let (row_block, per_lane) = if use_mma || rows <= 4 {
        (4, 16)
    } else {
        (8, 8)
    };
    let row_chunks = rows.div_ceil(row_block);
    // Splits count tiles of `tile` tokens (the pages form: whole pages).
    let (tile, stages, stage_words, smem_bytes) = match form {
        // q and its rotation scratch, the warps' partial outputs, the q fragments (8 bytes
        // per lane and 8 dimensions): 128 bytes per padded dimension.
        Form::Tiles => (16, 0, 0, 128 * dim_pad),
        Form::Pages => (l.page_tokens, 0, 0, pages_smem),
        Form::Scalar => {
            let tile = l.page_tokens.min(64);
            let norm_words = tile * s.norm_dtype.bytes() / 4;
            let stage_words = tile * (l.row_words_k() + l.row_words_v()) + 2 * norm_words + 4;
            let stages = (96 * 1024 / (4 * stage_words)).clamp(2, 4);
            let ring_words = (stages * stage_words).max(4 * row_block * dim_pad);
            let smem_floats =
                2 * row_block * dim_pad + 512 + 2 * row_block * tile + 3 * row_block.max(4);
            (tile, stages, stage_words, 4 * (smem_floats + ring_words))
        }
    };
    let longest = options
        .max_tokens
        .unwrap_or(0)
        .max(cache.lens().iter().copied().max().unwrap_or(0));
    let max_tiles = longest.div_ceil(tile).max(1);
    let (source, name) = match form {
        Form::Tiles => mma_kernel(s.bits_k, s.bits_v, dim_pad, false),
        Form::Pages => mma_kernel(s.bits_k, s.bits_v, dim_pad, true),
        Form::Scalar if row_block == 4 => (SOURCE_ATTEND, "kv_attend_rows4"),
        Form::Scalar => (SOURCE_ATTEND, "kv_attend_rows8"),
    };
    let pass1 = cuda.function(&source, name)?;
    // One full wave: as many splits as the resident blocks allow (a second, partial wave
    // would leave SMs idle at its end).
    let per_sm = pass1
        .occupancy_max_active_blocks_per_multiprocessor(128, smem_bytes, None)
        .map_err(|e| driver_error("reading the attention kernel's occupancy", e))?
        .max(1) as usize;
    let blocks_per_split = batch * s.kv_heads * row_chunks;
    let splits = options
        .splits
        .unwrap_or_else(|| (per_sm * cuda.multiprocessors() / blocks_per_split).max(1))
        .clamp(1, max_tiles.min(MAX_SPLITS));
    if batch > 65535 || s.kv_heads * row_chunks > 65535 {
        return Err(Error::Unsupported(format!(
            "CUDA attention takes at most 65535 sequences and 65535 head x row chunks, got B = {batch}, {}",
            s.kv_heads * row_chunks
        )));
    }
    let out_rows = batch * tq * hq;
    let mut part_ml = CudaTensor::zeros(cuda, vec![out_rows * splits * 2], DType::F32)?;
    let mut part_acc = CudaTensor::zeros(cuda, vec![out_rows * splits * dim_pad], DType::F32)?;
    let mut o = CudaTensor::poisoned(cuda, vec![batch, tq, hq, s.dim], DType::F32)?;
    let narrow = |what: &str, x: usize| {
        i32::try_from(x)
            .map_err(|_| Error::Unsupported(format!("{what} = {x} exceeds i32 on CUDA")))
    };
    let params = AttnParams {
        q: q.device_address(cuda),
        pool: cache.pool().device_address(cuda),
        block_table: cache.device_table().device_address(cuda),
        seq_lens: cache.device_lens().device_address(cuda),
        consts: cache.device_consts().device_address(cuda),
        part_ml: part_ml.device_address_mut(cuda),
        part_acc: part_acc.device_address_mut(cuda),
        o: o.device_address_mut(cuda),
        batch: batch as i32,
        tq: narrow("Tq", tq)?,
        hq: narrow("Hq", hq)?,
        kv_heads: s.kv_heads as i32,
        dim: s.dim as i32,
        dim_pad: dim_pad as i32,
        group: group as i32,
        rows: narrow("rows", rows)?,
        row_chunks: row_chunks as i32,
        q_dtype: crate::gdn::decode::dtype_code(q.dtype()),
        bits_k: s.bits_k as i32,
        bits_v: s.bits_v as i32,
        norm_f16: i32::from(s.norm_dtype == NormDType::F16),
        hadamard: i32::from(cache.key_quantizer().rotation.is_hadamard()),
        page_tokens: l.page_tokens as i32,
        max_pages: cache.max_pages() as i32,
        page_words: narrow("page_words", l.page_words())?,
        head_words: l.head_words() as i32,
        row_words_k: l.row_words_k() as i32,
        row_words_v: l.row_words_v() as i32,
        norm_words: l.norm_words() as i32,
        splits: splits as i32,
        tile: tile as i32,
        stages: stages as i32,
        stage_words: stage_words as i32,
        lanes_per_token: (dim_pad / per_lane) as i32,
        scale,
        hadamard_norm: 1.0 / (s.dim as f32).sqrt(),
        level_scale_k: level_scale(&cache.key_quantizer().codebook.levels),
        level_scale_v: level_scale(&cache.value_quantizer().codebook.levels),
        ml_log2: i32::from(use_mma),
    };
    Ok(AttendLaunch {
        params,
        pass1,
        pass1_config: LaunchConfig {
            grid_dim: (
                splits as u32,
                (s.kv_heads * row_chunks) as u32,
                batch as u32,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem_bytes as u32,
        },
        merge: cuda.function(&source, "kv_attend_merge")?,
        merge_config: LaunchConfig {
            grid_dim: (out_rows as u32, 1, 1),
            // Groups of dim_pad threads, each merging a run of MERGE_LOADS or more splits.
            block_dim: (
                (splits.div_ceil(MERGE_LOADS).clamp(1, MERGE_GROUPS) * dim_pad) as u32,
                1,
                1,
            ),
            // The splits' merge weights.
            shared_mem_bytes: (4 * splits) as u32,
        },
        _part_ml: part_ml,
        _part_acc: part_acc,
        o,
        splits,
        kernel_name: name,
    })
}

/// Attention over the cache: `o [B, Tq, Hq, D]` f32 on the GPU (see [`prepare_attend`]).
pub fn attend(
    cuda: &Cuda,
    cache: &CudaPagedKvCache,
    q: &CudaTensor,
    scale: Option<f32>,
) -> Result<CudaTensor> {
    let launch = prepare_attend(cuda, cache, q, scale, &CudaAttnOptions::default())?;
    // SAFETY: launched at once, while this function borrows the cache and the query.
    unsafe { launch.launch(cuda) }?;
    Ok(launch.o)
}

/// The tensor-core module and pass 1 (tiles or pages form) for these bit widths and padded
/// dimension.
fn mma_kernel(
    bits_k: u32,
    bits_v: u32,
    dim_pad: usize,
    pages: bool,
) -> (KernelSource, &'static str) {
    // The kernels of one form and bit-width pair, at d_pad 64, 128 and 256.
    macro_rules! kernel_names {
        ($form:literal, $k:literal, $v:literal) => {
            [
                concat!("kv_attend_", $form, "_k", $k, "v", $v, "_d64"),
                concat!("kv_attend_", $form, "_k", $k, "v", $v, "_d128"),
                concat!("kv_attend_", $form, "_k", $k, "v", $v, "_d256"),
            ]
        };
    }
    // Tiles form for the nine bit-width pairs, then the pages form.
    const NAMES: [[&str; 3]; 18] = [
        kernel_names!("mma", 2, 2),
        kernel_names!("mma", 2, 4),
        kernel_names!("mma", 2, 8),
        kernel_names!("mma", 4, 2),
        kernel_names!("mma", 4, 4),
        kernel_names!("mma", 4, 8),
        kernel_names!("mma", 8, 2),
        kernel_names!("mma", 8, 4),
        kernel_names!("mma", 8, 8),
        kernel_names!("pages", 2, 2),
        kernel_names!("pages", 2, 4),
        kernel_names!("pages", 2, 8),
        kernel_names!("pages", 4, 2),
        kernel_names!("pages", 4, 4),
        kernel_names!("pages", 4, 8),
        kernel_names!("pages", 8, 2),
        kernel_names!("pages", 8, 4),
        kernel_names!("pages", 8, 8),
    ];
    let bits = |b: u32| match b {
        2 => 0,
        4 => 1,
        _ => 2,
    };
    let d = match dim_pad {
        64 => 0,
        128 => 1,
        _ => 2,
    };
    let module = 3 * bits(bits_k) + bits(bits_v);
    (
        SOURCES_ATTEND_MMA[module],
        NAMES[module + 9 * usize::from(pages)][d],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bits_pair_and_dimension_names_a_kernel_of_its_module() {
        for (bits_k, bits_v) in [2u32, 4, 8]
            .into_iter()
            .flat_map(|k| [2u32, 4, 8].map(|v| (k, v)))
        {
            for (dim_pad, pages) in [64usize, 128, 256]
                .into_iter()
                .flat_map(|d| [(d, false), (d, true)])
            {
                let (source, name) = mma_kernel(bits_k, bits_v, dim_pad, pages);
                assert_eq!(source.name, format!("kv_attend_mma_k{bits_k}v{bits_v}"));
                let form = if pages { "pages" } else { "mma" };
                assert_eq!(
                    name,
                    format!("kv_attend_{form}_k{bits_k}v{bits_v}_d{dim_pad}")
                );
                assert!(source.text.contains(&format!("#define KVM_BK {bits_k}\n")));
                assert!(source.text.contains(&format!("#define KVM_BV {bits_v}\n")));
            }
        }
    }

    #[test]
    fn level_scales_are_powers_of_two_that_bring_the_largest_level_into_one_to_two() {
        for levels in [vec![-0.3f32, 0.1, 0.25], vec![-2.7, 2.7], vec![1e-3, -5e-4]] {
            let scale = level_scale(&levels);
            assert_eq!(
                scale.to_bits() & 0x7f_ffff,
                0,
                "{scale} is not a power of two"
            );
            let largest = levels.iter().fold(0.0f32, |m, &x| m.max(x.abs())) * scale;
            assert!((1.0..2.0).contains(&largest), "{levels:?}: {largest}");
        }
        assert_eq!(level_scale(&[0.0, 0.0]), 1.0);
    }
}
