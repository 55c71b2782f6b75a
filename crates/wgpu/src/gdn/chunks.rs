//! The launcher of the two-pass chunked prefill (`chunks.wgsl`; the math is at its top):
//! `gdn_chunk_prepare` over every (chunk, value head) at once, then `gdn_chunk_state` over
//! (sequence, value head, tile of value columns), in one compute pass. The prepare pass leaves
//! W, Qd, Kd (`[chunks, H, 32, ceil(K/4)]` vec4 words each), U, P and the chunk decays in one
//! f32 scratch buffer (the runtime's, kept between calls up to `DELTAKV_WGPU_SCRATCH_CACHE_MIB`:
//! the prepare pass writes every word the state pass reads); a call whose scratch would not
//! fit one storage binding returns `None` and the caller runs the single-pass kernel instead.

use super::recurrent::dtype_code;
use crate::runtime::{ShaderSource, Wgpu};
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::GdnDims;
use deltakv_contract::gdn::prefill::validate::SeqSpan;
use deltakv_contract::{DType, HostTensor, Result};
use wgpu::util::DeviceExt;

/// Tokens per chunk (`C` in the shader).
pub const CHUNK: usize = 32;

/// The prepare pass.
pub const PREPARE: ShaderSource = ShaderSource {
    name: "gdn_chunk_prepare",
    text: concat!(include_str!("../dtype.wgsl"), include_str!("chunks.wgsl")),
    entry_point: "gdn_chunk_prepare",
};

/// The state pass.
pub const STATE: ShaderSource = ShaderSource {
    name: "gdn_chunk_state",
    text: concat!(include_str!("../dtype.wgsl"), include_str!("chunks.wgsl")),
    entry_point: "gdn_chunk_state",
};

/// The state pass with one chunk row and one 4-row block of S per thread, in straight-line code.
pub const STATE_BLOCK: ShaderSource = ShaderSource {
    name: "gdn_chunk_state_block",
    text: concat!(
        include_str!("../dtype.wgsl"),
        include_str!("chunks.wgsl"),
        include_str!("chunks_state_block.wgsl")
    ),
    entry_point: "gdn_chunk_state_block",
};

/// Set to 16 or 32, the environment variable that fixes the state pass's column tile (for
/// timing one against the other); K > 128 always takes 16.
pub const TILE_ENV: &str = "DELTAKV_WGPU_PREFILL_TILE";

/// Set to 8, 16 or 32, the environment variable that fixes the state pass's row groups (its
/// threads are row groups x column pairs, at most 256: 32 groups only with 16-column tiles).
pub const GROUPS_ENV: &str = "DELTAKV_WGPU_PREFILL_GROUPS";

/// Set to `0`, the environment variable that makes the state pass read the row width of W, Qd
/// and Kd (ceil(K / 4) words) at run time instead of fixing it in the pipeline (for timing one
/// against the other).
pub const FIXED_WIDTH_ENV: &str = "DELTAKV_WGPU_PREFILL_FIXED_WIDTH";

/// Set to `loops`, the environment variable that makes the state pass run its general kernel
/// (`gdn_chunk_state`) where the one-block kernel (`gdn_chunk_state_block`: 16-column tiles,
/// 32 row groups, K <= 128 and a multiple of 16) would serve (for timing one against the other).
pub const STATE_KERNEL_ENV: &str = "DELTAKV_WGPU_PREFILL_STATE";

/// Set to `1`, the environment variable that builds the two passes with wgpu's loop bounding
/// (the counter naga adds to every loop, which can keep the driver from unrolling; measured
/// slower on the H100), for timing. Without it, as by default, every loop of both passes still
/// ends: their trip counts come from the chunk table and the head dimensions, which the launch
/// has checked.
pub const LOOP_BOUNDING_ENV: &str = "DELTAKV_WGPU_PREFILL_LOOP_BOUNDING";

