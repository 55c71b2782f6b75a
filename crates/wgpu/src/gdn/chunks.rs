//! The launcher of the two-pass chunked prefill (`chunks.wgsl`; the math is at its top):
//! `gdn_chunk_prepare` over every (chunk, value head) at once, then `gdn_chunk_state` over
//! (walk unit, value head, tile of value columns), in one compute pass; a walk unit is a
//! sequence, or a segment of one, which adds the transition walk and the combine before the
//! outputs walk (`chunks_state.wgsl`). The prepare pass leaves
//! W, Qd, Kd (`[chunks, H, 32, ceil(K/4)]` vec4 words each), U, P and the chunk decays in one
//! f32 scratch buffer (the runtime's, kept between calls up to `DELTAKV_WGPU_SCRATCH_CACHE_MIB`:
//! the prepare pass writes every word the state pass reads); a call whose scratch would not
//! fit one storage binding returns `None` and the caller runs the single-pass kernel instead.

pub use super::chunk_sources::{COMBINE, PREPARE, PREPARE_STAGED, STATE, STATE_COOP, STATE_STAGED};
use super::chunk_table::chunk_table;
use super::recurrent::dtype_code;
pub use super::state_plan::{
    GROUPS_ENV, PREPARE_KERNEL_ENV, PrepareKernel, SEGMENT_ENV, STATE_KERNEL_ENV, StateKernel,
    StatePlan, TILE_ENV,
};
use crate::runtime::{ShaderSource, Wgpu};
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::GdnDims;
use deltakv_contract::gdn::prefill::validate::SeqSpan;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// Tokens per chunk (`CT` in the shaders).
pub const CHUNK: usize = 32;

/// Workgroup memory of `gdn_chunk_state_coop` (its arrays and the walk's unit span).
const COOP_WORKGROUP_BYTES: u32 = 45_064;

/// Value columns per combine workgroup (`COMBINE_COLS` in `chunks_combine.wgsl`).
const COMBINE_COLS: usize = 16;
/// Which passes a submission runs (both for a prefill; one alone to time it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkPasses {
    Both,
    Prepare,
    State,
}

/// State-pass workgroups below which a call takes 16-column tiles instead of 32-column ones.
const NARROW_TILES_BELOW: usize = 256;
/// Chunks per row of the prepare grid (`wid.z * 32768 + wid.y` in the shader).
const GRID_ROW: usize = 32768;

/// The inputs of one prefill on the device.
pub struct ChunkCall<'a> {
    pub dims: GdnDims,
    pub seqs: &'a [SeqSpan],
    pub q: &'a WgpuTensor,
    pub k: &'a WgpuTensor,
    pub v: &'a WgpuTensor,
    pub g: &'a WgpuTensor,
    pub beta: &'a WgpuTensor,
    /// `[N, H, K, V]` f32: initial states in, final states out.
    pub state: &'a WgpuTensor,
    pub o: &'a WgpuTensor,
    pub scale: f32,
    pub l2norm: bool,
    /// State checkpoints, when asked: the outputs walk stores its state after every chunk the
    /// table names.
    pub checkpoints: Option<ChunkCheckpoints<'a>>,
}

/// Where the outputs walk stores state checkpoints (`prefill_states.rs` builds both).
pub struct ChunkCheckpoints<'a> {
    /// `[C, H, K, V]` f32, the contract's layout.
    pub states: &'a WgpuTensor,
    /// u32 per chunk of the chunk table: the checkpoint row taken after it, or
    /// [`NO_CHECKPOINT`].
    pub table: &'a WgpuTensor,
}

/// A chunk after which no checkpoint is taken: the contract's value, `NO_CHECKPOINT` in
/// `chunks_state.wgsl`.
pub use deltakv_contract::gdn::prefill::checkpoint::NO_CHECKPOINT;

