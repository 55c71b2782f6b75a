//! AVX-512 kernels of [`super`]: sixteen codes of 2, 3 or 4 bits come out of two unaligned u32
//! loads into one register (`vpsrlvd` on the two words broadcast to eight lanes each, then
//! `vpermps` on a 16-entry level table, which reads exactly the low four bits of each lane, so
//! no mask and no blend are needed), and feed the score and value FMAs; 8-bit codes are
//! widened from 16 bytes and gathered from the 256 levels. The dense (exact)
//! cache gets the same 16-wide dot and accumulate loops. Every function here is
//! `#[target_feature(enable = "avx512f,avx2,fma")]`; callers check the CPU first and fall
//! back to the AVX2 kernels where these decline (`dim` not a multiple of 16).

use super::Quantizer;
use crate::simd::has_vbmi;
use std::arch::x86_64::*;

/// Lanes of one register.
const LANES: usize = 16;

/// The level table of one quantizer: 16 entries in a register for codes of up to 4 bits, and
/// the levels themselves for 8-bit codes, which are gathered.
#[derive(Clone, Copy)]
struct Table {
    register: __m512,
    levels: *const f32,
}

/// The levels repeated to 16 entries: `vpermps` indexes with the low four bits of a lane, and
/// for 2- and 3-bit codes the bits above the code (the next code's) must not matter.
fn level_table(levels: &[f32]) -> [f32; LANES] {
    std::array::from_fn(|i| levels[i % levels.len()])
}

/// Sixteen levels of group `j` (codes `16 j .. 16 j + 16`) of the vector at `src`; with
/// `VBMI`, through [`decode16_vbmi`].
///
/// # Safety
/// AVX-512F (and AVX-512 VBMI + VL with `VBMI`) in the caller; `src + j * 2B + 8` bytes are
/// readable (`src + 16 j + 16` for 8-bit codes), and `table.levels` holds 256 levels then.
#[inline(always)]
unsafe fn decode16<const B: usize, const VBMI: bool>(
    src: *const u8,
    j: usize,
    table: Table,
) -> __m512 {
    if B == 8 {
        // One byte per code: widen 16 bytes to lanes and gather from the 256 levels (1 KiB,
        // in L1). SAFETY: the caller's contract (16 bytes readable at the group).
        return unsafe {
            let bytes = _mm_loadu_si128(src.add(j * LANES) as *const __m128i);
            _mm512_i32gather_ps::<4>(_mm512_cvtepu8_epi32(bytes), table.levels)
        };
    }
    let table = table.register;
    if VBMI {
        // SAFETY: the caller's contract.
        return unsafe { decode16_vbmi::<B>(src, j, table) };
    }
    // Codes 0..8 of the group start at its first byte, codes 8..16 exactly B bytes later.
    // SAFETY: the caller's contract.
    let (lo, hi) = unsafe {
        let at = src.add(j * 2 * B);
        (
            (at as *const u32).read_unaligned(),
            (at.add(B) as *const u32).read_unaligned(),
        )
    };
    // SAFETY (intrinsics): AVX-512F in the caller (the contract).
    unsafe {
        let words = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi32(lo as i32)),
            _mm256_set1_epi32(hi as i32),
        );
        let b = B as i32;
        let shifts = _mm512_setr_epi32(
            0,
            b,
            2 * b,
            3 * b,
            4 * b,
            5 * b,
            6 * b,
            7 * b,
            0,
            b,
            2 * b,
            3 * b,
            4 * b,
            5 * b,
            6 * b,
            7 * b,
        );
        _mm512_permutexvar_ps(_mm512_srlv_epi32(words, shifts), table)
    }
}

/// [`decode16`] with AVX-512 VBMI: the group's 16 codes lie in 8 bytes (at most 48 bits
/// used), broadcast to both halves of an xmm register; `vpmultishiftqb` copies each code's
/// bit field to its own byte (bits above the code are the next code's, which `vpermps`
/// ignores), `vpmovzxbd` widens the bytes to lanes. Four instructions instead of seven.
///
/// # Safety
/// As [`decode16`], with VBMI and VL.
#[inline(always)]
unsafe fn decode16_vbmi<const B: usize>(src: *const u8, j: usize, table: __m512) -> __m512 {
    // SAFETY: the caller's contract (8 bytes readable from the group's first byte).
    let word = unsafe { (src.add(j * 2 * B) as *const u64).read_unaligned() };
    let b = B as i8;
    // SAFETY (intrinsics): VBMI, VL and AVX-512F in the caller.
    unsafe {
        let control = _mm_setr_epi8(
            0,
            b,
            2 * b,
            3 * b,
            4 * b,
            5 * b,
            6 * b,
            7 * b,
            8 * b,
            9 * b,
            10 * b,
            11 * b,
            12 * b,
            13 * b,
            14 * b,
            15 * b,
        );
        let bytes = _mm_multishift_epi64_epi8(control, _mm_set1_epi64x(word as i64));
        _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(bytes), table)
    }
}

