//! Flash-decoding over the device's paged compressed cache: pass 1 (`attend.wgsl`) per
//! (split, KV head x chunk of four rows, sequence) over the packed codes, pass 2
//! (`merge.wgsl`) merging the splits and rotating back. Decode (Tq = 1) and the causal-chunk
//! form (Tq > 1: query i of sequence b at position `len_b - Tq + i`) are one shader: the rows
//! of a workgroup are (query, head of the GQA group) pairs, each with its causal limit.
//!
//! Pass 1 is built without wgpu's loop bounding (the counter naga adds to every loop, which
//! kept NVIDIA's Vulkan compiler from unrolling and measured slower on the H100; docs/wgpu.md).
//!
//! Splits: about 256 workgroups in all (4 splits at B = 8 with 8 KV heads, 32 at B = 1),
//! never more than the longest sequence has tiles of 128 tokens: on the H100 the fastest of
//! the split counts timed at both shapes (docs/wgpu.md).
//! Sequences of different lengths share a dispatch: a workgroup reads its sequence's length on
//! the device and takes its share of that sequence's tiles, so a prepared launch stays valid as
//! the cache grows, as long as no sequence outgrows `max_tokens` given at preparation.

use super::cache::{WgpuPagedKvCache, u32_of};
use super::{
    Dispatch, SOURCE_ATTEND_SHARED, SOURCE_ATTEND_SUBGROUP, SOURCE_MERGE, submit, uniform_bytes,
};
use crate::runtime::Wgpu;
use crate::tensor::WgpuTensor;
use crate::unroll::{Unroll, unrolled};
use deltakv_contract::kv::NormDType;
use deltakv_contract::kv::book::PagedCache;
use deltakv_contract::kv::paged::{QueryHeads, attention_scale, check_query_tensor};
use deltakv_contract::{DType, Error, Result};

/// Tokens per tile of the general pass 1 (its workgroup size).
const TILE: usize = 128;
/// Workgroups pass 1 aims at when picking the splits.
const TARGET_WORKGROUPS: usize = 256;

/// The loops of `attend.wgsl` written out before the driver sees them: over a thread's 16
/// value codes and dimensions (`c`), over the four rows (`r`), and over the codes of a key
/// word in the branch that `bits_k` takes (`k`: 128 / bits per 16-byte word, or 16 per 48-bit
/// step of 3-bit codes), so the accumulators, row vectors and code words are indexed by
/// constants only.
pub fn attend_loops(bits_k: u32) -> Vec<Unroll> {
    let key_codes = if bits_k == 3 {
        Unroll {
            header: "for (var k = 0u; k < 16u; k++) {",
            counter: "k",
            trips: 16,
        }
    } else {
        Unroll {
            header: "for (var k = 0u; k < per; k++) {",
            counter: "k",
            trips: 128 / bits_k,
        }
    };
    vec![
        Unroll {
            header: "for (var c = 0u; c < 16u; c++) {",
            counter: "c",
            trips: 16,
        },
        Unroll {
            header: "for (var r = 0u; r < 4u; r++) {",
            counter: "r",
            trips: 4,
        },
        key_codes,
    ]
}

/// Tuning of the attention launch (results do not depend on it beyond f32 rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuAttnOptions {
    /// Splits of each sequence's tokens; `None`: about 256 workgroups in all.
    pub splits: Option<usize>,
    /// The longest sequence the launch must serve (splits are planned for it); `None`: the
    /// cache's longest sequence now.
    pub max_tokens: Option<usize>,
}

/// A validated attention call over a cache, ready to submit any number of times; its output
/// stays on the device.
pub struct AttendLaunch {
    pass1: Dispatch,
    merge: Dispatch,
    _uniform: wgpu::Buffer,
    _part_ml: WgpuTensor,
    _part_acc: WgpuTensor,
    o: WgpuTensor,
    splits: usize,
}

impl AttendLaunch {
    /// Queues `repeat` rounds of both passes in one submission (without waiting).
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        submit(
            wgpu,
            &[&self.pass1, &self.merge],
            repeat,
            "running kv_attend",
        )
    }

    /// `o [B, Tq, Hq, D]` f32, written by each submission.
    pub fn output(&self) -> &WgpuTensor {
        &self.o
    }

    /// Splits of each sequence's tokens.
    pub fn splits(&self) -> usize {
        self.splits
    }
}

