//! Compressed-KV attention on CUDA: the paged cache resident on the GPU
//! ([`CudaPagedKvCache`]), the encode that appends to it, and flash-decoding over its packed
//! codes ([`attend()`], [`prepare_attend`]). The scheme, layout and math are the contract's
//! (`deltakv_contract::kv`, `deltakv_contract::kv::paged`); the CPU's `PagedKvCache` holds the
//! same bytes and answers the same calls.
//!
//! ```no_run
//! use deltakv_contract::kv::{KvScheme, PagedLayout};
//! use deltakv_contract::HostTensor;
//! use deltakv_cuda::kv::{CudaPagedKvCache, attend};
//! use deltakv_cuda::{Cuda, CudaTensor};
//!
//! let cuda = Cuda::get()?;
//! // 4-bit keys, 2-bit values, d = 128, 8 KV heads, pages of 64 tokens.
//! let layout = PagedLayout::new(KvScheme::new(128, 8, 4, 2), 64)?;
//! let mut cache = CudaPagedKvCache::new(cuda, layout, 2, 64, 128)?; // B = 2, 64 pages each
//! let chunk = HostTensor::from_f32(vec![2, 100, 8, 128], vec![0.5; 2 * 100 * 8 * 128])?;
//! let kv = CudaTensor::upload(cuda, &chunk)?;
//! cache.append(cuda, &kv, &kv, &[100, 37])?; // 100 tokens to sequence 0, 37 to sequence 1
//! let q = CudaTensor::upload(cuda, &HostTensor::from_f32(vec![2, 1, 32, 128], vec![1.0; 8192])?)?;
//! let o = attend(cuda, &cache, &q, None)?.download(cuda)?; // [2, 1, 32, 128] f32
//! # Ok::<(), deltakv_contract::Error>(())
//! ```

pub mod attend;
pub mod cache;

pub use attend::{AttendLaunch, AttnKernel, CudaAttnOptions, attend, prepare_attend};
pub use cache::{CudaPagedKvCache, EncodeLaunch};

use crate::compile::KernelSource;
use deltakv_contract::kv::Quantizer;
use deltakv_contract::{HostTensor, Result};

/// The encode kernels (`kernels/kv_encode.cu`).
pub const SOURCE_ENCODE: KernelSource = KernelSource {
    name: "kv_encode",
    text: include_str!("../../kernels/kv_encode.cu"),
};

/// The scalar attention kernels and the merge pass (`kernels/kv_attend.cu`).
pub const SOURCE_ATTEND: KernelSource = KernelSource {
    name: "kv_attend",
    text: include_str!("../../kernels/kv_attend.cu"),
};

/// One tensor-core module: `kernels/kv_attend.cu` (parameters, query rotation, merge), then
/// `kernels/kv_attend_mma.cu` (the tile math and the tiles form) and
/// `kernels/kv_attend_pages.cu` (the pages form) for one pair of bit widths.
macro_rules! mma_source {
    ($name:literal, $bits_k:literal, $bits_v:literal) => {
        KernelSource {
            name: $name,
            text: concat!(
                "#define KVM_BK ",
                $bits_k,
                "\n#define KVM_BV ",
                $bits_v,
                "\n",
                include_str!("../../kernels/kv_attend.cu"),
                "\n",
                include_str!("../../kernels/kv_attend_mma.cu"),
                "\n",
                include_str!("../../kernels/kv_attend_pages.cu")
            ),
        }
    };
}

/// The tensor-core attention modules, keys 2, 4, 8 bits (major) x values 2, 4, 8 bits.
pub const SOURCES_ATTEND_MMA: [KernelSource; 9] = [
    mma_source!("kv_attend_mma_k2v2", 2, 2),
    mma_source!("kv_attend_mma_k2v4", 2, 4),
    mma_source!("kv_attend_mma_k2v8", 2, 8),
    mma_source!("kv_attend_mma_k4v2", 4, 2),
    mma_source!("kv_attend_mma_k4v4", 4, 4),
    mma_source!("kv_attend_mma_k4v8", 4, 8),
    mma_source!("kv_attend_mma_k8v2", 8, 2),
    mma_source!("kv_attend_mma_k8v4", 8, 4),
    mma_source!("kv_attend_mma_k8v8", 8, 8),
];

/// The constants the kernels read (f32): key levels and boundaries, value levels and
/// boundaries (256 each; boundaries padded with +inf, levels with 0), then the rotation: the
/// Hadamard signs (d), or the dense matrix transposed (`[c][i] = M[i][c]`, d x d) followed by
/// the matrix itself (d x d).
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
