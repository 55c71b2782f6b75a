//! The fixed per-layer rotation Pi.
//!
//! * Power-of-two d: `Pi = H diag(s) / sqrt(d)`, H the Walsh-Hadamard matrix (Sylvester order)
//!   and `s` random signs from the seed, applied as a fast Walsh-Hadamard transform in
//!   `d log d` operations. `Pi^T = diag(s) H / sqrt(d)` (H is symmetric).
//! * Other d: a dense orthogonal matrix, Gram-Schmidt (in f64, two passes) of a seeded
//!   Gaussian matrix, applied as a d x d matrix-vector product.

use crate::error::{Error, Result};
use crate::rng::Rng;

#[derive(Clone, Debug)]
enum Kind {
    Hadamard {
        signs: Vec<f32>,
    },
    /// Row-major d x d, `y = M x`.
    Dense {
        matrix: Vec<f32>,
    },
}

/// A seeded orthogonal rotation of R^d.
#[derive(Clone, Debug)]
pub struct Rotation {
    dim: usize,
    kind: Kind,
}

/// In-place unnormalised fast Walsh-Hadamard transform (length a power of two).
/// `sum(a * b)` with sixteen partial sums, so the loop vectorises (a single f32 sum is a serial
/// chain: the dense rotation at d = 96 ran 5x slower per token than the FWHT at d = 128).
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let (mut pa, mut pb) = (a.chunks_exact(16), b.chunks_exact(16));
    for (ca, cb) in (&mut pa).zip(&mut pb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(ca).zip(cb) {
            *l += x * y;
        }
    }
    let tail: f32 = pa
        .remainder()
        .iter()
        .zip(pb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    lanes.iter().sum::<f32>() + tail
}

#[inline(always)]
fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    if n >= 8 {
        // The first three stages within each group of eight, unrolled.
        for c in x.chunks_exact_mut(8) {
            let a: [f32; 8] = [
                c[0] + c[1],
                c[0] - c[1],
                c[2] + c[3],
                c[2] - c[3],
                c[4] + c[5],
                c[4] - c[5],
                c[6] + c[7],
                c[6] - c[7],
            ];
            let b: [f32; 8] = [
                a[0] + a[2],
                a[1] + a[3],
                a[0] - a[2],
                a[1] - a[3],
                a[4] + a[6],
                a[5] + a[7],
                a[4] - a[6],
                a[5] - a[7],
            ];
            for i in 0..4 {
                c[i] = b[i] + b[i + 4];
                c[i + 4] = b[i] - b[i + 4];
            }
        }
        h = 8;
    }
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (p, q) = (*u, *v);
                *u = p + q;
                *v = p - q;
            }
        }
        h *= 2;
    }
}

impl Rotation {
    /// The rotation of R^dim for `seed` (deterministic on every machine).
    pub fn new(dim: usize, seed: u64) -> Result<Self> {
        if dim == 0 {
            return Err(Error::InvalidValue(
                "rotation dimension must be positive".into(),
            ));
        }
        let mut rng = Rng::new(seed ^ 0x005E_ED0F_D1A6_u64.wrapping_mul(dim as u64 + 1));
        let kind = if dim.is_power_of_two() {
            let signs = (0..dim)
                .map(|_| if rng.next_u64() >> 63 == 0 { 1.0 } else { -1.0 })
                .collect();
            Kind::Hadamard { signs }
        } else {
            Kind::Dense {
                matrix: dense_orthogonal(dim, &mut rng),
            }
        };
        Ok(Self { dim, kind })
    }

    #[inline]
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The signs `s` of the Hadamard form (`None` for the dense form): what a GPU kernel needs
    /// to apply the same rotation.
    pub fn hadamard_signs(&self) -> Option<&[f32]> {
        match &self.kind {
            Kind::Hadamard { signs } => Some(signs),
            Kind::Dense { .. } => None,
        }
    }

    /// The row-major d x d matrix of the dense form (`None` for the Hadamard form).
    pub fn dense_matrix(&self) -> Option<&[f32]> {
        match &self.kind {
            Kind::Dense { matrix } => Some(matrix),
            Kind::Hadamard { .. } => None,
        }
    }