/// Set to `serial`, the environment variable that makes the prepare invert I + A by one forward
/// substitution instead of by 16 x 16 blocks (for timing one against the other).
pub const INVERSE_ENV: &str = "DELTAKV_WGPU_PREFILL_INVERSE";

/// Set to `0`, the environment variable that makes the one-block state kernel read Kd from the
/// scratch buffer in its update instead of staging the chunk's Kd in workgroup memory (for
/// timing one against the other).
pub const STAGE_KD_ENV: &str = "DELTAKV_WGPU_PREFILL_STAGE_KD";

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
}

/// Both passes, ready to encode any number of times.
pub struct ChunkLaunch {
    prepare: wgpu::ComputePipeline,
    state: wgpu::ComputePipeline,
    prepare_group: wgpu::BindGroup,
    state_group: wgpu::BindGroup,
    prepare_grid: (u32, u32, u32),
    state_grid: (u32, u32, u32),
    tile: usize,
    /// The scratch (shared with other calls: see `Wgpu::scratch`) and the chunk table, kept
    /// alive for the bindings.
    _buffers: (wgpu::Buffer, WgpuTensor),
}

impl ChunkLaunch {
    /// Plans the chunks, allocates the scratch and builds the bindings; `None` when the
    /// scratch or the grid exceeds what the adapter allows in one binding or dispatch.
    pub fn new(wgpu: &Wgpu, call: &ChunkCall<'_>) -> Result<Option<Self>> {
        let d = &call.dims;
        let heads = d.value_heads;
        // Chunk table: (first token, length) per chunk, then each sequence's first chunk.
        let mut table: Vec<u32> = Vec::new();
        let mut firsts: Vec<u32> = vec![0];
        for s in call.seqs {
            let mut t = 0;
            while t < s.len {
                table.push((s.start + t) as u32);
                table.push(CHUNK.min(s.len - t) as u32);
                t += CHUNK;
            }
            firsts.push((table.len() / 2) as u32);
        }
        let chunks = table.len() / 2;
        table.extend_from_slice(&firsts);
        let kp4 = d.key_dim.div_ceil(4);
        let vp4 = d.value_dim.div_ceil(4);
        // Scratch regions in vec4 words: W, Qd, Kd, U, P, decays.
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
        if bytes > limits.max_storage_buffer_binding_size
            || bytes > limits.max_buffer_size
            || words > u32::MAX as usize
            || chunks.div_ceil(GRID_ROW) > max_dim
            || GRID_ROW.min(chunks) > max_dim
            || heads > max_dim
            || call.seqs.len() > max_dim
        {
            return Ok(None);
        }
        let narrow_tiles = d.key_dim > 128
            || match std::env::var(TILE_ENV).ok().as_deref().map(str::trim) {
                Some("16") => true,
                Some("32") => false,
                _ => call.seqs.len() * heads * d.value_dim.div_ceil(32) < NARROW_TILES_BELOW,
            };
        let tile = if narrow_tiles { 16 } else { 32 };
        // 32 row groups (256 threads) where the tile allows it: each thread then keeps one
        // 4-row block of S, and the walk over chunks, which bounds the pass, has twice the
        // threads of 16 groups for the same products.
        let row_groups = match std::env::var(GROUPS_ENV).ok().as_deref().map(str::trim) {
            Some("8") => 8,
            Some("16") => 16,
            _ if tile == 16 => 32,
            _ => 16,
        };
        let row_blocks = kp4.div_ceil(row_groups) as u32;
        let block_kernel = tile == 16
            && row_groups == 32
            && kp4 <= 32
            && kp4.is_multiple_of(4)
            && std::env::var(STATE_KERNEL_ENV)
                .ok()
                .as_deref()
                .map(str::trim)
                != Some("loops");
        let state_kp4 = match std::env::var(FIXED_WIDTH_ENV)
            .ok()
            .as_deref()
            .map(str::trim)
        {
            Some("0") => 0,
            _ => kp4 as u32,
        };
        let scratch = wgpu.scratch(bytes)?;
        let table_bytes: Vec<u8> = table.iter().flat_map(|w| w.to_le_bytes()).collect();
        let table = WgpuTensor::upload(
            wgpu,
            &HostTensor::from_le_bytes(vec![table.len()], DType::I32, &table_bytes)?,
        )?;
        let code = |t: &WgpuTensor| dtype_code(t.dtype());
        let params: [u32; 20] = [
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
        ];
        let uniform = wgpu
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("gdn_chunk params"),
                contents: &params
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect::<Vec<u8>>(),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let blocked_inverse =
            u32::from(std::env::var(INVERSE_ENV).ok().as_deref().map(str::trim) != Some("serial"));
        let bounded = std::env::var(LOOP_BOUNDING_ENV)
            .ok()
            .as_deref()
            .map(str::trim)
            == Some("1");
        let pipeline = |source: &ShaderSource, constants: &[(&'static str, u32)]| {
            if bounded {
                wgpu.pipeline(source, constants)
            } else {
                // SAFETY: every loop of chunks.wgsl and chunks_state_block.wgsl ends (see
                // LOOP_BOUNDING_ENV).
                unsafe { wgpu.pipeline_without_loop_bounding(source, constants) }
            }
        };
        let prepare = pipeline(&PREPARE, &[("BLOCKED_INVERSE", blocked_inverse)])?;
        let state = if block_kernel {
            let stage_kd = u32::from(
                std::env::var(STAGE_KD_ENV)
                    .ok()
                    .is_none_or(|v| v.trim() != "0"),
            );
            pipeline(
                &STATE_BLOCK,
                &[("VT", 16), ("STATE_KP4", state_kp4), ("STAGE_KD", stage_kd)],
            )?
        } else {
            pipeline(
                &STATE,
                &[
                    ("VT", tile as u32),
                    ("ROW_GROUPS", row_groups as u32),
                    ("ROW_BLOCKS", row_blocks),
                    ("STATE_KP4", state_kp4),
                ],
            )?
        };
        let group = |pipeline: &wgpu::ComputePipeline, bound: &[(u32, &wgpu::Buffer)]| {
            let entries: Vec<wgpu::BindGroupEntry> = bound
                .iter()
                .map(|&(binding, b)| wgpu::BindGroupEntry {
                    binding,
                    resource: b.as_entire_binding(),
                })
                .collect();
            wgpu.device().create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("gdn_chunk"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        };
        let prepare_group = group(
            &prepare,
            &[
                (0, &uniform),
                (1, call.q.buffer()),
                (2, call.k.buffer()),
                (3, call.v.buffer()),
                (4, call.g.buffer()),
                (5, call.beta.buffer()),
                (6, table.buffer()),
                (7, &scratch),
            ],
        );
        let state_group = group(
            &state,
            &[
                (0, &uniform),
                (6, table.buffer()),
                (7, &scratch),
                (8, call.state.buffer()),
                (9, call.o.buffer()),
            ],
        );
        wgpu.check("binding the chunked prefill's buffers")?;
        Ok(Some(Self {
            prepare,
            state,
            prepare_group,
            state_group,
            prepare_grid: (
                heads as u32,
                GRID_ROW.min(chunks) as u32,
                chunks.div_ceil(GRID_ROW) as u32,
            ),
            state_grid: (
                d.value_dim.div_ceil(tile) as u32,
                heads as u32,
                call.seqs.len() as u32,
            ),
            tile,
            _buffers: (scratch, table),
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
        pass.set_pipeline(&self.state);
        pass.set_bind_group(0, &self.state_group, &[]);
        pass.dispatch_workgroups(self.state_grid.0, self.state_grid.1, self.state_grid.2);
    }

    /// The state pass's column tile.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// Submits `repeat` rounds of `passes` back to back in one command buffer (without
    /// waiting).
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize, passes: ChunkPasses) -> Result<()> {
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for _ in 0..repeat {
                self.encode(&mut pass, passes);
            }
        }
        wgpu.queue().submit([encoder.finish()]);
        wgpu.check("running the chunked prefill")
    }
}