/// The eight sums of `acc` (two tokens x four rows), token-major: `[t0 r0..r3, t1 r0..r3]`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn sums_2x4(acc0: &[__m512; 4], acc1: &[__m512; 4]) -> __m256 {
    let half = |v: __m512| {
        _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    };
    let x = _mm256_hadd_ps(
        _mm256_hadd_ps(half(acc0[0]), half(acc0[1])),
        _mm256_hadd_ps(half(acc0[2]), half(acc0[3])),
    );
    let y = _mm256_hadd_ps(
        _mm256_hadd_ps(half(acc1[0]), half(acc1[1])),
        _mm256_hadd_ps(half(acc1[2]), half(acc1[3])),
    );
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(x, y),
        _mm256_permute2f128_ps::<0x31>(x, y),
    )
}

/// See [`code_dots`]; bounds are checked there. Inlined into the two builds below.
#[inline(always)]
unsafe fn code_dots_b<const R: usize, const B: usize, const VBMI: bool>(
    codes: &[u32],
    words: usize,
    levels: &[f32],
    n: usize,
    dim: usize,
    q: &[f32],
    out: &mut [[f32; R]],
) {
    let groups = dim / LANES;
    let level_table = level_table(levels);
    let base = codes.as_ptr() as *const u8;
    let qp = q.as_ptr();
    // SAFETY: checked by the caller (`code_dots`).
    unsafe {
        let table = Table {
            register: _mm512_loadu_ps(level_table.as_ptr()),
            levels: levels.as_ptr(),
        };
        // Two tokens at a time: 2R independent FMA chains, each query load used twice.
        let mut t = 0;
        while t + 2 <= n {
            let src0 = base.add(t * words * 4);
            let src1 = base.add((t + 1) * words * 4);
            let mut acc0 = [_mm512_setzero_ps(); R];
            let mut acc1 = [_mm512_setzero_ps(); R];
            for j in 0..groups {
                let v0 = decode16::<B, VBMI>(src0, j, table);
                let v1 = decode16::<B, VBMI>(src1, j, table);
                for r in 0..R {
                    let qv = _mm512_loadu_ps(qp.add(r * dim + j * LANES));
                    acc0[r] = _mm512_fmadd_ps(qv, v0, acc0[r]);
                    acc1[r] = _mm512_fmadd_ps(qv, v1, acc1[r]);
                }
            }
            if R == 4 || R == 8 {
                // Four rows at a time: [t r0..r3, t+1 r0..r3] per sums_2x4.
                debug_assert!(t + 2 <= out.len());
                for h in 0..R / 4 {
                    let a0: &[__m512; 4] = acc0[4 * h..4 * h + 4].try_into().expect("four");
                    let a1: &[__m512; 4] = acc1[4 * h..4 * h + 4].try_into().expect("four");
                    let sums = sums_2x4(a0, a1);
                    let first = out.as_mut_ptr().add(t) as *mut f32;
                    _mm_storeu_ps(first.add(4 * h), _mm256_castps256_ps128(sums));
                    _mm_storeu_ps(first.add(R + 4 * h), _mm256_extractf128_ps::<1>(sums));
                }
            } else {
                for r in 0..R {
                    out[t][r] = _mm512_reduce_add_ps(acc0[r]);
                    out[t + 1][r] = _mm512_reduce_add_ps(acc1[r]);
                }
            }
            t += 2;
        }
        if t < n {
            let src = base.add(t * words * 4);
            let mut acc = [_mm512_setzero_ps(); R];
            for j in 0..groups {
                let v = decode16::<B, VBMI>(src, j, table);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(r * dim + j * LANES)), v, *a);
                }
            }
            for r in 0..R {
                out[t][r] = _mm512_reduce_add_ps(acc[r]);
            }
        }
    }
}

/// Whether these kernels take codes of `bits` at working row length `dim`.
fn handles(bits: usize, dim: usize) -> bool {
    [2, 3, 4, 8].contains(&bits) && dim > 0 && dim.is_multiple_of(LANES)
}

