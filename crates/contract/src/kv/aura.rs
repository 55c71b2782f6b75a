//! AURA's published codebooks for d = 128, so caches quantised by AURA-family tools
//! (metaltile's kernels, FFAI) can be read and written with the same levels.
//!
//! The numbers are data from `thewafflehaus/FFAI`, `Sources/FFAI/KVCache/AURACodebook.swift`
//! (commit f5a3454, Apache-2.0; the same values appear in `ekryski/mlx-swift-lm`'s
//! `TurboQuantKVCache.swift`, MIT), which gives 2-, 3- and 4-bit levels taken from the llama.cpp
//! TurboQuant fork and an 8-bit table fitted offline to the Beta(d = 128) coordinate law. They
//! are levels for a coordinate of a *unit* vector at d = 128; at another d they are scaled by
//! `sqrt(128 / d)`, as FFAI does. Decision boundaries are the midpoints of neighbouring levels
//! (the published midpoints equal those averages to within 5e-7).
//!
//! Against [`super::codebook::lloyd_max`] at d = 128 (per-coordinate MSE x d, computed by
//! `codebook::distortion` and checked in `tests/kv_codec.rs`): 2 bits 0.1160 (the same), 3 bits
//! 0.03401 vs 0.03397, 4 bits 0.01946 vs 0.00931 (the table stops at 0.1739 where Lloyd-Max
//! reaches 0.2377), 8 bits 1.573e-4 vs 4.024e-5 (top level 0.3218 vs 0.3892; the table is also
//! not exactly symmetric). So `lloyd-max` stays the default; `aura` is for compatibility. The
//! rotation is a separate matter: reading a cache written elsewhere also needs the writer's
//! rotation (its sign sequence), which this crate does not reproduce.

use super::codebook::{Codebook, distortion};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The head dimension the tables were published for.
pub const AURA_DIM: usize = 128;

pub(super) const LEVELS_2: [f32; 4] = [-0.133462, -0.039994, 0.039994, 0.133462];

pub(super) const LEVELS_3: [f32; 8] = [
    -0.190685, -0.117832, -0.065717, -0.021460, 0.021460, 0.065717, 0.117832, 0.190685,
];

pub(super) const LEVELS_4: [f32; 16] = [
    -0.173926, -0.117195, -0.089527, -0.068756, -0.051262, -0.035597, -0.020989, -0.006938,
    0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926,
];

