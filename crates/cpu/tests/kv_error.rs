//! Attention error of the compressed cache against exact f64 attention. On Gaussian keys and
//! on keys with outlier channels (x8) plus a shared offset, the kernel reaches what the ideal
//! algorithm (exact f64 attention over the decoded vectors) reaches, for every bit pair.
//! 8/8 bits stay below 1% on Gaussian keys and below 2% on the outlier keys (where the
//! ideal algorithm itself is at 1.6%); the last test takes that 8/8 error apart.

use deltakv_contract::kv::KvScheme;
use deltakv_contract::kv::oracle::{OracleDims, attention_reference};
use deltakv_contract::kv::random::{KvCase, KvSpec};
use deltakv_contract::metrics::rel_rms;
use deltakv_cpu::kv::{AttnOptions, KvCache, attend_compressed};

const PAIRS: [(u32, u32); 7] = [(2, 2), (3, 3), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)];

/// (bits K, bits V, kernel rel_rms, ideal rel_rms) for each pair.
fn table(spec: KvSpec, seed: u64) -> Vec<(u32, u32, f64, f64)> {
    let KvSpec {
        tq,
        tokens: t,
        hq,
        hkv,
        d,
        ..
    } = spec;
    let case = KvCase::random(spec, seed);
    let dims = OracleDims { tq, hq, hkv, d };
    let scale = 1.0 / (d as f32).sqrt();
    let exact =
        attention_reference(&case.q, &[case.keys(0)], &[case.values(0)], dims, scale).unwrap();
    let mut rows = Vec::new();
    for (bk, bv) in PAIRS {
        let mut cache = KvCache::new(KvScheme::new(d, hkv, bk, bv), 1).unwrap();
        cache.append(0, case.keys(0), case.values(0)).unwrap();
        let out =
            attend_compressed(&cache, &case.q, tq, hq, scale, &AttnOptions::default()).unwrap();
        let (mut dk, mut dv) = (Vec::new(), Vec::new());
        for tok in 0..t {
            for h in 0..hkv {
                dk.extend(cache.decode_key(0, h, tok).unwrap());
                dv.extend(cache.decode_value(0, h, tok).unwrap());
            }
        }
        let ideal = attention_reference(&case.q, &[&dk], &[&dv], dims, scale).unwrap();
        let ideal_f32: Vec<f32> = ideal.iter().map(|&x| x as f32).collect();
        rows.push((bk, bv, rel_rms(&out, &exact), rel_rms(&ideal_f32, &exact)));
    }
    rows
}

fn check(name: &str, rows: &[(u32, u32, f64, f64)], limit_8_8: f64) {
    eprintln!("{name}\nbits K/V | kernel rel_rms | ideal rel_rms");
    for &(bk, bv, err, ideal) in rows {
        eprintln!("{bk}/{bv}      | {err:.4}         | {ideal:.4}");
        assert!(
            (err - ideal).abs() < 1e-3 * ideal + 1e-6,
            "{name} {bk}/{bv}: kernel {err} vs ideal {ideal}"
        );
        if (bk, bv) == (8, 8) {
            assert!(err < limit_8_8, "{name} 8/8: {err}");
        }
    }
}

#[test]
fn error_on_gaussian_keys_matches_the_ideal_algorithm() {
    let rows = table(KvSpec::gaussian(1, 4, 1024, 8, 2, 128), 11);
    check("gaussian keys", &rows, 0.01);
}

#[test]
fn error_on_outlier_keys_matches_the_ideal_algorithm() {
    let rows = table(KvSpec::outliers(1, 4, 1024, 8, 2, 128), 11);
    check("outlier keys (4 channels x8, shared offset)", &rows, 0.02);
}

