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
use deltakv_contract::{DType, Error, HostTensor, Result};
use std::sync::OnceLock;
use wgpu::util::DeviceExt;

/// Tokens per chunk (`C` in the shader).
pub const CHUNK: usize = 32;

/// The prepare pass.
pub const PREPARE: ShaderSource = ShaderSource {
    name: "gdn_chunk_prepare",
    text: concat!(include_str!("../dtype.wgsl"), include_str!("chunks.wgsl")),
    entry_point: "gdn_chunk_prepare",
};

/// The prepare pass for 16-bit q, k and v with K and V even and at most 128, the chunk's rows
/// staged in workgroup memory (`chunks_prepare_staged.wgsl`).
pub const PREPARE_STAGED: ShaderSource = ShaderSource {
    name: "gdn_chunk_prepare_staged",
    text: concat!(
        include_str!("../dtype.wgsl"),
        include_str!("chunks.wgsl"),
        include_str!("chunks_prepare_staged.wgsl")
    ),
    entry_point: "gdn_chunk_prepare_staged",
};

/// The state pass.
pub const STATE: ShaderSource = ShaderSource {
    name: "gdn_chunk_state",
    text: concat!(include_str!("../dtype.wgsl"), include_str!("chunks.wgsl")),
    entry_point: "gdn_chunk_state",
};

/// The state pass with W, Qd and Kd staged in workgroup memory.
pub const STATE_STAGED: ShaderSource = ShaderSource {
    name: "gdn_chunk_state_staged",
    text: concat!(
        include_str!("../dtype.wgsl"),
        include_str!("chunks.wgsl"),
        include_str!("chunks_state_staged.wgsl")
    ),
    entry_point: "gdn_chunk_state_staged",
};

/// Set to 16 or 32, the environment variable that fixes the state pass's column tile (see
/// [`StatePlan::tile`]).
pub const TILE_ENV: &str = "DELTAKV_WGPU_PREFILL_TILE";

/// Set to 8, 16 or 32, the environment variable that fixes the state pass's row groups (see
/// [`StatePlan::row_groups`]).
pub const GROUPS_ENV: &str = "DELTAKV_WGPU_PREFILL_GROUPS";

/// Set to `general` or `staged`, the environment variable that picks the state pass's
/// kernel where more than one serves (see [`StateKernel`]).
pub const STATE_KERNEL_ENV: &str = "DELTAKV_WGPU_PREFILL_STATE";

/// Set to `general` or `staged`, the environment variable that picks the prepare pass's kernel
/// where more than one serves (see [`PrepareKernel`]).
pub const PREPARE_KERNEL_ENV: &str = "DELTAKV_WGPU_PREFILL_PREPARE";

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
    /// `gdn_chunk_state` (`chunks.wgsl`): any shape the launcher plans.
    General,
    /// `gdn_chunk_state_staged` (`chunks_state_staged.wgsl`): 16-column tiles, 32 row groups,
    /// K <= 128 and a multiple of 16; one chunk row and one 4-row block of S per thread in
    /// straight-line code, W, Qd and Kd staged in workgroup memory one or two phases ahead,
    /// taking turns in one buffer; W S and Qd S summed in two halves over K (29 KiB, eight
    /// barriers per chunk).
    Staged,
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
}

impl StatePlan {
    /// The plan [`TILE_ENV`], [`GROUPS_ENV`], [`STATE_KERNEL_ENV`] and [`PREPARE_KERNEL_ENV`]
    /// give (unset or empty: the default), or an error naming a variable whose value is not
    /// one of its choices.
    pub fn from_env() -> Result<Self> {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let number = |name: &str, choices: &[usize]| -> Result<Option<usize>> {
            match read(name) {
                None => Ok(None),
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| choices.contains(n))
                    .map(Some)
                    .ok_or_else(|| {
                        Error::InvalidValue(format!("{name}={v}: expected one of {choices:?}"))
                    }),
            }
        };
        let kernel = named_choice(
            STATE_KERNEL_ENV,
            read(STATE_KERNEL_ENV),
            &[
                ("auto", StateKernel::Auto),
                ("general", StateKernel::General),
                ("staged", StateKernel::Staged),
            ],
        )?;
        let prepare = named_choice(
            PREPARE_KERNEL_ENV,
            read(PREPARE_KERNEL_ENV),
            &[
                ("auto", PrepareKernel::Auto),
                ("general", PrepareKernel::General),
                ("staged", PrepareKernel::Staged),
            ],
        )?;
        // The combination is checked where every plan is, at launch.
        Ok(StatePlan {
            tile: number(TILE_ENV, &[16, 32])?,
            row_groups: number(GROUPS_ENV, &[8, 16, 32])?,
            kernel,
            prepare,
        })
    }

    /// The plan of the environment, read once per process.
    pub fn from_env_once() -> Result<Self> {
        static PLAN: OnceLock<std::result::Result<StatePlan, String>> = OnceLock::new();
        PLAN.get_or_init(|| Self::from_env().map_err(|e| e.to_string()))
            .clone()
            .map_err(Error::InvalidValue)
    }

    /// An error for a tile or row-group count outside the kernels' choices.
    pub fn check(&self) -> Result<()> {
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

/// The choice `value` names among `choices` (the first when unset), or an error naming the
/// variable `name` and its choices.
fn named_choice<T: Copy>(name: &str, value: Option<String>, choices: &[(&str, T)]) -> Result<T> {
    let Some(value) = value else {
        return Ok(choices[0].1);
    };
    choices
        .iter()
        .find(|(word, _)| *word == value)
        .map(|&(_, choice)| choice)
        .ok_or_else(|| {
            let words: Vec<&str> = choices.iter().map(|(word, _)| *word).collect();
            Error::InvalidValue(format!(
                "{name}={value}: expected one of {}",
                words.join(", ")
            ))
        })
}

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
    kernel: StateKernel,
    /// The scratch (shared with other calls: see `Wgpu::scratch`) and the chunk table, kept
    /// alive for the bindings.
    _buffers: (wgpu::Buffer, WgpuTensor),
}

