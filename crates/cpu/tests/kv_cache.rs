//! The compressed KV cache: its size against the scheme, bad chunks refused, and its encoding
//! (compiled for each SIMD level) equal to the contract's codec bit for bit.

use deltakv_contract::kv::{KvScheme, NormDType};
use deltakv_contract::rng::Rng;
use deltakv_cpu::kv::KvCache;

#[test]
fn cache_bytes_match_the_scheme() {
    for d in [64, 80, 128, 256] {
        for (bk, bv) in [(4, 2), (3, 3), (8, 8), (2, 4)] {
            for norms in [NormDType::F32, NormDType::F16] {
                let mut scheme = KvScheme::new(d, 2, bk, bv);
                scheme.norm_dtype = norms;
                let mut cache = KvCache::new(scheme, 2).unwrap();
                let mut rng = Rng::new(5);
                let a = rng.normal_vec(10 * 2 * d, 1.0);
                cache.append(0, &a, &a).unwrap();
                let b = rng.normal_vec(3 * 2 * d, 1.0);
                cache.append(1, &b, &b).unwrap();
                assert_eq!(cache.seq_len(0).unwrap(), 10);
                assert_eq!(cache.seq_len(1).unwrap(), 3);
                let per = (d * (bk + bv) as usize) as f64 / 8.0 + 2.0 * norms.bytes() as f64;
                let got = cache.bytes() as f64 / (13.0 * 2.0);
                assert!((got - per).abs() <= 8.0, "d={d} {bk}/{bv}: {got} vs {per}");
                if (d * bk as usize).is_multiple_of(32) && (d * bv as usize).is_multiple_of(32) {
                    assert_eq!(got, per);
                }
            }
        }
    }
}

#[test]
fn cache_rejects_bad_chunks() {
    let mut cache = KvCache::new(KvScheme::new(64, 2, 4, 2), 1).unwrap();
    let err = cache
        .append(0, &[0.0; 100], &[0.0; 100])
        .unwrap_err()
        .to_string();
    assert!(err.contains("whole number"), "{err}");
    let mut bad = vec![0.0; 128];
    bad[70] = f32::NAN;
    let err = cache.append(0, &bad, &[0.0; 128]).unwrap_err().to_string();
    assert!(
        err.contains("non-finite") && err.contains("head 1"),
        "{err}"
    );
    assert!(cache.append(1, &[0.0; 128], &[0.0; 128]).is_err());
    assert!(KvCache::new(KvScheme::new(48, 2, 4, 2), 1).is_err());
    assert!(KvCache::new(KvScheme::new(64, 2, 5, 2), 1).is_err());
}

#[test]
fn cache_encoding_equals_the_codec_at_every_simd_level() {
    // The cache encodes through builds compiled for the CPU (AVX-512 where present); its codes
    // and norms must equal the portable codec's, bit for bit, at power-of-two d (FWHT) and
    // not (dense rotation), for narrow and 8-bit codes.
    use deltakv_cpu::simd::{SimdLimit, set_simd_limit};
    for limit in [SimdLimit::Baseline, SimdLimit::Avx2, SimdLimit::Any] {
        set_simd_limit(limit);
        for (d, bits_k, bits_v) in [(128, 4, 2), (96, 3, 8), (80, 2, 4)] {
            let (heads, tokens) = (2, 37);
            let mut rng = Rng::new(d as u64 + 100 * bits_k as u64);
            let k = rng.normal_vec(tokens * heads * d, 2.0);
            let v = rng.normal_vec(tokens * heads * d, 0.5);
            let mut scheme = KvScheme::new(d, heads, bits_k, bits_v);
            scheme.seed = 4;
            let mut cache = KvCache::new(scheme, 1).unwrap();
            cache.append(0, &k, &v).unwrap();
            let (kq, vq) = (cache.key_quantizer(), cache.value_quantizer());
            let (mut scratch, mut codes) = (vec![0.0; d], vec![0u32; d]);
            for h in 0..heads {
                let store = cache.head(0, h).unwrap();
                for t in 0..tokens {
                    let x = &k[(t * heads + h) * d..][..d];
                    let mut words = vec![0u32; kq.words()];
                    let norm = kq.encode(x, &mut words, &mut scratch, &mut codes).unwrap();
                    assert_eq!(&store.k_codes[t * kq.words()..][..kq.words()], &words[..]);
                    assert_eq!(
                        store.k_norms.get(t).unwrap().to_bits(),
                        norm.to_bits(),
                        "{limit:?}"
                    );
                    let x = &v[(t * heads + h) * d..][..d];
                    let mut words = vec![0u32; vq.words()];
                    let norm = vq.encode(x, &mut words, &mut scratch, &mut codes).unwrap();
                    assert_eq!(&store.v_codes[t * vq.words()..][..vq.words()], &words[..]);
                    assert_eq!(
                        store.v_norms.get(t).unwrap().to_bits(),
                        norm.to_bits(),
                        "{limit:?}"
                    );
                }
            }
        }
    }
    set_simd_limit(SimdLimit::Any);
}
