//! The chunked (WY) GDN prefill for one (sequence, value head), in f32.
//!
//! For a chunk of c <= 64 tokens with state S0 on entry, G = inclusive cumsum of g in the chunk:
//!
//! ```text
//! A    = strictly_lower( diag(beta) K K^T  o  exp(G_i - G_j) )
//! T    = (I + A)^-1                               (unit lower triangular, forward substitution)
//! V'   = T ( diag(beta) V - diag(beta exp(G)) K S0 )   (the delta-rule values v'_t; FLA's
//!                                                       U - W S0 with the T factored out)
//! O    = scale * ( diag(exp(G)) Q S0 + lower_incl( Q K^T o exp(G_i - G_j) ) V' )
//! S    = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T V'
//! ```
//!
//! which unrolls the recurrence exactly. Applying T after the product with S0 saves the
//! c x c x K product of FLA's W; products that share an operand run stacked, so a chunk makes
//! five calls: `[diag(beta) K ; scale Q] K^T`, `[diag(beta exp G) K ; scale diag(exp G) Q] S0`,
//! `T X`, the intra-chunk `scores V'`, and the state update.
//!
//! Masks are applied before any `exp`, so rows past a sequence end never produce `0 * inf`; a
//! partial last chunk decays with its last valid token. g is not bounded below: a gate under
//! the contract's [`RESET_GATE`] makes `exp(g)` vanish (below 1e-34) and would wreck the f32
//! cumsum by cancellation (`(-3e38 + x) - (-3e38 + y)`), so such a token is treated as an exact
//! state reset: the cumsum restarts there and every decay that spans it is exactly 0.

use super::prepare::PreparedGdn;
use crate::linalg::{MatRef, matmul};
use crate::rows::RowWriter;
use crate::simd::{has_avx2_fma, has_avx512};
use deltakv_contract::gdn::gating::RESET_GATE;

/// Tokens per chunk (FLA's BT).
pub(crate) const CHUNK: usize = 64;

/// Per-thread scratch, reused across chunks and heads. Row strides are fixed by K and V; only
/// the first `c` (or `2c`) rows are live in a partial chunk.
pub(crate) struct ChunkScratch {
    /// `[2c, K]`: rows `0..c` = diag(beta) K, rows `c..2c` = scale * Q.
    kq: Vec<f32>,
    /// `[2c, K]`: rows `0..c` = diag(beta exp G) K, rows `c..2c` = scale diag(exp G) Q.
    kq_decayed: Vec<f32>,
    /// `[c, K]` raw keys.
    k: Vec<f32>,
    /// `[2c, CHUNK]`: rows `0..c` = A, rows `c..2c` = intra-chunk scores.
    products: Vec<f32>,
    /// `[c, CHUNK]` = (I + A)^-1.
    t_inv: Vec<f32>,
    /// `[c, V]`: diag(beta) V, then X = diag(beta) V - diag(beta exp G) K S0.
    x: Vec<f32>,
    /// `[2c, V]`: rows `0..c` = diag(beta exp G) K S0, rows `c..2c` = the chunk's output.
    projected: Vec<f32>,
    /// `[c, V]` = V'.
    new_values: Vec<f32>,
    /// `[c, K]` = diag(exp(G_last - G)) K.
    k_decayed: Vec<f32>,
    /// `[c, c]` pairwise decays exp(G_i - G_j), j <= i.
    pair_decay: Vec<f32>,
    g_cum: [f32; CHUNK],
    /// Index of the reset segment each token is in (0 = still connected to the chunk's S0).
    segment: [u32; CHUNK],
    beta: [f32; CHUNK],
    row: Vec<f32>,
}

impl ChunkScratch {
    pub(crate) fn new(kd: usize, vd: usize) -> Self {
        Self {
            kq: vec![0.0; 2 * CHUNK * kd],
            kq_decayed: vec![0.0; 2 * CHUNK * kd],
            k: vec![0.0; CHUNK * kd],
            products: vec![0.0; 2 * CHUNK * CHUNK],
            t_inv: vec![0.0; CHUNK * CHUNK],
            x: vec![0.0; CHUNK * vd],
            projected: vec![0.0; 2 * CHUNK * vd],
            new_values: vec![0.0; CHUNK * vd],
            k_decayed: vec![0.0; CHUNK * kd],
            pair_decay: vec![0.0; CHUNK * CHUNK],
            g_cum: [0.0; CHUNK],
            segment: [0; CHUNK],
            beta: [0.0; CHUNK],
            row: vec![0.0; kd.max(vd)],
        }
    }

    /// `exp(G_i)`: the decay from the chunk's entry state to token i.
    #[inline]
    fn decay_from_start(&self, i: usize) -> f32 {
        if self.segment[i] == 0 {
            self.g_cum[i].exp()
        } else {
            0.0
        }
    }
}

