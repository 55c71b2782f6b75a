//! The paged compressed cache: codes and norms bit for bit those of the contiguous cache,
//! attention over it equal to the f64 oracle over its decoded vectors and to the contiguous
//! path, and the block table's rules (an engine's pages used as given, bad tables refused,
//! a failed append changing nothing).

use deltakv_contract::kv::book::PagedCache;
use deltakv_contract::kv::case::PagedCase;
use deltakv_contract::kv::paged::Stream;
use deltakv_contract::kv::{KvScheme, NormDType, PagedLayout};
use deltakv_contract::metrics::rel_rms;
use deltakv_cpu::kv::{AttnOptions, KvCache, PagedKvCache, attend_compressed, attend_paged};

/// Appends every sequence of `case` in chunks of `chunk` tokens, interleaving sequences.
fn fill(case: &PagedCase, layout: PagedLayout, chunk: usize, max_pages: usize) -> PagedKvCache {
    let lens = case.lens();
    let pages: usize = lens.iter().map(|&l| layout.pages_for(l)).sum();
    let mut cache = PagedKvCache::new(layout, lens.len(), max_pages, pages + 3).unwrap();
    let row = case.dims.hkv * case.dims.d;
    let mut at = vec![0usize; lens.len()];
    while at.iter().zip(&lens).any(|(a, l)| a < l) {
        for b in 0..lens.len() {
            let n = chunk.min(lens[b] - at[b]);
            if n > 0 {
                let range = at[b] * row..(at[b] + n) * row;
                cache
                    .append(b, &case.keys[b][range.clone()], &case.values[b][range])
                    .unwrap();
                at[b] += n;
            }
        }
    }
    cache
}

const SHAPES: [(&[usize], usize, usize, usize, usize); 5] = [
    // (lens, Tq, Hq, Hkv, d)
    (&[1, 63, 65, 200], 1, 8, 2, 128),
    (&[1000], 1, 32, 8, 128),
    (&[70, 17], 3, 6, 2, 96),
    (&[130, 64], 2, 4, 4, 64),
    (&[90], 5, 8, 1, 256),
];

#[test]
fn codes_and_norms_equal_the_contiguous_cache() {
    for (i, &(lens, _, hq, hkv, d)) in SHAPES.iter().enumerate() {
        for (bits_k, bits_v, page) in [(4, 2, 16), (3, 8, 64), (2, 3, 32)] {
            let case = PagedCase::new(lens, 1, hq, hkv, d, 10 + i as u64);
            let mut scheme = KvScheme::new(d, hkv, bits_k, bits_v);
            scheme.seed = 7;
            if i % 2 == 1 {
                scheme.norm_dtype = NormDType::F16;
            }
            let layout = PagedLayout::new(scheme, page).unwrap();
            let paged = fill(&case, layout, if i == 0 { 1 } else { 37 }, 64);
            let mut contiguous = KvCache::new(scheme, lens.len()).unwrap();
            for b in 0..lens.len() {
                contiguous
                    .append(b, &case.keys[b], &case.values[b])
                    .unwrap();
            }
            let view = paged.view();
            let (wk, wv) = (
                paged.key_quantizer().words(),
                paged.value_quantizer().words(),
            );
            for (b, &len) in lens.iter().enumerate() {
                for h in 0..hkv {
                    let store = contiguous.head(b, h).unwrap();
                    for t in 0..len {
                        let (row, norm) = view.row(Stream::Key, b, h, t).unwrap();
                        assert_eq!(row, &store.k_codes[t * wk..][..wk], "K codes {b} {h} {t}");
                        assert_eq!(norm.to_bits(), store.k_norms.get(t).unwrap().to_bits());
                        let (row, norm) = view.row(Stream::Value, b, h, t).unwrap();
                        assert_eq!(row, &store.v_codes[t * wv..][..wv], "V codes {b} {h} {t}");
                        assert_eq!(norm.to_bits(), store.v_norms.get(t).unwrap().to_bits());
                    }
                }
            }
            assert_eq!(paged.bytes(), contiguous.bytes());
        }
    }
}

