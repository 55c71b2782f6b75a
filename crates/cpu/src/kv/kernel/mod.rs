//! Pass 1 of flash-decoding on one block of tokens, for up to four query rows that share a KV
//! head (the GQA group of one query position):
//!
//! ```text
//! s_rt = norm_k[t] * <q'_r, c(idx_k[t])>         (t < limit_r, else -inf)
//! m_r  = max_t s_rt,  p_rt = exp(s_rt - m_r),  l_r = sum_t p_rt
//! a_r  = sum_t (p_rt * norm_v[t]) c(idx_v[t])     (still in the rotated basis)
//! ```
//!
//! The packed codes are read [`SUB`] tokens at a time, once for all rows, and never through a
//! dequantised copy of the cache: with AVX2 (`avx2.rs`) eight codes come out of one unaligned
//! u32 load straight into a register (`vpsrlvd`, `vpermps` on the levels; a gather for 8 bits)
//! and feed the FMAs, sixteen with AVX-512 (`avx512.rs`); the portable path decodes a
//! [`SUB`]-token tile and runs plain Rust. Every path reads the contract's layout
//! (`deltakv_contract::kv::codec`) relying on its `CODE_PAD` words after each stream. The dense
//! (exact) cache runs the same dot / accumulate code on its f32 rows directly, with unit norms.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cache::Norms;
use crate::simd::{Fused, MulAdd, Unfused, has_avx2_fma, has_avx512};
use deltakv_contract::kv::Quantizer;
use half::f16;

/// Tokens decoded per tile.
pub(crate) const SUB: usize = 128;
/// Most rows handled together (the scratch's capacity).
pub(crate) const MAX_ROWS: usize = 8;

/// Rows per block call: a GQA group of up to eight query heads reads each block of codes once
/// with AVX-512 (16 accumulators of two tokens x eight rows fit its 32 registers); the AVX2
/// and portable builds take four (their 16 registers would spill).
pub(crate) fn rows_per_call(allow_simd: bool) -> usize {
    if allow_simd && has_avx512() { 8 } else { 4 }
}

/// Stored norms as a kernel reads them.
#[derive(Clone, Copy)]
pub(crate) enum NormSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// f32 norms as their bits (the paged layout).
    F32Words(&'a [u32]),
    /// f16 norms two per u32 word, low half first (the paged layout).
    F16Words(&'a [u32]),
}

impl NormSlice<'_> {
    /// Norms `t0..t0 + out.len()` as f32.
    #[inline]
    pub(crate) fn copy_to(&self, t0: usize, out: &mut [f32]) {
        match self {
            NormSlice::F32(n) => out.copy_from_slice(&n[t0..t0 + out.len()]),
            NormSlice::F16(n) => {
                for (o, v) in out.iter_mut().zip(&n[t0..]) {
                    *o = v.to_f32();
                }
            }
            NormSlice::F32Words(w) => {
                for (o, &bits) in out.iter_mut().zip(&w[t0..]) {
                    *o = f32::from_bits(bits);
                }
            }
            NormSlice::F16Words(w) => {
                for (i, o) in out.iter_mut().enumerate() {
                    let t = t0 + i;
                    *o = f16::from_bits((w[t / 2] >> (16 * (t % 2))) as u16).to_f32();
                }
            }
        }
    }
}

/// The packed rows (stride `stride` u32 words, one vector each) and norms of one stream,
/// starting at the source's first token.
#[derive(Clone, Copy)]
pub(crate) struct CodeStream<'a> {
    pub codes: &'a [u32],
    pub stride: usize,
    pub norms: NormSlice<'a>,
}

impl<'a> CodeStream<'a> {
    /// The K or V stream of a contiguous store.
    pub(crate) fn of(codes: &'a [u32], norms: &'a Norms, q: &Quantizer) -> Self {
        Self {
            codes,
            stride: q.words(),
            norms: match norms {
                Norms::F32(n) => NormSlice::F32(n),
                Norms::F16(n) => NormSlice::F16(n),
            },
        }
    }
}

