//! `deltakv bench gdn --device wgpu` (prefill part): device time of one prefill at the model
//! shapes, inputs resident on the device (copies not counted): the median over samples of a
//! dispatch timed from submission to idle, for each of `--modes` (chunk: the two passes of
//! `chunks.wgsl`, each also timed alone, then the whole call again; recurrent: the token loop).
//! The model shapes at each `--seq-lens` length, then a tensor-parallel shard at 65536 tokens
//! (as `bench gdn --device cuda` runs it). With `--checkpoint-every N`, the chunked prefill
//! storing its state checkpoints too.

use super::gdn::{SERVING_SHAPES, SHAPES, prefill_flops};
use deltakv::Result;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnOptions, PrefillMode};
use deltakv::wgpu::Wgpu;
use deltakv::wgpu::gdn::{ChunkPasses, PreparedPrefill, StatePlan};
use deltakv::wgpu::timing::median_dispatch_us;
use serde_json::json;

/// Times the prefill at every shape and length; prints a table and appends records.
pub fn run(
    seq_lens: &[usize],
    modes: &[PrefillMode],
    checkpoint_every: Option<usize>,
    records: &mut Vec<serde_json::Value>,
) -> Result<()> {
    let wgpu = Wgpu::get()?;
    println!(
        "GDN prefill on wgpu ({}), bf16 inputs, inputs resident, median device time",
        wgpu.describe()
    );
    let mut runs: Vec<(&str, usize, usize, usize, usize, usize)> = Vec::new();
    for (shape, key_heads, value_heads, key_dim, value_dim) in SHAPES {
        for &tokens in seq_lens {
            runs.push((shape, tokens, key_heads, value_heads, key_dim, value_dim));
        }
    }
    // The tensor-parallel shard of the CUDA bench's serving shapes (few heads, a long prompt).
    for (shape, batch, tokens, key_heads, value_heads, key_dim, value_dim) in SERVING_SHAPES {
        if shape == "tp8-shard" && batch == 1 {
            runs.push((shape, tokens, key_heads, value_heads, key_dim, value_dim));
        }
    }
    for (shape, tokens, key_heads, value_heads, key_dim, value_dim) in runs {
        let case = GdnCase::random(
            &GdnSpec::new(tokens, key_heads, value_heads, key_dim, value_dim),
            42,
        )?;
        for &mode in modes {
            let name = format!("{mode:?}").to_lowercase();
            let prepared =
                PreparedPrefill::new(wgpu, &case.inputs(), &GdnOptions::default(), mode)?;
            // One call before the timed ones (besides the timer's own warm-up): the first
            // calls after new buffers are made can run several times slower.
            prepared.submit(wgpu, 1)?;
            let us = median_dispatch_us(wgpu, 1, 5, |n| prepared.submit(wgpu, n))?;
            let ms = us / 1e3;
            let tokens_per_s = tokens as f64 / (ms / 1e3);
            let gflops = prefill_flops(mode, tokens, key_dim, value_dim) * value_heads as f64
                / (ms / 1e3)
                / 1e9;
            println!(
                "{shape:<12} {name:<9} T={tokens:<6} {ms:>10.2} ms {tokens_per_s:>12.0} tok/s {gflops:>7.1} GFLOP/s"
            );
            // Read back once: a device fault shows here rather than passing unseen.
            prepared.outputs(wgpu)?;
            let mut passes = serde_json::Map::new();
            if mode == PrefillMode::Chunk {
                let mut parts = Vec::new();
                for (label, which) in [
                    ("prepare", ChunkPasses::Prepare),
                    ("state", ChunkPasses::State),
                ] {
                    let tile = std::cell::Cell::new(None);
                    let us = median_dispatch_us(wgpu, 1, 3, |n| {
                        tile.set(prepared.submit_pass(wgpu, n, which)?);
                        Ok(())
                    })?;
                    if let Some(tile) = tile.get() {
                        parts.push(format!("{label} {:.2} ms", us / 1e3));
                        passes.insert(format!("{label}_ms"), json!(us / 1e3));
                        passes.insert("state_tile".to_string(), json!(tile));
                    }
                }
                if !parts.is_empty() {
                    // The whole call once more, after the passes, with everything warm.
                    let again = median_dispatch_us(wgpu, 1, 5, |n| prepared.submit(wgpu, n))?;
                    parts.push(format!("whole call again {:.2} ms", again / 1e3));
                    passes.insert("again_ms".to_string(), json!(again / 1e3));
                    let kernel = prepared
                        .state_kernel()
                        .map(|k| format!("{k:?}").to_lowercase());
                    if let Some(kernel) = &kernel {
                        passes.insert("state_kernel".to_string(), json!(kernel));
                    }
                    let units = prepared.walk_units().unwrap_or(1);
                    passes.insert("walk_units".to_string(), json!(units));
                    println!(
                        "{:<12} passes (state kernel {}, {units} walk units): {}",
                        "",
                        kernel.unwrap_or_default(),
                        parts.join(", ")
                    );
                }
            }
            records.push(json!({
                "op": "gdn_prefill", "device": "wgpu", "adapter": wgpu.name(),
                "mode": name, "shape": shape, "B": 1, "T": tokens, "Hg": key_heads,
                "H": value_heads, "K": key_dim, "V": value_dim, "dtype": "bf16",
                "median_ms": ms, "tokens_per_s": tokens_per_s, "gflop_per_s": gflops,
                "passes": passes,
            }));
            if let Some(every) = checkpoint_every.filter(|_| mode == PrefillMode::Chunk) {
                let prepared = PreparedPrefill::checkpointed(
                    wgpu,
                    &case.inputs(),
                    &GdnOptions::default(),
                    mode,
                    &StatePlan::from_env_once()?,
                    Some(every),
                )?;
                prepared.submit(wgpu, 1)?;
                let us = median_dispatch_us(wgpu, 1, 5, |n| prepared.submit(wgpu, n))?;
                let with_ms = us / 1e3;
                prepared.outputs(wgpu)?;
                let units = prepared.walk_units().unwrap_or(1);
                println!(
                    "{:<12} with checkpoints every {every} tokens: {with_ms:.2} ms ({:+.1}%), {units} walk units",
                    "",
                    100.0 * (with_ms / ms - 1.0)
                );
                records.push(json!({
                    "op": "gdn_prefill", "device": "wgpu", "adapter": wgpu.name(),
                    "mode": name, "shape": shape, "B": 1, "T": tokens, "Hg": key_heads,
                    "H": value_heads, "K": key_dim, "V": value_dim, "dtype": "bf16",
                    "checkpoint_every": every, "median_ms": with_ms, "walk_units": units,
                }));
            }
        }
    }
    Ok(())
}
