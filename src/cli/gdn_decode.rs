//! `deltakv gdn-decode`: one decode call over a safetensors file, writing `o`, the whole updated
//! `state_pool` and, when asked, `intermediate_states`.

use super::DeviceArg;
use super::gdn::{METADATA, options_from_metadata};
use clap::Args;
use deltakv::gdn::{DecodeInputs, DecodeOptions, GDN_OVERFLOW_CAUSE, Gating};
use deltakv::io::TensorFile;
use deltakv::tensor::check_result_finite;
use deltakv::{Result, gdn_decode};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct GdnDecodeArgs {
    /// Input safetensors: q, k [B,T,Hg,K]; v [B,T,H,V]; g, beta [B,T,H] or fused gating a, b
    /// [B,T,H] with A_log, dt_bias [H]; state_pool [S,H,K,V] f32/bf16; slot_indices [B] i32/i64
    /// (negative = skip). T <= 16. Metadata: scale, use_qk_l2norm, intermediate_states.
    #[arg(long)]
    pub input: PathBuf,
    /// Output safetensors: o [B,T,H,V] (v's dtype), state_pool (the whole updated pool, same
    /// dtype) and, with intermediate_states = true, intermediate_states [B,T,H,K,V] f32. Must
    /// not be the input file.
    #[arg(long)]
    pub output: PathBuf,
    /// Where to run: cpu (always built); cuda (with `--features cuda`) or wgpu (with
    /// `--features wgpu`).
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
}

/// The pool first: a file without it is not a decode input at all.
const REQUIRED: [&str; 5] = ["state_pool", "q", "k", "v", "slot_indices"];
/// Direct (g, beta) or fused (a, b, A_log, dt_bias) gating; `Gating::from_parts` picks.
const OPTIONAL: [&str; 6] = ["g", "beta", "a", "b", "A_log", "dt_bias"];

pub fn run(args: GdnDecodeArgs) -> Result<()> {
    let device: deltakv::Device = args.device.into();
    device.ensure_runs("gdn decode")?;
    super::files::check_output(&args.input, &args.output)?;
    let mut file = TensorFile::load_named(&args.input, &REQUIRED, &OPTIONAL)?;
    let metadata = [METADATA.as_slice(), &["intermediate_states"]].concat();
    super::files::warn_ignored(&file, &metadata);
    let options = DecodeOptions {
        gdn: options_from_metadata(&file)?,
        intermediate_states: file.metadata_bool("intermediate_states")?.unwrap_or(false),
    };
    // The pool is taken out of the file so it can be updated in place and written back whole.
    let mut pool = file
        .tensors
        .remove("state_pool")
        .ok_or_else(|| deltakv::Error::MissingTensor("state_pool".to_string()))?;
    // The kernel trusts the pool's values (a serving engine owns it); a file gets checked.
    pool.check_finite("state_pool")?;
    let inputs = DecodeInputs {
        q: file.require("q")?,
        k: file.require("k")?,
        v: file.require("v")?,
        gating: Gating::from_lookup(|name| file.get(name))?,
        slot_indices: file.require("slot_indices")?,
    };
    warn_if_every_row_skipped(inputs.slot_indices, options.intermediate_states)?;
    let started = Instant::now();
    let out = gdn_decode(device, &inputs, &mut pool, &options)?;
    let elapsed = started.elapsed();
    // The library checks o and the intermediate states; the pool goes to a file too.
    check_result_finite("state_pool", &pool, "s, h, k, v", GDN_OVERFLOW_CAUSE)?;
    let mut result = TensorFile::new();
    let o_shape = out.o.shape().to_vec();
    let pool_shape = pool.shape().to_vec();
    let pool_dtype = pool.dtype();
    result.insert("o", out.o);
    result.insert("state_pool", pool);
    let states = match out.intermediate_states {
        Some(states) => {
            let shape = format!(", intermediate_states {:?}", states.shape());
            result.insert("intermediate_states", states);
            shape
        }
        None => String::new(),
    };
    result.save(&args.output)?;
    println!(
        "wrote {}: o {:?}, state_pool {:?} {pool_dtype}{states} (decode of B = {}, T = {} on {device} in {:.3} ms)",
        args.output.display(),
        o_shape,
        pool_shape,
        o_shape[0],
        o_shape[1],
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

/// A call whose every row is skipped (all slot indices negative) computes nothing: `o` and
/// any intermediate states are zeros and the pool is written back unchanged. That is valid
/// but rarely meant, so it gets a warning.
fn warn_if_every_row_skipped(
    slot_indices: &deltakv::HostTensor,
    intermediate_states: bool,
) -> Result<()> {
    let slots = slot_indices.to_i64_vec("slot_indices")?;
    if !slots.is_empty() && slots.iter().all(|&s| s < 0) {
        let states = if intermediate_states {
            ", intermediate_states"
        } else {
            ""
        };
        eprintln!(
            "warning: every slot index is negative, so every row is skipped: o{states} will be all zeros and state_pool unchanged"
        );
    }
    Ok(())
}
