//! The recurrent GDN step on one column block of a state, shared by the recurrent prefill and
//! by decode.
//!
//! Columns of S are independent in the recurrence (column j of `v'` and `o` reads only column
//! j of S), so a K x V state is processed as blocks of [`BLOCK`] columns small enough for L1.
//! Per token, with `d = exp(g)`:
//!
//! ```text
//! pass 1 (read):   a = S^T k,  b = S^T q                  (one sweep over the block)
//!                  v' = beta * (v - d * a)
//!                  o  = scale * (d * b + (k . q) * v')     (= scale * S_new^T q)
//! pass 2 (write):  S  = d * S + k v'^T
//! ```
//!
//! so the block is read twice and written once per token while it sits in L1, and the state in
//! memory is touched once per call however many tokens run.

use crate::simd::{Fused, MulAdd, Unfused, has_avx2_fma};

/// Columns per state block: 32 floats = four AVX2 registers per accumulator row.
pub(crate) const BLOCK: usize = 32;

/// One state block: `K` rows of `BLOCK` columns (padding columns stay zero).
pub(crate) type StateBlock = Vec<[f32; BLOCK]>;

/// The inputs of one token for one value head; `value` and `out` are this block's columns,
/// zero-padded to `BLOCK`.
pub(crate) struct TokenStep<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub key_dot_query: f32,
    pub value: &'a [f32; BLOCK],
    pub decay: f32,
    pub beta: f32,
    pub scale: f32,
}

#[inline(always)]
fn step_generic<M: MulAdd>(state: &mut [[f32; BLOCK]], t: &TokenStep<'_>, out: &mut [f32; BLOCK]) {
    let mut sk = [0.0f32; BLOCK];
    let mut sq = [0.0f32; BLOCK];
    for ((row, &ki), &qi) in state.iter().zip(t.k).zip(t.q) {
        for j in 0..BLOCK {
            sk[j] = M::mul_add(ki, row[j], sk[j]);
            sq[j] = M::mul_add(qi, row[j], sq[j]);
        }
    }
    let mut new_value = [0.0f32; BLOCK];
    for j in 0..BLOCK {
        new_value[j] = t.beta * M::mul_add(-t.decay, sk[j], t.value[j]);
        out[j] = t.scale * M::mul_add(t.decay, sq[j], t.key_dot_query * new_value[j]);
    }
    for (row, &ki) in state.iter_mut().zip(t.k) {
        for j in 0..BLOCK {
            row[j] = M::mul_add(t.decay, row[j], ki * new_value[j]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn step_avx2(state: &mut [[f32; BLOCK]], t: &TokenStep<'_>, out: &mut [f32; BLOCK]) {
    step_generic::<Fused>(state, t, out)
}

/// Advances one state block by one token and writes the block's output columns to `out`.
pub(crate) fn step_block(state: &mut [[f32; BLOCK]], t: &TokenStep<'_>, out: &mut [f32; BLOCK]) {
    debug_assert_eq!(state.len(), t.k.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { step_avx2(state, t, out) };
        return;
    }
    step_generic::<Unfused>(state, t, out)
}

/// `sum(a * b)` in f32.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Copies columns `col0..col0 + width` of a row-major `K x V` state into `block`, zero-padded.
pub(crate) fn load_block(block: &mut [[f32; BLOCK]], state: &[f32], value_dim: usize, col0: usize) {
    let width = BLOCK.min(value_dim - col0);
    for (i, row) in block.iter_mut().enumerate() {
        row[..width].copy_from_slice(&state[i * value_dim + col0..][..width]);
        row[width..].iter_mut().for_each(|x| *x = 0.0);
    }
}

/// Writes a block back into columns `col0..` of a row-major `K x V` state.
pub(crate) fn store_block(
    block: &[[f32; BLOCK]],
    state: &mut [f32],
    value_dim: usize,
    col0: usize,
) {
    let width = BLOCK.min(value_dim - col0);
    for (i, row) in block.iter().enumerate() {
        state[i * value_dim + col0..][..width].copy_from_slice(&row[..width]);
    }
}

/// Copies `value[col0..]` (up to `BLOCK` entries) into a zero-padded block.
pub(crate) fn pad_value(value: &[f32], col0: usize) -> [f32; BLOCK] {
    let width = BLOCK.min(value.len() - col0);
    let mut padded = [0.0f32; BLOCK];
    padded[..width].copy_from_slice(&value[col0..col0 + width]);
    padded
}
