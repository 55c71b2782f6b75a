//! The launcher of the GDN kernels, which share their parameters and bindings
//! (`gdn_common.wgsl`): `decode_bands.wgsl`, GDN decode (a slot of a pool per row) in 16-byte
//! state accesses; `recurrent.wgsl`, the token loop behind the recurrent prefill (a sequence
//! per row) and the decode of shapes `decode_bands.wgsl` does not take (V not a multiple of 4);
//! and `chunk.wgsl`, the single-pass chunked prefill. Callers validate first; this only encodes the dispatch.

use super::decode_sources::{BANDS_BF16, BANDS_F32, unrolled};
use crate::runtime::{ShaderSource, Wgpu};
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::GdnDims;
use deltakv_contract::{DType, Error, Result};

/// The shader for adapters with subgroup operations: the row-group sums by shuffles, the
/// dtype helpers, then the kernel.
pub const SOURCE_SUBGROUP: ShaderSource = ShaderSource {
    name: "gdn_recurrent_subgroup",
    text: concat!(
        include_str!("reduce_subgroup.wgsl"),
        include_str!("../dtype.wgsl"),
        include_str!("gdn_common.wgsl"),
        include_str!("store_o.wgsl"),
        include_str!("state_words.wgsl"),
        include_str!("recurrent.wgsl")
    ),
    entry_point: "gdn_recurrent",
};

/// The shader for adapters without: the row-group sums through workgroup memory.
pub const SOURCE_SHARED: ShaderSource = ShaderSource {
    name: "gdn_recurrent_shared",
    text: concat!(
        include_str!("reduce_shared.wgsl"),
        include_str!("../dtype.wgsl"),
        include_str!("gdn_common.wgsl"),
        include_str!("store_o.wgsl"),
        include_str!("state_words.wgsl"),
        include_str!("recurrent.wgsl")
    ),
    entry_point: "gdn_recurrent",
};

/// The chunked prefill (`chunk.wgsl`) for adapters with subgroup operations.
pub const CHUNK_SUBGROUP: ShaderSource = ShaderSource {
    name: "gdn_chunk_subgroup",
    text: concat!(
        include_str!("reduce_subgroup.wgsl"),
        include_str!("../dtype.wgsl"),
        include_str!("gdn_common.wgsl"),
        include_str!("store_o.wgsl"),
        include_str!("state_words.wgsl"),
        include_str!("chunk.wgsl")
    ),
    entry_point: "gdn_chunk",
};

/// The chunked prefill for adapters without.
pub const CHUNK_SHARED: ShaderSource = ShaderSource {
    name: "gdn_chunk_shared",
    text: concat!(
        include_str!("reduce_shared.wgsl"),
        include_str!("../dtype.wgsl"),
        include_str!("gdn_common.wgsl"),
        include_str!("store_o.wgsl"),
        include_str!("state_words.wgsl"),
        include_str!("chunk.wgsl")
    ),
    entry_point: "gdn_chunk",
};

const ROW_GROUPS: usize = 8;
/// Bands of rows of the decode kernel (`BANDS` in `decode_bands.wgsl`).
const DECODE_BANDS: usize = 8;

/// The dtype code the shaders use (`DT_*` in `dtype.wgsl`).
pub(crate) fn dtype_code(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
    }
}

/// Mirrors `struct Params` in the shader, field for field.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct Params {
    rows: u32,
    tokens: u32,
    key_heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    group: u32,
    act_dtype: u32,
    out_dtype: u32,
    gate_a_dtype: u32,
    gate_b_dtype: u32,
    a_log_dtype: u32,
    dt_bias_dtype: u32,
    row_mode: u32,
    fused: u32,
    l2norm: u32,
    intermediate: u32,
    scale: f32,
    states: u32,
    pad: u32,
}

impl Params {
    fn to_bytes(self) -> Vec<u8> {
        let words = [
            self.rows,
            self.tokens,
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
            self.group,
            self.act_dtype,
            self.out_dtype,
            self.gate_a_dtype,
            self.gate_b_dtype,
            self.a_log_dtype,
            self.dt_bias_dtype,
            self.row_mode,
            self.fused,
            self.l2norm,
            self.intermediate,
            self.scale.to_bits(),
            self.states,
            self.pad,
        ];
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// How a row of the grid finds its tokens and its state.
pub enum Rows<'a> {
    /// Row b runs tokens b*T..(b+1)*T on state b (prefill without varlen).
    Dense,
    /// Row b runs tokens b*T..(b+1)*T on slot `slot_indices[b]` (i32 or i64; negative skips).
    Slots(&'a WgpuTensor),
    /// Row n runs tokens `offsets[n]..offsets[n+1]` (u32 `[N + 1]`) on state n (varlen prefill).
    Offsets(&'a WgpuTensor),
}

/// Everything one dispatch reads and writes.
pub struct RecurrentCall<'a> {
    pub dims: GdnDims,
    /// Rows of the grid: B for decode, N for prefill.
    pub rows: usize,
    pub q: &'a WgpuTensor,
    pub k: &'a WgpuTensor,
    pub v: &'a WgpuTensor,
    /// `g` and `beta`, or `a`, `b`, `A_log`, `dt_bias` (fused gating).
    pub gates: &'a [&'a WgpuTensor],
    pub row_source: Rows<'a>,
    /// `[S, H, K, V]` f32 or bf16, updated in place.
    pub state: &'a WgpuTensor,
    pub o: &'a WgpuTensor,
    pub intermediate: Option<&'a WgpuTensor>,
    pub scale: f32,
    pub l2norm: bool,
    pub kernel: Kernel,
}

/// Which kernel runs a call, and its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `recurrent.wgsl`, the token loop: threads own column pairs, `col_pairs` threads per row
    /// group, 32 (64 columns per workgroup) or 8 (16 columns).
    Pairs { col_pairs: usize },
    /// `chunk.wgsl`, the chunked prefill (dense or varlen rows, no intermediate states), in the
    /// tile of [`Kernel::Pairs`].
    Chunk { col_pairs: usize },
    /// `decode_bands.wgsl` (slot rows, V a multiple of 4): 8 bands of contiguous rows, 32
    /// column quads per workgroup (256 invocations), its row loops written out.
    Bands,
}

