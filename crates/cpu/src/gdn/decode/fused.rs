//! Up to [`MAX_FUSED`] decode tokens in one read and one write of an f32 state slab, in place,
//! with AVX-512 registers (speculative decoding's T > 1).
//!
//! With `S` the state before the group, `d_t = exp(g_t)` and `u_t` the written value
//! `beta_t (v_t - d_t S_{t-1}^T k_t)`, the state before token t is
//!
//! ```text
//! S_{t-1} = (d_0 ... d_{t-1}) S + sum_{s<t} (d_{s+1} ... d_{t-1}) k_s u_s^T
//! ```
//!
//! so every product the tokens need comes from one sweep over S:
//!
//! ```text
//! pass 1:  a_t = S^T k_t,  b_t = S^T q_t                        (all tokens, one read of S)
//! columns: S_{t-1}^T k_t = D_t a_t + sum_{s<t} c_st (k_s . k_t) u_s    D_t = d_0 ... d_{t-1}
//!          S_{t-1}^T q_t = D_t b_t + sum_{s<t} c_st (k_s . q_t) u_s    c_st = d_{s+1} ... d_{t-1}
//!          u_t = beta_t (v_t - d_t S_{t-1}^T k_t)
//!          o_t = scale (d_t S_{t-1}^T q_t + (k_t . q_t) u_t)
//! pass 2:  per row, y = S[i]; for t: y = d_t y + k_t[i] u_t  (the intermediate state S_t[i],
//!          stored when asked); S[i] = y                           (one write of S)
//! ```
//!
//! Pass 1 keeps 2 x tokens x registers accumulators (at most 16), so the block width shrinks
//! as the group grows: 128 columns for one token, 64 for two, 32 for three or four.

use super::avx512::{LANES, StepInputs};
use std::arch::x86_64::*;

/// Most tokens fused into one sweep.
pub(super) const MAX_FUSED: usize = 4;

/// A group of 1..=[`MAX_FUSED`] consecutive tokens of one (row, value head) and where their
/// results go. Pointers address the group's first column.
pub(super) struct FusedTokens<'a> {
    /// The tokens in order; each `value` starts at the group's first column.
    pub steps: &'a [StepInputs<'a>],
    /// `k_s . k_t` and `k_s . q_t` for `s < t`, indexed `[s][t]`.
    pub key_dot_key: [[f32; MAX_FUSED]; MAX_FUSED],
    pub key_dot_later_query: [[f32; MAX_FUSED]; MAX_FUSED],
    /// Token t's output row.
    pub outs: [*mut f32; MAX_FUSED],
    /// Token t's intermediate state (row 0; rows `stride` apart), when asked.
    pub states: Option<[*mut f32; MAX_FUSED]>,
}

/// Runs the group on `width` columns (a multiple of [`LANES`]) of the slab at `state`.
///
/// # Safety
/// The CPU supports AVX-512F. Rows `state + i * stride .. + width` for `i < K`, and the same
/// rows of every `states` pointer, are in bounds and touched by no other thread; every `outs`
/// pointer and every step's `value` hold `width` elements; every step's `k` and `q` hold K.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tokens_f32(state: *mut f32, stride: usize, width: usize, f: &FusedTokens) {
    debug_assert!(width.is_multiple_of(LANES) && (1..=MAX_FUSED).contains(&f.steps.len()));
    let mut col = 0;
    while col < width {
        let left = (width - col) / LANES;
        let registers = match (f.steps.len(), left) {
            (1, 8..) => 8,
            (1 | 2, 4..) => 4,
            (_, 2..) => 2,
            _ => 1,
        };
        // SAFETY: the caller's contract, for columns col..col + registers * LANES.
        unsafe {
            match (f.steps.len(), registers) {
                (1, 8) => block::<1, 8>(state, stride, col, f),
                (1, 4) => block::<1, 4>(state, stride, col, f),
                (1, 2) => block::<1, 2>(state, stride, col, f),
                (1, _) => block::<1, 1>(state, stride, col, f),
                (2, 4) => block::<2, 4>(state, stride, col, f),
                (2, 2) => block::<2, 2>(state, stride, col, f),
                (2, _) => block::<2, 1>(state, stride, col, f),
                (3, 2) => block::<3, 2>(state, stride, col, f),
                (3, _) => block::<3, 1>(state, stride, col, f),
                (_, 2) => block::<4, 2>(state, stride, col, f),
                _ => block::<4, 1>(state, stride, col, f),
            }
        }
        col += registers * LANES;
    }
}