/// Validates `q [B, Tq, Hq, D]` (f32, f16 or bf16, on the device) against the cache and
/// prepares the attention launch (`scale` defaults to D^-0.5). Every sequence must hold at
/// least Tq tokens. The launch binds the cache's buffers: submit it only while the cache lives
/// (appends keep the buffers). q's values are not scanned for NaN.
pub fn prepare_attend(
    wgpu: &Wgpu,
    cache: &WgpuPagedKvCache,
    q: &WgpuTensor,
    scale: Option<f32>,
    options: &WgpuAttnOptions,
) -> Result<AttendLaunch> {
    let l = *cache.layout();
    let s = l.scheme;
    let batch = cache.batch();
    let QueryHeads { tq, hq, group } = check_query_tensor(&l, q, cache.lens())?;
    let scale = attention_scale(scale, s.dim)?;
    let rows = tq * group;
    let row_chunks = rows.div_ceil(4);
    let dim_pad = s.dim.next_power_of_two().max(64);
    let lanes = s.dim.div_ceil(16).next_power_of_two();
    let longest = options
        .max_tokens
        .unwrap_or(0)
        .max(cache.lens().iter().copied().max().unwrap_or(0));
    let max_tiles = longest.div_ceil(TILE).max(1);
    let per_split = batch * s.kv_heads * row_chunks;
    let splits = options
        .splits
        .unwrap_or_else(|| TARGET_WORKGROUPS.div_ceil(per_split))
        .clamp(1, max_tiles);
    let max_groups = wgpu.device().limits().max_compute_workgroups_per_dimension as usize;
    if batch > max_groups || s.kv_heads * row_chunks > max_groups || splits > max_groups {
        return Err(Error::Unsupported(format!(
            "wgpu attention takes at most {max_groups} sequences, head x row chunks and splits, got B = {batch}, {}",
            s.kv_heads * row_chunks
        )));
    }
    let out_rows = batch * tq * hq;
    u32_of("q's elements", out_rows * s.dim)?;
    u32_of("partial outputs", out_rows * splits * dim_pad)?;
    let part_ml = WgpuTensor::zeros(wgpu, vec![out_rows * splits * 2], DType::F32)?;
    let part_acc = WgpuTensor::zeros(wgpu, vec![out_rows * splits * dim_pad], DType::F32)?;
    let o = WgpuTensor::poisoned(wgpu, vec![batch, tq, hq, s.dim], DType::F32)?;
    let merge_groups = out_rows.min(max_groups);
    let merge_rows = out_rows.div_ceil(merge_groups);
    let params = [
        batch as u32,
        tq as u32,
        hq as u32,
        s.kv_heads as u32,
        s.dim as u32,
        dim_pad as u32,
        group as u32,
        rows as u32,
        row_chunks as u32,
        crate::gdn::recurrent::dtype_code(q.dtype()),
        u32::from(s.norm_dtype == NormDType::F16),
        u32::from(cache.key_quantizer().rotation.is_hadamard()),
        l.page_tokens as u32,
        cache.max_pages() as u32,
        l.page_words() as u32,
        l.head_words() as u32,
        l.row_words_k() as u32,
        l.row_words_v() as u32,
        l.norm_words() as u32,
        splits as u32,
        scale.to_bits(),
        (1.0 / (s.dim as f32).sqrt()).to_bits(),
        out_rows as u32,
        merge_groups as u32,
    ];
    let uniform = wgpu.buffer_with(
        "kv_attend params",
        &uniform_bytes(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let constants = [
        ("BITS_K", s.bits_k),
        ("BITS_V", s.bits_v),
        ("LANES", lanes as u32),
    ];
    let source = if wgpu.has_subgroups() {
        SOURCE_ATTEND_SUBGROUP
    } else {
        SOURCE_ATTEND_SHARED
    };
    let source = unrolled(&source, &attend_loops(s.bits_k))?;
    // SAFETY: every loop of attend.wgsl ends: its bounds are pipeline constants, the head dim
    // (64..=256, validated) and the validated parameters.
    let pipeline = unsafe { wgpu.pipeline_without_loop_bounding(&source, &constants)? };
    let pool = cache.pool().buffer();
    let pass1 = Dispatch::new(
        wgpu,
        pipeline,
        &[
            ("params", &uniform),
            ("q", q.buffer()),
            ("pool", pool),
            ("pool (16-byte view)", pool),
            ("block table", cache.device_table().buffer()),
            ("sequence lengths", cache.device_lens().buffer()),
            ("codebooks and rotation", cache.device_consts().buffer()),
            ("partial m and l", part_ml.buffer()),
            ("partial outputs", part_acc.buffer()),
        ],
        (
            splits as u32,
            (s.kv_heads * row_chunks) as u32,
            batch as u32,
        ),
    )?;
    let merge = Dispatch::new(
        wgpu,
        wgpu.pipeline(&SOURCE_MERGE, &[])?,
        &[
            ("params", &uniform),
            ("codebooks and rotation", cache.device_consts().buffer()),
            ("partial m and l", part_ml.buffer()),
            ("partial outputs", part_acc.buffer()),
            ("o", o.buffer()),
        ],
        (merge_groups as u32, merge_rows as u32, 1),
    )?;
    Ok(AttendLaunch {
        pass1,
        merge,
        _uniform: uniform,
        _part_ml: part_ml,
        _part_acc: part_acc,
        o,
        splits,
    })
}

/// Attention over the cache: `o [B, Tq, Hq, D]` f32 on the device (see [`prepare_attend`]).
pub fn attend(
    wgpu: &Wgpu,
    cache: &WgpuPagedKvCache,
    q: &WgpuTensor,
    scale: Option<f32>,
) -> Result<WgpuTensor> {
    let launch = prepare_attend(wgpu, cache, q, scale, &WgpuAttnOptions::default())?;
    launch.submit(wgpu, 1)?;
    Ok(launch.o)
}
