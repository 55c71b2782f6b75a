//! Error metrics against the f64 oracles.

/// `rms(x - reference) / rms(reference)`, FLA's relative error. Returns the absolute rms
/// difference when the reference is all zeros, and infinity when lengths differ or `x` holds
/// a NaN (so a broken kernel can never pass a threshold).
pub fn rel_rms(x: &[f32], reference: &[f64]) -> f64 {
    if x.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut diff = 0.0f64;
    let mut norm = 0.0f64;
    for (&a, &b) in x.iter().zip(reference) {
        let a = f64::from(a);
        if !a.is_finite() {
            return f64::INFINITY;
        }
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    if norm == 0.0 {
        (diff / x.len().max(1) as f64).sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_rms_matches_definition() {
        let reference = [3.0, 4.0];
        let x = [3.0f32, 4.5];
        let expected = (0.25f64 / 2.0).sqrt() / (25.0f64 / 2.0).sqrt();
        assert!((rel_rms(&x, &reference) - expected).abs() < 1e-12);
        assert_eq!(rel_rms(&[f32::NAN, 4.0], &reference), f64::INFINITY);
        assert_eq!(rel_rms(&[1.0], &reference), f64::INFINITY);
    }
}