/// The last byte a 16-wide decode of `n` vectors reads, plus one.
fn read_end(n: usize, words: usize, bits: usize, dim: usize) -> usize {
    (n - 1) * words * 4 + (dim / LANES - 1) * 2 * bits + if bits == 8 { 16 } else { 8 }
}

/// Generates the two builds of a code kernel: AVX-512F alone, and with VBMI + VL.
macro_rules! builds {
    ($body:ident, $plain:ident, $vbmi:ident, ($($arg:ident: $ty:ty),*)) => {
        #[target_feature(enable = "avx512f,avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $plain<const R: usize, const B: usize>($($arg: $ty),*) {
            // SAFETY: forwarded contract; the features are this function's own.
            unsafe { $body::<R, B, false>($($arg),*) }
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $vbmi<const R: usize, const B: usize>($($arg: $ty),*) {
            // SAFETY: forwarded contract; the features are this function's own.
            unsafe { $body::<R, B, true>($($arg),*) }
        }
    };
}

builds!(code_dots_b, code_dots_plain, code_dots_vbmi, (
    codes: &[u32], words: usize, levels: &[f32], n: usize, dim: usize, q: &[f32],
    out: &mut [[f32; R]]
));
builds!(code_accumulate_b, code_accumulate_plain, code_accumulate_vbmi, (
    codes: &[u32], words: usize, levels: &[f32], w: &[f32], wstride: usize, n: usize,
    dim: usize, acc: &mut [f32]
));

/// `out[t][r] = <q_r, c(idx[t])>` for `n` packed vectors, decoded in registers. Returns false
/// (nothing done) unless the codes have 2, 3, 4 or 8 bits and `dim` is a multiple of 16.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn code_dots<const R: usize>(
    codes: &[u32],
    words: usize,
    quant: &Quantizer,
    n: usize,
    dim: usize,
    q: &[f32],
    out: &mut [[f32; R]],
) -> bool {
    let bits = quant.bits() as usize;
    if !handles(bits, dim) {
        return false;
    }
    if n == 0 {
        return true;
    }
    assert!(q.len() >= R * dim && out.len() >= n);
    assert!(
        read_end(n, words, bits, dim) <= codes.len() * 4,
        "code_dots reads past the codes"
    );
    let levels = &quant.codebook.levels;
    // SAFETY: bounds asserted above; AVX-512F is this function's own, VBMI + VL checked.
    unsafe {
        match (bits, has_vbmi()) {
            (2, true) => code_dots_vbmi::<R, 2>(codes, words, levels, n, dim, q, out),
            (3, true) => code_dots_vbmi::<R, 3>(codes, words, levels, n, dim, q, out),
            (8, _) => code_dots_plain::<R, 8>(codes, words, levels, n, dim, q, out),
            (4, true) => code_dots_vbmi::<R, 4>(codes, words, levels, n, dim, q, out),
            (2, false) => code_dots_plain::<R, 2>(codes, words, levels, n, dim, q, out),
            (3, false) => code_dots_plain::<R, 3>(codes, words, levels, n, dim, q, out),
            _ => code_dots_plain::<R, 4>(codes, words, levels, n, dim, q, out),
        }
    }
    true
}

/// See [`code_accumulate`]; bounds are checked there. Inlined into the two builds below.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn code_accumulate_b<const R: usize, const B: usize, const VBMI: bool>(
    codes: &[u32],
    words: usize,
    levels: &[f32],
    w: &[f32],
    wstride: usize,
    n: usize,
    dim: usize,
    acc: &mut [f32],
) {
    let level_table = level_table(levels);
    let base = codes.as_ptr() as *const u8;
    // SAFETY: checked by the caller (`code_accumulate`).
    unsafe {
        let table = Table {
            register: _mm512_loadu_ps(level_table.as_ptr()),
            levels: levels.as_ptr(),
        };
        weighted_sum::<R>(w, wstride, n, dim, acc, |t, group| {
            decode16::<B, VBMI>(base.add(t * words * 4), group, table)
        });
    }
}