pub(super) const LEVELS_8: [f32; 256] = [
    -0.321782, -0.280567, -0.254225, -0.234551, -0.218845, -0.205896, -0.194947, -0.185487,
    -0.177261, -0.170089, -0.163792, -0.158191, -0.153197, -0.148718, -0.144665, -0.140977,
    -0.137562, -0.134328, -0.131279, -0.128411, -0.125697, -0.123103, -0.120632, -0.118283,
    -0.116025, -0.113890, -0.111876, -0.109954, -0.108093, -0.106292, -0.104584, -0.102905,
    -0.101196, -0.099518, -0.097901, -0.096345, -0.094819, -0.093324, -0.091828, -0.090333,
    -0.088899, -0.087495, -0.086091, -0.084687, -0.083345, -0.082032, -0.080689, -0.079377,
    -0.078096, -0.076844, -0.075624, -0.074372, -0.073121, -0.071901, -0.070710, -0.069551,
    -0.068391, -0.067231, -0.066072, -0.064912, -0.063783, -0.062654, -0.061525, -0.060426,
    -0.059358, -0.058290, -0.057191, -0.056123, -0.055085, -0.054048, -0.053010, -0.051972,
    -0.050935, -0.049928, -0.048921, -0.047914, -0.046906, -0.045899, -0.044892, -0.043885,
    -0.042909, -0.041932, -0.040955, -0.040009, -0.039063, -0.038117, -0.037171, -0.036225,
    -0.035279, -0.034333, -0.033417, -0.032502, -0.031556, -0.030610, -0.029694, -0.028779,
    -0.027863, -0.026948, -0.026032, -0.025117, -0.024232, -0.023346, -0.022431, -0.021515,
    -0.020630, -0.019745, -0.018860, -0.017975, -0.017060, -0.016175, -0.015290, -0.014405,
    -0.013520, -0.012635, -0.011780, -0.010926, -0.010040, -0.009155, -0.008270, -0.007385,
    -0.006531, -0.005646, -0.004761, -0.003906, -0.003052, -0.002167, -0.001312, -0.000458,
    0.000458, 0.001343, 0.002197, 0.003052, 0.003937, 0.004822, 0.005676, 0.006561, 0.007446,
    0.008301, 0.009186, 0.010071, 0.010926, 0.011811, 0.012696, 0.013550, 0.014435, 0.015320,
    0.016205, 0.017090, 0.017975, 0.018860, 0.019745, 0.020661, 0.021546, 0.022431, 0.023346,
    0.024262, 0.025147, 0.026032, 0.026948, 0.027863, 0.028779, 0.029694, 0.030610, 0.031556,
    0.032502, 0.033418, 0.034364, 0.035310, 0.036225, 0.037171, 0.038148, 0.039094, 0.040040,
    0.040986, 0.041963, 0.042970, 0.043946, 0.044923, 0.045930, 0.046937, 0.047914, 0.048921,
    0.049928, 0.050935, 0.051972, 0.053010, 0.054048, 0.055085, 0.056123, 0.057191, 0.058290,
    0.059388, 0.060456, 0.061555, 0.062684, 0.063813, 0.064943, 0.066072, 0.067231, 0.068391,
    0.069551, 0.070741, 0.071931, 0.073152, 0.074403, 0.075593, 0.076814, 0.078096, 0.079408,
    0.080720, 0.082032, 0.083345, 0.084687, 0.086091, 0.087495, 0.088929, 0.090394, 0.091859,
    0.093323, 0.094819, 0.096375, 0.097962, 0.099549, 0.101196, 0.102875, 0.104584, 0.106353,
    0.108154, 0.109985, 0.111876, 0.113890, 0.116025, 0.118283, 0.120632, 0.123103, 0.125697,
    0.128411, 0.131279, 0.134328, 0.137562, 0.140977, 0.144665, 0.148718, 0.153197, 0.158191,
    0.163792, 0.170089, 0.177261, 0.185487, 0.194947, 0.205897, 0.218845, 0.234551, 0.254225,
    0.280567, 0.321781,
];

/// AURA's codebook for (dim, bits): the d = 128 table, scaled by `sqrt(128 / dim)` at other d;
/// cached per (dim, bits).
pub fn aura(dim: usize, bits: u32) -> Result<Arc<Codebook>> {
    let published: &[f32] = match bits {
        2 => &LEVELS_2,
        3 => &LEVELS_3,
        4 => &LEVELS_4,
        8 => &LEVELS_8,
        _ => {
            return Err(Error::Unsupported(format!(
                "{bits}-bit AURA codebooks (published: 2, 3, 4, 8)"
            )));
        }
    };
    if !(3..=4096).contains(&dim) {
        return Err(Error::InvalidValue(format!(
            "codebook dimension {dim} is outside 3..=4096"
        )));
    }
    type Cache = Mutex<HashMap<(usize, u32), Arc<Codebook>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let poisoned = |_| Error::InvalidValue("codebook cache lock poisoned".into());
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(found) = cache.lock().map_err(poisoned)?.get(&(dim, bits)) {
        return Ok(found.clone());
    }
    let scale = if dim == AURA_DIM {
        1.0
    } else {
        (AURA_DIM as f64 / dim as f64).sqrt()
    };
    let levels: Vec<f32> = published
        .iter()
        .map(|&c| (f64::from(c) * scale) as f32)
        .collect();
    let mse = distortion(dim, &levels);
    let built = Arc::new(Codebook::from_levels(dim, bits, levels, mse));
    let mut guard = cache.lock().map_err(poisoned)?;
    Ok(guard.entry((dim, bits)).or_insert(built).clone())
}
