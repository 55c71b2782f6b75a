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
mod encode;

pub use attend::{AttendLaunch, AttnKernel, CudaAttnOptions, MAX_SPLITS, attend, prepare_attend};
pub use cache::CudaPagedKvCache;
/// The cache's accessors (layout, lengths, block table, ...), from the contract.
pub use deltakv_contract::kv::book::PagedCache;
pub use encode::EncodeLaunch;

use crate::compile::KernelSource;
use deltakv_contract::kv::Quantizer;
use deltakv_contract::{HostTensor, Result};

/// The encode kernels (`kernels/kv_encode.cu`, then the one-lane kernels of
/// `kernels/kv_encode_lanes.cu`).
pub const SOURCE_ENCODE: KernelSource = KernelSource {
    name: "kv_encode",
    text: concat!(
        include_str!("../../kernels/kv_encode.cu"),
        "\n",
        include_str!("../../kernels/kv_encode_lanes.cu")
    ),
};

/// The scalar attention kernels and the merge pass (`kernels/kv_attend.cu`).
pub const SOURCE_ATTEND: KernelSource = KernelSource {
    name: "kv_attend",
    text: include_str!("../../kernels/kv_attend.cu"),
};

/// One tensor-core module: `kernels/kv_attend.cu` (parameters, query rotation, merge), then
/// `kernels/kv_attend_mma.cu` (the tile math), `kernels/kv_attend_block.cu` (the block's
/// prologue and finish, and the tiles form) and `kernels/kv_attend_pages.cu` (the pages form)
/// for one pair of bit widths.
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
                include_str!("../../kernels/kv_attend_block.cu"),
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

/// Cells of the encode's nearest-level grid (`KV_GRID_CELLS` in `kernels/kv_encode.cu`).
const GRID_CELLS: usize = 64;
/// Floats of one stream's grid in the constants (`KV_GRID_FLOATS`): a header of four, then
/// four per cell.
pub(crate) const GRID_FLOATS: usize = 4 + 4 * GRID_CELLS;

/// Whether the encode finds a quantizer's nearest levels on its grid ([`nearest_grid`]
/// enabled) rather than by the binary search.
pub(crate) fn grid_enabled(q: &Quantizer) -> bool {
    nearest_grid(&q.codebook.levels, &q.codebook.boundaries)[2] != 0.0
}

/// The cell of `u` on a grid of `scale` and `offset`: `floor(63 sat(fma(u, scale, offset)))`,
/// `sat` clamping to [0, 1] and NaN to 0, the fma rounded once, as `kv_grid_cell` in
/// `kernels/kv_encode.cu` forms it (63 t is exact in f64).
fn grid_cell(u: f32, scale: f32, offset: f32) -> usize {
    let t = u.mul_add(scale, offset);
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    ((GRID_CELLS - 1) as f64 * t as f64).floor() as usize
}