/// `acc_r += sum_{t < n} w[r * wstride + t] * row_t`, where `row(t, g)` gives the 16 columns
/// of group `g` of row `t`: 32 columns (two registers per row) at a time while they last,
/// then 16. Shared by the packed-code and the dense value loops.
///
/// # Safety
/// AVX-512F in the caller; `acc` holds `R * dim` and `w` `(R - 1) * wstride + n` floats; `row`
/// is safe to call for `t < n`, `g < dim / 16`.
#[inline(always)]
unsafe fn weighted_sum<const R: usize>(
    w: &[f32],
    wstride: usize,
    n: usize,
    dim: usize,
    acc: &mut [f32],
    row: impl Fn(usize, usize) -> __m512,
) {
    let (wp, ap) = (w.as_ptr(), acc.as_mut_ptr());
    // SAFETY: the caller's contract.
    unsafe {
        let mut c = 0;
        while c < dim {
            let pair = c + 2 * LANES <= dim;
            let g = c / LANES;
            let mut a = [[_mm512_setzero_ps(); 2]; R];
            for t in 0..n {
                let v0 = row(t, g);
                let v1 = if pair {
                    row(t, g + 1)
                } else {
                    _mm512_setzero_ps()
                };
                for (r, ar) in a.iter_mut().enumerate() {
                    let wt = _mm512_set1_ps(*wp.add(r * wstride + t));
                    ar[0] = _mm512_fmadd_ps(wt, v0, ar[0]);
                    ar[1] = _mm512_fmadd_ps(wt, v1, ar[1]);
                }
            }
            let width = if pair { 2 } else { 1 };
            for (r, ar) in a.iter().enumerate() {
                for (h, v) in ar[..width].iter().enumerate() {
                    let p = ap.add(r * dim + c + LANES * h);
                    _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), *v));
                }
            }
            c += width * LANES;
        }
    }
}

/// `acc_r += sum_t w[r * wstride + t] * c(idx[t])` over `n` packed vectors decoded in
/// registers. Returns false (nothing done) unless the codes have 2, 3, 4 or 8 bits and `dim` is a
/// multiple of 16.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) fn code_accumulate<const R: usize>(
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
    if !handles(bits, dim) {
        return false;
    }
    if n == 0 {
        return true;
    }
    assert!(acc.len() >= R * dim);
    assert!(w.len() >= (R - 1) * wstride + n);
    assert!(
        read_end(n, words, bits, dim) <= codes.len() * 4,
        "code_accumulate reads past the codes"
    );
    let levels = &quant.codebook.levels;
    let (l, ws, a) = (levels, wstride, acc);
    // SAFETY: bounds asserted above; AVX-512F is this function's own, VBMI + VL checked.
    unsafe {
        match (bits, has_vbmi()) {
            (2, true) => code_accumulate_vbmi::<R, 2>(codes, words, l, w, ws, n, dim, a),
            (3, true) => code_accumulate_vbmi::<R, 3>(codes, words, l, w, ws, n, dim, a),
            (8, _) => code_accumulate_plain::<R, 8>(codes, words, l, w, ws, n, dim, a),
            (4, true) => code_accumulate_vbmi::<R, 4>(codes, words, l, w, ws, n, dim, a),
            (2, false) => code_accumulate_plain::<R, 2>(codes, words, l, w, ws, n, dim, a),
            (3, false) => code_accumulate_plain::<R, 3>(codes, words, l, w, ws, n, dim, a),
            _ => code_accumulate_plain::<R, 4>(codes, words, l, w, ws, n, dim, a),
        }
    }
    true
}

/// `<q_r, k>` for `R` rows (`dim` a multiple of 16, slices long enough: checked).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn dots<const R: usize>(q: &[f32], k: &[f32], dim: usize) -> [f32; R] {
    assert!(dim.is_multiple_of(LANES) && q.len() >= R * dim && k.len() >= dim);
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    // SAFETY: every load is below R * dim of q and dim of k (asserted).
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for c in (0..dim).step_by(LANES) {
            let kv = _mm512_loadu_ps(kp.add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(r * dim + c)), kv, *a);
            }
        }
        acc.map(|a| _mm512_reduce_add_ps(a))
    }
}

/// `acc_r += sum_{t < n} w[r * wstride + t] * tile[t * dim ..]` (`dim` a multiple of 16).
#[target_feature(enable = "avx512f,avx2,fma")]
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
    assert!(dim.is_multiple_of(LANES) && tile.len() >= n * dim && acc.len() >= R * dim);
    assert!(w.len() >= (R - 1) * wstride + n);
    let tp = tile.as_ptr();
    // SAFETY: bounds asserted above; AVX-512F is this function's own.
    unsafe {
        weighted_sum::<R>(w, wstride, n, dim, acc, |t, group| {
            _mm512_loadu_ps(tp.add(t * dim + group * LANES))
        })
    }
}
