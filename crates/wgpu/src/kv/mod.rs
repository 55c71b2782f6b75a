//! Compressed-KV attention on wgpu: the paged cache resident on the device
//! ([`WgpuPagedKvCache`]), the encode that appends to it (`encode.wgsl`), and split-K
//! flash-decoding over its packed codes ([`attend()`], [`prepare_attend`]; `attend.wgsl`,
//! `merge.wgsl`). The scheme, layout and math are the contract's (`deltakv_contract::kv`,
//! `deltakv_contract::kv::paged`); the CPU's `PagedKvCache` and the CUDA cache hold the same
//! bytes and answer the same calls.
//!
//! ```no_run
//! use deltakv_contract::kv::{KvScheme, PagedLayout};
//! use deltakv_contract::HostTensor;
//! use deltakv_wgpu::kv::{WgpuPagedKvCache, attend};
//! use deltakv_wgpu::{Wgpu, WgpuTensor};
//!
//! let wgpu = Wgpu::get()?;
//! // 4-bit keys, 2-bit values, d = 128, 8 KV heads, pages of 64 tokens.
//! let layout = PagedLayout::new(KvScheme::new(128, 8, 4, 2), 64)?;
//! let mut cache = WgpuPagedKvCache::new(wgpu, layout, 2, 64, 128)?; // B = 2, 64 pages each
//! let chunk = HostTensor::from_f32(vec![2, 100, 8, 128], vec![0.5; 2 * 100 * 8 * 128])?;
//! let kv = WgpuTensor::upload(wgpu, &chunk)?;
//! cache.append(wgpu, &kv, &kv, &[100, 37])?; // 100 tokens to sequence 0, 37 to sequence 1
//! let q = WgpuTensor::upload(wgpu, &HostTensor::from_f32(vec![2, 1, 32, 128], vec![1.0; 8192])?)?;
//! let o = attend(wgpu, &cache, &q, None)?.download(wgpu)?; // [2, 1, 32, 128] f32
//! # Ok::<(), deltakv_contract::Error>(())
//! ```

pub mod attend;
pub mod cache;

pub use attend::{AttendLaunch, WgpuAttnOptions, attend, prepare_attend};
pub use cache::{EncodeLaunch, WgpuPagedKvCache};
/// The cache's accessors (layout, lengths, block table, ...), from the contract.
pub use deltakv_contract::kv::book::PagedCache;

use crate::runtime::ShaderSource;
use deltakv_contract::kv::Quantizer;
use deltakv_contract::{HostTensor, Result};

/// The encode (`encode.wgsl`, after the dtype helpers).
pub const SOURCE_ENCODE: ShaderSource = ShaderSource {
    name: "kv_encode",
    text: concat!(include_str!("../dtype.wgsl"), include_str!("encode.wgsl")),
    entry_point: "kv_encode",
};

/// Pass 1 of the attention (`attend.wgsl`, after the dtype helpers), the tile's row maxima
/// through subgroup operations.
pub const SOURCE_ATTEND_SUBGROUP: ShaderSource = ShaderSource {
    name: "kv_attend_subgroup",
    text: concat!(
        include_str!("../dtype.wgsl"),
        include_str!("tile_max_subgroup.wgsl"),
        include_str!("attend.wgsl")
    ),
    entry_point: "kv_attend",
};

/// Pass 1 for adapters without subgroup operations: the row maxima by one atomic per thread.
pub const SOURCE_ATTEND_SHARED: ShaderSource = ShaderSource {
    name: "kv_attend_shared",
    text: concat!(
        include_str!("../dtype.wgsl"),
        include_str!("tile_max_shared.wgsl"),
        include_str!("attend.wgsl")
    ),
    entry_point: "kv_attend",
};

/// Pass 2: the merge of the splits and the rotation back (`merge.wgsl`).
pub const SOURCE_MERGE: ShaderSource = ShaderSource {
    name: "kv_attend_merge",
    text: include_str!("merge.wgsl"),
    entry_point: "kv_attend_merge",
};

/// The constants the shaders read (f32): key levels and boundaries, value levels and
/// boundaries (256 each; boundaries padded with +inf, levels with 0), then the rotation: the
/// Hadamard signs (d), or the dense matrix transposed (`[c][i] = M[i][c]`, d x d) followed by
/// the matrix itself (d x d). The same table as the CUDA backend's.
pub fn consts(k: &Quantizer, v: &Quantizer) -> Result<HostTensor> {
    let mut out = Vec::new();
    for q in [k, v] {
        let mut levels = vec![0.0f32; 256];
        levels[..q.codebook.levels.len()].copy_from_slice(&q.codebook.levels);
        let mut bounds = vec![f32::INFINITY; 256];
        bounds[..q.codebook.boundaries.len()].copy_from_slice(&q.codebook.boundaries);
        out.extend(levels);
        out.extend(bounds);
    }
    let rotation = &k.rotation;
    let d = rotation.dim();
    if let Some(signs) = rotation.hadamard_signs() {
        out.extend_from_slice(signs);
    } else if let Some(m) = rotation.dense_matrix() {
        out.extend((0..d * d).map(|x| m[(x % d) * d + x / d]));
        out.extend_from_slice(m);
    }
    let len = out.len();
    HostTensor::from_f32(vec![len], out)
}

/// The little-endian bytes of a uniform block of 32-bit words.
pub(crate) fn uniform_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Writes `values` into an i32 tensor's buffer (queued before the next submission).
pub(crate) fn write_i32(wgpu: &crate::Wgpu, t: &crate::WgpuTensor, values: &[i32]) -> Result<()> {
    let bytes: Vec<u8> = values.iter().flat_map(|w| w.to_le_bytes()).collect();
    let scope = wgpu.error_scope();
    wgpu.queue().write_buffer(t.buffer(), 0, &bytes);
    scope.finish("writing the KV cache's tables")
}

/// A prepared dispatch: pipeline, bindings and grid.
pub(crate) struct Dispatch {
    pub pipeline: wgpu::ComputePipeline,
    pub bind_group: wgpu::BindGroup,
    pub grid: (u32, u32, u32),
}

impl Dispatch {
    /// Binds `buffers` at 0, 1, 2, .. of the pipeline's group 0.
    pub fn new(
        wgpu: &crate::Wgpu,
        pipeline: wgpu::ComputePipeline,
        buffers: &[(&str, &wgpu::Buffer)],
        grid: (u32, u32, u32),
    ) -> Result<Self> {
        let entries: Vec<(u32, &str, &wgpu::Buffer)> = buffers
            .iter()
            .enumerate()
            .map(|(i, &(name, buffer))| (i as u32, name, buffer))
            .collect();
        let bind_group = wgpu.bind_group("the KV kernel", &pipeline, &entries)?;
        Ok(Self {
            pipeline,
            bind_group,
            grid,
        })
    }

    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.grid.0, self.grid.1, self.grid.2);
    }
}

/// Submits `repeat` rounds of `dispatches` (in order) in one command buffer, without waiting.
pub(crate) fn submit(
    wgpu: &crate::Wgpu,
    dispatches: &[&Dispatch],
    repeat: usize,
    what: &str,
) -> Result<()> {
    wgpu.submit_pass(what, |pass| {
        for _ in 0..repeat {
            for d in dispatches {
                d.encode(pass);
            }
        }
    })
}
