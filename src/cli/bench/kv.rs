//! `deltakv bench kv`: encode throughput and decode-attention time over the compressed KV
//! cache against the exact path over an f32 cache, at growing context lengths.

use super::{JsonArg, median_ms, progress, write_json};
use crate::cli::DeviceArg;
use clap::Args;
use deltakv::kv::{AttnOptions, DenseKvCache, KvCache, KvScheme, attend_compressed, attend_dense};
use deltakv::rng::Rng;
use deltakv::{Device, Error, Result};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// Where to run: cpu (always built); cuda (with `--features cuda`: the paged cache on the
    /// GPU, GPU time from CUDA-graph replays, beside a device-to-device copy and a
    /// B = 8 x 8192-token encode); wgpu (with `--features wgpu`: the same on the wgpu device,
    /// time per dispatch from batched submissions, beside wgpu's own buffer copy).
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
    /// Context lengths (cached tokens per sequence) to time decode attention at.
    #[arg(long, value_delimiter = ',', default_value = "4096,16384,32768,131072")]
    pub contexts: Vec<usize>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Query heads.
    #[arg(long, default_value_t = 32)]
    pub hq: usize,
    /// KV heads.
    #[arg(long, default_value_t = 8)]
    pub hkv: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Bits per key coordinate in the compressed cache (2, 3, 4 or 8).
    #[arg(long, default_value_t = 4)]
    pub bits_k: u32,
    /// Bits per value coordinate in the compressed cache (2, 3, 4 or 8).
    #[arg(long, default_value_t = 2)]
    pub bits_v: u32,
    /// Tokens per flash-decoding block (1 to 65536; the CPU's, the GPU backends choose their
    /// own).
    #[arg(long, default_value_t = 512, value_parser = super::super::kv::parse_block_tokens)]
    pub block_tokens: usize,
    #[command(flatten)]
    pub json: JsonArg,
}

const CHUNK: usize = 4096;

/// Times `a` and `b` in alternation (so both see the same machine load), at least 7 rounds
/// and 2 s; returns (median ms of a, median ms of b, median of the per-round ratios b / a).
fn paired(
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64, f64)> {
    a()?;
    b()?;
    let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    while ta.len() < 7 || (started.elapsed() < Duration::from_secs(2) && ta.len() < 50) {
        let t = Instant::now();
        a()?;
        let ms_a = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        b()?;
        let ms_b = t.elapsed().as_secs_f64() * 1e3;
        ta.push(ms_a);
        tb.push(ms_b);
        ratios.push(ms_b / ms_a);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(&mut ta), median(&mut tb), median(&mut ratios)))
}

