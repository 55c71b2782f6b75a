//! AVX2 + FMA kernels of [`super`]: unpacking codes in registers (`vpsrlvd`, mask,
//! `vpermps` on the level table), the score and value loops over packed codes, and the
//! dense-row helpers. Every function here is `#[target_feature(enable = "avx2,fma")]`; callers
//! check the CPU first.

use super::Quantizer;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `<q_r, k>` for `R` rows (`dim` a multiple of 8, slices long enough: checked).
#[target_feature(enable = "avx2,fma")]
pub(super) fn dots<const R: usize>(q: &[f32], k: &[f32], dim: usize) -> [f32; R] {
    assert!(dim.is_multiple_of(8) && q.len() >= R * dim && k.len() >= dim);
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    // SAFETY: every load is below R * dim of q and dim of k (asserted).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for c in (0..dim).step_by(8) {
            let kv = _mm256_loadu_ps(kp.add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(r * dim + c)), kv, *a);
            }
        }
        let mut out = [0.0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }
}

/// The level table as used by [`decode8`]: 8 + 8 entries, 2-bit levels repeated twice.
fn level_table(levels: &[f32]) -> [f32; 16] {
    let mut table = [0.0f32; 16];
    if levels.len() == 4 {
        table[..4].copy_from_slice(levels);
        table[4..8].copy_from_slice(levels);
    } else {
        table[..levels.len()].copy_from_slice(levels);
    }
    table
}

/// Eight levels of group `j` of the vector at `src` (`B` bits per code, B <= 4).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode8<const B: usize>(src: *const u8, j: usize, lo: __m256, hi: __m256) -> __m256 {
    // SAFETY: the caller keeps src + j*B + 4 inside the code stream.
    let w = unsafe { (src.add(j * B) as *const u32).read_unaligned() };
    let b = B as i32;
    let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    // No mask: vpermps reads only the low 3 bits (the 2-bit table is repeated twice so bit 2
    // does not matter), and the 4-bit blend reads bit 3 after shifting it to the sign bit.
    let idx = _mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts);
    let v = _mm256_permutevar8x32_ps(lo, idx);
    if B == 4 {
        let vh = _mm256_permutevar8x32_ps(hi, idx);
        _mm256_blendv_ps(v, vh, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
    } else {
        v
    }
}

/// Sixteen 2-bit levels (groups `j` and `j + 1`) from one u32 load.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode16_b2(src: *const u8, j: usize, lo: __m256) -> (__m256, __m256) {
    // SAFETY: the caller keeps src + j*2 + 4 inside the code stream.
    let w = unsafe { (src.add(j * 2) as *const u32).read_unaligned() };
    let w = _mm256_set1_epi32(w as i32);
    let i0 = _mm256_srlv_epi32(w, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    let i1 = _mm256_srlv_epi32(w, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30));
    (
        _mm256_permutevar8x32_ps(lo, i0),
        _mm256_permutevar8x32_ps(lo, i1),
    )
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn code_dots_b<const R: usize, const B: usize>(
    codes: &[u32],
    words: usize,
    levels: &[f32],
    n: usize,
    dim: usize,
    q: &[f32],
    out: &mut [[f32; R]],
) {
    let groups = dim / 8;
    let table = level_table(levels);
    let base = codes.as_ptr() as *const u8;
    let qp = q.as_ptr();
    // SAFETY: checked by the caller (`code_dots`).
    unsafe {
        let lo = _mm256_loadu_ps(table.as_ptr());
        let hi = _mm256_loadu_ps(table.as_ptr().add(8));
        // Two tokens at a time: eight independent FMA chains, each q load used twice.
        let mut t = 0;
        while t + 2 <= n {
            let src0 = base.add(t * words * 4);
            let src1 = base.add((t + 1) * words * 4);
            let mut acc0 = [_mm256_setzero_ps(); R];
            let mut acc1 = [_mm256_setzero_ps(); R];
            for j in 0..groups {
                let v0 = decode8::<B>(src0, j, lo, hi);
                let v1 = decode8::<B>(src1, j, lo, hi);
                for r in 0..R {
                    let qv = _mm256_loadu_ps(qp.add(r * dim + j * 8));
                    acc0[r] = _mm256_fmadd_ps(qv, v0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(qv, v1, acc1[r]);
                }
            }
            if R == 4 {
                // Both tokens' four sums at once: out[t] and out[t + 1] are adjacent.
                let x = _mm256_hadd_ps(
                    _mm256_hadd_ps(acc0[0], acc0[1]),
                    _mm256_hadd_ps(acc0[2], acc0[3]),
                );
                let y = _mm256_hadd_ps(
                    _mm256_hadd_ps(acc1[0], acc1[1]),
                    _mm256_hadd_ps(acc1[2], acc1[3]),
                );
                let sums = _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(x, y),
                    _mm256_permute2f128_ps::<0x31>(x, y),
                );
                debug_assert!(t + 2 <= out.len());
                _mm256_storeu_ps(out.as_mut_ptr().add(t) as *mut f32, sums);
            } else {
                for r in 0..R {
                    out[t][r] = hsum(acc0[r]);
                    out[t + 1][r] = hsum(acc1[r]);
                }
            }
            t += 2;
        }
        if t < n {
            let src = base.add(t * words * 4);
            let mut acc = [_mm256_setzero_ps(); R];
            for j in 0..groups {
                let v = decode8::<B>(src, j, lo, hi);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(r * dim + j * 8)), v, *a);
                }
            }
            for r in 0..R {
                out[t][r] = hsum(acc[r]);
            }
        }
    }
}

