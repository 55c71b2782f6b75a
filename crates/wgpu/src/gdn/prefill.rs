//! GDN prefill on wgpu: a whole prompt through the gated delta rule, from optional initial
//! states to the final states, with FLA's semantics (GQA/GVA, any T, varlen `cu_seqlens`, l2
//! norm, K, V <= 256; see `deltakv_contract::gdn`).
//!
//! One workgroup per (sequence, value head, tile of columns), the tile's state in registers for
//! the whole sequence: `final_state` is seeded with the initial state (or zeros) and advanced
//! in place. [`PrefillMode::Chunk`] runs the two passes of `chunks.wgsl` (every chunk's WY
//! factors at once, then the state walk per (walk unit, head, column tile), a walk unit being a
//! sequence or, with segments, a segment of one; see `chunks.rs`),
//! or, where their scratch buffer would not fit one binding, the token loop of
//! `recurrent.wgsl` (`chunk.wgsl`, the recurrence unrolled over chunks of 16 tokens in one
//! pass, runs only where the plan asks for [`StateKernel::OnePass`]);
//! [`PrefillMode::Recurrent`] the token loop of `recurrent.wgsl`.
//!
//! State checkpoints and prefills over a device state pool are in `prefill_states.rs`.

use super::chunks::{
    ChunkCall, ChunkLaunch, ChunkPasses, StateKernel, StatePlan, check_chunk_plan,
    refuse_unstored_checkpoints,
};
use super::prefill_states::DeviceCheckpoints;
use super::recurrent::{Kernel, RecurrentCall, RecurrentLaunch, Rows};
use crate::runtime::Wgpu;
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::prefill::checkpoint::CheckpointPlan;
use deltakv_contract::gdn::prefill::validate::validate_prefill;
use deltakv_contract::gdn::{GDN_OVERFLOW_CAUSE, GdnInputs, GdnOptions, GdnOutput, PrefillMode};
use deltakv_contract::tensor::check_result_finite;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// Workgroups below which a call uses 16-column tiles instead of 64-column ones (four times the
/// workgroups, for the few long sequences of a prefill).
const NARROW_TILES_BELOW: usize = 1024;

enum Launch {
    Chunks(Box<ChunkLaunch>),
    Single(RecurrentLaunch),
}

/// A validated prefill with its inputs on the device: submitted once by [`gdn_prefill`], any
/// number of times by a benchmark (each submission advances the final states again).
pub struct PreparedPrefill {
    launch: Launch,
    o: WgpuTensor,
    state: WgpuTensor,
    checkpoints: Option<DeviceCheckpoints>,
    /// Kept alive for the bindings.
    _inputs: Vec<WgpuTensor>,
}

/// What a prefill takes beyond FLA's arguments.
#[derive(Default)]
pub(crate) struct PrefillExtras {
    /// `[N, H, K, V]` f32 initial states already on the device (a pool's rows), used in place
    /// of `inputs.initial_state` (the pooled prefill refuses a call that gives both).
    pub initial_state: Option<WgpuTensor>,
    /// Checkpoints every this many tokens (see `deltakv_contract::gdn::prefill::checkpoint`).
    pub checkpoint_every: Option<usize>,
}

impl PreparedPrefill {
    /// Checks the call (the contract's rules, on the host), copies the inputs to the device and
    /// seeds the final states with the initial states (or zeros). The chunked state pass takes
    /// the plan of the environment ([`StatePlan::from_env_once`]).
    pub fn new(
        wgpu: &Wgpu,
        inputs: &GdnInputs<'_>,
        options: &GdnOptions,
        mode: PrefillMode,
    ) -> Result<Self> {
        Self::planned(wgpu, inputs, options, mode, &StatePlan::from_env_once()?)
    }

    /// [`PreparedPrefill::new`] with the chunked state pass shaped by `plan`.
    pub fn planned(
        wgpu: &Wgpu,
        inputs: &GdnInputs<'_>,
        options: &GdnOptions,
        mode: PrefillMode,
        plan: &StatePlan,
    ) -> Result<Self> {
        Self::build(wgpu, inputs, options, mode, plan, PrefillExtras::default())
    }

    /// [`PreparedPrefill::planned`] that also takes the state checkpoints every
    /// `checkpoint_every` tokens (a positive multiple of 64; chunked mode, the general or staged
    /// state kernel), which the chunked state pass's outputs walk stores as it passes them.
    pub fn checkpointed(
        wgpu: &Wgpu,
        inputs: &GdnInputs<'_>,
        options: &GdnOptions,
        mode: PrefillMode,
        plan: &StatePlan,
        checkpoint_every: Option<usize>,
    ) -> Result<Self> {
        let extras = PrefillExtras {
            initial_state: None,
            checkpoint_every,
        };
        Self::build(wgpu, inputs, options, mode, plan, extras)
    }