/// `T = (I + A)^-1` for strictly lower `A` (c x c, row stride CHUNK), by rows:
/// `T_i = e_i - sum_{m<i} A_im T_m`. Row m of T is zero past column m, so each update runs
/// over a whole number of 8-lane groups (vectorisable) without reading garbage.
#[inline(always)]
fn invert_unit_lower(a: &[f32], t_inv: &mut [f32], c: usize) {
    for i in 0..c {
        let (done, rest) = t_inv.split_at_mut(i * CHUNK);
        let row = &mut rest[..CHUNK];
        row.fill(0.0);
        row[i] = 1.0;
        for m in 0..i {
            let coef = a[i * CHUNK + m];
            let width = (m + 1).next_multiple_of(8);
            let prev = &done[m * CHUNK..][..width];
            for (x, &y) in row[..width].iter_mut().zip(prev) {
                *x -= coef * y;
            }
        }
    }
}

/// `exp(x)` for f32 without a libm call, so loops of it vectorise: Cody-Waite reduction to
/// `2^n * exp(r)`, |r| <= ln2/2, and a degree-6 Taylor polynomial (relative error ~1e-7).
/// Returns exactly 0 below -87.3 (where f32 `exp` leaves the normal range), including -inf.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let clamped = x.clamp(-87.3, 88.0);
    let n = (clamped * LOG2E + ROUND) - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let poly = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.3 { 0.0 } else { poly * scale }
}

/// Advances value head `head` over one chunk: `c <= CHUNK` tokens at flattened rows
/// `first_row..first_row + c` of one sequence. `state` is S0 on entry and S on return.
/// The element-wise work is compiled three times (AVX-512, AVX2+FMA, baseline) and picked at
/// run time;
/// the products dispatch inside `gemm`.
pub(crate) fn chunk_step(
    p: &PreparedGdn<'_>,
    first_row: usize,
    c: usize,
    head: usize,
    state: &mut [f32],
    s: &mut ChunkScratch,
    o: &RowWriter<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked just above).
        unsafe { chunk_step_avx512(p, first_row, c, head, state, s, o) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { chunk_step_avx2(p, first_row, c, head, state, s, o) };
        return;
    }
    chunk_step_impl(p, first_row, c, head, state, s, o)
}

// The AVX-512 and AVX2 builds of the element-wise work around the products.
crate::simd::target_build!(chunk_step_avx512, "avx512f,avx2,fma", chunk_step_impl, (
    p: &PreparedGdn<'_>, first_row: usize, c: usize, head: usize, state: &mut [f32],
    s: &mut ChunkScratch, o: &RowWriter<'_>,
));
crate::simd::target_build!(chunk_step_avx2, "avx2,fma", chunk_step_impl, (
    p: &PreparedGdn<'_>, first_row: usize, c: usize, head: usize, state: &mut [f32],
    s: &mut ChunkScratch, o: &RowWriter<'_>,
));

