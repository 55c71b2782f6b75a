//! Scalar codebooks for one coordinate of a rotated unit vector.
//!
//! After a random rotation, a coordinate `x` of a uniformly random unit vector in R^d has the
//! density `f(x) ∝ (1 - x^2)^((d-3)/2)` on `[-1, 1]` (close to N(0, 1/d)). The Lloyd-Max
//! quantizer for that law satisfies two conditions together:
//!
//! ```text
//! boundaries b_i = (c_i + c_{i+1}) / 2                 (nearest level)
//! levels     c_i = E[x | b_{i-1} < x < b_i]            (centroid of the cell)
//! ```
//!
//! The integrals run in f64 over cumulative sums of `f`, `x f` and `x^2 f` on a fine grid.
//! The levels start at the high-resolution optimum (quantiles of `f^(1/3)`), take a few Lloyd
//! iterations and are finished by Newton steps on the centroid conditions (plain Lloyd needs
//! ~95k iterations at 8 bits). The resulting per-coordinate MSE times d is close to the
//! Gaussian Lloyd-Max values 0.363, 0.118, 0.0345, 0.0095 for 1, 2, 3, 4 bits, and at 8 bits
//! ~0.97 of the Panter-Dite estimate `(sqrt(3) pi / 2) 4^-8 = 4.15e-5`. Codebooks are
//! computed once per (d, bits) (a few ms) and cached for the life of the process.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Which family of levels a cache uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CodebookKind {
    /// Lloyd-Max levels for the exact coordinate law at this d (computed, cached).
    #[default]
    LloydMax,
    /// AURA's published d = 128 tables (as used by metaltile), scaled by `sqrt(128 / d)`
    /// at other d as AURA does (see [`super::aura`]).
    Aura,
}

impl std::str::FromStr for CodebookKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "lloyd-max" | "lloydmax" | "lloyd_max" => Ok(CodebookKind::LloydMax),
            "aura" => Ok(CodebookKind::Aura),
            other => Err(Error::InvalidValue(format!(
                "unknown codebook `{other}` (expected lloyd-max or aura)"
            ))),
        }
    }
}

/// Sorted quantization levels and the midpoints between them.
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    pub dim: usize,
    pub bits: u32,
    /// `2^bits` levels, ascending.
    pub levels: Vec<f32>,
    /// `2^bits - 1` decision boundaries (midpoints of neighbouring levels).
    pub boundaries: Vec<f32>,
    /// Expected per-coordinate squared error under the coordinate law (f64 integral).
    pub mse: f64,
    /// For fast encoding of wide codebooks: `grid[g]` is the cell of the point
    /// `boundaries[0] + g * grid_step` (empty for narrow codebooks).
    grid: Vec<u16>,
    grid_step: f32,
}

/// Grid cells used to start the search of wide (8-bit) codebooks.
const GRID_CELLS: usize = 4096;

impl Codebook {
    /// Index of the level nearest to `y` (ties go to the lower level).
    #[inline]
    pub fn nearest(&self, y: f32) -> u32 {
        if !self.grid.is_empty() {
            // Start at the cell of the grid point at or below y, then step up.
            let g = ((y - self.boundaries[0]) / self.grid_step).floor();
            if g < 0.0 {
                return 0;
            }
            let mut idx = self.grid[(g as usize).min(self.grid.len() - 1)] as usize;
            while idx < self.boundaries.len() && y > self.boundaries[idx] {
                idx += 1;
            }
            return idx as u32;
        }
        self.nearest_search(y)
    }

    /// Branch-free binary search over the boundaries.
    #[inline]
    fn nearest_search(&self, y: f32) -> u32 {
        // Branchless binary search: `bits` steps over the 2^bits - 1 sorted boundaries.
        let mut idx = 0usize;
        let mut step = 1usize << (self.bits - 1);
        while step > 0 {
            idx += usize::from(y > self.boundaries[idx + step - 1]) * step;
            step >>= 1;
        }
        idx as u32
    }
}

/// Bit widths with a codebook (1 is only used to check the distortion against the literature).
pub const CODEBOOK_BITS: [u32; 5] = [1, 2, 3, 4, 8];

/// Grid intervals over [-1, 1] for the integrals.
const GRID: usize = 1 << 18;

/// Grid spacing.
const STEP: f64 = 2.0 / GRID as f64;