/// Both passes, ready to encode any number of times.
pub struct ChunkLaunch {
    prepare: wgpu::ComputePipeline,
    state: wgpu::ComputePipeline,
    prepare_group: wgpu::BindGroup,
    state_group: wgpu::BindGroup,
    prepare_grid: (u32, u32, u32),
    state_grid: (u32, u32, u32),
    tile: usize,
    kernel: StateKernel,
    /// The two steps before the outputs walk where a sequence is split into segments.
    segments: Option<Segments>,
    /// The scratch (shared with other calls: see `Wgpu::scratch`), the chunk table and the
    /// segment states, kept alive for the bindings.
    _buffers: (wgpu::Buffer, WgpuTensor, wgpu::Buffer),
}

/// The transition walk and the combine of a call with split sequences.
struct Segments {
    transition: wgpu::ComputePipeline,
    transition_group: wgpu::BindGroup,
    transition_grid: (u32, u32, u32),
    combine: wgpu::ComputePipeline,
    combine_group: wgpu::BindGroup,
    combine_grid: (u32, u32, u32),
}

/// The chunk scratch of a call in vec4 words: the regions W, Qd, Kd, U, P and the decays, each
/// one's offset, and the bytes of all.
struct ScratchLayout {
    offsets: [usize; 6],
    bytes: u64,
}

impl ScratchLayout {
    /// The layout for `chunks` chunks, where the scratch fits one storage binding (and the
    /// plan's `scratch_limit`) and the grids fit the adapter's dispatch; `None` where not.
    fn fitting(
        wgpu: &Wgpu,
        d: &GdnDims,
        sequences: usize,
        chunks: usize,
        plan: &StatePlan,
    ) -> Option<Self> {
        let heads = d.value_heads;
        let kp4 = d.key_dim.div_ceil(4);
        let vp4 = d.value_dim.div_ceil(4);
        let chunk_heads = chunks * heads;
        let per_k = chunk_heads * CHUNK * kp4;
        let regions = [
            per_k,
            per_k,
            per_k,
            chunk_heads * CHUNK * vp4,
            chunk_heads * CHUNK * CHUNK / 4,
            chunk_heads.max(1),
        ];
        let mut offsets = [0usize; 6];
        let mut words = 0usize;
        for (at, len) in offsets.iter_mut().zip(regions) {
            *at = words;
            words += len;
        }
        let limits = wgpu.device().limits();
        let bytes = 16 * words as u64;
        let max_dim = limits.max_compute_workgroups_per_dimension as usize;
        let fits = bytes <= limits.max_storage_buffer_binding_size
            && plan.scratch_limit.is_none_or(|most| bytes <= most)
            && bytes <= limits.max_buffer_size
            && words <= u32::MAX as usize
            && chunks.div_ceil(GRID_ROW) <= max_dim
            && GRID_ROW.min(chunks) <= max_dim
            && heads <= max_dim
            && sequences <= max_dim;
        fits.then_some(Self { offsets, bytes })
    }
}

/// The state pass's kernel (never `Auto`), column tile and row groups for a call.
struct StateChoice {
    kernel: StateKernel,
    tile: usize,
    row_groups: usize,
}

