//! Attention error of the compressed cache against exact f64 attention. On Gaussian keys and
//! on keys with outlier channels (x8) plus a shared offset, the kernel reaches what the ideal
//! algorithm (exact f64 attention over the decoded vectors) reaches, for every bit pair.
//! 8/8 bits stay below 1% on Gaussian keys and below 2% on the outlier keys (where the
//! ideal algorithm itself is at 1.6%).

use deltakv_core::kv::oracle::{OracleDims, attention_reference};
use deltakv_core::kv::random::{KvCase, KvSpec};
use deltakv_core::kv::{AttnOptions, KvCache, KvScheme, attend_compressed};
use deltakv_core::metrics::rel_rms;

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
                dk.extend(cache.decode_key(0, h, tok));
                dv.extend(cache.decode_value(0, h, tok));
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
