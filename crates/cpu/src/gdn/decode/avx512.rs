//! The single-token decode step on a state slab (f32 or bf16), in place, with AVX-512
//! registers.
//!
//! The same two passes as [`crate::gdn::recurrent`] (pass 1 reads the rows for `S^T k` and
//! `S^T q`; pass 2 rewrites them as `d * S + k v'^T`), over blocks of up to 128 columns: up to
//! eight 16-lane registers per accumulator row, so pass 1 keeps 16 independent FMA chains busy
//! and reads whole rows in order. Pass 2 runs last row first, so the rows pass 1 read last are
//! still in L1 (a 128 x 128 slab is 64 KiB, more than L1). Rows are read in place with the
//! pool's stride, so no copy of the block is made; a bf16 pool is widened as it is loaded and
//! rounded (to nearest even) as it is stored.

#[cfg(target_arch = "x86_64")]
use half::bf16;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A pool element as sixteen f32 lanes.
#[cfg(target_arch = "x86_64")]
pub(super) trait Lanes: Copy {
    /// # Safety
    /// AVX-512F; 16 elements readable at `p`.
    unsafe fn load(p: *const Self) -> __m512;
    /// # Safety
    /// AVX-512F; 16 elements writable at `p`.
    unsafe fn store(p: *mut Self, v: __m512);
}

/// Elsewhere the trait only marks the pool types.
#[cfg(not(target_arch = "x86_64"))]
pub(super) trait Lanes: Copy {}
#[cfg(not(target_arch = "x86_64"))]
impl Lanes for f32 {}
#[cfg(not(target_arch = "x86_64"))]
impl Lanes for half::bf16 {}

#[cfg(target_arch = "x86_64")]
impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn load(p: *const bf16) -> __m512 {
        // SAFETY: the caller's contract (16 x 2 bytes); the bf16 bits are the f32's top half.
        unsafe {
            let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut bf16, v: __m512) {
        // The same rounding as the contract's `bf16_round`: to nearest even, NaN kept (quiet).
        // SAFETY: the caller's contract (AVX-512F; 16 x 2 bytes writable).
        unsafe {
            let bits = _mm512_castps_si512(v);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
            let bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff));
            let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
            let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x40));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let out = _mm512_mask_blend_epi32(nan, rounded, quiet);
            _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(out))
        }
    }
}

/// Lanes of one AVX-512 register of f32.
pub(super) const LANES: usize = 16;

/// One token of one value head: its key and query rows (K), its value columns (from the
/// block's first column on) and scalars.
#[derive(Clone, Copy)]
pub(super) struct StepInputs<'a> {
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub value: &'a [f32],
    pub decay: f32,
    pub beta: f32,
    pub scale: f32,
    pub key_dot_query: f32,
}

/// Advances `width` columns (a multiple of [`LANES`]) of one slab by one token.
///
/// # Safety
/// The CPU supports AVX-512F. `state` points at column 0 of this block in row 0 of the slab;
/// rows `state + i * stride .. + width` for `i < K` are in bounds and touched by no other
/// thread; `s.value` and `out` hold at least `width` elements; `s.q.len() == s.k.len() == K`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn token<E: Lanes>(
    state: *mut E,
    stride: usize,
    width: usize,
    s: StepInputs<'_>,
    out: &mut [f32],
) {
    debug_assert!(width.is_multiple_of(LANES) && s.value.len() >= width && out.len() >= width);
    let mut col = 0;
    while col < width {
        let left = (width - col) / LANES;
        // SAFETY: the caller's contract, for columns col..col + registers * LANES.
        unsafe {
            let at = state.add(col);
            let s = StepInputs {
                value: &s.value[col..],
                ..s
            };
            let o = &mut out[col..];
            match left {
                8.. => block::<E, 8>(at, stride, s, o),
                4..=7 => block::<E, 4>(at, stride, s, o),
                2 | 3 => block::<E, 2>(at, stride, s, o),
                _ => block::<E, 1>(at, stride, s, o),
            }
        }
        col += match left {
            8.. => 8,
            4..=7 => 4,
            2 | 3 => 2,
            _ => 1,
        } * LANES;
    }
}

/// One block of `R * LANES` columns (see [`token`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn block<E: Lanes, const R: usize>(
    state: *mut E,
    stride: usize,
    s: StepInputs<'_>,
    out: &mut [f32],
) {
    let (k, q, value) = (s.k, s.q, s.value);
    // SAFETY (whole body): rows i < k.len() of R * LANES columns are in bounds (the caller's
    // contract); `value` and `out` hold R * LANES elements from here.
    unsafe {
        let mut sk: [__m512; R] = [_mm512_setzero_ps(); R];
        let mut sq: [__m512; R] = [_mm512_setzero_ps(); R];
        let mut row = state;
        for (&ki, &qi) in k.iter().zip(q) {
            let (kb, qb) = (_mm512_set1_ps(ki), _mm512_set1_ps(qi));
            for r in 0..R {
                let x = E::load(row.add(r * LANES));
                sk[r] = _mm512_fmadd_ps(kb, x, sk[r]);
                sq[r] = _mm512_fmadd_ps(qb, x, sq[r]);
            }
            row = row.add(stride);
        }
        let decay = _mm512_set1_ps(s.decay);
        let (beta, scale) = (_mm512_set1_ps(s.beta), _mm512_set1_ps(s.scale));
        let kdq = _mm512_set1_ps(s.key_dot_query);
        let mut new_value: [__m512; R] = [_mm512_setzero_ps(); R];
        for (r, nv) in new_value.iter_mut().enumerate() {
            let v = _mm512_loadu_ps(value.as_ptr().add(r * LANES));
            // Fused exactly as the AVX2 step is, so both builds give the same bits.
            *nv = _mm512_mul_ps(beta, _mm512_fnmadd_ps(decay, sk[r], v));
            let o = _mm512_fmadd_ps(decay, sq[r], _mm512_mul_ps(kdq, *nv));
            _mm512_storeu_ps(out.as_mut_ptr().add(r * LANES), _mm512_mul_ps(scale, o));
        }
        // Last row first: the rows pass 1 read last are the ones still in L1. (A block's rows
        // sit `stride` apart, so they fall in few L1 sets and a block of 128 rows overflows
        // them; in the same order as pass 1, LRU would evict each row just before its reuse.)
        for (i, &ki) in k.iter().enumerate().rev() {
            let kb = _mm512_set1_ps(ki);
            let row = state.add(i * stride);
            for (r, &nv) in new_value.iter().enumerate() {
                let p = row.add(r * LANES);
                let update = _mm512_mul_ps(kb, nv);
                E::store(p, _mm512_fmadd_ps(decay, E::load(p), update));
            }
        }
    }
}