/// The uniform grid over a codebook's boundaries that the encode looks the nearest level up
/// in (`kernels/kv_encode.cu`): scale, offset, 1 (enabled), 0, then per cell, as the kernels
/// copy it to shared memory: the count of boundaries in lower cells (its bits as an integer),
/// the cell's own boundary (+inf if none), and the rounded squares of the levels at that count
/// and the next (0 past the last level). The cell of u is [`grid_cell`], the same f32
/// arithmetic here and on the GPU; the largest spacing count that puts every boundary in its
/// own cell is taken. All zero (disabled: the binary search) above 4 bits or where no spacing
/// separates the boundaries.
fn nearest_grid(levels: &[f32], boundaries: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; GRID_FLOATS];
    let n = boundaries.len();
    if n == 0 || n > 15 {
        return out;
    }
    let b0 = boundaries[0];
    let span = boundaries[n - 1] - b0;
    for cells in (1..GRID_CELLS).rev() {
        // 63 (u scale + offset) = (u - b0) cells / span, each rounded to f32.
        let scale = if span > 0.0 {
            (cells as f64 / ((GRID_CELLS - 1) as f64 * span as f64)) as f32
        } else {
            0.0
        };
        let offset = -b0 * scale;
        if !scale.is_finite() || !offset.is_finite() {
            continue;
        }
        let g: Vec<usize> = boundaries
            .iter()
            .map(|&b| grid_cell(b, scale, offset))
            .collect();
        if g.windows(2).any(|w| w[0] >= w[1]) {
            continue;
        }
        out[..4].copy_from_slice(&[scale, offset, 1.0, 0.0]);
        let square = |i: usize| levels.get(i).map_or(0.0, |&l| l * l);
        for c in 0..GRID_CELLS {
            let below = g.iter().filter(|&&x| x < c).count();
            let own = g
                .iter()
                .position(|&x| x == c)
                .map_or(f32::INFINITY, |i| boundaries[i]);
            out[4 + 4 * c..8 + 4 * c].copy_from_slice(&[
                f32::from_bits(below as u32),
                own,
                square(below),
                square(below + 1),
            ]);
        }
        return out;
    }
    out
}

/// The constants the kernels read (f32): key levels and boundaries, value levels and
/// boundaries (256 each; boundaries padded with +inf, levels with 0), then the rotation: the
/// Hadamard signs (d), or the dense matrix transposed (`[c][i] = M[i][c]`, d x d) followed by
/// the matrix itself (d x d); last, from a multiple of four floats (the kernels copy their cells
/// 16 bytes at a time), the key and value nearest-level grids (`GRID_FLOATS` each).
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
    out.resize(out.len().next_multiple_of(4), 0.0);
    for q in [k, v] {
        out.extend(nearest_grid(&q.codebook.levels, &q.codebook.boundaries));
    }
    let len = out.len();
    HostTensor::from_f32(vec![len], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #{boundaries < u}, as the encode's binary search answers.
    fn count_below(boundaries: &[f32], u: f32) -> usize {
        boundaries.iter().filter(|&&b| u > b).count()
    }

    #[test]
    fn the_nearest_level_grid_answers_as_the_search_at_and_between_every_boundary() {
        for (dim, bits) in [64, 128]
            .into_iter()
            .flat_map(|d| (1..=4u32).map(move |b| (d, b)))
        {
            let book = deltakv_contract::kv::codebook::lloyd_max(dim, bits).unwrap();
            let b = &book.boundaries;
            let grid = nearest_grid(&book.levels, b);
            assert_eq!(grid[2], 1.0, "d {dim}, {bits}-bit grid disabled");
            // The code and its squared level, as the kernels take them from the cell.
            let lookup = |u: f32| {
                let cell = &grid[4 + 4 * grid_cell(u, grid[0], grid[1])..];
                let above = u > cell[1];
                let code = cell[0].to_bits() as usize + usize::from(above);
                (code, if above { cell[3] } else { cell[2] })
            };
            let mut probes = vec![
                -1e30f32,
                -1.0,
                0.0,
                1.0,
                1e30,
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NAN,
            ];
            for &x in b {
                probes.extend([
                    x,
                    f32::from_bits(x.to_bits().wrapping_sub(1)),
                    f32::from_bits(x.to_bits().wrapping_add(1)),
                ]);
                probes.extend([x * 0.5, x * 1.5, -x]);
            }
            for i in 0..10_000 {
                probes.push((i as f32 / 5000.0 - 1.0) * 0.5);
            }
            for u in probes {
                let code = count_below(b, u);
                let level = book.levels[code];
                let expected = (code, level * level);
                assert_eq!(lookup(u), expected, "d {dim}, {bits} bits, u = {u:e}");
            }
        }
        assert_eq!(
            nearest_grid(&[0.5; 256], &[0.5; 255])[2],
            0.0,
            "8-bit codebooks keep the search"
        );
    }
}
