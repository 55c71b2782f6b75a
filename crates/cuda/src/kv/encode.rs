//! The encode's launches: the parameters every encode kernel takes (`kernels/kv_encode.cu`),
//! the kernel a scheme and input take, and the one-lane kernels' Hadamard sign words.

use super::SOURCE_ENCODE;
use crate::runtime::{Cuda, driver_error};
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use deltakv_contract::env;
use deltakv_contract::kv::{KvScheme, Quantizer};
use deltakv_contract::{DType, Result};

/// Mirrors `struct KvEncodeParams` in `kernels/kv_encode.cu`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct EncodeParams {
    pub(super) k: u64,
    pub(super) v: u64,
    pub(super) pool: u64,
    pub(super) block_table: u64,
    pub(super) seq_lens: u64,
    pub(super) new_lens: u64,
    pub(super) consts: u64,
    pub(super) flags: u64,
    pub(super) batch: i32,
    pub(super) tokens: i32,
    pub(super) kv_heads: i32,
    pub(super) dim: i32,
    pub(super) in_dtype: i32,
    pub(super) norm_f16: i32,
    pub(super) bits_k: i32,
    pub(super) bits_v: i32,
    pub(super) words_k: i32,
    pub(super) words_v: i32,
    pub(super) page_tokens: i32,
    pub(super) max_pages: i32,
    pub(super) page_words: i32,
    pub(super) head_words: i32,
    pub(super) row_words_k: i32,
    pub(super) row_words_v: i32,
    pub(super) norm_words: i32,
    pub(super) hadamard_norm: f32,
    pub(super) grid: i32,
    pub(super) heads_magic: u32,
    pub(super) tokens_magic: u32,
    pub(super) heads_shift: i32,
    pub(super) tokens_shift: i32,
    pub(super) page_shift: i32,
    /// The one-lane kernels' stream at `blockIdx.y` 0 (d 128).
    pub(super) first_stream: i32,
    /// The Hadamard signs for d <= 128 as the one-lane kernels take them ([`LaneSigns`]).
    pub(super) signs: [u32; LANE_SIGNS],
}

/// Sign words in the encode parameters (`signs[128]` in `kernels/kv_encode.cu`).
pub(super) const LANE_SIGNS: usize = 128;

