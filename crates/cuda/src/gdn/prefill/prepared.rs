//! A prefill call validated and prepared on the device: its plan (segments, relay, kernels),
//! scratch buffers and kernel parameters, launched by [`PrefillLaunch::launch`] any number of
//! times (the algorithm is at the top of `kernels/gdn_prefill.cu`).

use super::checkpoint::{CudaCheckpoints, chunk_checkpoints};
use super::kernels::{
    CM_BLOCK, MAX_WALK_SEGMENTS, PREPARE_THREADS, PrefillParams, StatePass, WalkKernel,
    gates_bytes, outputs_walk, pass_kernels, prepare_groups, state_pass_kind, walk_grid,
};
use super::launch::{Kernel, LoadedKernel};
use super::operand::{Conversion, OperandForm, kernel_operand, normalized_copy};
use super::plan::{CHUNK, PAD, PrefillPlan, SEGMENT_FIELDS, Split, TILE, padded_dim};
use super::relay::{FinalStaging, RelayLaunch};
use super::states::{PrefillStates, StateSources, state_sources};
use super::switches::switches;
use super::{SOURCE, SOURCE_PREPARE_MMA};
use crate::gdn::decode::dtype_code;
use crate::runtime::{Cuda, driver_error};
use crate::tensor::CudaTensor;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use deltakv_contract::gdn::gating::RESET_GATE;
use deltakv_contract::gdn::prefill::checkpoint::CheckpointPlan;
use deltakv_contract::gdn::prefill::validate::{PrefillShapes, check_prefill_meta};
use deltakv_contract::gdn::{GdnInputs, GdnOptions};
use deltakv_contract::{DType, Error, HostTensor, Result};

/// A validated prefill call with its scratch buffers, ready to launch any number of times (a
/// CUDA graph captures [`PrefillLaunch::launch`]).
pub struct PrefillLaunch {
    params: PrefillParams,
    plan: PrefillPlan,
    /// The checkpoints every launch writes, when asked.
    checkpoints: Option<CudaCheckpoints>,
    value_heads: u32,
    sequences: u32,
    prepare: LoadedKernel,
    /// The state pass that writes the outputs.
    state: LoadedKernel,
    /// The scan's transition pass.
    transition: LoadedKernel,
    combine: cudarc::driver::CudaFunction,
    /// The relay's launches, when the plan relays some sequence.
    relay: Option<RelayLaunch>,
    convert: cudarc::driver::CudaFunction,
    conversions: Vec<Conversion>,
    _buffers: Vec<CudaTensor>,
}

/// What a prefill call stores beyond its outputs, and how it is split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillExtras {
    /// Also store the state every this many tokens of each sequence (a positive multiple of
    /// 64; the contract's layout, `deltakv_contract::gdn::prefill::checkpoint`).
    pub checkpoint_every: Option<usize>,
    /// How long sequences are split for the state pass (`Split::Auto`: from the GPU's size;
    /// `DELTAKV_PREFILL_SEGMENT_CHUNKS=n` then forces the scan over n chunks, and
    /// `DELTAKV_PREFILL_RELAY=off` or a first-segment share in (0, 1) turns the relay off or
    /// sets its split).
    pub split: Split,
}