    pub(crate) fn build(
        wgpu: &Wgpu,
        inputs: &GdnInputs<'_>,
        options: &GdnOptions,
        mode: PrefillMode,
        plan: &StatePlan,
        extras: PrefillExtras,
    ) -> Result<Self> {
        let (shapes, _) = validate_prefill(inputs, options)?;
        let checkpoint_plan = CheckpointPlan::optional(extras.checkpoint_every, &shapes.seqs)?;
        if checkpoint_plan.is_some() && mode != PrefillMode::Chunk {
            return Err(Error::Unsupported(
                "state checkpoints on wgpu are taken by the chunked prefill (mode chunk); the \
                 token-loop kernel has none"
                    .to_string(),
            ));
        }
        let d = shapes.dims;
        // Calls and plans the kernels cannot run are refused here, before anything is uploaded
        // or queued.
        if checkpoint_plan.is_some() {
            refuse_unstored_checkpoints(wgpu, &d, &shapes.seqs, plan)?;
        }
        if mode == PrefillMode::Chunk {
            check_chunk_plan(wgpu, &d, shapes.seqs.len(), inputs.q.dtype(), plan)?;
        }
        let sequences = shapes.seqs.len();
        let up = |t: &HostTensor| WgpuTensor::upload(wgpu, t);
        let (q, k, v, g, beta) = (
            up(inputs.q)?,
            up(inputs.k)?,
            up(inputs.v)?,
            up(inputs.g)?,
            up(inputs.beta)?,
        );
        let state = match (extras.initial_state, inputs.initial_state) {
            (Some(device_state), _) => device_state,
            (None, Some(s)) => up(s)?,
            (None, None) => WgpuTensor::zeros(
                wgpu,
                vec![sequences, d.value_heads, d.key_dim, d.value_dim],
                DType::F32,
            )?,
        };
        let o_shape = vec![d.batch, d.tokens, d.value_heads, d.value_dim];
        let o = WgpuTensor::poisoned(wgpu, o_shape, inputs.v.dtype())?;
        let offsets = match inputs.cu_seqlens {
            Some(_) => {
                let mut bytes: Vec<u8> = Vec::with_capacity(4 * (sequences + 1));
                for s in &shapes.seqs {
                    bytes.extend_from_slice(&(s.start as u32).to_le_bytes());
                }
                bytes.extend_from_slice(&(d.tokens as u32).to_le_bytes());
                let offsets = HostTensor::from_le_bytes(vec![sequences + 1], DType::I32, &bytes)?;
                Some(up(&offsets)?)
            }
            None => None,
        };
        let row_source = match &offsets {
            Some(t) => Rows::Offsets(t),
            None => Rows::Dense,
        };
        let checkpoints = match checkpoint_plan {
            Some(plan) => Some(DeviceCheckpoints::new(wgpu, plan, &shapes.seqs, &d)?),
            None => None,
        };
        let chunked = if mode == PrefillMode::Chunk {
            ChunkLaunch::new(
                wgpu,
                &ChunkCall {
                    dims: d,
                    seqs: &shapes.seqs,
                    q: &q,
                    k: &k,
                    v: &v,
                    g: &g,
                    beta: &beta,
                    state: &state,
                    o: &o,
                    scale: shapes.scale,
                    l2norm: options.use_qk_l2norm,
                    checkpoints: checkpoints.as_ref().map(DeviceCheckpoints::bindings),
                },
                plan,
            )?
        } else {
            None
        };
        if checkpoints.is_some() && chunked.is_none() {
            // refuse_unstored_checkpoints refused every such call before the uploads.
            return Err(Error::Unsupported(
                "state checkpoints: the two-pass chunked kernels did not take this call"
                    .to_string(),
            ));
        }
        let wide_groups = sequences * d.value_heads * d.value_dim.div_ceil(64);
        let launch = match chunked {
            Some(launch) => Launch::Chunks(Box::new(launch)),
            None => Launch::Single(RecurrentLaunch::new(
                wgpu,
                &RecurrentCall {
                    dims: d,
                    rows: sequences,
                    q: &q,
                    k: &k,
                    v: &v,
                    gates: &[&g, &beta],
                    row_source,
                    state: &state,
                    o: &o,
                    intermediate: None,
                    scale: shapes.scale,
                    l2norm: options.use_qk_l2norm,
                    kernel: {
                        let col_pairs = if wide_groups < NARROW_TILES_BELOW {
                            8
                        } else {
                            32
                        };
                        // The one-pass chunk kernel only where the plan asks for it: on
                        // lavapipe it loses the state past ~900 tokens of a sequence (K =
                        // 128; docs/wgpu.md), so a chunked call too large for the two passes'
                        // scratch runs the token loop, the same recurrence.
                        if mode == PrefillMode::Chunk && plan.kernel == StateKernel::OnePass {
                            Kernel::Chunk { col_pairs }
                        } else {
                            Kernel::Pairs { col_pairs }
                        }
                    },
                },
            )?),
        };
        Ok(Self {
            launch,
            o,
            state,
            checkpoints,
            _inputs: [q, k, v, g, beta].into_iter().chain(offsets).collect(),
        })
    }

