//! `deltakv bench gdn` (decode part): latency of one decode call at the Qwen3-Next shape
//! (Hg = 16, H = 32, K = V = 128) for batch sizes B, with a pool of B slots kept resident and
//! updated in place call after call, as in a serving loop.
//!
//! `state GB/s` counts the pool bytes a call must move at least once (each addressed slot read
//! and written once), so it shows whether the state is touched once per call.

use super::median_ms;
use deltakv::gdn::DecodeOptions;
use deltakv::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv::{DType, Device, Result, gdn_decode, gdn_decode_into};
use serde_json::json;
use std::time::{Duration, Instant};

/// (name, Hg, H, K, V) of the decode shape.
const SHAPE: (&str, usize, usize, usize, usize) = ("qwen3-next", 16, 32, 128, 128);

/// Refuses a batch size of 0 (`--decode-batches`).
pub fn check_batches(batches: &[usize]) -> Result<()> {
    match batches.iter().find(|&&b| b == 0) {
        Some(bad) => Err(deltakv::Error::InvalidValue(format!(
            "--decode-batches: sizes must be at least 1, got {bad}"
        ))),
        None => Ok(()),
    }
}

/// The benchmark's problem: Qwen3-Next's shape, a pool of exactly B slots, raw q/k (the
/// kernel normalises), fused gating; the same on every device.
pub fn bench_case(batch: usize, tokens: usize, pool_dtype: DType) -> Result<DecodeCase> {
    let (_, key_heads, value_heads, key_dim, value_dim) = SHAPE;
    let mut spec = DecodeSpec::new(batch, tokens, key_heads, value_heads, key_dim, value_dim);
    spec.slots = batch;
    spec.pool_dtype = pool_dtype;
    spec.raw_qk = true;
    spec.fused_gating = true;
    DecodeCase::random(&spec, 42)
}

/// Times decode at each batch size (T = 1 with f32 and bf16 pools; and T = 4 with intermediate
/// states at the smallest batch), prints a table and appends JSON records.
pub fn run(device: Device, batches: &[usize], records: &mut Vec<serde_json::Value>) -> Result<()> {
    device.ensure_available()?;
    check_batches(batches)?;
    let (shape, key_heads, value_heads, key_dim, value_dim) = SHAPE;
    let mut cases = Vec::new();
    for &batch in batches {
        cases.push((batch, 1, DType::F32, false));
        cases.push((batch, 1, DType::BF16, false));
    }
    if let Some(&smallest) = batches.iter().min() {
        cases.push((smallest, 4, DType::F32, true));
    }
    if device != Device::Cpu && batches.contains(&64) && batches.iter().min() != Some(&64) {
        // The GPU also reports speculative decoding at B = 64: T = 4 with intermediate states.
        cases.push((64, 4, DType::F32, true));
    }
    if device == Device::Cuda {
        #[cfg(feature = "cuda")]
        for line in super::gdn_decode_cuda::run(SHAPE, &cases, records)? {
            println!("{line}");
        }
        return Ok(());
    }
    if device == Device::Wgpu {
        #[cfg(feature = "wgpu")]
        for line in super::gdn_decode_wgpu::run(SHAPE, &cases, records)? {
            println!("{line}");
        }
        return Ok(());
    }
    let mut lines = Vec::new();
    let bar = super::progress(cases.len());
    for (batch, tokens, pool_dtype, intermediate) in cases {
        bar.set_message(format!("decode B={batch} T={tokens} pool {pool_dtype}"));
        let case = bench_case(batch, tokens, pool_dtype)?;
        let inputs = case.inputs()?;
        let mut pool = case.state_pool.clone();
        let options = DecodeOptions {
            gdn: deltakv::gdn::GdnOptions {
                scale: None,
                use_qk_l2norm: true,
            },
            intermediate_states: intermediate,
        };
        // With intermediate states the call writes B * T full states: it goes through
        // `gdn_decode_into` with buffers reused call after call, as a serving loop would.
        let dims = (batch * tokens * value_heads, key_dim * value_dim);
        let mut o = vec![0.0f32; dims.0 * value_dim];
        let mut states = vec![0.0f32; if intermediate { dims.0 * dims.1 } else { 0 }];
        let mut call = |pool: &mut deltakv::HostTensor| -> Result<()> {
            if intermediate {
                gdn_decode_into(
                    device,
                    &inputs,
                    pool,
                    &options.gdn,
                    &mut o,
                    Some(&mut states),
                )
                .map(drop)
            } else {
                gdn_decode(device, &inputs, pool, &options).map(drop)
            }
        };
        // Short calls are timed in back-to-back groups of `reps` (about 2 ms per sample, as a
        // serving loop issues them), so the median is not one call's timer and wake-up noise.
        for _ in 0..3 {
            call(&mut pool)?;
        }
        let started = Instant::now();
        call(&mut pool)?;
        let once = started.elapsed().as_secs_f64();
        let reps = ((2e-3 / once) as usize).clamp(1, 100);
        let ms = median_ms(5, Duration::from_secs(1), || {
            for _ in 0..reps {
                call(&mut pool)?;
            }
            Ok(())
        })? / reps as f64;
        let us = ms * 1e3;
        let pool_bytes =
            (batch * value_heads * key_dim * value_dim * pool_dtype.size_in_bytes()) as f64;
        let state_gb_s = 2.0 * pool_bytes / (ms / 1e3) / 1e9;
        let per_token_us = us / tokens as f64;
        lines.push(format!(
            "{shape:<12} B={batch:<4} T={tokens:<2} pool {pool_dtype:<4} {:<13} {us:>10.1} us/call {per_token_us:>10.1} us/token {state_gb_s:>7.1} state GB/s",
            if intermediate { "+intermediate" } else { "" }
        ));
        records.push(json!({
            "op": "gdn_decode", "device": device.name(), "shape": shape, "B": batch, "T": tokens,
            "Hg": key_heads, "H": value_heads, "K": key_dim, "V": value_dim, "dtype": "bf16",
            "pool_dtype": pool_dtype.to_string(), "intermediate_states": intermediate,
            "fused_gating": true, "use_qk_l2norm": true, "median_ms": ms, "calls_per_sample": reps,
            "us_per_token": per_token_us, "state_gb_per_s": state_gb_s,
            "threads": rayon::current_num_threads(),
        }));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "GDN decode on {device}, {} threads, bf16 q/k/v, fused gating, l2 norm, pool of B slots updated in place; median over samples of back-to-back calls (~2 ms each), per call",
        rayon::current_num_threads()
    );
    for line in lines {
        println!("{line}");
    }
    Ok(())
}