pub fn run(args: KvBenchArgs) -> Result<()> {
    let device: Device = args.device.into();
    device.ensure_runs("compressed-KV attention")?;
    let mut contexts = args.contexts.clone();
    contexts.sort_unstable();
    if contexts.is_empty() || contexts[0] == 0 || args.batch == 0 {
        return Err(Error::InvalidValue(
            "--contexts and --batch must be at least 1".into(),
        ));
    }
    let (b, hq, hkv, d) = (args.batch, args.hq, args.hkv, args.dim);
    if hkv == 0 || hq == 0 || !hq.is_multiple_of(hkv) {
        return Err(Error::InvalidValue(format!(
            "--hq {hq} must be a positive multiple of --hkv {hkv}"
        )));
    }
    let scheme = KvScheme::new(d, hkv, args.bits_k, args.bits_v);
    scheme.validate()?;
    args.json.check()?;
    #[cfg(feature = "cuda")]
    if device == Device::Cuda {
        let mut records = Vec::new();
        for line in super::kv_cuda::run(&args, &mut records)? {
            println!("{line}");
        }
        if let Some(path) = &args.json.json {
            write_json(path, &records)?;
            println!("wrote {}", path.display());
        }
        return Ok(());
    }
    #[cfg(feature = "wgpu")]
    if device == Device::Wgpu {
        let mut records = Vec::new();
        for line in super::kv_wgpu::run(&args, &mut records)? {
            println!("{line}");
        }
        if let Some(path) = &args.json.json {
            write_json(path, &records)?;
            println!("wrote {}", path.display());
        }
        return Ok(());
    }
    let mut cache = KvCache::new(scheme, b)?;
    let mut dense = DenseKvCache::new(d, hkv, b)?;
    let opts = AttnOptions {
        block_tokens: args.block_tokens,
        ..AttnOptions::default()
    };
    let bar = progress(1 + 2 * contexts.len());
    let mut rng = Rng::new(7);
    let row = hkv * d;

    // Encode throughput: CHUNK tokens (all KV heads, K and V) into a fresh cache.
    bar.set_message("encode");
    let k0 = rng.normal_vec(CHUNK * row, 1.0);
    let v0 = rng.normal_vec(CHUNK * row, 1.0);
    let encode_ms = median_ms(3, Duration::from_secs(2), || {
        let mut fresh = KvCache::new(scheme, 1)?;
        fresh.append(0, &k0, &v0)
    })?;
    let encode_tps = CHUNK as f64 / (encode_ms / 1e3);
    bar.inc(1);

    let q = rng.normal_vec(b * hq * d, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let mut lines = Vec::new();
    let mut records = Vec::new();
    let mut filled = 0;
    for &ctx in &contexts {
        bar.set_message(format!("fill {ctx}"));
        while filled < ctx {
            let n = CHUNK.min(ctx - filled);
            let k = rng.normal_vec(n * row, 1.0);
            let v = rng.normal_vec(n * row, 1.0);
            for s in 0..b {
                cache.append(s, &k, &v)?;
                dense.append(s, &k, &v)?;
            }
            filled += n;
        }
        bar.set_message(format!("ctx {ctx}"));
        let (ms_c, ms_e, ratio) = paired(
            || attend_compressed(&cache, &q, 1, hq, scale, &opts).map(drop),
            || attend_dense(&dense, &q, 1, hq, scale, &opts).map(drop),
        )?;
        bar.inc(2);
        let (bytes_c, bytes_e) = (cache.bytes(), dense.bytes());
        lines.push(format!(
            "ctx {ctx:>6}: compressed {:>1}/{:<1} {ms_c:>8.2} ms  exact f32 {ms_e:>8.2} ms  speedup {:>5.2}x  cache {:>7.1} MiB vs {:>7.1} MiB ({:.1}x smaller)",
            args.bits_k,
            args.bits_v,
            ratio,
            bytes_c as f64 / (1 << 20) as f64,
            bytes_e as f64 / (1 << 20) as f64,
            bytes_e as f64 / bytes_c as f64,
        ));
        records.push(json!({
            "op": "kv_decode_attention", "device": device.name(), "B": b, "context": ctx,
            "Hq": hq, "Hkv": hkv, "D": d, "bits_k": args.bits_k, "bits_v": args.bits_v,
            "block_tokens": args.block_tokens,
            "compressed_ms": ms_c, "exact_ms": ms_e, "speedup": ratio,
            "compressed_bytes": bytes_c, "exact_bytes": bytes_e,
            "threads": rayon::current_num_threads(),
        }));
    }
    bar.finish_and_clear();
    println!(
        "KV decode attention on {device}, {} threads: B={b} Hq={hq} Hkv={hkv} D={d}, {}/{}-bit codes + f32 norms vs f32 cache, median wall time (the two paths timed in alternation; speedup = median of per-round ratios)",
        rayon::current_num_threads(),
        args.bits_k,
        args.bits_v
    );
    println!(
        "encode: {CHUNK} tokens x {hkv} KV heads (K and V) in {encode_ms:.2} ms -> {encode_tps:.0} tokens/s"
    );
    for line in lines {
        println!("{line}");
    }
    records.push(json!({
        "op": "kv_encode", "device": device.name(), "tokens": CHUNK, "Hkv": hkv, "D": d,
        "bits_k": args.bits_k, "bits_v": args.bits_v, "median_ms": encode_ms, "tokens_per_s": encode_tps,
    }));
    if let Some(path) = &args.json.json {
        write_json(path, &records)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