impl PrefillLaunch {
    /// Validates a call on device tensors and prepares its launch, writing `o` (`[B, T, H, V]`,
    /// v's dtype), the final states as `states` says, and the checkpoints `extras` asks for
    /// into a buffer of the launch ([`PrefillLaunch::into_checkpoints`]).
    pub fn new(
        cuda: &Cuda,
        inputs: &GdnInputs<'_, CudaTensor>,
        options: &GdnOptions,
        states: &mut PrefillStates<'_>,
        o: &mut CudaTensor,
        final_state: Option<&mut CudaTensor>,
        extras: PrefillExtras,
    ) -> Result<Self> {
        let PrefillExtras {
            checkpoint_every,
            split,
        } = extras;
        let offsets = match inputs.cu_seqlens {
            Some(cu) => Some(cu.download(cuda)?.to_i64_vec("cu_seqlens")?),
            None => None,
        };
        let PrefillShapes { dims, seqs, scale } =
            check_prefill_meta(inputs, options, offsets.as_deref())?;
        let (o_shape, state_shape) = (
            [dims.batch, dims.tokens, dims.value_heads, dims.value_dim],
            [seqs.len(), dims.value_heads, dims.key_dim, dims.value_dim],
        );
        expect_buffer("o", o, &o_shape, inputs.v.dtype())?;
        // A bf16 q, k or v whose rows have a compiled size is read in place (or by the convert
        // kernel's row path) in 16-byte pieces; the lockstep and overlapped passes store a
        // 2-byte o in pairs. Other inputs are converted by element, the states read and
        // written by element.
        let (kp, vp) = (padded_dim(dims.key_dim), padded_dim(dims.value_dim));
        for (name, t, dim, pad) in [
            ("q", inputs.q, dims.key_dim, kp),
            ("k", inputs.k, dims.key_dim, kp),
            ("v", inputs.v, dims.value_dim, vp),
        ] {
            if t.dtype() == DType::BF16 && dim == pad {
                t.check_aligned(
                    cuda,
                    name,
                    16,
                    "the kernels read its rows in 16-byte pieces",
                )?;
            }
        }
        if o.dtype() != DType::F32 {
            o.check_aligned(
                cuda,
                "o",
                4,
                "the state passes store it in pairs of elements",
            )?;
        }
        if dims.tokens == 0 {
            return Err(Error::InvalidValue(
                "prefill needs at least one token (T = 0)".to_string(),
            ));
        }
        let tiles_v = vp / TILE;
        let switches = switches()?;
        let split = match (split, switches.segment_chunks) {
            (Split::Auto, Some(chunks)) => Split::Scan(chunks),
            (split, _) => split,
        };
        let plan = PrefillPlan::new(
            &seqs,
            dims.value_heads * tiles_v,
            cuda.multiprocessors(),
            split,
            // Only an automatic split consults the variable.
            match split {
                Split::Auto => switches.relay,
                _ => None,
            },
        );
        if plan.segment_count() > MAX_WALK_SEGMENTS {
            return Err(Error::Unsupported(format!(
                "CUDA prefill walks at most {MAX_WALK_SEGMENTS} segments per call (its sequences \
                 plus the splits of long ones), got {}: fewer sequences per call, or a longer \
                 segment for a forced scan",
                plan.segment_count()
            )));
        }
        let heads = dims.value_heads;
        let StateSources {
            initial,
            final_address,
            state_rows: state_rows_buffer,
            slots,
        } = state_sources(cuda, inputs, states, final_state, &state_shape, &dims)?;

        let chunks = plan.chunks();
        let segments = plan.segment_count();
        // Written in full by the prepare kernel before the state kernels read them.
        let written = |shape: Vec<usize>, dtype| CudaTensor::scratch(cuda, shape, dtype);
        let scratch = |shape: Vec<usize>, dtype| CudaTensor::zeros(cuda, shape, dtype);
        // W and U in the state passes' stage layouts (`PF_W_ELEMS` in the kernels: U by
        // 64-column tiles, rows swizzled), so each is one bulk copy per chunk there.
        let gates = written(vec![chunks, heads, gates_bytes() / 4], DType::F32)?;
        // Each chunk's k rows (and q's, for the overlapped pass) as the walks' stages hold them
        // (rows of kp + PAD, padding included), stored by the prepare.
        let key_chunks = || written(vec![chunks, dims.key_heads, CHUNK, kp + PAD], DType::BF16);
        let checkpoint_plan = checkpoint_every
            .map(|every| CheckpointPlan::new(every, &seqs))
            .transpose()?;
        let storing_checkpoints = checkpoint_plan.as_ref().is_some_and(|c| c.total() > 0);
        let pass = state_pass_kind(switches.state_pass, kp, cuda.arch());
        let registers_pass = pass == StatePass::Registers;
        // The register walks read k from its core-matrix copy (`k_cm`, below) instead.
        let k_chunks = (!registers_pass).then(key_chunks).transpose()?;
        // The scores Q K^T o D, which the prepare kernel writes for the overlapped pass (and
        // q's chunk copies) and for the register pass (in the core-matrix layout).
        let overlapped = pass == StatePass::Overlap;
        let scores = if overlapped {
            Some(written(vec![chunks, heads, CHUNK, CHUNK], DType::BF16)?)
        } else if registers_pass {
            Some(written(vec![chunks, heads, 8 * CM_BLOCK], DType::BF16)?)
        } else {
            None
        };
        let q_chunks = overlapped.then(key_chunks).transpose()?;
        // The register walks' operands, which the prepare stores where one runs: T diag(beta)'s
        // halves and k's chunk rows (and q's, for the outputs walk) in the core-matrix layout.
        let key_cm = || written(vec![chunks, dims.key_heads, kp / 8 * CM_BLOCK], DType::BF16);
        let t_cm = registers_pass
            .then(|| written(vec![chunks, heads, 2, 8 * CM_BLOCK], DType::BF16))
            .transpose()?;
        let k_cm = registers_pass.then(key_cm).transpose()?;
        let q_cm = registers_pass.then(key_cm).transpose()?;
        // W and U for every walk but the register walks.
        let w = (!registers_pass)
            .then(|| written(vec![chunks, heads, CHUNK, kp], DType::BF16))
            .transpose()?;
        let u = (!registers_pass)
            .then(|| written(vec![chunks, heads, vp / TILE, CHUNK, TILE], DType::BF16))
            .transpose()?;
        let chunk_first_row = upload_i64(cuda, plan.chunk_first_row.clone())?;
        let chunk_len = upload_i32(cuda, plan.chunk_len.clone())?;
        let segment_table = upload_i32(cuda, plan.segments.clone())?;
        let seq_first_segment = upload_i32(cuda, plan.seq_first_segment.clone())?;
        let empty = || scratch(vec![0], DType::F32);
        let (segment_states, transition_d, transition_m) = if plan.segmented {
            (
                scratch(vec![segments, heads, kp, vp], DType::F32)?,
                scratch(vec![segments, heads, kp, vp], DType::F32)?,
                scratch(vec![segments, heads, kp, kp], DType::F32)?,
            )
        } else if plan.relayed > 0 {
            // The lead's hand-over, written before the second segments read it.
            let hand_over = written(vec![plan.relayed, heads, kp, vp], DType::F32)?;
            (hand_over, empty()?, empty()?)
        } else {
            (empty()?, empty()?, empty()?)
        };
        // The relayed sequences' final states, copied to the caller's rows after the join (a row
        // per sequence, so the kernels index it as they index the caller's; only the relayed
        // sequences' rows are written).
        let relay_final = if plan.relayed > 0 && final_address != 0 {
            Some(written(
                vec![seqs.len(), heads, dims.key_dim, dims.value_dim],
                DType::F32,
            )?)
        } else {
            None
        };
        let beta_dtype = inputs.beta.dtype();
        let mut conversions = Vec::new();
        let mut operands = Vec::new();
        let query_key = OperandForm {
            dim: dims.key_dim,
            pad: kp,
            dtype: DType::BF16,
            normalize: options.use_qk_l2norm,
        };
        let value = OperandForm {
            dim: dims.value_dim,
            pad: vp,
            dtype: DType::BF16,
            normalize: false,
        };
        // g as one column of B * T * H rows: only its dtype may change.
        let gate = OperandForm {
            dim: 1,
            pad: 1,
            dtype: DType::F32,
            normalize: false,
        };
        // bf16 q and k of the compiled K are l2-normalised by the prepare kernel itself, into
        // copies the state pass reads (no conversion launches).
        let fused_qk_norm = options.use_qk_l2norm
            && inputs.q.dtype() == DType::BF16
            && inputs.k.dtype() == DType::BF16
            && dims.key_dim == kp;
        let ((q_src, q), (k_src, k)) = if fused_qk_norm {
            // The walks read k from the prepare's chunk copies (below), and q too on the
            // overlapped pass; the lockstep pass reads q's rows from a normalised copy.
            let q = match pass {
                StatePass::Lockstep => normalized_copy(cuda, inputs.q, kp, &mut operands)?,
                StatePass::Overlap | StatePass::Registers => (inputs.q.device_address(cuda), 0),
            };
            (q, (inputs.k.device_address(cuda), 0))
        } else {
            let mut operand = |t: &CudaTensor, form| {
                kernel_operand(cuda, t, form, &mut conversions, &mut operands)
            };
            (
                (0, operand(inputs.q, query_key)?),
                (0, operand(inputs.k, query_key)?),
            )
        };
        let mut operand =
            |t: &CudaTensor, form| kernel_operand(cuda, t, form, &mut conversions, &mut operands);
        let (v, g) = (operand(inputs.v, value)?, operand(inputs.g, gate)?);
        let (head_groups, heads_per_block) =
            prepare_groups(heads / dims.key_heads, switches.prepare_group_limit);
        // Checkpoints: a buffer poisoned until the launch writes it, and the row of each chunk.
        let mut checkpoints = match checkpoint_plan {
            Some(plan) => Some(CudaCheckpoints {
                states: CudaTensor::poisoned(cuda, plan.shape(&dims), DType::F32)?,
                plan,
            }),
            None => None,
        };
        let checkpoint_table = match (&checkpoints, storing_checkpoints) {
            (Some(c), true) => {
                let table = chunk_checkpoints(&seqs, &c.plan)?;
                Some(upload_i32(cuda, table)?)
            }
            _ => None,
        };
        let params = PrefillParams {
            q,
            k,
            v,
            g,
            beta: inputs.beta.device_address(cuda),
            o: o.device_address_mut(cuda),
            w: w.as_ref().map_or(0, |t| t.device_address(cuda)),
            u: u.as_ref().map_or(0, |t| t.device_address(cuda)),
            chunk_first_row: chunk_first_row.device_address(cuda),
            chunk_len: chunk_len.device_address(cuda),
            segments: segment_table.device_address(cuda),
            seq_first_segment: seq_first_segment.device_address(cuda),
            initial_state: initial,
            final_state: final_address,
            state_rows: state_rows_buffer
                .as_ref()
                .map_or(0, |t| t.device_address(cuda)),
            segment_states: segment_states.device_address(cuda),
            transition_d: transition_d.device_address(cuda),
            transition_m: transition_m.device_address(cuda),
            gates: gates.device_address(cuda),
            scores: scores.as_ref().map_or(0, |t| t.device_address(cuda)),
            checkpoints: checkpoints
                .as_mut()
                .filter(|_| storing_checkpoints)
                .map_or(0, |c| c.states.device_address_mut(cuda)),
            chunk_checkpoint: checkpoint_table
                .as_ref()
                .map_or(0, |t| t.device_address(cuda)),
            q_src,
            k_src,
            q_chunks: q_chunks.as_ref().map_or(0, |t| t.device_address(cuda)),
            k_chunks: k_chunks.as_ref().map_or(0, |t| t.device_address(cuda)),
            t_cm: t_cm.as_ref().map_or(0, |t| t.device_address(cuda)),
            k_cm: k_cm.as_ref().map_or(0, |t| t.device_address(cuda)),
            q_cm: q_cm.as_ref().map_or(0, |t| t.device_address(cuda)),
            key_heads: dims.key_heads as i32,
            value_heads: heads as i32,
            key_dim: dims.key_dim as i32,
            value_dim: dims.value_dim as i32,
            key_pad: kp as i32,
            value_pad: vp as i32,
            out_dtype: dtype_code(inputs.v.dtype()),
            beta_dtype: dtype_code(beta_dtype),
            use_segment_states: i32::from(plan.segmented),
            heads_per_block: heads_per_block as i32,
            head_groups: head_groups as i32,
            fused_qk_norm: i32::from(fused_qk_norm),
            scale,
            reset_gate: RESET_GATE,
        };
        if heads > 65535 || chunks > i32::MAX as usize {
            return Err(Error::Unsupported(format!(
                "CUDA prefill takes at most 65535 value heads and 2^31 chunks, got H = {heads}, \
                 {chunks} chunks"
            )));
        }
        let names = pass_kernels(pass, kp, vp, heads_per_block, switches.prepare_pair);
        let walk = |kernel: WalkKernel| -> Result<_> {
            Ok(LoadedKernel {
                function: cuda.function(&SOURCE, kernel.name)?,
                threads: kernel.threads,
                shared_bytes: kernel.smem as u32,
            })
        };
        let prepare = LoadedKernel {
            function: cuda.function(&SOURCE_PREPARE_MMA, names.prepare.name)?,
            threads: PREPARE_THREADS,
            shared_bytes: names.prepare.smem as u32,
        };
        // The outputs walk's blocks: every segment but the relay's second ones (those walk
        // after the lead), each over every head and value tile.
        let outputs_blocks = (plan.segment_count() - plan.relayed) * heads * (vp / TILE);
        let outputs = outputs_walk(
            pass,
            names.outputs,
            switches.output_stages,
            outputs_blocks,
            cuda.multiprocessors(),
            plan.relayed > 0,
        );
        let state_pass = walk(outputs)?;
        let relay = if plan.relayed > 0 {
            let relayed_rows = plan
                .segments
                .chunks(SEGMENT_FIELDS)
                .take(plan.relayed)
                .map(|record| {
                    let n = record[0] as usize;
                    let row = slots.as_ref().map_or(n as u64, |s| s[n] as u64);
                    (n, row)
                })
                .collect();
            let staging = relay_final.as_ref().map(|t| FinalStaging {
                scratch: t.device_address(cuda),
                rows: relayed_rows,
                state_bytes: 4 * heads * dims.key_dim * dims.value_dim,
            });
            Some(RelayLaunch::new(
                walk(names.lead)?,
                &params,
                segment_table.device_address(cuda),
                (seqs.len(), plan.relayed),
                segment_states.device_address(cuda),
                staging,
            ))
        } else {
            None
        };
        let mut buffers = vec![
            gates,
            chunk_first_row,
            chunk_len,
            segment_table,
            seq_first_segment,
            segment_states,
            transition_d,
            transition_m,
        ];
        buffers.extend(k_chunks);
        buffers.extend(w);
        buffers.extend(u);
        buffers.extend(scores);
        buffers.extend(t_cm);
        buffers.extend(k_cm);
        buffers.extend(q_cm);
        buffers.extend(q_chunks);
        buffers.extend(state_rows_buffer);
        buffers.extend(relay_final);
        buffers.extend(checkpoint_table);
        buffers.extend(operands);
        Ok(Self {
            convert: cuda.function(&SOURCE, "gdn_prefill_convert")?,
            conversions,
            params,
            value_heads: heads as u32,
            sequences: seqs.len() as u32,
            prepare,
            state: state_pass,
            transition: walk(names.transition)?,
            combine: cuda.function(&SOURCE, names.combine)?,
            relay,
            plan,
            checkpoints,
            _buffers: buffers,
        })
    }

