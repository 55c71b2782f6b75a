//! `deltakv bench ...`: timing harness shared by the per-op benchmarks, JSON records and the
//! progress bar.

mod gdn;
mod gdn_decode;
#[cfg(feature = "cuda")]
mod gdn_decode_cuda;
#[cfg(feature = "wgpu")]
mod gdn_decode_wgpu;
#[cfg(feature = "cuda")]
mod gdn_prefill_cuda;
#[cfg(feature = "wgpu")]
mod gdn_prefill_wgpu;
mod kv;
#[cfg(feature = "cuda")]
mod kv_cuda;
#[cfg(feature = "wgpu")]
mod kv_wgpu;

use clap::{Args, Subcommand};
use deltakv::{Error, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub op: BenchOp,
}

#[derive(Subcommand, Debug)]
pub enum BenchOp {
    /// GDN prefill (chunk and recurrent) at Qwen3-Next and Qwen3.5 shapes, then GDN decode
    /// (one step over a resident state pool) at the Qwen3-Next shape.
    Gdn(gdn::GdnBenchArgs),
    /// Compressed-KV encode and decode attention vs the exact f32 path.
    Kv(kv::KvBenchArgs),
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.op {
        BenchOp::Gdn(a) => gdn::run(a),
        BenchOp::Kv(a) => kv::run(a),
    }
}

/// Runs `work` once to warm up, then until both `min_runs` runs and `min_time` have passed
/// (capped at 50 runs); returns the median wall time in milliseconds.
pub fn median_ms(
    min_runs: usize,
    min_time: Duration,
    mut work: impl FnMut() -> Result<()>,
) -> Result<f64> {
    work()?;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < min_runs || (started.elapsed() < min_time && times.len() < 50) {
        let t = Instant::now();
        work()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// A progress bar over `total` benchmark cases (hidden when stderr is not a terminal).
pub fn progress(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar
}

/// Writes benchmark records as a JSON list (atomically: a failed write leaves an existing
/// file as it was).
pub fn write_json(path: &Path, records: &[serde_json::Value]) -> Result<()> {
    let text =
        serde_json::to_string_pretty(records).map_err(|e| Error::InvalidValue(e.to_string()))?;
    deltakv::io::write_atomically(path, (text + "\n").as_bytes())
}

/// `--json FILE` shared by the benches.
#[derive(Args, Debug, Clone)]
pub struct JsonArg {
    /// Also write the results as a JSON list of records to FILE (its directory must exist;
    /// checked before any run).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl JsonArg {
    /// Fails now, before minutes of timing, when the JSON file could not be written.
    pub fn check(&self) -> Result<()> {
        match &self.json {
            Some(path) => crate::cli::files::check_creatable("--json", path),
            None => Ok(()),
        }
    }
}