/// Chooses the state pass of a call of `sequences` sequences, or refuses a plan that names a
/// kernel the call or the device cannot take.
fn choose_state(
    wgpu: &Wgpu,
    d: &GdnDims,
    sequences: usize,
    plan: &StatePlan,
) -> Result<StateChoice> {
    // 32 row groups take 16-column tiles (256 threads at most; `check` refuses both fixed
    // at 32). Counted over sequences, not walk units, so that segments do not change the
    // tile (and with it the kernel).
    let narrow_tiles = d.key_dim > 128
        || match plan.tile {
            Some(tile) => tile == 16,
            None => {
                plan.row_groups == Some(32)
                    || plan.kernel == StateKernel::Coop
                    || sequences * d.value_heads * d.value_dim.div_ceil(32) < NARROW_TILES_BELOW
            }
        };
    let tile = if narrow_tiles { 16 } else { 32 };
    // 32 row groups (256 threads) where the tile allows it: each thread then keeps one
    // 4-row block of S, and the walk over chunks, which bounds the pass, has twice the
    // threads of 16 groups for the same products.
    let row_groups = plan.row_groups.unwrap_or(if tile == 16 { 32 } else { 16 });
    let kp4 = d.key_dim.div_ceil(4);
    let staged_shape = tile == 16 && row_groups == 32 && kp4 <= 32 && kp4.is_multiple_of(4);
    let kernel = match plan.kernel {
        StateKernel::Auto if staged_shape => StateKernel::Staged,
        StateKernel::Auto => StateKernel::General,
        StateKernel::Staged if !staged_shape => {
            return Err(Error::InvalidValue(format!(
                "the {:?} state kernel takes 16-column tiles, 32 row groups and K <= 128 a multiple of 16; this call has {tile} columns, {row_groups} groups, K = {}",
                plan.kernel, d.key_dim
            )));
        }
        StateKernel::Coop
            if !(tile == 16
                && matches!(d.key_dim, 64 | 128)
                && d.value_dim.is_multiple_of(2)
                && wgpu.device().limits().max_compute_workgroup_storage_size
                    >= COOP_WORKGROUP_BYTES
                && wgpu.has_coop16()
                && wgpu.has_subgroups()) =>
        {
            return Err(Error::Unsupported(format!(
                "the coop state kernel takes a device with cooperative matrices (DELTAKV_WGPU_COOP=1 on an adapter with 16x16x16 f16 -> f32), subgroups and 44 KiB of workgroup memory, 16-column tiles, K = 64 or 128 and an even V; this call has {tile} columns, K = {}, V = {} on {}",
                d.key_dim,
                d.value_dim,
                wgpu.describe()
            )));
        }
        other => other,
    };
    Ok(StateChoice {
        kernel,
        tile,
        row_groups,
    })
}

/// Whether the staged prepare kernel takes a call: 16-bit q, k and v, K and V even and at most
/// 128.
fn staged_prepare_fits(dtype: DType, d: &GdnDims) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && d.key_dim.is_multiple_of(2)
        && d.value_dim.is_multiple_of(2)
        && d.key_dim <= 128
        && d.value_dim <= 128
}

fn staged_prepare_refusal(dtype: DType, d: &GdnDims) -> Error {
    Error::InvalidValue(format!(
        "the staged prepare kernel takes bf16 or f16 q, k and v with K and V even and at most 128; this call has {dtype:?} inputs, K = {}, V = {}",
        d.key_dim, d.value_dim
    ))
}

/// Refuses, before anything is uploaded or queued, a plan the chunked kernels cannot run for
/// a call of `sequences` sequences with `dtype` inputs on this device (`ChunkLaunch::new`
/// makes the same choices). A plan naming such a kernel is refused whatever the call's size:
/// a call past the scratch limit runs the token loop only under a plan that could have run
/// the two passes.
pub(crate) fn check_chunk_plan(
    wgpu: &Wgpu,
    d: &GdnDims,
    sequences: usize,
    dtype: DType,
    plan: &StatePlan,
) -> Result<()> {
    plan.check()?;
    if plan.kernel == StateKernel::OnePass {
        return Ok(());
    }
    choose_state(wgpu, d, sequences, plan)?;
    if plan.prepare == PrepareKernel::Staged && !staged_prepare_fits(dtype, d) {
        return Err(staged_prepare_refusal(dtype, d));
    }
    Ok(())
}