/// Exact f64 attention over `k`, `v` (`[T, Hkv, D]`, one sequence) as f32.
fn exact(case: &KvCase, k: &[f32], v: &[f32], scale: f32) -> Vec<f64> {
    let KvSpec { tq, hq, hkv, d, .. } = case.spec;
    attention_reference(&case.q, &[k], &[v], OracleDims { tq, hq, hkv, d }, scale).unwrap()
}

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// rms over vectors of |x_hat - x| / |x|.
fn per_vector_error(x: &[f32], x_hat: &[f32], d: usize) -> f64 {
    let (mut sum, mut n) = (0.0, 0.0);
    for (a, b) in x.chunks_exact(d).zip(x_hat.chunks_exact(d)) {
        let norm: f64 = a.iter().map(|&v| f64::from(v).powi(2)).sum();
        let err: f64 = a
            .iter()
            .zip(b)
            .map(|(&u, &w)| f64::from(u - w).powi(2))
            .sum();
        sum += err / norm;
        n += 1.0;
    }
    (sum / n).sqrt()
}

/// Measured and predicted parts of the 8/8 error on one case.
struct Decomposition {
    /// sqrt(mse * d) of the 8-bit codebook: the expected per-vector relative error.
    unit: f64,
    per_vector_k: f64,
    per_vector_v: f64,
    /// rms of scale * <q, k_hat - k> over every (query row, visible token).
    score_noise: f64,
    /// The same predicted from the codebook: rms of scale * |q| |k| sqrt(mse).
    score_noise_predicted: f64,
    /// Mean |k|^2 / d.
    key_energy: f64,
    /// |k|^2 / d weighted by p_t^2 over every query row: the keys the output error comes from.
    attended_key_energy: f64,
    both: f64,
    k_only: f64,
    v_only: f64,
    /// K-only error propagated to first order: o + sum_t p_t (eps_t - sum_s p_s eps_s) v_t.
    k_only_linear: f64,
}

fn decompose(case: &KvCase) -> Decomposition {
    let KvSpec {
        tq,
        tokens: t,
        hq,
        hkv,
        d,
        ..
    } = case.spec;
    let scale = 1.0 / (d as f32).sqrt();
    let mut cache = KvCache::new(KvScheme::new(d, hkv, 8, 8), 1).unwrap();
    cache.append(0, case.keys(0), case.values(0)).unwrap();
    let (mut dk, mut dv) = (Vec::new(), Vec::new());
    for tok in 0..t {
        for h in 0..hkv {
            dk.extend(cache.decode_key(0, h, tok).unwrap());
            dv.extend(cache.decode_value(0, h, tok).unwrap());
        }
    }
    let (k, v) = (case.keys(0), case.values(0));
    let reference = exact(case, k, v, scale);
    let mse = cache.key_quantizer().codebook.mse;

    let (mut noise, mut predicted, mut pairs) = (0.0, 0.0, 0.0);
    let (mut attended, mut weight) = (0.0, 0.0);
    let mut linear = vec![0.0f64; reference.len()];
    let dot = |a: &[f32], b: &[f32]| -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum()
    };
    let s = f64::from(scale);
    for i in 0..tq {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let q = &case.q[(i * hq + h) * d..][..d];
            let q2 = dot(q, q);
            let visible = t - tq + i + 1;
            let (mut scores, mut eps) = (Vec::new(), Vec::new());
            for tok in 0..visible {
                let at = (tok * hkv + kh) * d;
                let (key, key_hat) = (&k[at..at + d], &dk[at..at + d]);
                let score = s * dot(q, key);
                let e = s * dot(q, key_hat) - score;
                scores.push(score);
                eps.push(e);
                noise += e * e;
                predicted += s * s * q2 * dot(key, key) * mse;
                pairs += 1.0;
            }
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let mean_eps: f64 = w.iter().zip(&eps).map(|(p, e)| p * e).sum::<f64>() / total;
            let o = &mut linear[(i * hq + h) * d..][..d];
            o.copy_from_slice(&reference[(i * hq + h) * d..][..d]);
            for tok in 0..visible {
                let p = w[tok] / total;
                let key = &k[(tok * hkv + kh) * d..][..d];
                attended += p * p * dot(key, key) / d as f64;
                weight += p * p;
                let c = p * (eps[tok] - mean_eps);
                for (x, &y) in o.iter_mut().zip(&v[(tok * hkv + kh) * d..][..d]) {
                    *x += c * f64::from(y);
                }
            }
        }
    }
    let key_energy = k.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / (t * hkv * d) as f64;
    Decomposition {
        unit: (mse * d as f64).sqrt(),
        per_vector_k: per_vector_error(k, &dk, d),
        per_vector_v: per_vector_error(v, &dv, d),
        score_noise: (noise / pairs).sqrt(),
        score_noise_predicted: (predicted / pairs).sqrt(),
        key_energy,
        attended_key_energy: attended / weight,
        both: rel_rms(&to_f32(&exact(case, &dk, &dv, scale)), &reference),
        k_only: rel_rms(&to_f32(&exact(case, &dk, v, scale)), &reference),
        v_only: rel_rms(&to_f32(&exact(case, k, &dv, scale)), &reference),
        k_only_linear: rel_rms(&to_f32(&linear), &reference),
    }
}

