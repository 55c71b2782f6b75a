//! The GDN recurrence in f64, one token at a time, exactly as written in the module docs of
//! [`super`], with nothing fused or reordered: the definition both oracles run.

/// `x / sqrt(|x|^2 + 1e-6)` in f64.
pub fn l2_normalize(x: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|v| v * inv).collect()
}

/// One token of the recurrence on a K x V row-major `state` (K = `k.len()`, V = `v.len()`);
/// returns `o_t` (length V). `q` and `k` are already normalised if the caller wants that.
/// Rows of `state` beyond what it holds, and entries of `q` beyond K, are not read.
pub fn recurrence_step(
    state: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: f64,
    beta: f64,
    scale: f64,
) -> Vec<f64> {
    let value_dim = v.len();
    let decay = g.exp();
    state.iter_mut().for_each(|s| *s *= decay);
    let mut new_value = v.to_vec();
    for (row, &ki) in state.chunks_exact(value_dim.max(1)).zip(k) {
        for (nv, s) in new_value.iter_mut().zip(row) {
            *nv -= s * ki;
        }
    }
    new_value.iter_mut().for_each(|x| *x *= beta);
    for (row, &ki) in state.chunks_exact_mut(value_dim.max(1)).zip(k) {
        for (s, nv) in row.iter_mut().zip(&new_value) {
            *s += ki * nv;
        }
    }
    let mut out = vec![0.0; value_dim];
    for (row, &qi) in state
        .chunks_exact(value_dim.max(1))
        .zip(q.iter().take(k.len()))
    {
        for (o, s) in out.iter_mut().zip(row) {
            *o += s * qi;
        }
    }
    out.iter_mut().for_each(|x| *x *= scale);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_matches_the_definition() {
        // K = 2, V = 1: S = [[1], [2]], k = [1, 0], q = [0, 1], v = [3], g = ln 0.5, beta = 0.5.
        let mut state = vec![1.0, 2.0];
        let o = recurrence_step(
            &mut state,
            &[0.0, 1.0],
            &[1.0, 0.0],
            &[3.0],
            0.5f64.ln(),
            0.5,
            2.0,
        );
        // S <- 0.5 S = [0.5, 1]; v' = 0.5 (3 - 0.5) = 1.25; S <- S + k v' = [1.75, 1];
        // o = 2 * S^T q = 2.
        assert!((state[0] - 1.75).abs() < 1e-12 && (state[1] - 1.0).abs() < 1e-12);
        assert!((o[0] - 2.0).abs() < 1e-12);
        let n = l2_normalize(&[3.0, 4.0]);
        assert!((n[0] - 0.6).abs() < 1e-7 && (n[1] - 0.8).abs() < 1e-7);
    }
}
