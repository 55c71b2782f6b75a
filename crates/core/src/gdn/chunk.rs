//! The chunked (WY) GDN prefill for one (sequence, value head), in f32.
//!
//! For a chunk of c <= 64 tokens with state S0 on entry, G = inclusive cumsum of g in the chunk:
//!
//! ```text
//! A    = strictly_lower( diag(beta) K K^T  o  exp(G_i - G_j) )
//! T    = (I + A)^-1                               (unit lower triangular, forward substitution)
//! W    = T diag(beta exp(G)) K,   U = T diag(beta) V
//! V'   = U - W S0                                 (the delta-rule values v'_t of the chunk)
//! O    = scale * ( diag(exp(G)) Q S0 + lower_incl( Q K^T o exp(G_i - G_j) ) V' )
//! S    = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T V'
//! ```
//!
//! which unrolls the recurrence exactly. Masks are applied before any `exp`, so rows past a
//! sequence end never produce `0 * inf`; a partial last chunk decays with its last valid token.
//!
//! g is not bounded below. A gate under [`RESET_GATE`] makes `exp(g)` vanish (below 1e-34) and
//! would wreck the f32 cumsum by cancellation (`(-3e38 + x) - (-3e38 + y)`), so such a token is
//! treated as an exact state reset: the cumsum restarts there and every decay that spans it is
//! exactly 0.

use super::validate::{PreparedGdn, SeqSpan};
use crate::linalg::{MatRef, matmul};
use crate::simd::DisjointWriter;

/// Tokens per chunk (FLA's BT).
pub(crate) const CHUNK: usize = 64;

/// Gates below this reset the state (`exp(-80)` is 1.8e-35: nothing survives it in f32).
pub(crate) const RESET_GATE: f32 = -80.0;

/// Per-task scratch, allocated once per (sequence, head).
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    k_scaled: Vec<f32>,
    v_scaled: Vec<f32>,
    g_cum: Vec<f32>,
    /// Index of the reset segment each token is in (0 = still connected to the chunk's S0).
    segment: Vec<u32>,
    beta: Vec<f32>,
    a: Vec<f32>,
    t_inv: Vec<f32>,
    w: Vec<f32>,
    new_values: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

impl Scratch {
    fn new(kd: usize, vd: usize) -> Self {
        Self {
            q: vec![0.0; CHUNK * kd],
            k: vec![0.0; CHUNK * kd],
            k_scaled: vec![0.0; CHUNK * kd],
            v_scaled: vec![0.0; CHUNK * vd],
            g_cum: vec![0.0; CHUNK],
            segment: vec![0; CHUNK],
            beta: vec![0.0; CHUNK],
            a: vec![0.0; CHUNK * CHUNK],
            t_inv: vec![0.0; CHUNK * CHUNK],
            w: vec![0.0; CHUNK * kd],
            new_values: vec![0.0; CHUNK * vd],
            scores: vec![0.0; CHUNK * CHUNK],
            out: vec![0.0; CHUNK * vd],
        }
    }
}