/// (magic, shift) with `n / d == ((n * magic) >> 32) + n) >> shift` for every n < 2^31 (the
/// kernels' `kv_divide`): shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1.
pub(super) fn divide_magic(d: u32) -> (u32, i32) {
    debug_assert!((1..1 << 31).contains(&d));
    let shift = 32 - (d - 1).leading_zeros();
    let magic = ((1u64 << 32) * ((1u64 << shift) - u64::from(d))) / u64::from(d) + 1;
    (magic as u32, shift as i32)
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for EncodeParams {}

/// A prepared encode launch (see [`super::CudaPagedKvCache::prepare_append`]); a CUDA graph
/// captures [`EncodeLaunch::launch`].
pub struct EncodeLaunch {
    params: EncodeParams,
    function: CudaFunction,
    config: LaunchConfig,
    /// The 2-bit stream's own kernel where a one-lane scheme at d 128 has one 2-bit stream:
    /// queued with the same grid as the first launch's programmatic dependent.
    two_bits: Option<(EncodeParams, CudaFunction)>,
}

impl EncodeLaunch {
    /// Queues the encode kernel (or kernels) on deltakv's stream.
    ///
    /// # Safety
    ///
    /// The launch holds device addresses, not borrows. When it is called, the
    /// cache and the k and v chunks it was prepared from must be alive, and the cache must
    /// not have been appended to, nor its block table changed, since the preparation: the
    /// kernel writes at the lengths the GPU holds when it runs, through the table entries the
    /// preparation checked.
    /// Dropping a tensor after the call is fine: deltakv frees device memory in its stream's
    /// order, after the work queued here.
    pub unsafe fn launch(&self, cuda: &Cuda) -> Result<()> {
        let mut builder = cuda.stream().launch_builder(&self.function);
        builder.arg(&self.params);
        // SAFETY: the parameters describe buffers of the sizes the kernel indexes: the chunk's
        // shape was checked, and every page a new token lands in was assigned and checked
        // against the pool (assign_pages) before the table was written; the caller keeps them
        // alive and unchanged (this function's contract).
        unsafe { builder.launch(self.config) }
            .map_err(|e| driver_error("launching kv_encode", e))?;
        if let Some((params, function)) = &self.two_bits {
            // SAFETY: as above; the kernel writes only its own stream's rows and norms, so it
            // may run beside the first launch, and its last block waits for that launch before
            // it ends (`griddepcontrol.wait`), so later work finds both streams written.
            unsafe {
                cuda.launch_programmatic_dependent(cuda.stream(), function, self.config, params)
            }
            .map_err(|e| driver_error("launching kv_encode (2-bit stream)", e))?;
        }
        Ok(())
    }
}

/// The Hadamard signs as the one-lane encode kernels (`kernels/kv_encode_lanes.cu`) take them,
/// formed once per cache: for f32 inputs one word per element (its sign bit, 0 or
/// 0x8000_0000); for 16-bit inputs one word per element pair, the even element's sign in bit 15
/// and the odd one's in bit 31, so one XOR signs both halves of an input word.
#[derive(Clone, Copy, Debug)]
pub(super) struct LaneSigns {
    elements: [u32; LANE_SIGNS],
    pairs: [u32; LANE_SIGNS],
}

impl LaneSigns {
    /// The sign words for inputs of `dtype`.
    pub(super) fn words(&self, dtype: DType) -> [u32; LANE_SIGNS] {
        if dtype == DType::F32 {
            self.elements
        } else {
            self.pairs
        }
    }
}

/// The one-lane kernels' signs ([`LaneSigns`]) when those kernels serve a scheme: the Hadamard
/// rotation at d = 64 or 128, and both streams' nearest levels on their grids (bit widths up
/// to 4). The eight-lane kernels take the rest, and every scheme when
/// `DELTAKV_KV_ENCODE=lanes8` is set (for comparisons).
pub(super) fn lane_encode_signs(k: &Quantizer, v: &Quantizer) -> Result<Option<LaneSigns>> {
    let lanes8 = env::choice(
        "DELTAKV_KV_ENCODE",
        &[("auto", false), ("lanes8", true)],
        false,
    )?;
    let Some(signs) = k.rotation.hadamard_signs() else {
        return Ok(None);
    };
    let serves = matches!(signs.len(), 64 | 128)
        && super::grid_enabled(k)
        && super::grid_enabled(v)
        && !lanes8;
    Ok(serves.then(|| {
        let mut elements = [0; LANE_SIGNS];
        for (bit, &sign) in elements.iter_mut().zip(signs) {
            *bit = sign.to_bits() & 0x8000_0000;
        }
        let mut pairs = [0; LANE_SIGNS];
        for (word, pair) in pairs.iter_mut().zip(elements.chunks_exact(2)) {
            *word = (pair[0] >> 16) | pair[1];
        }
        LaneSigns { elements, pairs }
    }))
}

/// The launch (or two) that encodes a chunk of `vectors` vectors per stream of scheme `s` from
/// inputs of `dtype`: the one-lane kernels where `lane` (their sign words are in `params`),
/// else the Hadamard kernels where `hadamard`, else the dense rotation's.
pub(super) fn encode_launch(
    cuda: &Cuda,
    params: EncodeParams,
    s: &KvScheme,
    dtype: DType,
    lane: bool,
    hadamard: bool,
    vectors: usize,
) -> Result<EncodeLaunch> {
    let name = match (lane, hadamard, s.dim, dtype) {
        (true, _, 64, DType::F32) => "kv_encode_lane64_f32",
        (true, _, 64, DType::F16) => "kv_encode_lane64_f16",
        (true, _, 64, _) => "kv_encode_lane64_bf16",
        (true, _, 128, DType::F32) => "kv_encode_lane128_f32",
        (true, _, 128, DType::F16) => "kv_encode_lane128_f16",
        (true, _, 128, _) => "kv_encode_lane128_bf16",
        (_, true, 64, DType::F32) => "kv_encode_hadamard64_f32",
        (_, true, 64, DType::F16) => "kv_encode_hadamard64_f16",
        (_, true, 64, _) => "kv_encode_hadamard64_bf16",
        (_, true, 128, DType::F32) => "kv_encode_hadamard128_f32",
        (_, true, 128, DType::F16) => "kv_encode_hadamard128_f16",
        (_, true, 128, _) => "kv_encode_hadamard128_bf16",
        (_, true, 256, DType::F32) => "kv_encode_hadamard256_f32",
        (_, true, 256, DType::F16) => "kv_encode_hadamard256_f16",
        (_, true, 256, _) => "kv_encode_hadamard256_bf16",
        _ => "kv_encode_dense",
    };
    // One lane per vector: 128 vectors per block pass; Hadamard: 16 (4 warps x 4); dense: 4.
    // Many blocks of a few passes each: keys and values differ in cost, and the hardware
    // balances small blocks across SMs where one wave of persistent blocks would leave some
    // SMs idle at the end (measured slower: docs/cuda-kernel-log.md).
    let per_block = if lane {
        128
    } else if name == "kv_encode_dense" {
        4
    } else {
        16
    };
    let blocks = vectors
        .div_ceil(per_block)
        .clamp(1, 64 * cuda.multiprocessors());
    let config = |streams: u32| LaunchConfig {
        grid_dim: (blocks as u32, streams, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // The one-lane kernels at d 128 find a 2-bit stream's levels in registers with their
    // own kernel (`_two_bits`): one launch where both streams take one kernel, else the
    // other stream's launch first and the 2-bit stream's as its dependent.
    let two_bits = |bits: u32| lane && s.dim == 128 && bits == 2;
    let two_bits_name = match dtype {
        DType::F32 => "kv_encode_lane128_f32_two_bits",
        DType::F16 => "kv_encode_lane128_f16_two_bits",
        _ => "kv_encode_lane128_bf16_two_bits",
    };
    Ok(match (two_bits(s.bits_k), two_bits(s.bits_v)) {
        (false, false) | (true, true) => EncodeLaunch {
            params,
            function: cuda.function(
                &SOURCE_ENCODE,
                if two_bits(s.bits_k) {
                    two_bits_name
                } else {
                    name
                },
            )?,
            config: config(2),
            two_bits: None,
        },
        (k_two_bits, _) => {
            let two_bits_stream = i32::from(!k_two_bits);
            EncodeLaunch {
                params: EncodeParams {
                    first_stream: 1 - two_bits_stream,
                    ..params
                },
                function: cuda.function(&SOURCE_ENCODE, name)?,
                config: config(1),
                two_bits: Some((
                    EncodeParams {
                        first_stream: two_bits_stream,
                        ..params
                    },
                    cuda.function(&SOURCE_ENCODE, two_bits_name)?,
                )),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{divide_magic, lane_encode_signs};
    use deltakv_contract::DType;
    use deltakv_contract::kv::codebook::codebook;
    use deltakv_contract::kv::rotation::Rotation;
    use deltakv_contract::kv::{KvScheme, Quantizer};
    use std::sync::Arc;

    /// The key and value quantizers a cache of this scheme builds.
    fn quantizers(dim: usize, bits_k: u32, bits_v: u32) -> (Quantizer, Quantizer) {
        let s = KvScheme::new(dim, 1, bits_k, bits_v);
        let rotation = Arc::new(Rotation::new(dim, s.seed).unwrap());
        let q = |bits| Quantizer::new(codebook(s.codebook, dim, bits).unwrap(), rotation.clone());
        (q(bits_k), q(bits_v))
    }

    /// The one-lane kernels take the Hadamard schemes at d 64 and 128 with <= 4-bit codes, and
    /// their sign words are the rotation's signs as sign bits.
    #[test]
    fn lane_encode_signs_follow_the_scheme() {
        if std::env::var("DELTAKV_KV_ENCODE").as_deref() == Ok("lanes8") {
            println!("skipped: DELTAKV_KV_ENCODE=lanes8 turns the one-lane kernels off");
            return;
        }
        for (dim, bits_k, bits_v, serves) in [
            (128, 4, 2, true),
            (64, 2, 3, true),
            (128, 8, 2, false),
            (64, 4, 8, false),
            (256, 4, 2, false),
            (96, 4, 2, false),
        ] {
            let (k, v) = quantizers(dim, bits_k, bits_v);
            let signs = lane_encode_signs(&k, &v).unwrap();
            assert_eq!(signs.is_some(), serves, "d {dim}, {bits_k}/{bits_v} bits");
            if let Some(signs) = signs {
                let bits = signs.words(DType::F32);
                let expected = k.rotation.hadamard_signs().unwrap();
                for (i, &bit) in bits.iter().enumerate() {
                    let negative = expected.get(i).is_some_and(|s| *s < 0.0);
                    assert_eq!(bit, if negative { 0x8000_0000 } else { 0 }, "sign {i}");
                }
                assert!(bits[..dim].contains(&0x8000_0000) && bits[..dim].contains(&0));
                for dtype in [DType::BF16, DType::F16] {
                    let words = signs.words(dtype);
                    for (j, &word) in words.iter().enumerate() {
                        let (even, odd) = (bits.get(2 * j), bits.get(2 * j + 1));
                        assert_eq!(word & 0x8000, even.map_or(0, |b| b >> 16), "pair {j}");
                        assert_eq!(word & 0x8000_0000, odd.copied().unwrap_or(0), "pair {j}");
                        assert_eq!(word & 0x7fff_7fff, 0, "pair {j}");
                    }
                }
            }
        }
    }

    /// The kernels' division by a multiply and a shift equals integer division over n < 2^31.
    #[test]
    fn divide_magic_divides_exactly() {
        let divisors = (1..=300u32).chain([1000, 4096, 8191, 65535, 65537, 1 << 20, (1 << 31) - 1]);
        for d in divisors {
            let (magic, shift) = divide_magic(d);
            let divide =
                |n: u32| (((u64::from(n) * u64::from(magic)) >> 32) + u64::from(n)) >> shift;
            let mut n: u32 = 0;
            let mut step = 1u32;
            while n < 1 << 31 {
                for m in [
                    n,
                    n.saturating_sub(1),
                    n + 1,
                    n.saturating_mul(d).min((1 << 31) - 1),
                ] {
                    assert_eq!(divide(m), u64::from(m / d), "{m} / {d}");
                }
                n = n.saturating_add(step);
                step = step.saturating_mul(3) / 2 + 1;
            }
            let last = (1u32 << 31) - 1;
            assert_eq!(divide(last), u64::from(last / d), "{last} / {d}");
        }
    }
}
