//! `deltakv bench gdn`: prefill throughput at model shapes, then decode latency
//! (`gdn_decode.rs`). Every argument is checked before the first run.
//!
//! GFLOP/s counts each algorithm's own multiply-adds (2 flops each): the recurrent step does
//! three K x V sweeps per token and head (S^T k and S^T q, then the update); the chunked path's
//! count is that of its dense 64-token products and the triangular inverse.

use super::{JsonArg, median_ms, progress, write_json};
use crate::cli::DeviceArg;
use clap::Args;
use deltakv::gdn::prefill::checkpoint::check_checkpoint_every;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnOptions, PrefillMode};
use deltakv::{Device, Result, gdn_prefill_checkpointed};
use serde_json::json;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct GdnBenchArgs {
    /// Where to run: cpu (always built), cuda (built with the `cuda` feature: the prefill at
    /// the serving shapes, then at --seq-lens), wgpu (built with the `wgpu` feature: the
    /// prefill in each of --modes at --seq-lens).
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
    /// Prompt lengths to time (prefill).
    #[arg(long, value_delimiter = ',', default_value = "512,4096,16384")]
    pub seq_lens: Vec<usize>,
    /// Which prefill algorithms to time (chunk, recurrent).
    #[arg(long, value_delimiter = ',', default_value = "chunk,recurrent")]
    pub modes: Vec<super::super::gdn::ModeArg>,
    /// Batch sizes for the decode benchmark that follows the prefill one (one decode step,
    /// pool of B slots).
    #[arg(long, value_delimiter = ',', default_value = "1,32,256")]
    pub decode_batches: Vec<usize>,
    /// Also time each chunked prefill with state checkpoints every N tokens (a positive
    /// multiple of 64), beside the prefill without them.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Which serving shapes `--device cuda` times before --seq-lens (K = V = 128): t16384
    /// (B 1, Hg 16, H 32), tp8 (B 1, T 65536, Hg 2, H 8), b8 (B 8, T 8192, Hg 16, H 32),
    /// t4096 (B 1, Hg 16, H 32), or none.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "t16384,tp8,b8,t4096"
    )]
    pub serving: Vec<ServingArg>,
    #[command(flatten)]
    pub json: JsonArg,
}

/// A serving shape of `--serving` (the rows of [`SERVING_SHAPES`], in order), or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServingArg {
    T16384,
    Tp8,
    B8,
    T4096,
    None,
}

/// (name, Hg, H, K, V) of the model shapes benchmarked.
pub const SHAPES: [(&str, usize, usize, usize, usize); 2] = [
    ("qwen3-next", 16, 32, 128, 128),
    ("qwen3.5-27b", 16, 48, 128, 128),
];

/// One prefill problem: (name, B, T, Hg, H, K, V).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub type PrefillShape = (&'static str, usize, usize, usize, usize, usize, usize);

/// The shapes of the comparison with FLA and FlashInfer (K = V = 128).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub const SERVING_SHAPES: [PrefillShape; 4] = [
    ("qwen3-next", 1, 16384, 16, 32, 128, 128),
    ("tp8-shard", 1, 65536, 2, 8, 128, 128),
    ("qwen3-next", 8, 8192, 16, 32, 128, 128),
    ("qwen3-next", 1, 4096, 16, 32, 128, 128),
];

/// The serving shapes `--serving` names, in the table's order; `none` alone names none.
#[cfg(feature = "cuda")]
fn serving_shapes(names: &[ServingArg]) -> Result<Vec<PrefillShape>> {
    if names.contains(&ServingArg::None) && names.len() > 1 {
        return Err(deltakv::Error::InvalidValue(
            "--serving: `none` cannot be combined with shapes".into(),
        ));
    }
    let order = [
        ServingArg::T16384,
        ServingArg::Tp8,
        ServingArg::B8,
        ServingArg::T4096,
    ];
    Ok(order
        .iter()
        .zip(SERVING_SHAPES)
        .filter(|(name, _)| names.contains(name))
        .map(|(_, shape)| shape)
        .collect())
}

/// Nominal flops of a prefill of `tokens` tokens per value head.
pub fn prefill_flops(mode: PrefillMode, tokens: usize, key_dim: usize, value_dim: usize) -> f64 {
    let (t, k, v) = (tokens as f64, key_dim as f64, value_dim as f64);
    match mode {
        PrefillMode::Recurrent => 2.0 * 3.0 * k * v * t,
        PrefillMode::Chunk => {
            let c = 64.0f64;
            let chunks = t / c;
            // A, W, Q K^T over K; U, scores.V' over V; three c x K x V products; the inverse.
            chunks * 2.0 * (3.0 * c * c * k + 2.0 * c * c * v + 3.0 * c * k * v + c * c * c / 6.0)
        }
    }
}

