//! Flash-decoding over the device's paged compressed cache: pass 1 (`attend.wgsl`) per
//! (split, KV head x chunk of four rows, sequence) over the packed codes, pass 2
//! (`merge.wgsl`) merging the splits and rotating back. Decode (Tq = 1) and the causal-chunk
//! form (Tq > 1: query i of sequence b at position `len_b - Tq + i`) are one shader: the rows
//! of a workgroup are (query, head of the GQA group) pairs, each with its causal limit.
//!
//! Pass 1 comes in two forms ([`AttendKernel`]): the general one (`attend.wgsl`, every d and
//! bit width) and the lanes form (`attend_lanes.wgsl`: d 64, 128 or 256, 2-, 4- or 8-bit codes,
//! LANES = d / 16 threads per token with q' and the accumulators in registers); both write the
//! same partials, so the merge is one.
//!
//! Splits: enough workgroups to fill a large GPU several times over (about 1024: 16 splits at
//! B = 8 with 8 KV heads), never more than the longest sequence has tiles of 128 tokens.
//! Sequences of different lengths share a dispatch: a workgroup reads its sequence's length on
//! the device and takes its share of that sequence's tiles, so a prepared launch stays valid as
//! the cache grows, as long as no sequence outgrows `max_tokens` given at preparation.

use super::cache::{WgpuPagedKvCache, u32_of};
use super::{
    Dispatch, SOURCE_ATTEND, SOURCE_ATTEND_LANES_SHARED, SOURCE_ATTEND_LANES_SUBGROUP,
    SOURCE_MERGE, submit, uniform_bytes,
};
use crate::runtime::{ShaderSource, Wgpu};
use crate::tensor::WgpuTensor;
use deltakv_contract::kv::NormDType;
use deltakv_contract::{DType, Error, Result};
use wgpu::util::DeviceExt;

/// Tokens per tile of the general pass 1 (its workgroup size).
const TILE: usize = 128;
/// The environment variable that picks pass 1's form for [`AttendKernel::Auto`]: one of
/// [`AttendKernel::name`] (e.g. `tiled`, `lanes`).
pub const KERNEL_ENV: &str = "DELTAKV_WGPU_KV_ATTEND";
/// Workgroups pass 1 aims at when picking the splits.
const TARGET_WORKGROUPS: usize = 1024;

/// The form of pass 1. A lanes form asked for a shape it does not serve (d other than 64, 128
/// or 256, 3-bit codes) runs the tiled one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttendKernel {
    /// `DELTAKV_WGPU_KV_ATTEND` if set, else [`AttendKernel::TiledUnbounded`] (the fastest
    /// form measured on the H100).
    #[default]
    Auto,
    /// `attend.wgsl`: a thread per token scores its whole key row; tiles of 128 tokens.
    Tiled,
    /// `attend_lanes.wgsl`: d / 16 lanes per token, q' in registers, the lanes' dots summed
    /// by subgroup shuffles where the adapter has them; tiles of 128 tokens (64 at d 256).
    Lanes,
    /// [`AttendKernel::Lanes`] with tiles of 64 tokens.
    LanesTile64,
    /// [`AttendKernel::Lanes`] with q' read from workgroup memory (fewer registers).
    LanesQShared,
    /// [`AttendKernel::Lanes`] with the dots summed through workgroup memory, subgroups or not.
    LanesNoShuffle,
    /// [`AttendKernel::Lanes`] built without wgpu's loop bounding
    /// ([`Wgpu::pipeline_without_loop_bounding`]).
    LanesUnbounded,
    /// [`AttendKernel::Tiled`] built without wgpu's loop bounding.
    TiledUnbounded,
}

impl AttendKernel {
    /// Every explicit form.
    pub const ALL: [AttendKernel; 7] = [
        AttendKernel::Tiled,
        AttendKernel::Lanes,
        AttendKernel::LanesTile64,
        AttendKernel::LanesQShared,
        AttendKernel::LanesNoShuffle,
        AttendKernel::LanesUnbounded,
        AttendKernel::TiledUnbounded,
    ];

    /// The form's name (as `DELTAKV_WGPU_KV_ATTEND` takes it).
    pub fn name(self) -> &'static str {
        match self {
            AttendKernel::Auto => "auto",
            AttendKernel::Tiled => "tiled",
            AttendKernel::Lanes => "lanes",
            AttendKernel::LanesTile64 => "lanes-tile64",
            AttendKernel::LanesQShared => "lanes-qshared",
            AttendKernel::LanesNoShuffle => "lanes-noshuffle",
            AttendKernel::LanesUnbounded => "lanes-unbounded",
            AttendKernel::TiledUnbounded => "tiled-unbounded",
        }
    }

    /// The form named `name` (see [`AttendKernel::name`]).
    pub fn from_name(name: &str) -> Result<Self> {
        let name = name.trim();
        std::iter::once(AttendKernel::Auto)
            .chain(AttendKernel::ALL)
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                Error::InvalidValue(format!(
                    "{KERNEL_ENV}={name}: expected one of auto, tiled, lanes, lanes-tile64, lanes-qshared, lanes-noshuffle, lanes-unbounded, tiled-unbounded"
                ))
            })
    }

    /// The form that runs at head dim `dim` with these bit widths (`Auto` resolved through
    /// the environment; lanes forms fall back to tiled where they do not serve).
    pub fn resolve(self, dim: usize, bits_k: u32, bits_v: u32) -> Result<Self> {
        let asked = match self {
            AttendKernel::Auto => match std::env::var(KERNEL_ENV) {
                Ok(v) if !v.trim().is_empty() => AttendKernel::from_name(&v)?,
                _ => AttendKernel::TiledUnbounded,
            },
            k => k,
        };
        let asked = if asked == AttendKernel::Auto {
            AttendKernel::TiledUnbounded
        } else {
            asked
        };
        let lanes_serve =
            matches!(dim, 64 | 128 | 256) && [bits_k, bits_v].iter().all(|b| [2, 4, 8].contains(b));
        Ok(if asked.is_tiled() || lanes_serve {
            asked
        } else if asked == AttendKernel::LanesUnbounded {
            AttendKernel::TiledUnbounded
        } else {
            AttendKernel::Tiled
        })
    }

    fn is_tiled(self) -> bool {
        matches!(self, AttendKernel::Tiled | AttendKernel::TiledUnbounded)
    }

    fn is_unbounded(self) -> bool {
        matches!(
            self,
            AttendKernel::LanesUnbounded | AttendKernel::TiledUnbounded
        )
    }

    /// Tokens per tile of pass 1 at head dim `dim`.
    fn tile(self, dim: usize) -> usize {
        match self {
            AttendKernel::Auto | AttendKernel::Tiled | AttendKernel::TiledUnbounded => TILE,
            AttendKernel::LanesTile64 => 64,
            _ => (1024 / (dim / 16)).min(128),
        }
    }
}