/// Where the keys and values of one (sequence, KV head) come from.
pub(crate) enum HeadSource<'a> {
    /// Packed codes; row 0 of each stream is token `origin` (a page starts past 0).
    Compressed {
        k: CodeStream<'a>,
        v: CodeStream<'a>,
        kq: &'a Quantizer,
        vq: &'a Quantizer,
        origin: usize,
    },
    /// `[tokens, d]` keys and values.
    Dense { k: &'a [f32], v: &'a [f32] },
}

/// Working buffers of one task.
pub(crate) struct Scratch {
    tile: Vec<f32>,
    norms: Vec<f32>,
    /// `MAX_ROWS x block` scores, then weights.
    s: Vec<f32>,
    block: usize,
}

impl Scratch {
    pub(crate) fn new(dim: usize, block: usize) -> Self {
        Self {
            tile: vec![0.0; SUB * dim],
            norms: vec![1.0; SUB],
            s: vec![0.0; MAX_ROWS * block],
            block,
        }
    }
}

/// The rows of one block call: `q` is `rows x dim` (scaled, in the working basis), row `r`
/// sees tokens `< limits[r]`; results go to `m`, `l` (per row) and `acc` (`rows x dim`).
pub(crate) struct Rows<'a> {
    pub q: &'a [f32],
    pub limits: &'a [usize],
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub acc: &'a mut [f32],
}

#[inline(always)]
fn exp_neg<M: MulAdd>(x: f32) -> f32 {
    // exp for x <= 0 (x < -87 and -inf give 0): 2^n * e^r with |r| <= ln2/2, degree-6 poly.
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let xc = x.max(-87.0);
    let n = (xc * LOG2E + 12_582_912.0) - 12_582_912.0;
    let r = M::mul_add(-n, LN2_LO, M::mul_add(-n, LN2_HI, xc));
    let mut p = 1.0 / 720.0;
    p = M::mul_add(p, r, 1.0 / 120.0);
    p = M::mul_add(p, r, 1.0 / 24.0);
    p = M::mul_add(p, r, 1.0 / 6.0);
    p = M::mul_add(p, r, 0.5);
    p = M::mul_add(p, r, 1.0);
    p = M::mul_add(p, r, 1.0);
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    if x < -87.0 { 0.0 } else { p * scale }
}

/// Largest element (-inf for an empty slice), eight lanes at a time so it vectorises.
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] = if c[i] > lanes[i] { c[i] } else { lanes[i] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(tail) {
        m = if v > m { v } else { m };
    }
    m
}

