//! The rules on the gates, and fused gating.
//!
//! * The log decay `g` is at most [`MAX_LOG_DECAY`] (0) and has no lower bound; a token whose
//!   `g` is below [`RESET_GATE`] resets the state (`exp(g)` is 0 in f32).
//! * Fused gating (Qwen3-Next's `fused_gdn_gating`) computes the decay and the write strength
//!   from the layer's raw projections instead of taking them as inputs. For row `r` of
//!   `[B, T, H]` and value head `h`, in f32:
//!
//! ```text
//! g    = -exp(A_log[h]) * softplus(a[r, h] + dt_bias[h])      softplus(x) = ln(1 + e^x), = x for x > 20
//! beta = sigmoid(b[r, h]) = 1 / (1 + e^-b)
//! ```

use super::shapes::{expect_float, expect_shape};
use crate::error::{Error, Result};
use crate::tensor::{check_finite, unravel};
use crate::view::HostData;

/// Largest accepted log decay. `exp(g)` multiplies the state at every token, so g > 0 grows it
/// without bound (and overflows a chunked kernel's within-chunk decay ratios); every gating in
/// use (Qwen3-Next's `-exp(A_log) * softplus(.)`, Mamba's, FLA's `logsigmoid`) gives g <= 0.
pub const MAX_LOG_DECAY: f32 = 0.0;

/// A token whose log decay is below this resets the state: `exp(-80)` is 1.8e-35, below
/// which nothing of the state survives in f32, so a kernel treats the token as an exact reset
/// (the decay is 0) rather than computing with it. A chunked kernel must: its cumulative sum
/// of g within a chunk would otherwise lose every later gate to cancellation
/// (`(-3e38 + x) - (-3e38 + y)`), and any decay that spans a reset is exactly 0.
pub const RESET_GATE: f32 = -80.0;

/// Reads a `[.., H]` gate tensor (g, beta, a, b) as f32, checking dtype, shape and
/// finiteness.
pub fn gate_values(
    name: &str,
    t: &(impl HostData + ?Sized),
    expected: &[usize],
    layout: &str,
) -> Result<Vec<f32>> {
    expect_float(name, t)?;
    expect_shape(name, t, expected, layout)?;
    let values = t.values().to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}

/// Reads the log decay `g` `[B, T, H]` ([`gate_values`]) and rejects any value above
/// [`MAX_LOG_DECAY`], naming its position.
pub fn log_decay_values(
    t: &(impl HostData + ?Sized),
    expected: &[usize],
    layout: &str,
) -> Result<Vec<f32>> {
    let values = gate_values("g", t, expected, layout)?;
    if let Some(i) = values.iter().position(|&x| x > MAX_LOG_DECAY) {
        return Err(Error::InvalidValue(format!(
            "tensor `g` holds a positive log decay ({}) at [b, t, h] = {:?}: g must be <= 0 (the state is multiplied by exp(g) at every token, so g > 0 grows it without bound)",
            values[i],
            unravel(i, expected)
        )));
    }
    Ok(values)
}

/// Reads a per-head `[H]` parameter of fused gating (A_log, dt_bias) as finite f32.
pub fn head_values(name: &str, t: &(impl HostData + ?Sized)) -> Result<Vec<f32>> {
    let values = t.values().to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}

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
/// (all already validated: finite, right lengths), in f32 as every backend does.
pub fn fused_gates(a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let heads = a_log.len();
    debug_assert_eq!(dt_bias.len(), heads);
    debug_assert_eq!(a.len(), b.len());
    let rates: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
    let g = a
        .chunks_exact(heads.max(1))
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