    /// True for the fast Walsh-Hadamard form.
    pub fn is_hadamard(&self) -> bool {
        matches!(self.kind, Kind::Hadamard { .. })
    }

    /// `y = Pi x` (both at least d long).
    #[inline]
    pub fn forward(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        self.check_lengths(x.len(), y.len())?;
        self.apply(x, y);
        Ok(())
    }

    /// `x = Pi^T y` (both at least d long).
    #[inline]
    pub fn inverse(&self, y: &[f32], x: &mut [f32]) -> Result<()> {
        self.check_lengths(y.len(), x.len())?;
        self.apply_inverse(y, x);
        Ok(())
    }

    fn check_lengths(&self, input: usize, output: usize) -> Result<()> {
        if input < self.dim || output < self.dim {
            return Err(Error::InvalidValue(format!(
                "rotation of dim {} needs input and output of at least {0} values, got {input} and {output}",
                self.dim
            )));
        }
        Ok(())
    }

    /// [`Self::forward`] for buffers the caller guarantees.
    #[inline(always)]
    pub(crate) fn apply(&self, x: &[f32], y: &mut [f32]) {
        let d = self.dim;
        match &self.kind {
            Kind::Hadamard { signs } => {
                let norm = 1.0 / (d as f32).sqrt();
                for ((o, &a), &s) in y[..d].iter_mut().zip(x).zip(signs) {
                    *o = a * s;
                }
                fwht(&mut y[..d]);
                y[..d].iter_mut().for_each(|v| *v *= norm);
            }
            Kind::Dense { matrix } => {
                for (o, row) in y[..d].iter_mut().zip(matrix.chunks_exact(d)) {
                    *o = dot_lanes(row, &x[..d]);
                }
            }
        }
    }

    /// [`Self::inverse`] for buffers the caller guarantees.
    #[inline]
    pub(crate) fn apply_inverse(&self, y: &[f32], x: &mut [f32]) {
        let d = self.dim;
        match &self.kind {
            Kind::Hadamard { signs } => {
                let norm = 1.0 / (d as f32).sqrt();
                x[..d].copy_from_slice(&y[..d]);
                fwht(&mut x[..d]);
                for (o, &s) in x[..d].iter_mut().zip(signs) {
                    *o *= s * norm;
                }
            }
            Kind::Dense { matrix } => {
                x[..d].iter_mut().for_each(|v| *v = 0.0);
                for (row, &c) in matrix.chunks_exact(d).zip(y) {
                    for (o, &m) in x[..d].iter_mut().zip(row) {
                        *o += m * c;
                    }
                }
            }
        }
    }

    /// Pi as a dense row-major f64 matrix (for tests and oracles).
    pub fn matrix_f64(&self) -> Vec<f64> {
        let d = self.dim;
        let mut out = vec![0.0; d * d];
        let mut e = vec![0.0f32; d];
        let mut col = vec![0.0f32; d];
        for j in 0..d {
            e.iter_mut().for_each(|v| *v = 0.0);
            e[j] = 1.0;
            self.apply(&e, &mut col);
            for i in 0..d {
                out[i * d + j] = f64::from(col[i]);
            }
        }
        out
    }
}

fn dense_orthogonal(d: usize, rng: &mut Rng) -> Vec<f32> {
    let mut rows: Vec<Vec<f64>> = (0..d)
        .map(|_| (0..d).map(|_| rng.normal()).collect())
        .collect();
    for i in 0..d {
        for _pass in 0..2 {
            for j in 0..i {
                let dot: f64 = rows[i].iter().zip(&rows[j]).map(|(a, b)| a * b).sum();
                let (head, tail) = rows.split_at_mut(i);
                for (a, b) in tail[0].iter_mut().zip(&head[j]) {
                    *a -= dot * b;
                }
            }
        }
        let norm = rows[i].iter().map(|a| a * a).sum::<f64>().sqrt();
        rows[i].iter_mut().for_each(|a| *a /= norm);
    }
    rows.into_iter().flatten().map(|v| v as f32).collect()
}
