//! How the chunked prefill's state pass is shaped ([`StatePlan`]): its column tile, row groups,
//! kernels and segments, from the launcher's defaults or the environment variables below.

use deltakv_contract::{Error, Result, env};
use std::sync::OnceLock;

/// Set to 16 or 32, the environment variable that fixes the state pass's column tile (see
/// [`StatePlan::tile`]).
pub const TILE_ENV: &str = "DELTAKV_WGPU_PREFILL_TILE";

/// Set to 8, 16 or 32, the environment variable that fixes the state pass's row groups (see
/// [`StatePlan::row_groups`]).
pub const GROUPS_ENV: &str = "DELTAKV_WGPU_PREFILL_GROUPS";

/// Set to `general`, `staged`, `coop` or `one-pass`, the environment variable that picks
/// the state pass's kernel where more than one serves (see [`StateKernel`]).
pub const STATE_KERNEL_ENV: &str = "DELTAKV_WGPU_PREFILL_STATE";

/// Set to `general` or `staged`, the environment variable that picks the prepare pass's kernel
/// where more than one serves (see [`PrepareKernel`]).
pub const PREPARE_KERNEL_ENV: &str = "DELTAKV_WGPU_PREFILL_PREPARE";

/// Set to a number of chunks (at least 1), the environment variable that splits each sequence
/// longer than that into segments of at most that many chunks (see
/// [`StatePlan::segment_chunks`]).
pub const SEGMENT_ENV: &str = "DELTAKV_WGPU_PREFILL_SEGMENT_CHUNKS";

/// The kernel of the prepare pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrepareKernel {
    /// [`PrepareKernel::Staged`] where it serves, else [`PrepareKernel::General`].
    #[default]
    Auto,
    /// `gdn_chunk_prepare` (`chunks.wgsl`): every dtype and head size.
    General,
    /// `gdn_chunk_prepare_staged` (`chunks_prepare_staged.wgsl`): bf16 or f16 q, k and v, K
    /// and V even and at most 128; the chunk's rows read from memory once into workgroup
    /// memory, every product reading them there.
    Staged,
}

/// The kernel of the state pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateKernel {
    /// [`StateKernel::Staged`] where it serves, else [`StateKernel::General`].
    #[default]
    Auto,
    /// `gdn_chunk_state` (`chunks_state.wgsl`): any shape the launcher plans.
    General,
    /// `gdn_chunk_state_staged` (`chunks_state_staged.wgsl`): 16-column tiles, 32 row groups,
    /// K <= 128 and a multiple of 16; one chunk row and one 4-row block of S per thread in
    /// straight-line code, W, Qd and Kd staged in workgroup memory one or two phases ahead,
    /// taking turns in one buffer; W S and Qd S summed in two halves over K (29 KiB, eight
    /// barriers per chunk).
    Staged,
    /// `gdn_chunk_state_coop` (`chunks_state_coop.wgsl`): the products on cooperative matrices
    /// (tensor cores) from f16 halves, f32-accurate; only on a device opened with them
    /// (`DELTAKV_WGPU_COOP=1`, subgroups of 32), 16-column tiles, K = 64 or 128, V even. Never
    /// chosen by `Auto`: slower than [`StateKernel::Staged`] on the H100.
    Coop,
    /// No state pass: the one-pass kernel `chunk.wgsl` (the recurrence unrolled over chunks of
    /// 16 tokens, no scratch), run only when asked for (to test and time it; on lavapipe it
    /// loses the state past ~900 tokens of a sequence at K = 128). Where the two passes'
    /// scratch exceeds one storage binding, `Auto` runs the token loop instead. No checkpoints.
    OnePass,
}