    /// Queues the call's kernels on deltakv's stream.
    ///
    /// # Safety
    ///
    /// The launch holds device addresses, not borrows. When it is called, every
    /// tensor it was prepared from (the inputs, `o`, the final states, or the pool) must be
    /// alive. The pool's slots are the ones checked at preparation, which copied the indices:
    /// rewriting the index tensor afterwards changes nothing.
    /// Dropping a tensor after the call is fine: deltakv frees device memory in its stream's
    /// order, after the work queued here.
    pub unsafe fn launch(&self, cuda: &Cuda) -> Result<()> {
        let heads = self.value_heads;
        let segments = self.plan.segment_count() as u32;
        // Column tiles and threads follow from the padded sizes the kernels were picked for.
        let (key_pad, value_pad) = (self.params.key_pad as u32, self.params.value_pad as u32);
        let (tiles_v, tiles_k) = (value_pad / TILE as u32, key_pad / TILE as u32);
        for conversion in &self.conversions {
            let mut builder = cuda.stream().launch_builder(&self.convert);
            builder.arg(&conversion.params);
            let config = LaunchConfig {
                grid_dim: (conversion.blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: source and scratch hold `rows * dim` and `rows * pad` elements of their
            // dtypes (the scratch was allocated from the source's shape).
            unsafe { builder.launch(config) }
                .map_err(|e| driver_error("launching gdn_prefill_convert", e))?;
        }
        let params = &self.params;
        // One prepare block per (chunk, key head, group of its value heads).
        let prepare_rows = (params.key_heads * params.head_groups) as u32;
        let prepare_grid = (self.plan.chunks() as u32, prepare_rows, 1);
        self.prepare
            .with(params, prepare_grid, "gdn_prefill_prepare")
            .launch(cuda.stream())?;
        if let Some(relay) = &self.relay {
            return relay.launch(cuda, &self.state, heads, tiles_v);
        }
        let walk_blocks = walk_grid(segments, heads, tiles_v);
        let walk = self.state.with(params, walk_blocks, "gdn_prefill_state");
        if !self.plan.segmented {
            // The one walk: the prepare's programmatic dependent.
            return walk.launch_dependent(cuda, cuda.stream());
        }
        // The scan: the transitions (the prepare's programmatic dependent), the combine, then
        // every segment's outputs.
        let grid = walk_grid(segments, heads, tiles_v + tiles_k);
        self.transition
            .with(params, grid, "gdn_prefill_transition")
            .launch_dependent(cuda, cuda.stream())?;
        let combine = Kernel {
            function: &self.combine,
            params,
            grid: (self.sequences, heads, value_pad / 16),
            threads: 256,
            shared_bytes: 0,
            name: "gdn_prefill_combine",
        };
        combine.launch(cuda.stream())?;
        walk.launch(cuda.stream())
    }

    /// The checkpoints the launches wrote, when `checkpoint_every` asked for them (the launch
    /// is consumed: its kernels write into that buffer).
    pub fn into_checkpoints(self) -> Option<CudaCheckpoints> {
        self.checkpoints
    }

    /// Segments the state pass walks (one per sequence unless the scan or the relay splits
    /// some: the relay's two segments of a sequence count twice).
    pub fn segments(&self) -> usize {
        self.plan.segment_count()
    }
}

pub(super) fn expect_buffer(
    name: &str,
    t: &CudaTensor,
    shape: &[usize],
    dtype: DType,
) -> Result<()> {
    if t.shape() != shape || t.dtype() != dtype {
        return Err(Error::InvalidValue(format!(
            "buffer `{name}` is {:?} {}, expected {shape:?} {dtype}",
            t.shape(),
            t.dtype()
        )));
    }
    Ok(())
}

pub(super) fn upload_i64(cuda: &Cuda, values: Vec<i64>) -> Result<CudaTensor> {
    CudaTensor::upload(cuda, &HostTensor::from_i64(vec![values.len()], values)?)
}

fn upload_i32(cuda: &Cuda, values: Vec<i32>) -> Result<CudaTensor> {
    CudaTensor::upload(cuda, &HostTensor::from_i32(vec![values.len()], values)?)
}