/// `out[t][r] = <q_r, c(idx[t])>` for `n` packed vectors, decoded in registers.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn code_dots<const R: usize>(
    codes: &[u32],
    words: usize,
    quant: &Quantizer,
    n: usize,
    dim: usize,
    q: &[f32],
    out: &mut [[f32; R]],
) {
    if n == 0 {
        return;
    }
    let bits = quant.bits() as usize;
    let groups = dim / 8;
    assert!(dim.is_multiple_of(8) && q.len() >= R * dim && out.len() >= n);
    let last = (n - 1) * words * 4 + (groups - 1) * bits + if bits == 8 { 8 } else { 4 };
    assert!(last <= codes.len() * 4, "code_dots reads past the codes");
    let levels = &quant.codebook.levels;
    // SAFETY: bounds asserted above.
    unsafe {
        match bits {
            2 => code_dots_b::<R, 2>(codes, words, levels, n, dim, q, out),
            3 => code_dots_b::<R, 3>(codes, words, levels, n, dim, q, out),
            4 => code_dots_b::<R, 4>(codes, words, levels, n, dim, q, out),
            _ => {
                let mut tile = [0.0f32; 256];
                for (t, o) in out[..n].iter_mut().enumerate() {
                    decode_tile(&codes[t * words..], words, quant, 1, dim, &mut tile);
                    *o = dots::<R>(q, &tile[..dim], dim);
                }
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn code_accumulate_b<const R: usize, const B: usize>(
    codes: &[u32],
    words: usize,
    levels: &[f32],
    w: &[f32],
    wstride: usize,
    n: usize,
    dim: usize,
    acc: &mut [f32],
) {
    let table = level_table(levels);
    let base = codes.as_ptr() as *const u8;
    // SAFETY: checked by the caller (`code_accumulate`).
    unsafe {
        let lo = _mm256_loadu_ps(table.as_ptr());
        let hi = _mm256_loadu_ps(table.as_ptr().add(8));
        let src = |t: usize| base.add(t * words * 4);
        weighted_sum::<R>(
            w,
            wstride,
            n,
            dim,
            acc,
            |t, g| {
                if B == 2 {
                    decode16_b2(src(t), g, lo)
                } else {
                    (
                        decode8::<B>(src(t), g, lo, hi),
                        decode8::<B>(src(t), g + 1, lo, hi),
                    )
                }
            },
            |t, g| decode8::<B>(src(t), g, lo, hi),
        );
    }
}

/// `acc_r += sum_{t < n} w[r * wstride + t] * row_t`, 16 columns at a time while they last,
/// then 8: `pair(t, g)` gives the 8-column groups `g` and `g + 1` of row `t`, `single(t, g)`
/// group `g` alone. Shared by the packed-code and the dense value loops.
///
/// # Safety
/// AVX2 and FMA in the caller; `acc` holds `R * dim` and `w` `(R - 1) * wstride + n` floats;
/// the closures are safe to call for `t < n` and groups below `dim / 8`.
#[inline(always)]
unsafe fn weighted_sum<const R: usize>(
    w: &[f32],
    wstride: usize,
    n: usize,
    dim: usize,
    acc: &mut [f32],
    pair: impl Fn(usize, usize) -> (__m256, __m256),
    single: impl Fn(usize, usize) -> __m256,
) {
    let (wp, ap) = (w.as_ptr(), acc.as_mut_ptr());
    // SAFETY: the caller's contract.
    unsafe {
        let mut c = 0;
        while c + 16 <= dim {
            let mut a = [[_mm256_setzero_ps(); 2]; R];
            for t in 0..n {
                let (v0, v1) = pair(t, c / 8);
                for (r, ar) in a.iter_mut().enumerate() {
                    let wt = _mm256_broadcast_ss(&*wp.add(r * wstride + t));
                    ar[0] = _mm256_fmadd_ps(wt, v0, ar[0]);
                    ar[1] = _mm256_fmadd_ps(wt, v1, ar[1]);
                }
            }
            for (r, ar) in a.iter().enumerate() {
                for (h, v) in ar.iter().enumerate() {
                    let p = ap.add(r * dim + c + 8 * h);
                    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *v));
                }
            }
            c += 16;
        }
        if c < dim {
            let mut a = [_mm256_setzero_ps(); R];
            for t in 0..n {
                let v0 = single(t, c / 8);
                for (r, ar) in a.iter_mut().enumerate() {
                    let wt = _mm256_broadcast_ss(&*wp.add(r * wstride + t));
                    *ar = _mm256_fmadd_ps(wt, v0, *ar);
                }
            }
            for (r, v) in a.iter().enumerate() {
                let p = ap.add(r * dim + c);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), *v));
            }
        }
    }
}