/// A prepared dispatch: pipeline, bindings and grid, to encode any number of times.
pub struct RecurrentLaunch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    grid: (u32, u32, u32),
}

impl RecurrentLaunch {
    /// Validates the grid against the device's limits and builds the bindings.
    pub fn new(wgpu: &Wgpu, call: &RecurrentCall<'_>) -> Result<Self> {
        let d = &call.dims;
        super::check_indexable(
            [
                ("q", call.q),
                ("k", call.k),
                ("v", call.v),
                ("state pool", call.state),
                ("o", call.o),
            ]
            .into_iter()
            .chain(call.intermediate.map(|t| ("intermediate states", t))),
        )?;
        let state_bf16 = call.state.dtype() == DType::BF16;
        if state_bf16 && !d.value_dim.is_multiple_of(2) {
            return Err(Error::Unsupported(format!(
                "a bf16 state pool on wgpu needs an even V (a column pair is one word), got V = {}",
                d.value_dim
            )));
        }
        let mut rows_per_thread = match d.key_dim.div_ceil(ROW_GROUPS) {
            0..=4 => 4,
            5..=8 => 8,
            9..=16 => 16,
            _ => 32,
        };
        let subgroups = wgpu.has_subgroups();
        let (source, columns_per_group, mut constants) = match call.kernel {
            Kernel::Pairs { col_pairs } => (
                if subgroups {
                    SOURCE_SUBGROUP
                } else {
                    SOURCE_SHARED
                },
                2 * col_pairs,
                vec![
                    ("COL_PAIRS", col_pairs as u32),
                    ("STATE_BF16", u32::from(state_bf16)),
                ],
            ),
            Kernel::Chunk { col_pairs } => {
                if call.intermediate.is_some()
                    || !matches!(call.row_source, Rows::Dense | Rows::Offsets(_))
                {
                    return Err(Error::InvalidValue(
                        "the chunked kernel runs prefills only (no slots, no intermediate states)"
                            .to_string(),
                    ));
                }
                let tokens = if d.key_dim <= 128 { 16 } else { 8 };
                (
                    if subgroups {
                        CHUNK_SUBGROUP
                    } else {
                        CHUNK_SHARED
                    },
                    2 * col_pairs,
                    vec![
                        ("COL_PAIRS", col_pairs as u32),
                        ("STATE_BF16", u32::from(state_bf16)),
                        ("CHUNK_TOKENS", tokens),
                    ],
                )
            }
            Kernel::Bands => {
                if !matches!(call.row_source, Rows::Slots(_)) || !d.value_dim.is_multiple_of(4) {
                    return Err(Error::InvalidValue(format!(
                        "the bands decode kernel runs slot rows with V a multiple of 4, got V = {}",
                        d.value_dim
                    )));
                }
                // Rows per band: ceil(K / bands) rounded up as above (at most 256 / bands).
                rows_per_thread = match d.key_dim.div_ceil(DECODE_BANDS) {
                    0..=4 => 4,
                    5..=8 => 8,
                    9..=16 => 16,
                    _ => 32,
                };
                let quads = 256 / DECODE_BANDS;
                let source = if state_bf16 { BANDS_BF16 } else { BANDS_F32 };
                // The state array is indexed by the row loops' counter: written out, it is
                // indexed by constants only and stays in registers (NVIDIA's compiler kept it
                // in local memory when the loops reached it as loops).
                (
                    unrolled(&source, rows_per_thread)?,
                    4 * quads,
                    vec![("QUADS", quads as u32), ("BANDS", DECODE_BANDS as u32)],
                )
            }
        };
        constants.push(("ROWS", rows_per_thread));
        let tiles = d.value_dim.div_ceil(columns_per_group);
        let max = wgpu.device().limits().max_compute_workgroups_per_dimension as usize;
        if call.rows > max || d.value_heads > max || tiles > max {
            return Err(Error::Unsupported(format!(
                "wgpu runs at most {max} rows and heads per call, got {} rows and H = {}",
                call.rows, d.value_heads
            )));
        }
        // The token-loop and one-pass chunk kernels are built without wgpu's loop bounding (its
        // counters keep the driver from unrolling their loops over rows, elements and chunk
        // tokens); the bands decode, written out row by row already, keeps it (it measured
        // slower without; docs/wgpu.md, decode tuning log).
        let pipeline = if matches!(call.kernel, Kernel::Bands) {
            wgpu.pipeline(&source, &constants)?
        } else {
            // SAFETY: every loop of recurrent.wgsl and chunk.wgsl ends: over a row's tokens (its
            // range from the row table this call built and checked), over constants (ROWS, four
            // elements, CHUNK_TOKENS), over K, V and a chunk's length, or by the workgroup's
            // thread count; the reduction loops double a mask below 8.
            unsafe { wgpu.pipeline_without_loop_bounding(&source, &constants)? }
        };
        let code = |t: &WgpuTensor| dtype_code(t.dtype());
        let (fused, gate_a, gate_b, a_log, dt_bias) = match call.gates {
            [g, beta] => (false, *g, *beta, *g, *g),
            [a, b, a_log, dt_bias] => (true, *a, *b, *a_log, *dt_bias),
            other => {
                return Err(Error::InvalidValue(format!(
                    "gating needs 2 or 4 tensors, got {}",
                    other.len()
                )));
            }
        };
        let (row_mode, row_info) = match call.row_source {
            Rows::Dense => (0, call.gates[0]),
            Rows::Slots(slots) => (if slots.dtype() == DType::I64 { 2 } else { 1 }, slots),
            Rows::Offsets(offsets) => (3, offsets),
        };
        let params = Params {
            rows: call.rows as u32,
            tokens: d.tokens as u32,
            key_heads: d.key_heads as u32,
            value_heads: d.value_heads as u32,
            key_dim: d.key_dim as u32,
            value_dim: d.value_dim as u32,
            group: (d.value_heads / d.key_heads) as u32,
            act_dtype: code(call.q),
            out_dtype: code(call.o),
            gate_a_dtype: code(gate_a),
            gate_b_dtype: code(gate_b),
            a_log_dtype: code(a_log),
            dt_bias_dtype: code(dt_bias),
            row_mode,
            fused: u32::from(fused),
            l2norm: u32::from(call.l2norm),
            intermediate: u32::from(call.intermediate.is_some()),
            scale: call.scale,
            // The kernels refuse a slot index at or past the state count (a replayed launch
            // over rewritten indices), where wgpu's clamped indexing would write the last slot;
            // dense and varlen rows are below it by construction. (The state's elements fit
            // u32: `check_indexable`.)
            states: call.state.shape()[0] as u32,
            pad: 0,
        };
        let uniform = wgpu.buffer_with(
            "gdn_recurrent params",
            &params.to_bytes(),
            wgpu::BufferUsages::UNIFORM,
        )?;
        // A write-only binding nothing writes, when no intermediate states are asked for (one
        // vec4, the smallest the decode kernel's binding takes).
        let intermediate = match call.intermediate {
            Some(t) => t.buffer(),
            None => wgpu.placeholder(0),
        };
        let buffers: [(&str, &wgpu::Buffer); 12] = [
            ("params", &uniform),
            ("q", call.q.buffer()),
            ("k", call.k.buffer()),
            ("v", call.v.buffer()),
            ("gate a", gate_a.buffer()),
            ("gate b", gate_b.buffer()),
            ("A_log", a_log.buffer()),
            ("dt_bias", dt_bias.buffer()),
            ("row table", row_info.buffer()),
            ("state pool", call.state.buffer()),
            ("o", call.o.buffer()),
            ("intermediate states", intermediate),
        ];
        // The chunked kernel writes no intermediate states: its layout ends at `o`.
        let used = if matches!(call.kernel, Kernel::Chunk { .. }) {
            11
        } else {
            12
        };
        let entries: Vec<(u32, &str, &wgpu::Buffer)> = buffers[..used]
            .iter()
            .enumerate()
            .map(|(i, &(name, buffer))| (i as u32, name, buffer))
            .collect();
        let bind_group = wgpu.bind_group("the GDN kernel", &pipeline, &entries)?;
        Ok(Self {
            pipeline,
            bind_group,
            grid: (tiles as u32, d.value_heads as u32, call.rows as u32),
        })
    }

    /// Records the dispatch into `pass`.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.encode_repeated(pass, 1);
    }

    /// Records `repeat` dispatches into `pass`, binding once.
    fn encode_repeated(&self, pass: &mut wgpu::ComputePass<'_>, repeat: usize) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        for _ in 0..repeat {
            pass.dispatch_workgroups(self.grid.0, self.grid.1, self.grid.2);
        }
    }

    /// Submits `repeat` back-to-back dispatches in one command buffer (without waiting).
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        wgpu.submit_pass("running gdn_recurrent", |pass| {
            self.encode_repeated(pass, repeat)
        })
    }
}
