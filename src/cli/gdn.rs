//! `deltakv gdn`: prefill over a safetensors file, writing `o` and `final_state`.

use super::DeviceArg;
use clap::{Args, ValueEnum};
use deltakv::gdn::prefill::checkpoint::check_checkpoint_every;
use deltakv::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv::io::TensorFile;
use deltakv::{Result, gdn_prefill_checkpointed};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum ModeArg {
    /// Chunked WY algorithm (fast for long prompts).
    #[default]
    Chunk,
    /// Token-by-token recurrence.
    Recurrent,
}

impl From<ModeArg> for PrefillMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Chunk => PrefillMode::Chunk,
            ModeArg::Recurrent => PrefillMode::Recurrent,
        }
    }
}

#[derive(Args, Debug)]
pub struct GdnArgs {
    /// Input safetensors: q, k [B,T,Hg,K]; v [B,T,H,V]; g, beta [B,T,H]; optional
    /// initial_state [N,H,K,V] f32 and cu_seqlens [N+1] i32/i64. Metadata: scale, use_qk_l2norm.
    #[arg(long)]
    pub input: PathBuf,
    /// Output safetensors: o [B,T,H,V] (v's dtype) and final_state [N,H,K,V] f32 (and the
    /// checkpoints when asked). Must not be
    /// the input file; written through a temporary file, so a failed run leaves nothing.
    #[arg(long)]
    pub output: PathBuf,
    /// Where to run: cpu (always built); cuda (with `--features cuda`); wgpu (with
    /// `--features wgpu`).
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
    /// Prefill algorithm: chunk (the fast WY path) or recurrent (token by token).
    #[arg(long, value_enum, default_value_t)]
    pub mode: ModeArg,
    /// Also write the state every N tokens of each sequence (N a positive multiple of 64):
    /// `checkpoints` [C,H,K,V] f32 and `checkpoint_offsets` [N+1] i64 (sequence n's are rows
    /// offsets[n]..offsets[n+1], at tokens N, 2N, ... of the sequence). cpu, and chunk mode
    /// on cuda and wgpu.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
}

const REQUIRED: [&str; 5] = ["q", "k", "v", "g", "beta"];
const OPTIONAL: [&str; 2] = ["initial_state", "cu_seqlens"];
/// Metadata keys read by `gdn` (and, with `intermediate_states`, `gdn-decode`).
pub const METADATA: [&str; 2] = ["scale", "use_qk_l2norm"];

/// Reads scale / use_qk_l2norm from the file's metadata.
pub fn options_from_metadata(file: &TensorFile) -> Result<GdnOptions> {
    Ok(GdnOptions {
        scale: file.metadata_f32("scale")?,
        use_qk_l2norm: file.metadata_bool("use_qk_l2norm")?.unwrap_or(false),
    })
}

pub fn run(args: GdnArgs) -> Result<()> {
    let device: deltakv::Device = args.device.into();
    device.ensure_runs("gdn prefill")?;
    if let Some(every) = args.checkpoint_every {
        check_checkpoint_every(every)?;
    }
    super::files::check_output(&args.input, &args.output)?;
    let file = TensorFile::load_named(&args.input, &REQUIRED, &OPTIONAL)?;
    super::files::warn_ignored(&file, &METADATA);
    let inputs = GdnInputs {
        q: file.require("q")?,
        k: file.require("k")?,
        v: file.require("v")?,
        g: file.require("g")?,
        beta: file.require("beta")?,
        initial_state: file.get("initial_state"),
        cu_seqlens: file.get("cu_seqlens"),
    };
    let options = options_from_metadata(&file)?;
    let started = Instant::now();
    let out = gdn_prefill_checkpointed(
        device,
        &inputs,
        &options,
        args.mode.into(),
        args.checkpoint_every,
    )?;
    let elapsed = started.elapsed();
    let mut result = TensorFile::new();
    let o_shape = out.o.shape().to_vec();
    let state_shape = out.final_state.shape().to_vec();
    result.insert("o", out.o);
    result.insert("final_state", out.final_state);
    let mut checkpoint_note = String::new();
    if let Some(checkpoints) = out.checkpoints {
        checkpoint_note = format!(
            ", checkpoints {:?} every {} tokens",
            checkpoints.states.shape(),
            checkpoints.every
        );
        result.insert("checkpoints", checkpoints.states);
        result.insert("checkpoint_offsets", checkpoints.offsets);
    }
    result.save(&args.output)?;
    println!(
        "wrote {}: o {:?}, final_state {:?}{checkpoint_note} ({:?} prefill on {device} in {:.1} ms)",
        args.output.display(),
        o_shape,
        state_shape,
        PrefillMode::from(args.mode),
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
