//! The prefill's `DELTAKV_PREFILL_*` switches (for experiments and comparisons: kernels, relay
//! and segments), read by `deltakv_contract::env` once per process.

use super::kernels::{MAX_PREPARE_GROUP, OutputStages, StatePass};
use super::plan::{RELAY_LEAD_SHARE, RELAY_MIN_CHUNKS, RelayRule};
use deltakv_contract::env;
use deltakv_contract::{Error, Result};
use std::sync::OnceLock;

/// The prefill's `DELTAKV_PREFILL_*` switches (for experiments and comparisons), read from the
/// environment once per process: each prepared call takes them from here rather than reading
/// seven variables again.
pub(super) struct Switches {
    pub prepare_group_limit: usize,
    /// The state pass asked for (`None`: the default).
    pub state_pass: Option<StatePass>,
    pub output_stages: OutputStages,
    /// `None`: the relay is off.
    pub relay: Option<RelayRule>,
    pub segment_chunks: Option<usize>,
    pub prepare_pair: bool,
}

/// The process's [`Switches`]; a value a switch does not take is the same error every call.
pub(super) fn switches() -> Result<&'static Switches> {
    static SWITCHES: OnceLock<std::result::Result<Switches, String>> = OnceLock::new();
    SWITCHES
        .get_or_init(|| {
            let read = || -> Result<Switches> {
                Ok(Switches {
                    prepare_group_limit: prepare_group_limit_from_env()?,
                    state_pass: state_pass_from_env()?,
                    output_stages: output_stages_from_env()?,
                    relay: relay_rule_from_env()?,
                    segment_chunks: segment_chunks_from_env()?,
                    prepare_pair: prepare_pair_from_env()?,
                })
            };
            read().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|message| Error::InvalidValue(message.clone()))
}

/// `DELTAKV_PREFILL_PREPARE_GROUP`: the most value heads per prepare block, 1 to
/// `MAX_PREPARE_GROUP` (for experiments: fewer heads per block make more, shorter blocks);
/// unset: `MAX_PREPARE_GROUP`.
fn prepare_group_limit_from_env() -> Result<usize> {
    let limit = env::number(
        "DELTAKV_PREFILL_PREPARE_GROUP",
        |limit| (1..=MAX_PREPARE_GROUP).contains(limit),
        &format!("1 to {MAX_PREPARE_GROUP} value heads per prepare block"),
    )?;
    Ok(limit.unwrap_or(MAX_PREPARE_GROUP))
}

/// The pass `DELTAKV_PREFILL_STATE` asks for (`None`: the default; see
/// [`super::kernels::state_pass_kind`]).
fn state_pass_from_env() -> Result<Option<StatePass>> {
    env::choice(
        "DELTAKV_PREFILL_STATE",
        &[
            ("auto", None),
            ("registers", None),
            ("overlap", Some(StatePass::Overlap)),
            ("lockstep", Some(StatePass::Lockstep)),
        ],
        None,
    )
}

fn output_stages_from_env() -> Result<OutputStages> {
    env::choice(
        "DELTAKV_PREFILL_OUTPUT_STAGES",
        &[
            ("auto", OutputStages::Auto),
            ("1", OutputStages::One),
            ("2", OutputStages::Two),
        ],
        OutputStages::Auto,
    )
}

/// `DELTAKV_PREFILL_RELAY`: `off`, or the relay's first-segment share in (0, 1), and
/// `DELTAKV_PREFILL_RELAY_MIN_CHUNKS`: sequences of at most that many chunks are not relayed
/// (both for experiments); unset: [`RELAY_LEAD_SHARE`] and [`RELAY_MIN_CHUNKS`].
fn relay_rule_from_env() -> Result<Option<RelayRule>> {
    let share = match env::text("DELTAKV_PREFILL_RELAY")? {
        None => RELAY_LEAD_SHARE,
        Some(text) if text == "off" => return Ok(None),
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|&share| share > 0.0 && share < 1.0)
            .ok_or_else(|| {
                Error::InvalidValue(format!(
                    "DELTAKV_PREFILL_RELAY={text}: expected `off` or a share strictly between 0 \
                     and 1"
                ))
            })?,
    };
    let min_chunks = env::number(
        "DELTAKV_PREFILL_RELAY_MIN_CHUNKS",
        |_: &usize| true,
        "a number of chunks",
    )?
    .unwrap_or(RELAY_MIN_CHUNKS);
    Ok(Some(RelayRule {
        min_chunks,
        ..RelayRule::share(share)
    }))
}

/// `DELTAKV_PREFILL_SEGMENT_CHUNKS`: a fixed segment length in chunks (for experiments).
fn segment_chunks_from_env() -> Result<Option<usize>> {
    env::number(
        "DELTAKV_PREFILL_SEGMENT_CHUNKS",
        |&chunks: &usize| chunks > 0,
        "a positive number of chunks",
    )
}

/// `DELTAKV_PREFILL_PREPARE_PAIR=off`: the register walks' prepare forms each head's A after
/// the previous head's inverse even where a block has at most two heads (the pair form's
/// timing against it in one binary); unset or `on`: the pair form there.
fn prepare_pair_from_env() -> Result<bool> {
    env::choice(
        "DELTAKV_PREFILL_PREPARE_PAIR",
        &[("on", true), ("off", false)],
        true,
    )
}