/// `N` tokens on the `R * LANES` columns starting at `col` (see [`tokens_f32`]). Loops index
/// registers by (token, register), which reads closer to the math than iterator chains.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn block<const N: usize, const R: usize>(
    state: *mut f32,
    stride: usize,
    col: usize,
    f: &FusedTokens,
) {
    let steps = &f.steps[..N];
    let rows = steps[0].k.len();
    // Decay products: before[t] = d_0 ... d_{t-1}; between[s][t] = d_{s+1} ... d_{t-1}.
    let mut before = [1.0f32; MAX_FUSED];
    let mut between = [[1.0f32; MAX_FUSED]; MAX_FUSED];
    for t in 1..N {
        before[t] = before[t - 1] * steps[t - 1].decay;
        for s in 0..t - 1 {
            between[s][t] = between[s][t - 1] * steps[t - 1].decay;
        }
    }
    // SAFETY (whole body): rows i < K of these R * LANES columns are in bounds for the pool
    // and the states, and `outs` / `value` hold them (the caller's contract).
    unsafe {
        let base = state.add(col);
        let mut by_key = [[_mm512_setzero_ps(); R]; N];
        let mut by_query = [[_mm512_setzero_ps(); R]; N];
        for i in 0..rows {
            let row = base.add(i * stride);
            let mut x = [_mm512_setzero_ps(); R];
            for (r, xr) in x.iter_mut().enumerate() {
                *xr = _mm512_loadu_ps(row.add(r * LANES));
            }
            for t in 0..N {
                let kb = _mm512_set1_ps(steps[t].k[i]);
                let qb = _mm512_set1_ps(steps[t].q[i]);
                for r in 0..R {
                    by_key[t][r] = _mm512_fmadd_ps(kb, x[r], by_key[t][r]);
                    by_query[t][r] = _mm512_fmadd_ps(qb, x[r], by_query[t][r]);
                }
            }
        }
        let mut written = [[_mm512_setzero_ps(); R]; N];
        for t in 0..N {
            let s_t = &steps[t];
            let (decay, beta) = (_mm512_set1_ps(s_t.decay), _mm512_set1_ps(s_t.beta));
            let (scale, kdq) = (_mm512_set1_ps(s_t.scale), _mm512_set1_ps(s_t.key_dot_query));
            let head = _mm512_set1_ps(before[t]);
            for r in 0..R {
                let mut sk = _mm512_mul_ps(head, by_key[t][r]);
                let mut sq = _mm512_mul_ps(head, by_query[t][r]);
                for s in 0..t {
                    let c = between[s][t];
                    let kk = _mm512_set1_ps(c * f.key_dot_key[s][t]);
                    let kq = _mm512_set1_ps(c * f.key_dot_later_query[s][t]);
                    sk = _mm512_fmadd_ps(kk, written[s][r], sk);
                    sq = _mm512_fmadd_ps(kq, written[s][r], sq);
                }
                let v = _mm512_loadu_ps(s_t.value.as_ptr().add(col + r * LANES));
                written[t][r] = _mm512_mul_ps(beta, _mm512_fnmadd_ps(decay, sk, v));
                let o = _mm512_fmadd_ps(decay, sq, _mm512_mul_ps(kdq, written[t][r]));
                _mm512_storeu_ps(f.outs[t].add(col + r * LANES), _mm512_mul_ps(scale, o));
            }
        }
        let decays: [__m512; N] = std::array::from_fn(|t| _mm512_set1_ps(steps[t].decay));
        // Last row first, as in the single-token step: those rows are still in L1.
        for i in (0..rows).rev() {
            let row = base.add(i * stride);
            let keys: [__m512; N] = std::array::from_fn(|t| _mm512_set1_ps(steps[t].k[i]));
            for r in 0..R {
                let p = row.add(r * LANES);
                let mut y = _mm512_loadu_ps(p);
                for t in 0..N {
                    y = _mm512_fmadd_ps(decays[t], y, _mm512_mul_ps(keys[t], written[t][r]));
                    if let Some(states) = &f.states {
                        _mm512_storeu_ps(states[t].add(i * stride + col + r * LANES), y);
                    }
                }
                _mm512_storeu_ps(p, y);
            }
        }
    }
}