#[test]
fn attention_equals_oracle_over_decoded_vectors() {
    let mut worst: f64 = 0.0;
    for (i, &(lens, tq, hq, hkv, d)) in SHAPES.iter().enumerate() {
        for (bits_k, bits_v) in [(4, 2), (3, 3), (8, 4), (2, 8)] {
            let case = PagedCase::new(lens, tq, hq, hkv, d, 100 + i as u64);
            let mut scheme = KvScheme::new(d, hkv, bits_k, bits_v);
            scheme.seed = i as u64;
            if i % 2 == 0 {
                scheme.norm_dtype = NormDType::F16;
            }
            let layout = PagedLayout::new(scheme, [16, 64, 32, 128, 16][i]).unwrap();
            let paged = fill(&case, layout, 50, 128);
            let ideal = case
                .decoded_reference(
                    &paged.view(),
                    paged.key_quantizer(),
                    paged.value_quantizer(),
                )
                .unwrap();
            let mut contiguous = KvCache::new(scheme, lens.len()).unwrap();
            for b in 0..lens.len() {
                contiguous
                    .append(b, &case.keys[b], &case.values[b])
                    .unwrap();
            }
            for opts in [
                AttnOptions::default(),
                AttnOptions {
                    block_tokens: 40,
                    splits: Some(3),
                    simd: false,
                },
            ] {
                let out = attend_paged(&paged, &case.q, tq, hq, case.scale, &opts).unwrap();
                let err = rel_rms(&out, &ideal);
                worst = worst.max(err);
                assert!(
                    err < 5e-6,
                    "shape {i} bits {bits_k}/{bits_v} {opts:?}: {err:.3e}"
                );
                let flat =
                    attend_compressed(&contiguous, &case.q, tq, hq, case.scale, &opts).unwrap();
                let flat: Vec<f64> = flat.iter().map(|&x| f64::from(x)).collect();
                let err = rel_rms(&out, &flat);
                assert!(err < 5e-6, "shape {i}: paged vs contiguous {err:.3e}");
            }
        }
    }
    println!("paged attention: worst rel_rms against the decoded oracle {worst:.2e}");
}

#[test]
fn block_table_rules() {
    let scheme = KvScheme::new(64, 2, 4, 2);
    let layout = PagedLayout::new(scheme, 16).unwrap();
    let case = PagedCase::new(&[40, 20], 1, 2, 2, 64, 3);
    let mut cache = PagedKvCache::new(layout, 2, 4, 6).unwrap();
    // An engine's pages: sequence 0 on pages 5, 2, 4; sequence 1 on 0, 3.
    cache.set_block_table(&[5, 2, 4, -1, 0, 3, -1, -1]).unwrap();
    for b in 0..2 {
        cache.append(b, &case.keys[b], &case.values[b]).unwrap();
    }
    assert_eq!(cache.block_table(), &[5, 2, 4, -1, 0, 3, -1, -1]);
    // Tables that break the rules are refused and change nothing.
    for bad in [
        [5, 2, 2, -1, 0, 3, -1, -1],  // a page twice
        [5, 2, 4, -1, 0, 6, -1, -1],  // past the pool
        [5, 2, -1, -1, 0, 3, -1, -1], // a held token without a page
    ] {
        assert!(cache.set_block_table(&bad).is_err(), "{bad:?}");
    }
    assert!(cache.set_block_table(&[5, 2, 4]).is_err());
    assert_eq!(cache.block_table(), &[5, 2, 4, -1, 0, 3, -1, -1]);
    // A -1 entry takes the lowest free page (1); then the pool is full.
    let row = 2 * 64;
    cache
        .append(1, &case.keys[0][..row * 13], &case.values[0][..row * 13])
        .unwrap();
    assert_eq!(cache.block_table()[6], 1);
    let before = cache.clone();
    let err = cache.append(0, &case.keys[0][..row * 9], &case.values[0][..row * 9]);
    assert!(err.is_err(), "no free page, must refuse");
    assert_eq!(cache.block_table(), before.block_table());
    assert_eq!(cache.lens(), before.lens());
    assert_eq!(cache.pool(), before.pool());
    // A non-finite value or a norm beyond f16 is refused the same way.
    let mut nan = case.keys[1][..row].to_vec();
    nan[5] = f32::NAN;
    assert!(cache.append(1, &nan, &case.values[1][..row]).is_err());
    let mut f16_scheme = scheme;
    f16_scheme.norm_dtype = NormDType::F16;
    let mut small = PagedKvCache::new(PagedLayout::new(f16_scheme, 16).unwrap(), 1, 2, 2).unwrap();
    let huge = vec![1e5f32; row];
    assert!(small.append(0, &huge, &huge).is_err());
    assert_eq!(small.lens(), &[0]);
    assert!(
        small
            .append(0, &case.keys[0][..row], &case.values[0][..row])
            .is_ok()
    );
}