/// `<q_r, k>` for `R` rows of `q` (stride `dim`).
#[inline(always)]
fn dots<M: MulAdd, const R: usize>(q: &[f32], k: &[f32], dim: usize) -> [f32; R] {
    let mut acc = [[0.0f32; 8]; R];
    let full = dim / 8 * 8;
    for c in (0..full).step_by(8) {
        let kc: &[f32; 8] = k[c..c + 8].try_into().unwrap();
        for (r, a) in acc.iter_mut().enumerate() {
            let qc: &[f32; 8] = q[r * dim + c..r * dim + c + 8].try_into().unwrap();
            for l in 0..8 {
                a[l] = M::mul_add(qc[l], kc[l], a[l]);
            }
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let a = &acc[r];
        let mut s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        for c in full..dim {
            s = M::mul_add(q[r * dim + c], k[c], s);
        }
        out[r] = s;
    }
    out
}

/// `acc_r += sum_t w[r][t] * tile[t]` over `n` tile rows (stride `dim`); `w` rows have
/// stride `wstride`.
#[inline(always)]
fn accumulate<M: MulAdd, const R: usize>(
    w: &[f32],
    wstride: usize,
    tile: &[f32],
    n: usize,
    dim: usize,
    acc: &mut [f32],
) {
    const C: usize = 16;
    let full = dim / C * C;
    for c in (0..full).step_by(C) {
        let mut a = [[0.0f32; C]; R];
        for t in 0..n {
            let vc: &[f32; C] = tile[t * dim + c..t * dim + c + C].try_into().unwrap();
            for (r, ar) in a.iter_mut().enumerate() {
                let wt = w[r * wstride + t];
                for l in 0..C {
                    ar[l] = M::mul_add(wt, vc[l], ar[l]);
                }
            }
        }
        for (r, ar) in a.iter().enumerate() {
            for l in 0..C {
                acc[r * dim + c + l] += ar[l];
            }
        }
    }
    for c in full..dim {
        for r in 0..R {
            let mut s = 0.0f32;
            for t in 0..n {
                s = M::mul_add(w[r * wstride + t], tile[t * dim + c], s);
            }
            acc[r * dim + c] += s;
        }
    }
}

/// Decodes `n` packed vectors (stride `words` u32) into `tile` rows of `dim` levels
/// (`dim >= d`, a multiple of 8; entries past d are finite junk, multiplied by zeros later).
#[inline(always)]
fn decode_tile<const AVX: bool>(
    codes: &[u32],
    words: usize,
    q: &Quantizer,
    n: usize,
    dim: usize,
    tile: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX is only true inside the avx2+fma wrapper (CPU checked by the caller);
        // reads stay within `codes`, which carries CODE_PAD words after the last vector.
        unsafe { avx2::decode_tile(codes, words, q, n, dim, tile) };
        return;
    }
    let (bits, d) = (q.bits(), q.dim());
    let levels = &q.codebook.levels;
    for t in 0..n {
        let w = &codes[t * words..];
        let row = &mut tile[t * dim..(t + 1) * dim];
        for (i, o) in row[..d].iter_mut().enumerate() {
            *o = levels[code_at(w, bits, i) as usize];
        }
        row[d..].iter_mut().for_each(|v| *v = 0.0);
    }
}

/// Code `i` of a vector's packed stream `words` (`bits` bits per code, LSB first, a code may
/// straddle two words): the portable reader of the contract's layout. The caller keeps `i`
/// below the vector's code count, so the words read lie within its stream and pad.
#[inline(always)]
fn code_at(words: &[u32], bits: u32, i: usize) -> u32 {
    let b = bits as usize;
    let bit = i * b;
    let (word, shift) = (bit / 32, bit % 32);
    let mut value = words[word] >> shift;
    if shift + b > 32 {
        value |= words[word + 1] << (32 - shift);
    }
    value & ((1u32 << b) - 1)
}