/// `acc_r += sum_t w[r * wstride + t] * c(idx[t])` over `n` packed vectors decoded in
/// registers; false (nothing done) for 8-bit codes, which go through a tile.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn code_accumulate<const R: usize>(
    codes: &[u32],
    words: usize,
    quant: &Quantizer,
    w: &[f32],
    wstride: usize,
    n: usize,
    dim: usize,
    acc: &mut [f32],
) -> bool {
    let bits = quant.bits() as usize;
    if n == 0 || bits == 8 {
        return n == 0;
    }
    let groups = dim / 8;
    assert!(dim.is_multiple_of(8) && acc.len() >= R * dim);
    assert!(w.len() >= (R - 1) * wstride + n);
    let last = (n - 1) * words * 4 + (groups - 1) * bits + 4;
    assert!(
        last <= codes.len() * 4,
        "code_accumulate reads past the codes"
    );
    let levels = &quant.codebook.levels;
    // SAFETY: bounds asserted above.
    unsafe {
        match bits {
            2 => code_accumulate_b::<R, 2>(codes, words, levels, w, wstride, n, dim, acc),
            3 => code_accumulate_b::<R, 3>(codes, words, levels, w, wstride, n, dim, acc),
            _ => code_accumulate_b::<R, 4>(codes, words, levels, w, wstride, n, dim, acc),
        }
    }
    true
}

