//! `deltakv kv`: encode k and v into the compressed KV cache (or a dense f32 one with
//! `--exact`), attend with q causally, and write `o` plus the cache size.

use super::DeviceArg;
use clap::{Args, ValueEnum};
use deltakv::io::TensorFile;
use deltakv::kv::{AttnOptions, CodebookKind, KvInputs, KvMode, KvOptions, NormDType};
use deltakv::{Result, kv_attention};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum NormArg {
    #[default]
    F32,
    F16,
}

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum CodebookArg {
    /// Lloyd-Max levels for the coordinate law at this head dim.
    #[default]
    LloydMax,
    /// AURA's published d=128 tables (scaled by sqrt(128/d) at other d; for compatibility).
    Aura,
}

#[derive(Args, Debug)]
pub struct KvArgs {
    /// Input safetensors: q [B,Tq,Hq,D], k and v [B,T,Hkv,D] (f32, f16 or bf16); optional
    /// seq_lens [B] (i32/i64, each in Tq..=T) for a ragged batch padded to T; metadata
    /// `scale` (default D^-0.5). Query i of sequence b sits at position L_b - Tq + i, with
    /// L_b = seq_lens[b] (or T).
    #[arg(long)]
    pub input: PathBuf,
    /// Output safetensors: o [B,Tq,Hq,D] f32, metadata `cache_bytes` and `mode`. Must not be
    /// the input file.
    #[arg(long)]
    pub output: PathBuf,
    /// Key bits (2, 3, 4 or 8).
    #[arg(long, default_value_t = 4, conflicts_with = "exact")]
    pub bits_k: u32,
    /// Value bits (2, 3, 4 or 8).
    #[arg(long, default_value_t = 2, conflicts_with = "exact")]
    pub bits_v: u32,
    /// Exact attention over a dense f32 cache instead.
    #[arg(long)]
    pub exact: bool,
    /// Seed of the layer's rotation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Storage of the per-vector norms.
    #[arg(long, value_enum, default_value_t)]
    pub norms: NormArg,
    /// Codebook of the scalar codes.
    #[arg(long, value_enum, default_value_t)]
    pub codebook: CodebookArg,
    /// Tokens per flash-decoding block (split-K work unit; changes speed, not results beyond
    /// f32 rounding; 1 to 65536). The GPU backends choose their own blocks.
    #[arg(long, default_value_t = 512, value_parser = parse_block_tokens)]
    pub block_tokens: usize,
    /// Where to run: cpu (always built); cuda (with `--features cuda`) or wgpu (with
    /// `--features wgpu`): the compressed path, encoded into a paged cache on the device.
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
}

const REQUIRED: [&str; 3] = ["q", "k", "v"];
const OPTIONAL: [&str; 1] = ["seq_lens"];
const METADATA: [&str; 1] = ["scale"];

pub fn options(args: &KvArgs) -> KvOptions {
    KvOptions {
        mode: if args.exact {
            KvMode::Exact
        } else {
            KvMode::Compressed {
                bits_k: args.bits_k,
                bits_v: args.bits_v,
            }
        },
        seed: args.seed,
        norm_dtype: match args.norms {
            NormArg::F32 => NormDType::F32,
            NormArg::F16 => NormDType::F16,
        },
        codebook: match args.codebook {
            CodebookArg::LloydMax => CodebookKind::LloydMax,
            CodebookArg::Aura => CodebookKind::Aura,
        },
        attn: AttnOptions {
            block_tokens: args.block_tokens,
            ..AttnOptions::default()
        },
    }
}

/// `--block-tokens`: 1 ..= `MAX_BLOCK_TOKENS`, refused when parsed, before any file is read.
pub fn parse_block_tokens(text: &str) -> std::result::Result<usize, String> {
    let tokens: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of tokens"))?;
    if !(1..=deltakv::kv::MAX_BLOCK_TOKENS).contains(&tokens) {
        return Err(format!(
            "{tokens} is outside 1..={}",
            deltakv::kv::MAX_BLOCK_TOKENS
        ));
    }
    Ok(tokens)
}

pub fn run(args: KvArgs) -> Result<()> {
    let device: deltakv::Device = args.device.into();
    device.ensure_runs("compressed-KV attention")?;
    super::files::check_output(&args.input, &args.output)?;
    let file = TensorFile::load_named(&args.input, &REQUIRED, &OPTIONAL)?;
    super::files::warn_ignored(&file, &METADATA);
    let inputs = KvInputs {
        q: file.require("q")?,
        k: file.require("k")?,
        v: file.require("v")?,
        seq_lens: file.get("seq_lens"),
        scale: file.metadata_f32("scale")?,
    };
    let options = options(&args);
    let started = Instant::now();
    let out = kv_attention(device, &inputs, &options)?;
    let elapsed = started.elapsed();
    let shape = out.o.shape().to_vec();
    let mut result = TensorFile::new();
    result.insert("o", out.o);
    result
        .metadata
        .insert("cache_bytes".into(), out.cache_bytes.to_string());
    let mode = match options.mode {
        KvMode::Exact => "exact f32".to_string(),
        KvMode::Compressed { bits_k, bits_v } => format!("{bits_k}/{bits_v}-bit"),
    };
    result.metadata.insert("mode".into(), mode.clone());
    result.save(&args.output)?;
    println!(
        "wrote {}: o {:?}, {mode} cache {} bytes (encode + attend on {device} in {:.1} ms)",
        args.output.display(),
        shape,
        out.cache_bytes,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