#[inline(always)]
fn chunk_step_impl(
    p: &PreparedGdn<'_>,
    first_row: usize,
    c: usize,
    head: usize,
    state: &mut [f32],
    s: &mut ChunkScratch,
    o: &RowWriter<'_>,
) {
    let d = p.dims;
    let (kd, vd) = (d.key_dim, d.value_dim);
    let key_head = d.key_head_of(head);

    // Gates: segment-aware cumsum.
    let mut running = 0.0f32;
    let mut segment = 0u32;
    for i in 0..c {
        let gate = (first_row + i) * d.value_heads + head;
        let g = p.g[gate];
        if g < RESET_GATE {
            segment += 1;
            running = 0.0;
        } else {
            running += g;
        }
        s.g_cum[i] = running;
        s.segment[i] = segment;
        s.beta[i] = p.beta[gate];
    }
    // Pairwise decays exp(G_i - G_j), j <= i. When the chunk's cumsum stays within +-40 (the
    // common case) they factor as exp(G_i) * exp(-G_j): 2c exponentials instead of c^2.
    let no_reset = s.segment[c - 1] == 0;
    let in_range = s.g_cum[..c].iter().all(|g| g.abs() < 40.0);
    if no_reset && in_range {
        let mut up = [0.0f32; CHUNK];
        let mut down = [0.0f32; CHUNK];
        for ((u, d), &g) in up.iter_mut().zip(&mut down).zip(&s.g_cum[..c]) {
            *u = exp_f32(g);
            *d = exp_f32(-g);
        }
        for (i, &up_i) in up[..c].iter().enumerate() {
            let row = &mut s.pair_decay[i * CHUNK..][..c];
            for (j, (x, &d)) in row.iter_mut().zip(&down[..c]).enumerate() {
                *x = if j <= i { up_i * d } else { 0.0 };
            }
        }
    } else {
        for i in 0..c {
            let (g_i, seg_i) = (s.g_cum[i], s.segment[i]);
            let row = &mut s.pair_decay[i * CHUNK..][..c];
            for (j, ((x, &g_j), &seg_j)) in row
                .iter_mut()
                .zip(&s.g_cum[..c])
                .zip(&s.segment[..c])
                .enumerate()
            {
                let exponent = if j <= i && seg_j == seg_i {
                    g_i - g_j
                } else {
                    f32::NEG_INFINITY
                };
                *x = exp_f32(exponent);
            }
        }
    }

    // Gather rows, folding in the per-row scalings the products need.
    for i in 0..c {
        let row = first_row + i;
        let beta = s.beta[i];
        let start_decay = s.decay_from_start(i);
        p.read_k(row, key_head, &mut s.k[i * kd..]);
        let k_row = &s.k[i * kd..][..kd];
        for ((x, y), &k) in s.kq[i * kd..][..kd]
            .iter_mut()
            .zip(&mut s.kq_decayed[i * kd..][..kd])
            .zip(k_row)
        {
            *x = beta * k;
            *y = beta * start_decay * k;
        }
        p.read_q(row, key_head, &mut s.row);
        let (q_rows, q_decayed_rows) = (
            &mut s.kq[(c + i) * kd..][..kd],
            &mut s.kq_decayed[(c + i) * kd..][..kd],
        );
        for ((x, y), &q) in q_rows.iter_mut().zip(q_decayed_rows).zip(&s.row[..kd]) {
            *x = p.scale * q;
            *y = p.scale * start_decay * q;
        }
        p.read_v(row, head, &mut s.row);
        for (x, &v) in s.x[i * vd..][..vd].iter_mut().zip(&s.row[..vd]) {
            *x = beta * v;
        }
    }
    let k = MatRef::rows(&s.k, c, kd, kd);

    // [A ; scores] = [diag(beta) K ; scale Q] K^T, then the decay masks.
    matmul(
        &mut s.products,
        CHUNK,
        MatRef::rows(&s.kq, 2 * c, kd, kd),
        k.t(),
        0.0,
        1.0,
    );
    for i in 0..c {
        let a_row = &mut s.products[i * CHUNK..][..c];
        let decays = &s.pair_decay[i * CHUNK..][..c];
        for (j, (x, &dec)) in a_row.iter_mut().zip(decays).enumerate() {
            *x = if j < i { *x * dec } else { 0.0 };
        }
        let score_row = &mut s.products[(c + i) * CHUNK..][..c];
        for (j, (x, &dec)) in score_row.iter_mut().zip(decays).enumerate() {
            *x = if j <= i { *x * dec } else { 0.0 };
        }
    }
    invert_unit_lower(&s.products, &mut s.t_inv, c);

    // [diag(beta exp G) K S0 ; scale diag(exp G) Q S0], then X and V' = T X.
    let state_view = MatRef::rows(state, kd, vd, vd);
    matmul(
        &mut s.projected,
        vd,
        MatRef::rows(&s.kq_decayed, 2 * c, kd, kd),
        state_view,
        0.0,
        1.0,
    );
    for (x, &ks) in s.x[..c * vd].iter_mut().zip(&s.projected[..c * vd]) {
        *x -= ks;
    }
    matmul(
        &mut s.new_values,
        vd,
        MatRef::rows(&s.t_inv, c, c, CHUNK),
        MatRef::rows(&s.x, c, vd, vd),
        0.0,
        1.0,
    );
    // O = scale diag(exp G) Q S0 + scores V'.
    let new_values = MatRef::rows(&s.new_values, c, vd, vd);
    matmul(
        &mut s.projected[c * vd..],
        vd,
        MatRef::rows(&s.products[c * CHUNK..], c, c, CHUNK),
        new_values,
        1.0,
        1.0,
    );
    for i in 0..c {
        // SAFETY: (row, head) belongs to this task alone.
        unsafe {
            o.write(
                ((first_row + i) * d.value_heads + head) * vd,
                &s.projected[(c + i) * vd..][..vd],
            )
        };
    }

    // S = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T V'. G_last - G_i is summed from the
    // chunk's end (the gates after token i) rather than taken as a difference of two forward
    // cumsums, which cancels: with Qwen3-Next's strong gates (G near -300 within a chunk) the
    // difference cost the final state 2.5e-6 rel_rms against 7e-8 for the recurrence. A reset
    // gate after token i makes its decay exactly 0, as in the pairwise decays.
    let mut suffix = 0.0f32;
    let mut reset_after = false;
    for i in (0..c).rev() {
        let decay = if reset_after { 0.0 } else { exp_f32(suffix) };
        let g = p.g[(first_row + i) * d.value_heads + head];
        if g < RESET_GATE {
            reset_after = true;
        } else {
            suffix += g;
        }
        for (x, &y) in s.k_decayed[i * kd..][..kd]
            .iter_mut()
            .zip(&s.k[i * kd..][..kd])
        {
            *x = decay * y;
        }
    }
    matmul(
        state,
        vd,
        MatRef::rows(&s.k_decayed, c, kd, kd).t(),
        new_values,
        s.decay_from_start(c - 1),
        1.0,
    );
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let rel = ((f64::from(exp_f32(x)) - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-90.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-3.0e38), 0.0);
    }
}