/// `acc_r += sum_{t < n} w[r * wstride + t] * tile[t * dim ..]` (`dim` a multiple of 8).
#[target_feature(enable = "avx2,fma")]
pub(super) fn accumulate<const R: usize>(
    w: &[f32],
    wstride: usize,
    tile: &[f32],
    n: usize,
    dim: usize,
    acc: &mut [f32],
) {
    if n == 0 {
        return;
    }
    assert!(dim.is_multiple_of(8) && tile.len() >= n * dim && acc.len() >= R * dim);
    assert!(w.len() >= (R - 1) * wstride + n);
    let tp = tile.as_ptr();
    let row = |t: usize, g: usize| tp.wrapping_add(t * dim + 8 * g);
    // SAFETY: bounds asserted above; AVX2 and FMA are this function's own.
    unsafe {
        weighted_sum::<R>(
            w,
            wstride,
            n,
            dim,
            acc,
            |t, g| (_mm256_loadu_ps(row(t, g)), _mm256_loadu_ps(row(t, g + 1))),
            |t, g| _mm256_loadu_ps(row(t, g)),
        )
    }
}

/// `x <- exp(x - m)` in place for x <= m (same polynomial as `exp_neg`); returns the sum.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n8 = x.len() / 8 * 8;
    let p = x.as_mut_ptr();
    let mut total = _mm256_setzero_ps();
    // SAFETY: i + 8 <= n8 <= x.len().
    unsafe {
        let mv = _mm256_set1_ps(m);
        for i in (0..n8).step_by(8) {
            let v = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv);
            let e = exp_neg8(v);
            _mm256_storeu_ps(p.add(i), e);
            total = _mm256_add_ps(total, e);
        }
    }
    let mut sum = hsum(total);
    for v in &mut x[n8..] {
        *v = super::exp_neg::<super::Fused>(*v - m);
        sum += *v;
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_neg8(x: __m256) -> __m256 {
    {
        let xc = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let magic = _mm256_set1_ps(12_582_912.0);
        let n = _mm256_sub_ps(
            _mm256_fmadd_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E), magic),
            magic,
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut y = _mm256_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
        let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-87.0));
        _mm256_and_ps(e, keep)
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode_tile(
    codes: &[u32],
    words: usize,
    q: &Quantizer,
    n: usize,
    dim: usize,
    tile: &mut [f32],
) {
    let bits = q.bits() as usize;
    let levels = &q.codebook.levels;
    let groups = dim / 8;
    if n == 0 || groups == 0 {
        return;
    }
    assert!(tile.len() >= n * dim);
    // Last byte read: vector n-1, group groups-1, 4 (or 8) bytes.
    let last = (n - 1) * words * 4 + (groups - 1) * bits + if bits == 8 { 8 } else { 4 };
    assert!(last <= codes.len() * 4, "decode_tile reads past the codes");
    let base = codes.as_ptr() as *const u8;
    let out = tile.as_mut_ptr();
    // SAFETY: all reads are below `last` (checked) and all writes below n * dim.
    unsafe {
        if bits == 8 {
            for t in 0..n {
                let src = base.add(t * words * 4);
                for j in 0..groups {
                    let b = _mm_loadl_epi64(src.add(j * 8) as *const __m128i);
                    let idx = _mm256_cvtepu8_epi32(b);
                    let v = _mm256_i32gather_ps::<4>(levels.as_ptr(), idx);
                    _mm256_storeu_ps(out.add(t * dim + j * 8), v);
                }
            }
            return;
        }
        let mut table = [0.0f32; 16];
        table[..levels.len()].copy_from_slice(levels);
        let lo = _mm256_loadu_ps(table.as_ptr());
        let hi = _mm256_loadu_ps(table.as_ptr().add(8));
        let b = bits as i32;
        let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
        let mask = _mm256_set1_epi32((1 << b) - 1);
        for t in 0..n {
            let src = base.add(t * words * 4);
            for j in 0..groups {
                let w = (src.add(j * bits) as *const u32).read_unaligned();
                let idx =
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), mask);
                let mut v = _mm256_permutevar8x32_ps(lo, idx);
                if bits == 4 {
                    let vh = _mm256_permutevar8x32_ps(hi, idx);
                    let sel = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx));
                    v = _mm256_blendv_ps(v, vh, sel);
                }
                _mm256_storeu_ps(out.add(t * dim + j * 8), v);
            }
        }
    }
}
