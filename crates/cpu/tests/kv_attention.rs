//! Attention over the compressed and dense KV caches against the f64 oracle, on fresh random
//! inputs at odd shapes (d = 64, 72, 80, 96, 100, 128, 192, 256, Tq = 1 and > 1, GQA ratios, ragged batches).

use deltakv_contract::kv::codebook::CodebookKind;
use deltakv_contract::kv::oracle::{OracleDims, attention_reference};
use deltakv_contract::kv::{KvScheme, NormDType};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::rng::Rng;
use deltakv_cpu::kv::{AttnOptions, DenseKvCache, KvCache, attend_compressed, attend_dense};

/// A ragged batch: per-sequence keys/values `[T_b, Hkv, D]` and queries `[B, Tq, Hq, D]`.
struct Case {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    q: Vec<f32>,
    dims: OracleDims,
    scale: f32,
}

impl Case {
    fn new(lens: &[usize], tq: usize, hq: usize, hkv: usize, d: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let keys = lens
            .iter()
            .map(|&t| rng.normal_vec(t * hkv * d, 1.0))
            .collect();
        let values = lens
            .iter()
            .map(|&t| rng.normal_vec(t * hkv * d, 1.0))
            .collect();
        let q = rng.normal_vec(lens.len() * tq * hq * d, 1.0);
        Self {
            keys,
            values,
            q,
            dims: OracleDims { tq, hq, hkv, d },
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    fn compressed(&self, scheme: KvScheme, chunk: usize) -> KvCache {
        let mut cache = KvCache::new(scheme, self.keys.len()).unwrap();
        let row = self.dims.hkv * self.dims.d;
        for (b, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
            // Appended in chunks (and token by token when chunk == 1).
            for (kc, vc) in k.chunks(chunk * row).zip(v.chunks(chunk * row)) {
                cache.append(b, kc, vc).unwrap();
            }
        }
        cache
    }

    fn dense(&self) -> DenseKvCache {
        let mut cache = DenseKvCache::new(self.dims.d, self.dims.hkv, self.keys.len()).unwrap();
        for (b, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
            cache.append(b, k, v).unwrap();
        }
        cache
    }

    fn reference(&self) -> Vec<f64> {
        let k: Vec<&[f32]> = self.keys.iter().map(|x| x.as_slice()).collect();
        let v: Vec<&[f32]> = self.values.iter().map(|x| x.as_slice()).collect();
        attention_reference(&self.q, &k, &v, self.dims, self.scale).unwrap()
    }

    /// The oracle over the cache's decoded (dequantised) vectors: the ideal algorithm.
    fn decoded_reference(&self, cache: &KvCache) -> Vec<f64> {
        let (hkv, d) = (self.dims.hkv, self.dims.d);
        let mut dk = Vec::new();
        let mut dv = Vec::new();
        for (b, k) in self.keys.iter().enumerate() {
            let len = k.len() / (hkv * d);
            let (mut kb, mut vb) = (Vec::new(), Vec::new());
            for t in 0..len {
                for h in 0..hkv {
                    kb.extend(cache.decode_key(b, h, t).unwrap());
                    vb.extend(cache.decode_value(b, h, t).unwrap());
                }
            }
            dk.push(kb);
            dv.push(vb);
        }
        let k: Vec<&[f32]> = dk.iter().map(|x| x.as_slice()).collect();
        let v: Vec<&[f32]> = dv.iter().map(|x| x.as_slice()).collect();
        attention_reference(&self.q, &k, &v, self.dims, self.scale).unwrap()
    }
}

fn opts(block: usize, splits: Option<usize>, simd: bool) -> AttnOptions {
    AttnOptions {
        block_tokens: block,
        splits,
        simd,
    }
}

const SHAPES: [(&[usize], usize, usize, usize, usize); 8] = [
    // (lens, Tq, Hq, Hkv, d)
    (&[300], 1, 8, 2, 128),
    (&[77, 140], 1, 4, 4, 64),
    (&[200, 33, 129], 3, 6, 2, 80),
    (&[150], 5, 12, 4, 96),
    (&[90, 260], 2, 8, 1, 192),
    (&[130], 1, 4, 2, 256),
    (&[64, 65], 7, 3, 3, 72),
    (&[41, 97], 2, 4, 2, 100),
];

#[test]
fn dense_path_matches_oracle() {
    for (i, &(lens, tq, hq, hkv, d)) in SHAPES.iter().enumerate() {
        let case = Case::new(lens, tq, hq, hkv, d, 100 + i as u64);
        let reference = case.reference();
        for o in [
            opts(64, None, true),
            opts(512, Some(1), true),
            opts(37, Some(3), false),
        ] {
            let out = attend_dense(&case.dense(), &case.q, tq, hq, case.scale, &o).unwrap();
            let err = rel_rms(&out, &reference);
            assert!(err < 2e-6, "shape {i} {o:?}: dense rel_rms {err:.3e}");
        }
    }
}

#[test]
fn compressed_path_equals_attention_over_decoded_vectors() {
    for (i, &(lens, tq, hq, hkv, d)) in SHAPES.iter().enumerate() {
        for (bits_k, bits_v) in [(4, 2), (3, 3), (8, 4), (2, 8)] {
            let case = Case::new(lens, tq, hq, hkv, d, 200 + i as u64);
            let mut scheme = KvScheme::new(d, hkv, bits_k, bits_v);
            scheme.seed = i as u64;
            if i % 2 == 1 {
                scheme.norm_dtype = NormDType::F16;
            }
            let cache = case.compressed(scheme, if i == 0 { 1 } else { 50 });
            let ideal = case.decoded_reference(&cache);
            for o in [
                opts(512, None, true),
                opts(48, Some(3), true),
                opts(100, None, false),
            ] {
                let out = attend_compressed(&cache, &case.q, tq, hq, case.scale, &o).unwrap();
                let err = rel_rms(&out, &ideal);
                assert!(
                    err < 5e-6,
                    "shape {i} bits {bits_k}/{bits_v} {o:?}: vs decoded oracle {err:.3e}"
                );
            }
        }
    }
}

#[test]
fn every_simd_level_equals_attention_over_decoded_vectors() {
    // The AVX2 build and the AVX-512 builds (plain and with VBMI, where the CPU has them) of
    // the compressed and dense paths, at every code width they decode in registers and at d
    // both a multiple of 16 and not (72, 100: the AVX-512 kernels decline and the AVX2 ones
    // run).
    use deltakv_cpu::simd::{SimdLimit, set_simd_limit};
    for limit in [SimdLimit::Avx2, SimdLimit::Avx512, SimdLimit::Any] {
        set_simd_limit(limit);
        for (i, &(lens, tq, hq, hkv, d)) in SHAPES.iter().enumerate() {
            let case = Case::new(lens, tq, hq, hkv, d, 700 + i as u64);
            let dense = attend_dense(
                &case.dense(),
                &case.q,
                tq,
                hq,
                case.scale,
                &opts(64, None, true),
            );
            let err = rel_rms(&dense.unwrap(), &case.reference());
            assert!(err < 2e-6, "{limit:?} shape {i}: dense rel_rms {err:.3e}");
            for (bits_k, bits_v, book) in [
                (4, 2, CodebookKind::LloydMax),
                (3, 4, CodebookKind::LloydMax),
                (2, 3, CodebookKind::LloydMax),
                (4, 3, CodebookKind::Aura),
                (8, 2, CodebookKind::LloydMax),
            ] {
                let mut scheme = KvScheme::new(d, hkv, bits_k, bits_v);
                scheme.codebook = book;
                let cache = case.compressed(scheme, 37);
                let out =
                    attend_compressed(&cache, &case.q, tq, hq, case.scale, &opts(96, None, true));
                let err = rel_rms(&out.unwrap(), &case.decoded_reference(&cache));
                assert!(
                    err < 5e-6,
                    "{limit:?} shape {i} bits {bits_k}/{bits_v} {book:?}: vs decoded oracle {err:.3e}"
                );
            }
        }
    }
    set_simd_limit(SimdLimit::Any);
}

#[test]
fn output_does_not_depend_on_block_size() {
    let case = Case::new(&[1000, 333], 4, 8, 2, 128, 9);
    let cache = case.compressed(KvScheme::new(128, 2, 4, 2), 256);
    let base =
        attend_compressed(&cache, &case.q, 4, 8, case.scale, &opts(512, None, true)).unwrap();
    let base64: Vec<f64> = base.iter().map(|&x| f64::from(x)).collect();
    for block in [1, 7, 32, 100, 256, 1024, 4096] {
        for splits in [None, Some(1), Some(5)] {
            let out = attend_compressed(
                &cache,
                &case.q,
                4,
                8,
                case.scale,
                &opts(block, splits, true),
            )
            .unwrap();
            let err = rel_rms(&out, &base64);
            assert!(err < 1e-6, "block {block} splits {splits:?}: {err:.3e}");
        }
    }
}

#[test]
fn eight_bit_error_is_below_one_percent() {
    for (i, &(lens, tq, hq, hkv, d)) in SHAPES.iter().enumerate() {
        let case = Case::new(lens, tq, hq, hkv, d, 300 + i as u64);
        let cache = case.compressed(KvScheme::new(d, hkv, 8, 8), 64);
        let out = attend_compressed(&cache, &case.q, tq, hq, case.scale, &AttnOptions::default())
            .unwrap();
        let err = rel_rms(&out, &case.reference());
        assert!(err < 0.01, "shape {i}: 8/8 rel_rms {err:.3e}");
    }
}

#[test]
fn poisoned_outputs_are_all_written() {
    // The output buffer starts as NaN; a NaN anywhere would make rel_rms infinite.
    let case = Case::new(&[5, 9, 1], 1, 4, 2, 64, 4);
    let cache = case.compressed(KvScheme::new(64, 2, 2, 2), 1);
    let out =
        attend_compressed(&cache, &case.q, 1, 4, case.scale, &opts(2, Some(4), true)).unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
    let err = rel_rms(&out, &case.decoded_reference(&cache));
    assert!(err < 5e-6, "{err:.3e}");
}

#[test]
fn chunk_form_equals_token_by_token_decode() {
    // Query i of a causal chunk equals a decode step after appending tokens 0..=T-Tq+i.
    let (lens, tq, hq, hkv, d) = (&[120usize][..], 5, 8, 2, 96);
    let case = Case::new(lens, tq, hq, hkv, d, 77);
    let scheme = KvScheme::new(d, hkv, 4, 2);
    let full = case.compressed(scheme, 1);
    let chunk =
        attend_compressed(&full, &case.q, tq, hq, case.scale, &opts(32, None, true)).unwrap();
    let row = hkv * d;
    let t = lens[0];
    let mut cache = KvCache::new(scheme, 1).unwrap();
    cache
        .append(
            0,
            &case.keys[0][..(t - tq) * row],
            &case.values[0][..(t - tq) * row],
        )
        .unwrap();
    for i in 0..tq {
        let r = (t - tq + i) * row..(t - tq + i + 1) * row;
        cache
            .append(0, &case.keys[0][r.clone()], &case.values[0][r])
            .unwrap();
        let qi = &case.q[i * hq * d..(i + 1) * hq * d];
        let step = attend_compressed(&cache, qi, 1, hq, case.scale, &opts(32, None, true)).unwrap();
        let want: Vec<f64> = chunk[i * hq * d..(i + 1) * hq * d]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let err = rel_rms(&step, &want);
        assert!(err < 1e-6, "query {i}: {err:.3e}");
    }
}