/// Cumulative integrals of `f`, `x f`, `x^2 f` at the grid nodes (f normalised to mass 1), and
/// of `f^(1/3)` normalised to 1, whose quantiles are the high-resolution starting levels.
struct Moments {
    c0: Vec<f64>,
    c1: Vec<f64>,
    c2: Vec<f64>,
    cube_root: Vec<f64>,
}

impl Moments {
    fn new(dim: usize) -> Self {
        let exponent = (dim as f64 - 3.0) / 2.0;
        let mut c0 = vec![0.0; GRID + 1];
        let mut c1 = vec![0.0; GRID + 1];
        let mut c2 = vec![0.0; GRID + 1];
        let mut cube_root = vec![0.0; GRID + 1];
        for i in 0..GRID {
            let x = -1.0 + (i as f64 + 0.5) * STEP;
            let log_f = exponent * (1.0 - x * x).ln();
            let f = log_f.exp() * STEP;
            c0[i + 1] = c0[i] + f;
            c1[i + 1] = c1[i] + x * f;
            c2[i + 1] = c2[i] + x * x * f;
            cube_root[i + 1] = cube_root[i] + (log_f / 3.0).exp();
        }
        let mass = c0[GRID];
        for c in [&mut c0, &mut c1, &mut c2] {
            c.iter_mut().for_each(|v| *v /= mass);
        }
        let cube_mass = cube_root[GRID];
        cube_root.iter_mut().for_each(|v| *v /= cube_mass);
        Self {
            c0,
            c1,
            c2,
            cube_root,
        }
    }

    /// Grid interval holding `x` and the position inside it.
    fn locate(x: f64) -> (usize, f64) {
        let pos = ((x + 1.0) / 2.0 * GRID as f64).clamp(0.0, GRID as f64);
        let i = (pos.floor() as usize).min(GRID - 1);
        (i, pos - i as f64)
    }

    /// Cumulative values at `x` (linear interpolation between nodes).
    fn at(&self, x: f64) -> (f64, f64, f64) {
        let (i, t) = Self::locate(x);
        let lerp = |c: &[f64]| c[i] + t * (c[i + 1] - c[i]);
        (lerp(&self.c0), lerp(&self.c1), lerp(&self.c2))
    }

    /// Derivatives at `x` of the interpolated cumulative `f` and `x f`.
    fn slopes(&self, x: f64) -> (f64, f64) {
        let (i, _) = Self::locate(x);
        (
            (self.c0[i + 1] - self.c0[i]) / STEP,
            (self.c1[i + 1] - self.c1[i]) / STEP,
        )
    }

    /// The x where the cumulative `c` reaches `p`.
    fn quantile(c: &[f64], p: f64) -> f64 {
        let i = c.partition_point(|&v| v < p).clamp(1, GRID);
        let (a, b) = (c[i - 1], c[i]);
        let t = if b > a { (p - a) / (b - a) } else { 0.5 };
        -1.0 + ((i - 1) as f64 + t) * STEP
    }

    /// Cell edges of the lower half of a symmetric codebook: -1, the midpoints, and 0 (the
    /// midpoint of the two middle levels -c and c).
    fn half_edges(half: &[f64]) -> Vec<f64> {
        let mut edges = vec![-1.0];
        edges.extend(half.windows(2).map(|w| 0.5 * (w[0] + w[1])));
        edges.push(0.0);
        edges
    }

    /// Centroids of the cells of the lower half (a level whose cell is empty stays put).
    /// Only the lower half is integrated: the cumulative sums start at -1, so the small outer
    /// cells keep their relative precision.
    fn half_centroids(&self, half: &[f64]) -> Vec<f64> {
        let cum: Vec<_> = Self::half_edges(half).iter().map(|&e| self.at(e)).collect();
        cum.windows(2)
            .zip(half)
            .map(|(w, &old)| {
                let m0 = w[1].0 - w[0].0;
                if m0 > 0.0 {
                    (w[1].1 - w[0].1) / m0
                } else {
                    old
                }
            })
            .collect()
    }

