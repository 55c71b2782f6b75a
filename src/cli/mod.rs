//! Command-line definitions (clap) and dispatch. Each subcommand lives in its own module.

mod bench;
mod demo;
mod demo_decode;
mod demo_kv;
#[cfg(feature = "cuda")]
mod demo_kv_cuda;
#[cfg(feature = "wgpu")]
mod demo_kv_wgpu;
#[cfg(feature = "cuda")]
mod demo_prefill_cuda;
mod files;
mod gdn;
mod gdn_decode;
mod kv;

use clap::{Parser, Subcommand, ValueEnum};
use deltakv::{Device, Result};

#[derive(Parser, Debug)]
#[command(
    name = "deltakv",
    version,
    about = "Gated DeltaNet and compressed-KV attention kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The `--device` choices.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum DeviceArg {
    /// The CPU backend (always built; the numerical reference).
    #[default]
    Cpu,
    /// NVIDIA GPUs through CUDA (with `--features cuda`; otherwise answers "not available").
    Cuda,
    /// Vulkan / Metal through wgpu (with `--features wgpu`; otherwise answers "not
    /// available").
    Wgpu,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
            DeviceArg::Wgpu => Device::Wgpu,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// GDN prefill over a safetensors file (q, k, v, g, beta, [initial_state], [cu_seqlens]).
    Gdn(gdn::GdnArgs),
    /// GDN decode of 1..=16 tokens per row over a state pool in a safetensors file (q, k, v,
    /// g/beta or a/b/A_log/dt_bias, state_pool, slot_indices); writes o and the updated pool.
    GdnDecode(gdn_decode::GdnDecodeArgs),
    /// The main job: a Qwen3-Next GDN layer on random inputs, checked against the f64 oracle.
    Demo(demo::DemoArgs),
    /// Benchmarks (tokens/s, GFLOP/s), optionally written as JSON records.
    Bench(bench::BenchArgs),
    /// Attention over a compressed KV cache (q, k, v in a safetensors file; writes o).
    Kv(kv::KvArgs),
}

pub fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Gdn(args) => gdn::run(args),
        Command::GdnDecode(args) => gdn_decode::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Kv(args) => kv::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