impl Scratch {
    /// `exp(G_i - G_j)` for `j <= i` in the chunk, 0 across a reset.
    #[inline]
    fn decay_between(&self, i: usize, j: usize) -> f32 {
        if self.segment[i] == self.segment[j] {
            (self.g_cum[i] - self.g_cum[j]).exp()
        } else {
            0.0
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
/// `T_i = e_i - sum_{m<i} A_im T_m`.
fn invert_unit_lower(a: &[f32], t_inv: &mut [f32], c: usize) {
    for i in 0..c {
        let (done, rest) = t_inv.split_at_mut(i * CHUNK);
        let row = &mut rest[..CHUNK];
        row[..c].fill(0.0);
        row[i] = 1.0;
        for m in 0..i {
            let coef = a[i * CHUNK + m];
            if coef != 0.0 {
                let prev = &done[m * CHUNK..m * CHUNK + m + 1];
                for (x, &y) in row[..=m].iter_mut().zip(prev) {
                    *x -= coef * y;
                }
            }
        }
    }
}

/// Runs every chunk of `seq` for value head `head`; `state` is S on entry and on return.
pub(crate) fn chunk_head(
    p: &PreparedGdn,
    seq: SeqSpan,
    head: usize,
    state: &mut [f32],
    o: &DisjointWriter<'_>,
) {
    let d = p.dims;
    let (kd, vd) = (d.key_dim, d.value_dim);
    let key_head = d.key_head_of(head);
    let mut s = Scratch::new(kd, vd);
    for chunk_start in (0..seq.len).step_by(CHUNK) {
        let c = CHUNK.min(seq.len - chunk_start);
        let first_row = seq.start + chunk_start;

        // Gather the chunk; fold beta into K and V as the products below need.
        let mut running = 0.0f32;
        let mut segment = 0u32;
        for i in 0..c {
            let row = first_row + i;
            let gate = row * d.value_heads + head;
            let g = p.g[gate];
            if g < RESET_GATE {
                segment += 1;
                running = 0.0;
            } else {
                running += g;
            }
            s.g_cum[i] = running;
            s.segment[i] = segment;
            let beta = p.beta[gate];
            s.beta[i] = beta;
            let qk_at = (row * d.key_heads + key_head) * kd;
            s.q[i * kd..][..kd].copy_from_slice(&p.q[qk_at..qk_at + kd]);
            s.k[i * kd..][..kd].copy_from_slice(&p.k[qk_at..qk_at + kd]);
            let v_at = (row * d.value_heads + head) * vd;
            for (dst, &src) in s.v_scaled[i * vd..][..vd]
                .iter_mut()
                .zip(&p.v[v_at..v_at + vd])
            {
                *dst = beta * src;
            }
            for (dst, &src) in s.k_scaled[i * kd..][..kd]
                .iter_mut()
                .zip(&p.k[qk_at..qk_at + kd])
            {
                *dst = beta * src;
            }
        }
        let q = MatRef::rows(&s.q, c, kd, kd);
        let k = MatRef::rows(&s.k, c, kd, kd);

        // A = strictly_lower(diag(beta) K K^T o exp(G_i - G_j)).
        matmul(
            &mut s.a,
            CHUNK,
            MatRef::rows(&s.k_scaled, c, kd, kd),
            k.t(),
            0.0,
            1.0,
        );
        for i in 0..c {
            for j in 0..c {
                let decay = if j < i { s.decay_between(i, j) } else { 0.0 };
                s.a[i * CHUNK + j] *= decay;
            }
        }
        invert_unit_lower(&s.a, &mut s.t_inv, c);
        let t_inv = MatRef::rows(&s.t_inv, c, c, CHUNK);

        // U = T diag(beta) V  (into new_values); W = T diag(beta exp(G)) K.
        matmul(
            &mut s.new_values,
            vd,
            t_inv,
            MatRef::rows(&s.v_scaled, c, vd, vd),
            0.0,
            1.0,
        );
        for i in 0..c {
            let decay = s.decay_from_start(i);
            s.k_scaled[i * kd..][..kd]
                .iter_mut()
                .for_each(|x| *x *= decay);
        }
        matmul(
            &mut s.w,
            kd,
            t_inv,
            MatRef::rows(&s.k_scaled, c, kd, kd),
            0.0,
            1.0,
        );
        let state_view = MatRef::rows(state, kd, vd, vd);
        // V' = U - W S0.
        matmul(
            &mut s.new_values,
            vd,
            MatRef::rows(&s.w, c, kd, kd),
            state_view,
            1.0,
            -1.0,
        );

        // O = scale * (diag(exp G) Q S0 + lower_incl(Q K^T o exp(G_i - G_j)) V').
        matmul(&mut s.out, vd, q, state_view, 0.0, p.scale);
        for i in 0..c {
            let decay = s.decay_from_start(i);
            s.out[i * vd..][..vd].iter_mut().for_each(|x| *x *= decay);
        }
        matmul(&mut s.scores, CHUNK, q, k.t(), 0.0, p.scale);
        for i in 0..c {
            for j in 0..c {
                let decay = if j <= i { s.decay_between(i, j) } else { 0.0 };
                s.scores[i * CHUNK + j] *= decay;
            }
        }
        matmul(
            &mut s.out,
            vd,
            MatRef::rows(&s.scores, c, c, CHUNK),
            MatRef::rows(&s.new_values, c, vd, vd),
            1.0,
            1.0,
        );
        for i in 0..c {
            let at = ((first_row + i) * d.value_heads + head) * vd;
            // SAFETY: (row, head) belongs to this task alone.
            let dst = unsafe { o.range(at, vd) };
            dst.copy_from_slice(&s.out[i * vd..][..vd]);
        }

        // S = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T V'.
        for i in 0..c {
            let decay = s.decay_between(c - 1, i);
            for (dst, &src) in s.k_scaled[i * kd..][..kd]
                .iter_mut()
                .zip(&s.k[i * kd..][..kd])
            {
                *dst = decay * src;
            }
        }
        matmul(
            state,
            vd,
            MatRef::rows(&s.k_scaled, c, kd, kd).t(),
            MatRef::rows(&s.new_values, c, vd, vd),
            s.decay_from_start(c - 1),
            1.0,
        );
    }
}