/// Refuses, before any input reaches the device, a checkpointed call whose checkpoints no walk
/// would store: the two-pass kernels store them, so not under the one-pass plan, nor where the
/// chunk scratch exceeds one storage binding (the call then runs another kernel), nor on the
/// coop state kernel.
pub(crate) fn refuse_unstored_checkpoints(
    wgpu: &Wgpu,
    d: &GdnDims,
    seqs: &[SeqSpan],
    plan: &StatePlan,
) -> Result<()> {
    if plan.kernel == StateKernel::Coop {
        return Err(Error::Unsupported(
            "the coop state kernel stores no state checkpoints: leave the state kernel to the \
             launcher (DELTAKV_WGPU_PREFILL_STATE) for a checkpointed call"
                .to_string(),
        ));
    }
    let chunks = seqs.iter().map(|s| s.len.div_ceil(CHUNK)).sum();
    if plan.kernel == StateKernel::OnePass
        || ScratchLayout::fitting(wgpu, d, seqs.len(), chunks, plan).is_none()
    {
        return Err(Error::Unsupported(format!(
            "state checkpoints on wgpu are stored by the two-pass chunked kernels, and this call \
             runs another (its chunk scratch exceeds one storage binding on {}, or the plan asked \
             for the one-pass kernel): split the call",
            wgpu.describe()
        )));
    }
    Ok(())
}