/// How the state pass is shaped: the launcher's choice for each field left at `None` / `Auto`
/// (the default plan). The fields exist to time and test the other shapes; the prefill's public
/// entry points take the plan the environment variables above give, read once per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatePlan {
    /// Value columns per workgroup, 16 or 32; default: 16 where fewer than 256 workgroups of
    /// 32 columns would run or 32 row groups are asked for (and always for K > 128), else 32.
    pub tile: Option<usize>,
    /// Row groups, 8, 16 or 32 (threads = row groups x tile / 2, at most 256, so 32 groups
    /// only with 16-column tiles); default: 32 with 16-column tiles, else 16.
    pub row_groups: Option<usize>,
    /// The kernel; one asked for a shape it does not serve is an error at launch.
    pub kernel: StateKernel,
    /// The prepare pass's kernel; likewise an error at launch where it does not serve.
    pub prepare: PrepareKernel,
    /// Chunks per segment: each sequence of more chunks is split into near-equal segments of at
    /// most this many, walked at once (a two-level scan: each segment's map, then every
    /// segment's entry state, then the outputs; more workgroups for few long sequences, about
    /// twice the walk's products). `None` (the default): every sequence walked whole. A call
    /// whose segment buffers would not fit one binding walks its sequences whole.
    pub segment_chunks: Option<usize>,
    /// The most bytes of scratch the two passes may take; a call that needs more runs the
    /// token loop (`recurrent.wgsl`). `None` (the default): the adapter's largest storage
    /// binding. Lower it to test that fallback on any adapter.
    pub scratch_limit: Option<u64>,
}

impl StatePlan {
    /// The plan [`TILE_ENV`], [`GROUPS_ENV`], [`STATE_KERNEL_ENV`], [`PREPARE_KERNEL_ENV`] and
    /// [`SEGMENT_ENV`] give (unset or empty: the default), or an error naming a variable whose
    /// value is not one of its choices.
    pub fn from_env() -> Result<Self> {
        let number = |name: &str, choices: &[usize]| {
            env::number(
                name,
                |n| choices.contains(n),
                &format!("one of {choices:?}"),
            )
        };
        let kernel = env::choice(
            STATE_KERNEL_ENV,
            &[
                ("auto", StateKernel::Auto),
                ("general", StateKernel::General),
                ("staged", StateKernel::Staged),
                ("coop", StateKernel::Coop),
                ("one-pass", StateKernel::OnePass),
            ],
            StateKernel::Auto,
        )?;
        let prepare = env::choice(
            PREPARE_KERNEL_ENV,
            &[
                ("auto", PrepareKernel::Auto),
                ("general", PrepareKernel::General),
                ("staged", PrepareKernel::Staged),
            ],
            PrepareKernel::Auto,
        )?;
        let segment_chunks = env::number(
            SEGMENT_ENV,
            |&chunks: &usize| chunks >= 1,
            "a number of chunks, at least 1",
        )?;
        // The combination is checked where every plan is, at launch.
        Ok(StatePlan {
            tile: number(TILE_ENV, &[16, 32])?,
            row_groups: number(GROUPS_ENV, &[8, 16, 32])?,
            kernel,
            prepare,
            segment_chunks,
            scratch_limit: None,
        })
    }

    /// The plan of the environment, read once per process.
    pub fn from_env_once() -> Result<Self> {
        static PLAN: OnceLock<std::result::Result<StatePlan, String>> = OnceLock::new();
        PLAN.get_or_init(|| Self::from_env().map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::InvalidValue)
    }

    /// An error for a tile or row-group count outside the kernels' choices, or segments of no
    /// chunks.
    pub fn check(&self) -> Result<()> {
        if self.segment_chunks == Some(0) {
            return Err(Error::InvalidValue(
                "segments of the state pass take at least one chunk, got 0".into(),
            ));
        }
        if let Some(tile) = self.tile
            && !matches!(tile, 16 | 32)
        {
            return Err(Error::InvalidValue(format!(
                "the state pass takes 16- or 32-column tiles, got {tile}"
            )));
        }
        if let Some(groups) = self.row_groups
            && (!matches!(groups, 8 | 16 | 32) || (groups == 32 && self.tile == Some(32)))
        {
            return Err(Error::InvalidValue(format!(
                "the state pass takes 8, 16 or 32 row groups (32 only with 16-column tiles), got {groups}"
            )));
        }
        Ok(())
    }
}