impl ChunkLaunch {
    /// Plans the chunks, allocates the scratch and builds the bindings; `None` when the
    /// scratch or the grid exceeds what the adapter allows in one binding or dispatch.
    pub fn new(wgpu: &Wgpu, call: &ChunkCall<'_>, plan: &StatePlan) -> Result<Option<Self>> {
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
        plan.check()?;
        // 32 row groups take 16-column tiles (256 threads at most; `check` refuses both fixed
        // at 32).
        let narrow_tiles = d.key_dim > 128
            || match plan.tile {
                Some(tile) => tile == 16,
                None => {
                    plan.row_groups == Some(32)
                        || call.seqs.len() * heads * d.value_dim.div_ceil(32) < NARROW_TILES_BELOW
                }
            };
        let tile = if narrow_tiles { 16 } else { 32 };
        // 32 row groups (256 threads) where the tile allows it: each thread then keeps one
        // 4-row block of S, and the walk over chunks, which bounds the pass, has twice the
        // threads of 16 groups for the same products.
        let row_groups = plan.row_groups.unwrap_or(if tile == 16 { 32 } else { 16 });
        let row_blocks = kp4.div_ceil(row_groups) as u32;
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
            other => other,
        };
        let state_kp4 = kp4 as u32;
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
        // Built without wgpu's loop bounding (the counter naga adds to every loop, which kept
        // the driver from unrolling and measured slower on the H100).
        // SAFETY: every loop of chunks.wgsl, chunks_prepare_staged.wgsl and
        // chunks_state_staged.wgsl ends: their trip counts come from the chunk table and the
        // head dimensions, which this launch has checked.
        let pipeline = |source: &ShaderSource, constants: &[(&'static str, u32)]| unsafe {
            wgpu.pipeline_without_loop_bounding(source, constants)
        };
        let half_inputs = matches!(call.q.dtype(), DType::BF16 | DType::F16);
        let staged_prepare = half_inputs
            && d.key_dim.is_multiple_of(2)
            && d.value_dim.is_multiple_of(2)
            && d.key_dim <= 128
            && d.value_dim <= 128;
        let prepare = match plan.prepare {
            PrepareKernel::Auto | PrepareKernel::Staged if staged_prepare => pipeline(
                &PREPARE_STAGED,
                &[
                    ("KW", (d.key_dim / 2) as u32),
                    ("VW", (d.value_dim / 2) as u32),
                    ("HALF_DTYPE", dtype_code(call.q.dtype())),
                ],
            )?,
            PrepareKernel::Staged => {
                return Err(Error::InvalidValue(format!(
                    "the staged prepare kernel takes bf16 or f16 q, k and v with K and V even and at most 128; this call has {:?} inputs, K = {}, V = {}",
                    call.q.dtype(),
                    d.key_dim,
                    d.value_dim
                )));
            }
            _ => pipeline(&PREPARE, &[])?,
        };
        let state = match kernel {
            StateKernel::Staged => {
                pipeline(&STATE_STAGED, &[("VT", 16), ("STATE_KP4", state_kp4)])?
            }
            _ => pipeline(
                &STATE,
                &[
                    ("VT", tile as u32),
                    ("ROW_GROUPS", row_groups as u32),
                    ("ROW_BLOCKS", row_blocks),
                    ("STATE_KP4", state_kp4),
                ],
            )?,
        };
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
        let state_group = wgpu.bind_group(
            "the chunked prefill's state pass",
            &state,
            &[
                (0, "params", &uniform),
                (6, "chunk table", table.buffer()),
                (7, "scratch", &scratch),
                (8, "final states", call.state.buffer()),
                (9, "o", call.o.buffer()),
            ],
        )?;
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
            kernel,
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

    /// The state pass's kernel (never [`StateKernel::Auto`]).
    pub fn kernel(&self) -> StateKernel {
        self.kernel
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_variable_names_one_of_its_choices() {
        let choices = [
            ("auto", PrepareKernel::Auto),
            ("general", PrepareKernel::General),
            ("staged", PrepareKernel::Staged),
        ];
        let pick = |value: Option<&str>| named_choice("VAR", value.map(String::from), &choices);
        assert_eq!(pick(None).unwrap(), PrepareKernel::Auto);
        assert_eq!(pick(Some("staged")).unwrap(), PrepareKernel::Staged);
        let err = pick(Some("fast")).unwrap_err().to_string();
        assert!(
            err.contains("VAR=fast") && err.contains("auto, general, staged"),
            "{err}"
        );
    }
}