impl ChunkLaunch {
    /// Plans the chunks, allocates the scratch and builds the bindings; `None` when the
    /// scratch or the grid exceeds what the adapter allows in one binding or dispatch.
    pub fn new(wgpu: &Wgpu, call: &ChunkCall<'_>, plan: &StatePlan) -> Result<Option<Self>> {
        let d = &call.dims;
        super::check_indexable([
            ("q", call.q),
            ("k", call.k),
            ("v", call.v),
            ("state", call.state),
            ("o", call.o),
        ])?;
        let heads = d.value_heads;
        plan.check()?;
        if plan.kernel == StateKernel::OnePass {
            return Ok(None);
        }
        let mut table = chunk_table(call.seqs, plan.segment_chunks);
        let chunks = table.chunks;
        let kp4 = d.key_dim.div_ceil(4);
        let vp4 = d.value_dim.div_ceil(4);
        let Some(ScratchLayout { offsets, bytes }) =
            ScratchLayout::fitting(wgpu, d, call.seqs.len(), chunks, plan)
        else {
            return Ok(None);
        };
        let limits = wgpu.device().limits();
        let max_dim = limits.max_compute_workgroups_per_dimension as usize;
        let StateChoice {
            kernel,
            tile,
            row_groups,
        } = choose_state(wgpu, d, call.seqs.len(), plan)?;
        let row_blocks = kp4.div_ceil(row_groups) as u32;
        // The split sequences' transitions and entry states (f32; chunks_state.wgsl), or, where
        // they would not fit one binding, the grid or the device's memory, every sequence
        // walked whole.
        let value_pad = d.value_dim.div_ceil(tile) * tile;
        let trans_width = value_pad + d.key_dim;
        let walk_floats = |slots: usize| slots * heads * d.key_dim * (trans_width + d.value_dim);
        let mut walk_states = None;
        if table.slots > 0 {
            // The combine's tile holds K <= 256 rows (the contract's limit, validated before).
            debug_assert!(d.key_dim <= 256);
            let floats = walk_floats(table.slots);
            let bytes = 4 * floats as u64;
            if bytes <= limits.max_storage_buffer_binding_size
                && bytes <= limits.max_buffer_size
                && floats <= u32::MAX as usize
                && table.units <= max_dim
            {
                let scope = wgpu.error_scope();
                let buffer = wgpu.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("gdn_chunk walk states"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                });
                walk_states = scope
                    .finish(&format!("allocating {bytes} bytes of segment states"))
                    .ok()
                    .map(|()| buffer);
            }
            if walk_states.is_none() {
                table = chunk_table(call.seqs, None);
            }
        }
        let split = walk_states.is_some();
        let walk_states = walk_states.unwrap_or_else(|| wgpu.placeholder(0).clone());
        let (units, slots) = (table.units, table.slots);
        let state_kp4 = kp4 as u32;
        let scratch = wgpu.scratch(bytes)?;
        let table_bytes: Vec<u8> = table.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let table = WgpuTensor::upload(
            wgpu,
            &HostTensor::from_le_bytes(vec![table.words.len()], DType::I32, &table_bytes)?,
        )?;
        let code = |t: &WgpuTensor| dtype_code(t.dtype());
        let params: [u32; 24] = [
            d.key_heads as u32,
            heads as u32,
            d.key_dim as u32,
            d.value_dim as u32,
            (heads / d.key_heads) as u32,
            code(call.q),
            code(call.o),
            code(call.g),
            code(call.beta),
            u32::from(call.l2norm),
            call.scale.to_bits(),
            chunks as u32,
            kp4 as u32,
            vp4 as u32,
            offsets[0] as u32,
            offsets[1] as u32,
            offsets[2] as u32,
            offsets[3] as u32,
            offsets[4] as u32,
            offsets[5] as u32,
            units as u32,
            value_pad as u32,
            trans_width as u32,
            (slots * heads * d.key_dim * trans_width) as u32,
        ];
        let uniform = wgpu.buffer_with(
            "gdn_chunk params",
            &params
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>(),
            wgpu::BufferUsages::UNIFORM,
        )?;
        // Built without wgpu's loop bounding (the counter naga adds to every loop, which kept
        // the driver from unrolling and measured slower on the H100).
        // SAFETY: every loop of chunks.wgsl, chunks_prepare_staged.wgsl, chunks_state.wgsl,
        // chunks_state_staged.wgsl, staged_s_*.wgsl, chunks_state_coop.wgsl and
        // chunks_combine.wgsl ends: their trip counts come from the
        // chunk table and the head dimensions, which this launch has checked.
        let pipeline = |source: &ShaderSource, constants: &[(&'static str, u32)]| unsafe {
            wgpu.pipeline_without_loop_bounding(source, constants)
        };
        let prepare = match plan.prepare {
            PrepareKernel::Auto | PrepareKernel::Staged
                if staged_prepare_fits(call.q.dtype(), d) =>
            {
                pipeline(
                    &PREPARE_STAGED,
                    &[
                        ("KW", (d.key_dim / 2) as u32),
                        ("VW", (d.value_dim / 2) as u32),
                        ("HALF_DTYPE", dtype_code(call.q.dtype())),
                    ],
                )?
            }
            PrepareKernel::Staged => return Err(staged_prepare_refusal(call.q.dtype(), d)),
            _ => pipeline(&PREPARE, &[])?,
        };
        // A checkpointed call never reaches the coop kernel (refuse_unstored_checkpoints).
        debug_assert!(call.checkpoints.is_none() || kernel != StateKernel::Coop);
        // The outputs walk of a checkpointed call stores them (CKPT = 1); every other walk is
        // built without that code.
        let checkpointed = |walk: u32| u32::from(walk == 0 && call.checkpoints.is_some());
        let walk = |walk: u32| match kernel {
            StateKernel::Staged => pipeline(
                &STATE_STAGED,
                &[
                    ("VT", 16),
                    ("STATE_KP4", state_kp4),
                    ("WALK", walk),
                    ("CKPT", checkpointed(walk)),
                ],
            ),
            StateKernel::Coop => pipeline(&STATE_COOP, &[("STATE_KP4", state_kp4), ("WALK", walk)]),
            _ => pipeline(
                &STATE,
                &[
                    ("VT", tile as u32),
                    ("ROW_GROUPS", row_groups as u32),
                    ("ROW_BLOCKS", row_blocks),
                    ("STATE_KP4", state_kp4),
                    ("WALK", walk),
                    ("CKPT", checkpointed(walk)),
                ],
            ),
        };
        let state = walk(0)?;
        let prepare_group = wgpu.bind_group(
            "the chunked prefill's prepare",
            &prepare,
            &[
                (0, "params", &uniform),
                (1, "q", call.q.buffer()),
                (2, "k", call.k.buffer()),
                (3, "v", call.v.buffer()),
                (4, "g", call.g.buffer()),
                (5, "beta", call.beta.buffer()),
                (6, "chunk table", table.buffer()),
                (7, "scratch", &scratch),
            ],
        )?;
        // The general and staged walks bind the checkpoints and their table (placeholders
        // where none are asked for, which CKPT = 0 never touches); the coop walk has neither.
        let (checkpoint_states, checkpoint_table) = match &call.checkpoints {
            Some(c) => (c.states.buffer(), c.table.buffer()),
            None => (wgpu.placeholder(1), wgpu.placeholder(2)),
        };
        let mut walk_entries = vec![
            (0, "params", &uniform),
            (6, "chunk table", table.buffer()),
            (7, "scratch", &scratch),
            (8, "final states", call.state.buffer()),
            (9, "o", call.o.buffer()),
            (10, "segment states", &walk_states),
        ];
        if kernel != StateKernel::Coop {
            walk_entries.push((11, "checkpoints", checkpoint_states));
            walk_entries.push((12, "checkpoint table", checkpoint_table));
        }
        let state_group =
            wgpu.bind_group("the chunked prefill's state pass", &state, &walk_entries)?;
        let segments = if split {
            let transition = walk(1)?;
            let transition_group =
                wgpu.bind_group("the segments' transition walk", &transition, &walk_entries)?;
            let combine = pipeline(&COMBINE, &[])?;
            let combine_group = wgpu.bind_group(
                "the segments' entry states",
                &combine,
                &[
                    (0, "params", &uniform),
                    (6, "chunk table", table.buffer()),
                    (8, "initial states", call.state.buffer()),
                    (10, "segment states", &walk_states),
                ],
            )?;
            Some(Segments {
                transition,
                transition_group,
                transition_grid: (
                    trans_width.div_ceil(tile) as u32,
                    heads as u32,
                    units as u32,
                ),
                combine,
                combine_group,
                combine_grid: (
                    d.value_dim.div_ceil(COMBINE_COLS) as u32,
                    heads as u32,
                    call.seqs.len() as u32,
                ),
            })
        } else {
            None
        };
        Ok(Some(Self {
            prepare,
            state,
            prepare_group,
            state_group,
            segments,
            prepare_grid: (
                heads as u32,
                GRID_ROW.min(chunks) as u32,
                chunks.div_ceil(GRID_ROW) as u32,
            ),
            state_grid: (
                d.value_dim.div_ceil(tile) as u32,
                heads as u32,
                units as u32,
            ),
            tile,
            kernel,
            _buffers: (scratch, table, walk_states),
        }))
    }

