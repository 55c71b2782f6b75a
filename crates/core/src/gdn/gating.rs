//! Fused GDN gating (Qwen3-Next's `fused_gdn_gating`): the decay and the write strength are
//! computed from the layer's raw projections instead of being passed in.
//!
//! For row `r` of `[B, T, H]` and value head `h`, in f32:
//!
//! ```text
//! g    = -exp(A_log[h]) * softplus(a[r, h] + dt_bias[h])      softplus(x) = ln(1 + e^x), = x for x > 20
//! beta = sigmoid(b[r, h]) = 1 / (1 + e^-b)
//! ```

/// `ln(1 + e^x)`, returning `x` itself above 20 (where the two agree in f32) so large inputs
/// never overflow.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Computes `(g, beta)` for `[rows, H]` raw gates `a`, `b` with per-head `a_log`, `dt_bias`
/// (all already validated: finite, right lengths).
pub fn fused_gates(a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let heads = a_log.len();
    debug_assert_eq!(dt_bias.len(), heads);
    debug_assert_eq!(a.len(), b.len());
    let rates: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
    let g = a
        .chunks_exact(heads)
        .flat_map(|row| {
            row.iter()
                .zip(&rates)
                .zip(dt_bias)
                .map(|((&x, &rate), &bias)| rate * softplus(x + bias))
        })
        .collect();
    let beta = b.iter().map(|&x| sigmoid(x)).collect();
    (g, beta)
}

/// The f64 version of [`fused_gates`] for one element, used by the oracle.
pub fn fused_gate_f64(a: f64, b: f64, a_log: f64, dt_bias: f64) -> (f64, f64) {
    let x = a + dt_bias;
    let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
    (-a_log.exp() * softplus, 1.0 / (1.0 + (-b).exp()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_definitions() {
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert_eq!(softplus(25.0), 25.0);
        assert!(softplus(-100.0) >= 0.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        let (g, beta) = fused_gates(&[0.5, -1.0], &[2.0, -3.0], &[0.1, -0.2], &[0.3, 0.0]);
        for h in 0..2 {
            let (a, b, al, dt) = (
                [0.5, -1.0][h],
                [2.0, -3.0][h],
                [0.1, -0.2][h],
                [0.3, 0.0][h],
            );
            let (g64, b64) = fused_gate_f64(a, b, al, dt);
            assert!((f64::from(g[h]) - g64).abs() < 1e-6, "g {h}");
            assert!((f64::from(beta[h]) - b64).abs() < 1e-6, "beta {h}");
        }
    }
}