/// Why 8/8 bits stay under 1% on Gaussian keys and not on the outlier keys: the decoded
/// vectors carry exactly the codebook's distortion (per-vector relative error sqrt(mse * d),
/// ~0.63%, for keys and values alike); a key's score error is that distortion times
/// scale |q| |k|, so it grows with the key's norm, which the outlier channels (x8) and the
/// shared offset raise ~2.5x (|k|^2 / d ~ 6.5 against 1); the output error is that score
/// noise propagated to first order through the softmax (the linearisation matches it to 1%),
/// weighted towards the high-attention tokens, which on the outlier keys are the larger ones,
/// plus the value distortion. Same codebook, same queries: < 1% on Gaussian keys, ~1.7-2.2%
/// on the outlier keys. The scheme (one norm per vector, one codebook for every coordinate)
/// has no lever against it.
#[test]
fn eight_bit_error_is_the_codebook_distortion_times_the_key_norm() {
    for (d, t, seed) in [(96, 701, 5), (128, 523, 6), (80, 389, 7)] {
        let gaussian = decompose(&KvCase::random(KvSpec::gaussian(1, 3, t, 6, 2, d), seed));
        let outliers = decompose(&KvCase::random(KvSpec::outliers(1, 3, t, 6, 2, d), seed));
        for (name, r) in [("gaussian", &gaussian), ("outlier", &outliers)] {
            eprintln!(
                "d={d} T={t} {name:8}: 8/8 {:.4} | K-only {:.4} (first order {:.4}) | V-only {:.4} \
                 | per-vector K {:.4} V {:.4} (sqrt(mse*d) {:.4}) | score noise {:.4} \
                 (predicted {:.4}) | |k|^2/d {:.2}, attended {:.2}",
                r.both,
                r.k_only,
                r.k_only_linear,
                r.v_only,
                r.per_vector_k,
                r.per_vector_v,
                r.unit,
                r.score_noise,
                r.score_noise_predicted,
                r.key_energy,
                r.attended_key_energy
            );
            let near = |x: f64, y: f64, tol: f64| (x / y - 1.0).abs() < tol;
            assert!(
                near(r.per_vector_k, r.unit, 0.1),
                "{name} d={d}: per-vector K"
            );
            assert!(
                near(r.per_vector_v, r.unit, 0.1),
                "{name} d={d}: per-vector V"
            );
            assert!(
                near(r.score_noise, r.score_noise_predicted, 0.1),
                "{name} d={d}: scores"
            );
            assert!(
                near(r.k_only, r.k_only_linear, 0.05),
                "{name} d={d}: first order"
            );
            assert!(near(r.v_only, r.unit, 0.2), "{name} d={d}: V-only");
            let sum = (r.k_only.powi(2) + r.v_only.powi(2)).sqrt();
            assert!(near(r.both, sum, 0.1), "{name} d={d}: K and V errors add");
        }
        assert!(
            gaussian.both < 0.01,
            "d={d}: gaussian 8/8 {}",
            gaussian.both
        );
        assert!(
            outliers.both < 0.025,
            "d={d}: outlier 8/8 {}",
            outliers.both
        );
        // The outlier keys' score noise is larger by their norm, as predicted.
        let ratio = outliers.score_noise / gaussian.score_noise;
        let norm_ratio = (outliers.key_energy / gaussian.key_energy).sqrt();
        assert!(
            (ratio / norm_ratio - 1.0).abs() < 0.1,
            "d={d}: {ratio} vs {norm_ratio}"
        );
    }
}