/// Tuning of the attention launch (results do not depend on it beyond f32 rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuAttnOptions {
    /// Splits of each sequence's tokens; `None`: about 1024 workgroups in all.
    pub splits: Option<usize>,
    /// The longest sequence the launch must serve (splits are planned for it); `None`: the
    /// cache's longest sequence now.
    pub max_tokens: Option<usize>,
    /// Pass 1's form.
    pub kernel: AttendKernel,
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
    kernel: AttendKernel,
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

    /// The form of pass 1 that runs.
    pub fn kernel(&self) -> AttendKernel {
        self.kernel
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
    let shape = q.shape().to_vec();
    let batch = cache.batch();
    if shape.len() != 4 || shape[0] != batch || shape[3] != s.dim {
        return Err(Error::shape(
            "q",
            format!("expected [B={batch}, Tq, Hq, D={}], got {shape:?}", s.dim),
        ));
    }
    if !q.dtype().is_float() {
        return Err(Error::dtype("q", q.dtype(), "f32, f16 or bf16"));
    }
    let (tq, hq) = (shape[1], shape[2]);
    if tq == 0 || hq == 0 || !hq.is_multiple_of(s.kv_heads) {
        return Err(Error::shape(
            "q",
            format!(
                "Tq >= 1 and Hq = {hq} a multiple of Hkv = {} needed",
                s.kv_heads
            ),
        ));
    }
    if let Some((b, &len)) = cache.lens().iter().enumerate().find(|&(_, &len)| len < tq) {
        return Err(Error::shape(
            "q",
            format!("Tq = {tq} new queries but sequence {b} holds only {len} tokens"),
        ));
    }
    let scale = scale.unwrap_or(1.0 / (s.dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidValue(format!("scale {scale} is not finite")));
    }
    let group = hq / s.kv_heads;
    let rows = tq * group;
    let row_chunks = rows.div_ceil(4);
    let dim_pad = s.dim.next_power_of_two().max(64);
    let lanes = s.dim.div_ceil(16).next_power_of_two();
    let longest = options
        .max_tokens
        .unwrap_or(0)
        .max(cache.lens().iter().copied().max().unwrap_or(0));
    let kernel = options.kernel.resolve(s.dim, s.bits_k, s.bits_v)?;
    let tile = kernel.tile(s.dim);
    let max_tiles = longest.div_ceil(tile).max(1);
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
    let uniform = wgpu
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("kv_attend params"),
            contents: &uniform_bytes(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let build = |source: &ShaderSource, constants: &[(&'static str, u32)]| {
        if kernel.is_unbounded() {
            // SAFETY: every loop of both pass-1 shaders ends: its bounds are pipeline
            // constants, the head dim (64..=256, validated) and the validated parameters.
            unsafe { wgpu.pipeline_without_loop_bounding(source, constants) }
        } else {
            wgpu.pipeline(source, constants)
        }
    };
    let pipeline = if kernel.is_tiled() {
        let constants = [
            ("BITS_K", s.bits_k),
            ("BITS_V", s.bits_v),
            ("LANES", lanes as u32),
        ];
        build(&SOURCE_ATTEND, &constants)?
    } else {
        let lanes = s.dim / 16;
        let shuffles = kernel != AttendKernel::LanesNoShuffle
            && wgpu.has_subgroups()
            && wgpu.subgroup_min_size() as usize >= lanes;
        let constants = [
            ("BITS_K", s.bits_k),
            ("BITS_V", s.bits_v),
            ("LANES", lanes as u32),
            ("TILE", tile as u32),
            (
                "Q_REGISTERS",
                u32::from(kernel != AttendKernel::LanesQShared),
            ),
        ];
        let source = if shuffles {
            &SOURCE_ATTEND_LANES_SUBGROUP
        } else {
            &SOURCE_ATTEND_LANES_SHARED
        };
        build(source, &constants)?
    };
    let pool = cache.pool().buffer();
    let pass1 = Dispatch::new(
        wgpu,
        pipeline,
        &[
            &uniform,
            q.buffer(),
            pool,
            pool,
            cache.device_table().buffer(),
            cache.device_lens().buffer(),
            cache.device_consts().buffer(),
            part_ml.buffer(),
            part_acc.buffer(),
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
            &uniform,
            cache.device_consts().buffer(),
            part_ml.buffer(),
            part_acc.buffer(),
            o.buffer(),
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
        kernel,
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
