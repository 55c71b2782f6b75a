//! How the decode kernel reads and writes pool elements (f32 or bf16): widened to f32 when a
//! block is loaded, rounded once when stored.

use super::avx512::Lanes;
use crate::gdn::recurrent::BLOCK;
use deltakv_contract::tensor::{bf16_round, bf16_widen};
use half::bf16;

/// A pool element type: widened to f32 when a block is loaded, rounded once when stored.
/// `src`/`dst` hold one block row of `width <= BLOCK` columns; the full-width case is written
/// with fixed-size arrays so it compiles to a few vector moves rather than a `memcpy` call.
pub(crate) trait PoolElem: Copy + Send + Sync + Lanes {
    /// Whether the compiler-vectorised task (the 32-column block path, used where the
    /// hand-written AVX-512 kernels of `avx512.rs` / `fused.rs` do not apply) is faster
    /// built for AVX-512 for this element type. Measured with `examples/decode_cpu_time.rs`
    /// (Qwen3-Next, B = 1, one thread): a bf16 pool 360-380 us (AVX2) -> 206-277 us (AVX-512),
    /// its conversions being the work; an f32 pool 207-222 us (AVX2) -> 248-268 us (AVX-512),
    /// so that f32 build stays on AVX2.
    const PREFERS_AVX512: bool;
    /// The pool as f32, when it is f32 (then T = 1 runs on it in place, without a copy).
    fn as_f32_ptr(ptr: *mut Self) -> Option<*mut f32>;
    fn widen(src: &[Self], dst: &mut [f32; BLOCK]);
    fn narrow(src: &[f32; BLOCK], dst: &mut [Self]);
    /// Any-length forms of `widen` / `narrow` (`dst.len() == src.len()`).
    fn widen_row(src: &[Self], dst: &mut [f32]);
    fn narrow_row(src: &[f32], dst: &mut [Self]);
}

impl PoolElem for f32 {
    const PREFERS_AVX512: bool = false;
    #[inline(always)]
    fn widen_row(src: &[f32], dst: &mut [f32]) {
        copy_row(src, dst);
    }
    #[inline(always)]
    fn narrow_row(src: &[f32], dst: &mut [f32]) {
        copy_row(src, dst);
    }
    fn as_f32_ptr(ptr: *mut f32) -> Option<*mut f32> {
        Some(ptr)
    }
    #[inline(always)]
    fn widen(src: &[f32], dst: &mut [f32; BLOCK]) {
        if let Ok(full) = <&[f32; BLOCK]>::try_from(src) {
            *dst = *full;
        } else {
            dst[..src.len()].copy_from_slice(src);
            dst[src.len()..].fill(0.0);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32; BLOCK], dst: &mut [f32]) {
        if let Ok(full) = <&mut [f32; BLOCK]>::try_from(&mut *dst) {
            // Eight-wide pieces: a whole-array assignment here became a `memcpy` call.
            for (d, s) in full.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let piece: [f32; 8] = s.try_into().expect("eight");
                d.copy_from_slice(&piece);
            }
        } else {
            let width = dst.len();
            dst.copy_from_slice(&src[..width]);
        }
    }
}

/// `dst <- src` in sixteen-float pieces, which compile to inline vector moves: a
/// `copy_from_slice` of a short row became a `memmove` call that dominated the multi-token
/// path (53% of its time in a profile).
#[inline(always)]
fn copy_row(src: &[f32], dst: &mut [f32]) {
    let mut dst_pieces = dst.chunks_exact_mut(16);
    let mut src_pieces = src.chunks_exact(16);
    for (d, s) in (&mut dst_pieces).zip(&mut src_pieces) {
        let piece: [f32; 16] = s.try_into().expect("sixteen");
        for (x, y) in d.iter_mut().zip(piece) {
            *x = y;
        }
    }
    for (x, &y) in dst_pieces
        .into_remainder()
        .iter_mut()
        .zip(src_pieces.remainder())
    {
        *x = y;
    }
}

impl PoolElem for bf16 {
    const PREFERS_AVX512: bool = true;
    #[inline(always)]
    fn widen_row(src: &[bf16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16_widen(s);
        }
    }
    #[inline(always)]
    fn narrow_row(src: &[f32], dst: &mut [bf16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16_round(s);
        }
    }
    fn as_f32_ptr(_: *mut bf16) -> Option<*mut f32> {
        None
    }
    #[inline(always)]
    fn widen(src: &[bf16], dst: &mut [f32; BLOCK]) {
        if let Ok(full) = <&[bf16; BLOCK]>::try_from(src) {
            // SAFETY: `bf16` is `repr(transparent)` over `u16`. Widening plain integers lets
            // the loop vectorise (it stayed scalar through `bf16::to_bits`).
            let bits = unsafe { &*(full as *const [bf16; BLOCK]).cast::<[u16; BLOCK]>() };
            for j in 0..BLOCK {
                dst[j] = f32::from_bits(u32::from(bits[j]) << 16);
            }
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = bf16_widen(s);
            }
            dst[src.len()..].fill(0.0);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32; BLOCK], dst: &mut [bf16]) {
        if let Ok(full) = <&mut [bf16; BLOCK]>::try_from(&mut *dst) {
            // SAFETY: `bf16` is `repr(transparent)` over `u16` (as in `widen`).
            let bits = unsafe { &mut *(full as *mut [bf16; BLOCK]).cast::<[u16; BLOCK]>() };
            for j in 0..BLOCK {
                bits[j] = bf16_round(src[j]).to_bits();
            }
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = bf16_round(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_conversions_match_half() {
        let mut specials = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0e-40,
            // Ties at the rounding point, both parities.
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            f32::from_bits(0x7F7F_FFFF),
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            specials.push(f32::from_bits(x));
        }
        for &v in &specials {
            let ours = bf16_round(v);
            let reference = bf16::from_f32(v);
            if v.is_nan() {
                assert!(ours.is_nan(), "{v:e}");
            } else {
                assert_eq!(ours.to_bits(), reference.to_bits(), "{v:e}");
            }
        }
        let src: Vec<bf16> = specials[..BLOCK]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let mut wide = [0.0f32; BLOCK];
        bf16::widen(&src, &mut wide);
        let mut back = vec![bf16::ZERO; BLOCK];
        bf16::narrow(&wide, &mut back);
        for j in 0..BLOCK {
            assert_eq!(wide[j].to_bits(), src[j].to_f32().to_bits());
            if !src[j].is_nan() {
                assert_eq!(back[j].to_bits(), src[j].to_bits());
            }
        }
    }
}