    /// One Newton step on the centroid conditions `F_i = centroid_i - c_i = 0` of the lower
    /// half. Cell i spans (c_{i-1} + c_i) / 2 .. (c_i + c_{i+1}) / 2 (the last one ends at 0),
    /// so the Jacobian is tridiagonal; it is solved by the Thomas algorithm.
    fn newton_step(&self, half: &[f64]) -> Vec<f64> {
        let n = half.len();
        let edges = Self::half_edges(half);
        let (mut sub, mut diag, mut sup, mut rhs) =
            (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for i in 0..n {
            let (a, b) = (edges[i], edges[i + 1]);
            let (lo, hi) = (self.at(a), self.at(b));
            let m0 = hi.0 - lo.0;
            if m0 <= 0.0 {
                // An empty cell: hold the level.
                diag[i] = 1.0;
                continue;
            }
            let centroid = (hi.1 - lo.1) / m0;
            // d centroid / d edge = +-(s1(edge) - centroid * s0(edge)) / m0.
            let derivative = |e: f64| {
                let (s0, s1) = self.slopes(e);
                (s1 - centroid * s0) / m0
            };
            diag[i] = -1.0;
            if i > 0 {
                let d_lo = -0.5 * derivative(a);
                sub[i] = d_lo;
                diag[i] += d_lo;
            }
            if i + 1 < n {
                let d_hi = 0.5 * derivative(b);
                sup[i] = d_hi;
                diag[i] += d_hi;
            }
            rhs[i] = half[i] - centroid;
        }
        // Thomas algorithm for sub[i] x[i-1] + diag[i] x[i] + sup[i] x[i+1] = rhs[i].
        for i in 1..n {
            let w = sub[i] / diag[i - 1];
            diag[i] -= w * sup[i - 1];
            rhs[i] -= w * rhs[i - 1];
        }
        let mut delta = vec![0.0; n];
        delta[n - 1] = rhs[n - 1] / diag[n - 1];
        for i in (0..n - 1).rev() {
            delta[i] = (rhs[i] - sup[i] * delta[i + 1]) / diag[i];
        }
        half.iter().zip(&delta).map(|(c, d)| c + d).collect()
    }

    /// Largest distance between a level of the lower half and the centroid of its cell.
    fn residual(&self, half: &[f64]) -> f64 {
        self.half_centroids(half)
            .iter()
            .zip(half)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()))
    }
}

/// Stop once every level is the centroid of its cell to this distance (the f64 rounding floor
/// of the cell integrals is about 1e-17 .. 1e-15).
const CONVERGED: f64 = 1e-14;

/// Runs Lloyd-Max to convergence for the coordinate law in R^dim; returns the levels and the
/// per-coordinate MSE.
///
/// Plain Lloyd iterations converge slowly for many levels (the smooth mode contracts by about
/// `1 - O(1/n^2)` per iteration: at 8 bits ~95k iterations from the high-resolution start, and
/// 20k iterations from equal-probability cells leave the outer levels ~4e-3 off). So the
/// levels start at the high-resolution optimum (quantiles of `f^(1/3)`), take a few Lloyd
/// iterations, and are finished by Newton steps on the centroid conditions; a Newton step that
/// would not reduce the residual or keep the levels sorted is replaced by a Lloyd iteration.
/// The law is symmetric, so only the lower half of the levels is solved for and mirrored.
/// Deterministic: a fixed sequence of f64 operations.
fn lloyd_max_levels(dim: usize, bits: u32) -> (Vec<f64>, f64) {
    let moments = Moments::new(dim);
    let n = 1usize << bits;
    let mut half: Vec<f64> = (0..n / 2)
        .map(|i| Moments::quantile(&moments.cube_root, (i as f64 + 0.5) / n as f64))
        .collect();
    for _ in 0..8 {
        half = moments.half_centroids(&half);
    }
    let mut residual = moments.residual(&half);
    let mut best = (half.clone(), residual);
    for _ in 0..100 {
        if residual < CONVERGED {
            break;
        }
        let next = moments.newton_step(&half);
        let valid = next[0] > -1.0 && next.windows(2).all(|w| w[0] < w[1]) && next[n / 2 - 1] < 0.0;
        let next_residual = if valid {
            moments.residual(&next)
        } else {
            f64::INFINITY
        };
        if next_residual < residual {
            half = next;
            residual = next_residual;
        } else {
            half = moments.half_centroids(&half);
            residual = moments.residual(&half);
        }
        if residual < best.1 {
            best = (half.clone(), residual);
        }
    }
    let half = best.0;
    let levels: Vec<f64> = half
        .iter()
        .copied()
        .chain(half.iter().rev().map(|&c| -c))
        .collect();
    // Distortion of the lower half, doubled.
    let cum: Vec<_> = Moments::half_edges(&half)
        .iter()
        .map(|&e| moments.at(e))
        .collect();
    let mse = 2.0
        * cum
            .windows(2)
            .zip(&half)
            .map(|(w, &c)| {
                let (m0, m1, m2) = (w[1].0 - w[0].0, w[1].1 - w[0].1, w[1].2 - w[0].2);
                m2 - 2.0 * c * m1 + c * c * m0
            })
            .sum::<f64>();
    (levels, mse)
}