    /// Queues `repeat` back-to-back dispatches in one submission.
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        match &self.launch {
            Launch::Chunks(launch) => launch.submit(wgpu, repeat, ChunkPasses::Both),
            Launch::Single(launch) => launch.submit(wgpu, repeat),
        }
    }

    /// Queues `repeat` rounds of one pass of the two-pass chunked kernel, for timing each
    /// (the state pass reads whatever the last prepare pass left); `Ok(None)` when this
    /// prefill runs in one pass. Returns the state pass's column tile.
    pub fn submit_pass(
        &self,
        wgpu: &Wgpu,
        repeat: usize,
        passes: ChunkPasses,
    ) -> Result<Option<usize>> {
        match &self.launch {
            Launch::Chunks(launch) => {
                launch.submit(wgpu, repeat, passes)?;
                Ok(Some(launch.tile()))
            }
            Launch::Single(_) => Ok(None),
        }
    }

    /// The chunked state pass's kernel; `None` when this prefill runs in one pass.
    pub fn state_kernel(&self) -> Option<StateKernel> {
        match &self.launch {
            Launch::Chunks(launch) => Some(launch.kernel()),
            Launch::Single(_) => None,
        }
    }

    /// The chunked state pass's walk units (one per sequence, more where sequences are split
    /// into segments); `None` when this prefill runs in one pass.
    pub fn walk_units(&self) -> Option<usize> {
        match &self.launch {
            Launch::Chunks(launch) => Some(launch.walk_units()),
            Launch::Single(_) => None,
        }
    }

    /// The final states on the device, `[N, H, K, V]` f32 (valid once submitted).
    pub(crate) fn final_states(&self) -> &WgpuTensor {
        &self.state
    }

    /// Copies `o`, the final states and the checkpoints back, refusing a result that
    /// overflowed f32.
    pub fn outputs(&self, wgpu: &Wgpu) -> Result<GdnOutput> {
        let o = self.o.download(wgpu)?;
        let final_state = self.state.download(wgpu)?;
        check_result_finite("o", &o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
        check_result_finite(
            "final_state",
            &final_state,
            "n, h, k, v",
            GDN_OVERFLOW_CAUSE,
        )?;
        let checkpoints = match &self.checkpoints {
            Some(checkpoints) => Some(checkpoints.download(wgpu)?),
            None => None,
        };
        Ok(GdnOutput {
            o,
            final_state,
            checkpoints,
        })
    }
}

/// Runs GDN prefill of host tensors on the device: the contract's checks on the host, the
/// inputs copied to the device, `o` (v's dtype) and `final_state` (`[N, H, K, V]` f32) copied
/// back. A result that overflowed f32 from finite inputs is an error, as on the CPU.
pub fn gdn_prefill(
    wgpu: &Wgpu,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
) -> Result<GdnOutput> {
    let prepared = PreparedPrefill::new(wgpu, inputs, options, mode)?;
    prepared.submit(wgpu, 1)?;
    prepared.outputs(wgpu)
}

/// [`gdn_prefill`] that also returns the state every `checkpoint_every` tokens of each sequence
/// (a positive multiple of 64; chunked mode only; see [`PreparedPrefill::checkpointed`]), in
/// the layout of `deltakv_contract::gdn::prefill::checkpoint`.
pub fn gdn_prefill_checkpointed(
    wgpu: &Wgpu,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    checkpoint_every: Option<usize>,
) -> Result<GdnOutput> {
    let plan = StatePlan::from_env_once()?;
    let prepared =
        PreparedPrefill::checkpointed(wgpu, inputs, options, mode, &plan, checkpoint_every)?;
    prepared.submit(wgpu, 1)?;
    prepared.outputs(wgpu)
}

/// [`gdn_prefill`] with the chunked state pass shaped by `plan` (for tests and timings of the
/// shapes the launcher would not pick).
pub fn gdn_prefill_planned(
    wgpu: &Wgpu,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    plan: &StatePlan,
) -> Result<GdnOutput> {
    let prepared = PreparedPrefill::planned(wgpu, inputs, options, mode, plan)?;
    prepared.submit(wgpu, 1)?;
    prepared.outputs(wgpu)
}