    /// Records the passes into `pass` (wgpu orders the second after the first's writes).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, passes: ChunkPasses) {
        if self.prepare_grid.1 > 0 && passes != ChunkPasses::State {
            pass.set_pipeline(&self.prepare);
            pass.set_bind_group(0, &self.prepare_group, &[]);
            pass.dispatch_workgroups(
                self.prepare_grid.0,
                self.prepare_grid.1,
                self.prepare_grid.2,
            );
        }
        if passes == ChunkPasses::Prepare {
            return;
        }
        if let Some(segments) = &self.segments {
            let (x, y, z) = segments.transition_grid;
            pass.set_pipeline(&segments.transition);
            pass.set_bind_group(0, &segments.transition_group, &[]);
            pass.dispatch_workgroups(x, y, z);
            let (x, y, z) = segments.combine_grid;
            pass.set_pipeline(&segments.combine);
            pass.set_bind_group(0, &segments.combine_group, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        pass.set_pipeline(&self.state);
        pass.set_bind_group(0, &self.state_group, &[]);
        pass.dispatch_workgroups(self.state_grid.0, self.state_grid.1, self.state_grid.2);
    }

    /// The state pass's column tile.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// The state pass's walk units: one per sequence, or one per segment of a split one.
    pub fn walk_units(&self) -> usize {
        self.state_grid.2 as usize
    }

    /// The state pass's kernel (never [`StateKernel::Auto`]).
    pub fn kernel(&self) -> StateKernel {
        self.kernel
    }

    /// Submits `repeat` rounds of `passes` back to back in one command buffer (without
    /// waiting).
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize, passes: ChunkPasses) -> Result<()> {
        wgpu.submit_pass("running the chunked prefill", |pass| {
            for _ in 0..repeat {
                self.encode(pass, passes);
            }
        })
    }
}