/// Pass 1 over tokens `t0..t1` for `R` rows; `dim` is the working row length. `AVX`: inside
/// the AVX2 + FMA build; `W512`: inside the AVX-512 build (which tries the 16-wide kernels
/// first and falls back to the AVX2 ones where they decline).
#[inline(always)]
fn block_generic<M: MulAdd, const AVX: bool, const W512: bool, const R: usize>(
    src: &HeadSource<'_>,
    dim: usize,
    t0: usize,
    t1: usize,
    rows: &mut Rows<'_>,
    scratch: &mut Scratch,
) {
    let n_all = t1 - t0;
    debug_assert!(n_all <= scratch.block);
    let bs = scratch.block;
    let Scratch { tile, norms, s, .. } = scratch;
    // Scores.
    let mut t = t0;
    let mut dd = [[0.0f32; R]; SUB];
    while t < t1 {
        let n = SUB.min(t1 - t);
        match src {
            HeadSource::Compressed { k, kq, origin, .. } => {
                let (w, local) = (k.stride, t - origin);
                k.norms.copy_to(local, &mut norms[..n]);
                let codes = &k.codes[local * w..];
                #[cfg(target_arch = "x86_64")]
                if AVX {
                    // SAFETY: AVX (W512) is only true inside the avx2+fma (avx512f) wrapper;
                    // codes carry CODE_PAD words after the last vector.
                    let done = W512
                        && unsafe { avx512::code_dots::<R>(codes, w, kq, n, dim, rows.q, &mut dd) };
                    if !done {
                        // SAFETY: as above.
                        unsafe { avx2::code_dots::<R>(codes, w, kq, n, dim, rows.q, &mut dd) };
                    }
                } else {
                    decode_tile::<AVX>(codes, w, kq, n, dim, tile);
                    for (i, d) in dd[..n].iter_mut().enumerate() {
                        *d = dots::<M, R>(rows.q, &tile[i * dim..(i + 1) * dim], dim);
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    decode_tile::<AVX>(codes, w, kq, n, dim, tile);
                    for (i, d) in dd[..n].iter_mut().enumerate() {
                        *d = dots::<M, R>(rows.q, &tile[i * dim..(i + 1) * dim], dim);
                    }
                }
            }
            HeadSource::Dense { k, .. } => {
                norms[..n].iter_mut().for_each(|v| *v = 1.0);
                for (i, d) in dd[..n].iter_mut().enumerate() {
                    let key = &k[(t + i) * dim..(t + i + 1) * dim];
                    #[cfg(target_arch = "x86_64")]
                    if W512 && dim.is_multiple_of(16) {
                        // SAFETY: W512 is only true inside the avx512f wrapper.
                        *d = unsafe { avx512::dots::<R>(rows.q, key, dim) };
                        continue;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if AVX && dim.is_multiple_of(8) {
                        // SAFETY: AVX is only true inside the avx2+fma wrapper.
                        *d = unsafe { avx2::dots::<R>(rows.q, key, dim) };
                        continue;
                    }
                    *d = dots::<M, R>(rows.q, key, dim);
                }
            }
        }
        for r in 0..R {
            let valid = rows.limits[r].saturating_sub(t).min(n);
            let out = &mut s[r * bs + (t - t0)..r * bs + (t - t0) + n];
            let (live, masked) = out.split_at_mut(valid);
            for ((o, d), &nk) in live.iter_mut().zip(&dd[..valid]).zip(&norms[..valid]) {
                *o = d[r] * nk;
            }
            masked.iter_mut().for_each(|o| *o = f32::NEG_INFINITY);
        }
        t += n;
    }
    // Softmax of the block.
    for r in 0..R {
        let sr = &mut s[r * bs..r * bs + n_all];
        let m = max_of(sr);
        rows.m[r] = m;
        if m == f32::NEG_INFINITY {
            sr.iter_mut().for_each(|v| *v = 0.0);
            rows.l[r] = 0.0;
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if AVX {
            // SAFETY: AVX is only true inside the avx2+fma wrapper.
            rows.l[r] = unsafe { avx2::exp_sub_sum(sr, m) };
            continue;
        }
        let mut l = 0.0f32;
        for v in sr.iter_mut() {
            *v = exp_neg::<M>(*v - m);
            l += *v;
        }
        rows.l[r] = l;
    }
    // Values.
    rows.acc[..R * dim].iter_mut().for_each(|v| *v = 0.0);
    let mut t = t0;
    while t < t1 {
        let n = SUB.min(t1 - t);
        let off = t - t0;
        let values: &[f32] = match src {
            HeadSource::Compressed { v, vq, origin, .. } => {
                let (w, local) = (v.stride, t - origin);
                v.norms.copy_to(local, &mut norms[..n]);
                for r in 0..R {
                    let wr = &mut s[r * bs + off..r * bs + off + n];
                    for (x, &nv) in wr.iter_mut().zip(&norms[..n]) {
                        *x *= nv;
                    }
                }
                let codes = &v.codes[local * w..];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX is only true inside the avx2+fma wrapper; codes carry CODE_PAD
                // words after the last vector.
                if AVX
                    && ((W512
                        && unsafe {
                            avx512::code_accumulate::<R>(
                                codes,
                                w,
                                vq,
                                &s[off..],
                                bs,
                                n,
                                dim,
                                rows.acc,
                            )
                        })
                        || unsafe {
                            avx2::code_accumulate::<R>(
                                codes,
                                w,
                                vq,
                                &s[off..],
                                bs,
                                n,
                                dim,
                                rows.acc,
                            )
                        })
                {
                    t += n;
                    continue;
                }
                decode_tile::<AVX>(codes, w, vq, n, dim, tile);
                tile
            }
            HeadSource::Dense { v, .. } => &v[t * dim..(t + n) * dim],
        };
        #[cfg(target_arch = "x86_64")]
        if W512 && dim.is_multiple_of(16) {
            // SAFETY: W512 is only true inside the avx512f wrapper.
            unsafe { avx512::accumulate::<R>(&s[off..], bs, values, n, dim, rows.acc) };
            t += n;
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if AVX && dim.is_multiple_of(8) {
            // SAFETY: AVX is only true inside the avx2+fma wrapper.
            unsafe { avx2::accumulate::<R>(&s[off..], bs, values, n, dim, rows.acc) };
            t += n;
            continue;
        }
        accumulate::<M, R>(&s[off..], bs, values, n, dim, rows.acc);
        t += n;
    }
}

macro_rules! dispatch_rows {
    ($name:ident, $m:ty, $avx:expr, $w512:expr) => {
        #[inline(always)]
        fn $name(
            src: &HeadSource<'_>,
            dim: usize,
            t0: usize,
            t1: usize,
            rows: &mut Rows<'_>,
            scratch: &mut Scratch,
        ) {
            match rows.limits.len() {
                1 => block_generic::<$m, $avx, $w512, 1>(src, dim, t0, t1, rows, scratch),
                2 => block_generic::<$m, $avx, $w512, 2>(src, dim, t0, t1, rows, scratch),
                3 => block_generic::<$m, $avx, $w512, 3>(src, dim, t0, t1, rows, scratch),
                4 => block_generic::<$m, $avx, $w512, 4>(src, dim, t0, t1, rows, scratch),
                5 => block_generic::<$m, $avx, $w512, 5>(src, dim, t0, t1, rows, scratch),
                6 => block_generic::<$m, $avx, $w512, 6>(src, dim, t0, t1, rows, scratch),
                7 => block_generic::<$m, $avx, $w512, 7>(src, dim, t0, t1, rows, scratch),
                _ => block_generic::<$m, $avx, $w512, 8>(src, dim, t0, t1, rows, scratch),
            }
        }
    };
}

dispatch_rows!(block_fused_avx512, Fused, true, true);
dispatch_rows!(block_fused_avx, Fused, true, false);
dispatch_rows!(block_plain, Unfused, false, false);

// The AVX-512 and AVX2 builds of pass 1.
crate::simd::target_build!(block_avx512, "avx512f,avx2,fma", block_fused_avx512, (
    src: &HeadSource<'_>, dim: usize, t0: usize, t1: usize, rows: &mut Rows<'_>,
    scratch: &mut Scratch,
));
crate::simd::target_build!(block_avx2, "avx2,fma", block_fused_avx, (
    src: &HeadSource<'_>, dim: usize, t0: usize, t1: usize, rows: &mut Rows<'_>,
    scratch: &mut Scratch,
));

/// Pass 1 over tokens `t0..t1` (at most the scratch's block size) for 1..=8 rows.
pub(crate) fn attend_block(
    src: &HeadSource<'_>,
    dim: usize,
    t0: usize,
    t1: usize,
    rows: &mut Rows<'_>,
    scratch: &mut Scratch,
    allow_simd: bool,
) {
    debug_assert!((1..=MAX_ROWS).contains(&rows.limits.len()));
    #[cfg(target_arch = "x86_64")]
    if allow_simd && has_avx512() {
        // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked just above).
        unsafe { block_avx512(src, dim, t0, t1, rows, scratch) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if allow_simd && has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { block_avx2(src, dim, t0, t1, rows, scratch) };
        return;
    }
    let _ = allow_simd;
    block_plain(src, dim, t0, t1, rows, scratch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        for i in 0..1740 {
            let x = -(i as f32) * 0.05;
            let want = (f64::from(x)).exp();
            let got = f64::from(exp_neg::<Unfused>(x));
            assert!(
                (got - want).abs() <= 3e-7 * want + 1e-38,
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(exp_neg::<Unfused>(-88.0), 0.0);
        assert_eq!(exp_neg::<Unfused>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg::<Unfused>(0.0), 1.0);
    }
}