/// Expected per-coordinate squared error of any ascending `levels` (nearest-level cells)
/// under the coordinate law at `dim`.
pub(crate) fn distortion(dim: usize, levels: &[f32]) -> f64 {
    let moments = Moments::new(dim);
    let mut edges = vec![-1.0f64];
    edges.extend(
        levels
            .windows(2)
            .map(|w| 0.5 * (f64::from(w[0]) + f64::from(w[1]))),
    );
    edges.push(1.0);
    let cum: Vec<_> = edges.iter().map(|&e| moments.at(e)).collect();
    cum.windows(2)
        .zip(levels)
        .map(|(w, &c)| {
            let c = f64::from(c);
            let (m0, m1, m2) = (w[1].0 - w[0].0, w[1].1 - w[0].1, w[1].2 - w[0].2);
            m2 - 2.0 * c * m1 + c * c * m0
        })
        .sum()
}

fn build(dim: usize, bits: u32) -> Codebook {
    let (levels64, mse) = lloyd_max_levels(dim, bits);
    let levels: Vec<f32> = levels64.iter().map(|&c| c as f32).collect();
    Codebook::from_levels(dim, bits, levels, mse)
}

impl Codebook {
    /// A codebook from ascending `levels` (`2^bits` of them) whose distortion is `mse`:
    /// boundaries at the midpoints, and the search grid for wide codebooks.
    pub(crate) fn from_levels(dim: usize, bits: u32, levels: Vec<f32>, mse: f64) -> Codebook {
        debug_assert_eq!(levels.len(), 1 << bits);
        debug_assert!(levels.windows(2).all(|w| w[0] < w[1]));
        let boundaries: Vec<f32> = levels.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
        let mut book = Codebook {
            dim,
            bits,
            levels,
            boundaries,
            mse,
            grid: Vec::new(),
            grid_step: 0.0,
        };
        if bits >= 6 {
            let lo = book.boundaries[0];
            let hi = book.boundaries[book.boundaries.len() - 1];
            book.grid_step = (hi - lo) / GRID_CELLS as f32;
            book.grid = (0..GRID_CELLS)
                .map(|g| {
                    // The cell of the grid point itself, minus one for rounding safety.
                    let y = lo + g as f32 * book.grid_step;
                    book.nearest_search(y).saturating_sub(1) as u16
                })
                .collect();
        }
        book
    }
}

type Cache = Mutex<HashMap<(usize, u32), Arc<Codebook>>>;

/// The Lloyd-Max codebook for (dim, bits), computed on first use and cached.
pub fn lloyd_max(dim: usize, bits: u32) -> Result<Arc<Codebook>> {
    if !(3..=4096).contains(&dim) {
        return Err(Error::InvalidValue(format!(
            "codebook dimension {dim} is outside 3..=4096"
        )));
    }
    if !CODEBOOK_BITS.contains(&bits) {
        return Err(Error::Unsupported(format!(
            "{bits}-bit codebooks (supported: 2, 3, 4, 8)"
        )));
    }
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(found) = cache.lock().map_err(poisoned)?.get(&(dim, bits)) {
        return Ok(found.clone());
    }
    // Computed outside the lock; a racing thread may compute the same table, which is harmless.
    let built = Arc::new(build(dim, bits));
    let mut guard = cache.lock().map_err(poisoned)?;
    Ok(guard.entry((dim, bits)).or_insert(built).clone())
}

fn poisoned<T>(_: T) -> Error {
    Error::InvalidValue("codebook cache lock poisoned".into())
}

/// The codebook of `kind` for (dim, bits).
pub fn codebook(kind: CodebookKind, dim: usize, bits: u32) -> Result<Arc<Codebook>> {
    match kind {
        CodebookKind::LloydMax => lloyd_max(dim, bits),
        CodebookKind::Aura => super::aura::aura(dim, bits),
    }
}
