//! The compressed-KV part of `deltakv demo`: one full-attention layer's decode step at 16k
//! context (Hq = 32, Hkv = 8, d = 128, keys with outlier channels and a shared offset),
//! 4-bit keys / 2-bit values against the exact f32 path and the f64 oracle.

use deltakv::kv::oracle::{OracleDims, attention_reference};
use deltakv::kv::random::{KvCase, KvSpec};
use deltakv::kv::{AttnOptions, DenseKvCache, KvCache, KvScheme, attend_compressed, attend_dense};
use deltakv::metrics::rel_rms;
use deltakv::{Error, Result};
use std::time::Instant;

fn median_ms(mut work: impl FnMut() -> Result<()>) -> Result<f64> {
    work()?;
    let mut times = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        work()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Largest rel_rms accepted for a kernel against the math it implements: the compressed
/// kernel against f64 attention over the decoded vectors, the exact f32 path against f64.
const KERNEL_RULE: f64 = 1e-5;

pub fn run(seed: u64) -> Result<()> {
    let (context, hq, hkv, d, bits_k, bits_v) = (16384, 32, 8, 128, 4, 2);
    println!();
    println!(
        "compressed KV: one attention layer's decode step, {context} cached tokens, Hq = {hq}, Hkv = {hkv}, d = {d}"
    );
    println!(
        "  keys with 4 outlier channels (x8) and a shared offset; {bits_k}-bit keys, {bits_v}-bit values, f32 norms"
    );
    let case = KvCase::random(KvSpec::outliers(1, 1, context, hq, hkv, d), seed);
    let t = Instant::now();
    let mut cache = KvCache::new(KvScheme::new(d, hkv, bits_k, bits_v), 1)?;
    cache.append(0, case.keys(0), case.values(0))?;
    let encode_s = t.elapsed().as_secs_f64();
    let mut dense = DenseKvCache::new(d, hkv, 1)?;
    dense.append(0, case.keys(0), case.values(0))?;
    let scale = 1.0 / (d as f32).sqrt();
    let opts = AttnOptions::default();
    let out = attend_compressed(&cache, &case.q, 1, hq, scale, &opts)?;
    let exact = attend_dense(&dense, &case.q, 1, hq, scale, &opts)?;
    let ms_c = median_ms(|| attend_compressed(&cache, &case.q, 1, hq, scale, &opts).map(drop))?;
    let ms_e = median_ms(|| attend_dense(&dense, &case.q, 1, hq, scale, &opts).map(drop))?;
    let reference = attention_reference(
        &case.q,
        &[case.keys(0)],
        &[case.values(0)],
        OracleDims { tq: 1, hq, hkv, d },
        scale,
    )?;
    // The ideal algorithm: exact f64 attention over the decoded (dequantised) vectors.
    let (mut dk, mut dv) = (Vec::new(), Vec::new());
    for t in 0..context {
        for h in 0..hkv {
            dk.extend(cache.decode_key(0, h, t)?);
            dv.extend(cache.decode_value(0, h, t)?);
        }
    }
    let ideal = attention_reference(
        &case.q,
        &[&dk],
        &[&dv],
        OracleDims { tq: 1, hq, hkv, d },
        scale,
    )?;
    let ideal_f32: Vec<f32> = ideal.iter().map(|&x| x as f32).collect();
    let err_ideal = rel_rms(&ideal_f32, &reference);
    let err_kernel = rel_rms(&out, &ideal);
    let err_c = rel_rms(&out, &reference);
    let err_e = rel_rms(&exact, &reference);
    let ratio = dense.bytes() as f64 / cache.bytes() as f64;
    println!(
        "encode: {context} tokens x {hkv} KV heads in {:.1} ms -> {:.0} tokens/s",
        encode_s * 1e3,
        context as f64 / encode_s
    );
    println!(
        "cache: {:.1} MiB compressed vs {:.1} MiB f32 -> {ratio:.1}x smaller ({} bytes per token per KV head)",
        cache.bytes() as f64 / (1 << 20) as f64,
        dense.bytes() as f64 / (1 << 20) as f64,
        cache.scheme().bytes_per_token_head()
    );
    println!(
        "decode attention: compressed {ms_c:.2} ms, exact f32 {ms_e:.2} ms -> {:.2}x faster",
        ms_e / ms_c
    );
    let verdict = |err: f64| if err < KERNEL_RULE { "PASS" } else { "FAIL" };
    println!(
        "codec loss (rel_rms against exact f64 attention; the scheme's accuracy, reported, not checked): {}/{}-bit kernel {err_c:.3}, ideal codec (f64 attention over the decoded vectors) {err_ideal:.3}",
        cache.scheme().bits_k,
        cache.scheme().bits_v
    );
    println!(
        "kernel checks (rule: rel_rms < {KERNEL_RULE:.0e}): compressed kernel against the ideal codec {err_kernel:.1e} {}, exact f32 path against exact f64 {err_e:.1e} {}",
        verdict(err_kernel),
        verdict(err_e)
    );
    let mut wide = KvCache::new(KvScheme::new(d, hkv, 8, 8), 1)?;
    wide.append(0, case.keys(0), case.values(0))?;
    let out8 = attend_compressed(&wide, &case.q, 1, hq, scale, &opts)?;
    println!(
        "  for comparison, 8-bit keys and values: rel_rms {:.4} against exact, cache {:.1}x smaller",
        rel_rms(&out8, &reference),
        dense.bytes() as f64 / wide.bytes() as f64
    );
    let ok = err_e < KERNEL_RULE && err_kernel < KERNEL_RULE && out.iter().all(|v| v.is_finite());
    #[cfg(feature = "cuda")]
    let ok = super::demo_kv_cuda::run(
        case.keys(0),
        case.values(0),
        &case.q,
        (context, hq, hkv, d),
        *cache.scheme(),
        &ideal,
        KERNEL_RULE,
    )? && ok;
    #[cfg(feature = "wgpu")]
    let ok = super::demo_kv_wgpu::run(
        case.keys(0),
        case.values(0),
        &case.q,
        (context, hq, hkv, d),
        *cache.scheme(),
        &ideal,
        KERNEL_RULE,
    )? && ok;
    println!(
        "summary (compressed KV): {} (both kernel checks) — {ratio:.1}x smaller cache, {:.2}x the exact path's speed",
        if ok { "PASS" } else { "FAIL" },
        ms_e / ms_c
    );
    if !ok {
        return Err(Error::InvalidValue(
            "compressed-KV demo check failed".into(),
        ));
    }
    Ok(())
}
