//! The split-K merge of flash-decoding: how a backend combines the online-softmax states of
//! blocks of tokens into one attention row.
//!
//! A block of tokens with scores `s_t` and values `v_t` leaves, per query row, its maximum
//! `m = max s_t`, its sum `l = sum e^(s_t - m)` and its un-normalised output
//! `a = sum e^(s_t - m) v_t`. Two such states merge exactly (up to f32 rounding):
//!
//! ```text
//! M = max(m1, m2),   l = e^(m1 - M) l1 + e^(m2 - M) l2,   a = e^(m1 - M) a1 + e^(m2 - M) a2
//! ```
//!
//! and the row's output is `a / l`. Subtracting the running maximum keeps every exponent
//! `<= 0`, so no score, however large, overflows; a block that saw no token (`m = -inf`) is
//! the identity of the merge. Blocks may be merged in any grouping and order, which is what
//! lets a backend split the token axis over threads or thread blocks (split-K).

/// Merges the state `(m2, l2, acc2)` of one block into the running state `(m, l, acc)` of the
/// same row. `acc` and `acc2` are the un-normalised outputs (entries past the shorter one are
/// left alone). A state with `m = -inf` holds no token: merging it changes nothing, and merging
/// into it copies the other.
#[inline]
pub fn merge_partial(m: &mut f32, l: &mut f32, acc: &mut [f32], m2: f32, l2: f32, acc2: &[f32]) {
    if m2 == f32::NEG_INFINITY {
        return;
    }
    if *m == f32::NEG_INFINITY {
        *m = m2;
        *l = l2;
        for (x, &y) in acc.iter_mut().zip(acc2) {
            *x = y;
        }
        return;
    }
    let mn = m.max(m2);
    let (c1, c2) = ((*m - mn).exp(), (m2 - mn).exp());
    *m = mn;
    *l = c1 * *l + c2 * l2;
    for (x, &y) in acc.iter_mut().zip(acc2) {
        *x = c1 * *x + c2 * y;
    }
}

/// Turns a merged row's un-normalised output into the attention output, `acc / l`; a row that
/// saw no token (`l == 0`) becomes zeros.
#[inline]
pub fn normalize_partial(l: f32, acc: &mut [f32]) {
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    acc.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state of one block of (score, value) pairs, computed directly.
    fn block(tokens: &[(f32, [f32; 2])]) -> (f32, f32, [f32; 2]) {
        let m = tokens.iter().map(|t| t.0).fold(f32::NEG_INFINITY, f32::max);
        let mut l = 0.0;
        let mut a = [0.0; 2];
        for &(s, v) in tokens {
            let p = (s - m).exp();
            l += p;
            a[0] += p * v[0];
            a[1] += p * v[1];
        }
        (m, l, a)
    }

    #[test]
    fn merging_blocks_equals_one_softmax_over_all_tokens() {
        let tokens = [
            (1.0, [1.0, 0.0]),
            (80.0, [0.0, 2.0]),
            (79.0, [4.0, 1.0]),
            (-3.0, [1.0, 1.0]),
        ];
        let (m_all, l_all, mut a_all) = block(&tokens);
        normalize_partial(l_all, &mut a_all);
        let (mut m, mut l, mut a) = (f32::NEG_INFINITY, 0.0f32, [0.0f32; 2]);
        // An empty block first (the identity), then the two halves in reverse order.
        merge_partial(&mut m, &mut l, &mut a, f32::NEG_INFINITY, 0.0, &[9.0, 9.0]);
        assert_eq!((m, l, a), (f32::NEG_INFINITY, 0.0, [0.0, 0.0]));
        for half in [&tokens[2..], &tokens[..2]] {
            let (m2, l2, a2) = block(half);
            merge_partial(&mut m, &mut l, &mut a, m2, l2, &a2);
        }
        normalize_partial(l, &mut a);
        assert_eq!(m, m_all);
        for j in 0..2 {
            assert!((a[j] - a_all[j]).abs() < 1e-6, "{a:?} vs {a_all:?}");
        }
        let mut none = [3.0f32, 4.0];
        normalize_partial(0.0, &mut none);
        assert_eq!(none, [0.0, 0.0]);
    }
}