pub fn run(args: GdnBenchArgs) -> Result<()> {
    let device: Device = args.device.into();
    device.ensure_available()?;
    let seq_lens = args.seq_lens.clone();
    if let Some(bad) = seq_lens.iter().find(|&&t| t == 0) {
        return Err(deltakv::Error::InvalidValue(format!(
            "--seq-lens: lengths must be at least 1, got {bad}"
        )));
    }
    super::gdn_decode::check_batches(&args.decode_batches)?;
    if let Some(every) = args.checkpoint_every {
        check_checkpoint_every(every)?;
    }
    args.json.check()?;
    let mut records = Vec::new();
    match device {
        Device::Cpu => prefill(&args, &seq_lens, &mut records)?,
        #[cfg(feature = "cuda")]
        Device::Cuda => {
            // The serving shapes asked for, then Qwen3-Next's shape at each --seq-lens length.
            let mut shapes = serving_shapes(&args.serving)?;
            shapes.extend(
                seq_lens
                    .iter()
                    .map(|&t| ("qwen3-next", 1, t, 16, 32, 128, 128)),
            );
            for line in super::gdn_prefill_cuda::run(&shapes, args.checkpoint_every, &mut records)?
            {
                println!("{line}");
            }
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu => {
            let modes: Vec<PrefillMode> = args.modes.iter().map(|&m| m.into()).collect();
            super::gdn_prefill_wgpu::run(&seq_lens, &modes, args.checkpoint_every, &mut records)?;
        }
        #[allow(unreachable_patterns)] // with both GPU features every device is matched above
        _ => println!("GDN prefill on {device}: not implemented yet, skipped"),
    }
    super::gdn_decode::run(device, &args.decode_batches, &mut records)?;
    if let Some(path) = &args.json.json {
        write_json(path, &records)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Times the prefill at every shape, length and mode; prints a table and appends records.
fn prefill(
    args: &GdnBenchArgs,
    seq_lens: &[usize],
    records: &mut Vec<serde_json::Value>,
) -> Result<()> {
    let device = Device::Cpu;
    // Each mode, and the chunked one again with checkpoints where they are asked for.
    let runs: Vec<(PrefillMode, Option<usize>)> = args
        .modes
        .iter()
        .flat_map(|&mode_arg| {
            let mode = PrefillMode::from(mode_arg);
            let with_checkpoints = args.checkpoint_every.filter(|_| mode == PrefillMode::Chunk);
            std::iter::once((mode, None)).chain(with_checkpoints.map(|n| (mode, Some(n))))
        })
        .collect();
    let total = SHAPES.len() * seq_lens.len() * runs.len();
    let bar = progress(total);
    let mut lines = Vec::new();
    for (shape, key_heads, value_heads, key_dim, value_dim) in SHAPES {
        for &tokens in seq_lens {
            let case = GdnCase::random(
                &GdnSpec::new(tokens, key_heads, value_heads, key_dim, value_dim),
                42,
            )?;
            for &(mode, checkpoint_every) in &runs {
                bar.set_message(format!("{shape} T={tokens} {mode:?}"));
                let ms = median_ms(3, Duration::from_secs(2), || {
                    let options = GdnOptions::default();
                    gdn_prefill_checkpointed(
                        device,
                        &case.inputs(),
                        &options,
                        mode,
                        checkpoint_every,
                    )
                    .map(drop)
                })?;
                let label = match checkpoint_every {
                    Some(n) => format!("{mode:?}+ckpt{n}").to_lowercase(),
                    None => format!("{mode:?}").to_lowercase(),
                };
                let tokens_per_s = tokens as f64 / (ms / 1e3);
                let gflops = prefill_flops(mode, tokens, key_dim, value_dim) * value_heads as f64
                    / (ms / 1e3)
                    / 1e9;
                lines.push(format!(
                    "{shape:<12} {label:<9} T={tokens:<6} {ms:>10.2} ms {tokens_per_s:>12.0} tok/s {gflops:>7.1} GFLOP/s"
                ));
                records.push(json!({
                    "op": "gdn_prefill", "device": device.name(), "mode": format!("{mode:?}").to_lowercase(),
                    "checkpoint_every": checkpoint_every,
                    "shape": shape, "B": 1, "T": tokens, "Hg": key_heads, "H": value_heads,
                    "K": key_dim, "V": value_dim, "dtype": "bf16", "median_ms": ms,
                    "tokens_per_s": tokens_per_s, "gflop_per_s": gflops,
                    "threads": rayon::current_num_threads(),
                }));
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    println!(
        "GDN prefill on {device}, {} threads, bf16 inputs, median wall time",
        rayon::current_num_threads()
    );
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    #[test]
    fn serving_names_pick_rows_in_table_order() {
        let picked = serving_shapes(&[ServingArg::T4096, ServingArg::Tp8]).unwrap();
        assert_eq!(picked, vec![SERVING_SHAPES[1], SERVING_SHAPES[3]]);
        assert!(serving_shapes(&[ServingArg::None]).unwrap().is_empty());
        let err = serving_shapes(&[ServingArg::None, ServingArg::B8]).unwrap_err();
        assert!(err.to_string().contains("--serving"), "{err}");
    }
}
