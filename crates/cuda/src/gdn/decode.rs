//! GDN decode on CUDA: T = 1..=16 new tokens per sequence over a state pool that stays on the
//! GPU and is updated in place, in one kernel launch per call.
//!
//! The math, layouts and rules are the contract's (see `deltakv_contract::gdn::decode`): row `b`
//! reads and writes slot `slot_indices[b]`, a negative index skips the row (zero output, no slot
//! touched), f32 or bf16 pool with f32 arithmetic, optional fused gating, l2 norm and
//! intermediate states. The kernel is `kernels/gdn_decode.cu`.
//!
//! Validation before launch: every shape and dtype (the contract's own check), and the slot
//! indices, which are copied to the host (B integers) to reject out-of-range and duplicate
//! slots before the pool is touched. Values on the device are not scanned for NaN (that would
//! cost a pass and a wait on every step); [`gdn_decode_checked`] does it, for callers that
//! want the contract's full check, and [`gdn_decode_host`] runs host tensors with it.

use crate::compile::KernelSource;
use crate::runtime::{Cuda, driver_error};
use crate::tensor::CudaTensor;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use deltakv_contract::gdn::decode::through::{check_device_decode, decode_through_device};
use deltakv_contract::gdn::decode::validate::{
    DecodeShapes, check_decode_shapes, resolve_scale, slot_rows,
};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, Gating, GdnDims};
use deltakv_contract::{DType, Error, HostTensor, Result};

/// The decode kernels' source: the general kernel, then the T = 1, K = V = 128 kernels that
/// share its parameters and helpers.
pub const SOURCE: KernelSource = KernelSource {
    name: "gdn_decode",
    text: concat!(
        include_str!("../../kernels/gdn_decode.cu"),
        include_str!("../../kernels/gdn_decode_t1.cu")
    ),
};

const THREADS: u32 = 128;
const COL_GROUPS: usize = 8;

/// Why the decode kernels need their pool and intermediate states 16-byte aligned.
const DECODE_PIECES: &str = "the decode kernels move it in 16-byte pieces";

/// Mirrors `struct DecodeParams` in the kernel, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DecodeParams {
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    a: u64,
    b: u64,
    a_log: u64,
    dt_bias: u64,
    slots: u64,
    pool: u64,
    o: u64,
    intermediate: u64,
    key_head_magic: u64,
    batch: i32,
    tokens: i32,
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
    act_dtype: i32,
    out_dtype: i32,
    g_dtype: i32,
    beta_dtype: i32,
    a_dtype: i32,
    b_dtype: i32,
    a_log_dtype: i32,
    dt_bias_dtype: i32,
    slot_dtype: i32,
    fused_gating: i32,
    l2norm: i32,
    scale: f32,
    pool_slots: i64,
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for DecodeParams {}

/// The dtype code the kernels use (`DT_*` in `kernels/common.cuh`).
pub(crate) fn dtype_code(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
    }
}

/// Decode results on the GPU (the pool itself is updated in place).
#[derive(Debug)]
pub struct CudaDecodeOutput {
    /// `[B, T, H, V]` in v's dtype; zeros for skipped rows.
    pub o: CudaTensor,
    /// `[B, T, H, K, V]` f32 when asked; zeros for skipped rows.
    pub intermediate_states: Option<CudaTensor>,
}

/// A validated decode call, ready to launch any number of times (a CUDA graph captures
/// [`DecodeLaunch::launch`]).
pub struct DecodeLaunch {
    params: DecodeParams,
    function: cudarc::driver::CudaFunction,
    config: LaunchConfig,
}

impl DecodeLaunch {
    /// Queues the kernel on deltakv's stream.
    ///
    /// # Safety
    ///
    /// The launch holds device addresses, not borrows. When it is called, every
    /// tensor it was prepared from (q, k, v, the gates, the slot indices, the pool, o and the
    /// intermediate states) must be alive, and slot indices written in place since the
    /// preparation must not put two rows on one slot (they would race). An index at or past
    /// the pool's slot count is refused by the kernel itself: that row's o and intermediate
    /// states come out NaN and no slot is touched.
    /// Dropping a tensor after the call is fine: deltakv frees device memory in its stream's
    /// order, after the work queued here.
    pub unsafe fn launch(&self, cuda: &Cuda) -> Result<()> {
        let mut builder = cuda.stream().launch_builder(&self.function);
        builder.arg(&self.params);
        // SAFETY: the parameters were built from buffers of the sizes the kernel indexes
        // (checked by `check_decode_shapes`), slot indices were range-checked on the host, and
        // the caller keeps both so (this function's contract).
        unsafe { builder.launch(self.config) }
            .map(|_| ())
            .map_err(|e| driver_error("launching gdn_decode", e))
    }
}

/// Shapes and dtypes (the contract's check) and slot indices of a call on device tensors. The
/// indices are copied to the host (B integers), so out-of-range or duplicate slots never reach
/// the GPU.
fn validate_on_device(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &CudaTensor,
) -> Result<DecodeShapes> {
    let shapes = check_decode_shapes(inputs, state_pool)?;
    let indices = inputs.slot_indices.download(cuda)?;
    slot_rows(&indices, shapes.dims.batch, shapes.slots)?;
    Ok(shapes)
}

/// Validates a decode call and prepares its launch, writing into `o` (`[B, T, H, V]`, v's
/// dtype) and, when given, `intermediate_states` (`[B, T, H, K, V]` f32).
pub fn prepare_decode_launch(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &mut CudaTensor,
    options: &deltakv_contract::gdn::GdnOptions,
    o: &mut CudaTensor,
    intermediate_states: Option<&mut CudaTensor>,
) -> Result<DecodeLaunch> {
    let DecodeShapes { dims, .. } = validate_on_device(cuda, inputs, state_pool)?;
    build_launch(
        cuda,
        inputs,
        state_pool,
        options,
        dims,
        o,
        intermediate_states,
    )
}

/// The launch of a call whose inputs are validated: checks the output buffers, picks the
/// kernel and fills its parameters.
fn build_launch(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &mut CudaTensor,
    options: &deltakv_contract::gdn::GdnOptions,
    dims: GdnDims,
    o: &mut CudaTensor,
    intermediate_states: Option<&mut CudaTensor>,
) -> Result<DecodeLaunch> {
    let scale = resolve_scale(options, dims.key_dim)?;
    let expect = |name: &str, t: &CudaTensor, shape: &[usize], dtype: DType| -> Result<()> {
        if t.shape() != shape || t.dtype() != dtype {
            return Err(Error::InvalidValue(format!(
                "output buffer `{name}` is {:?} {}, expected {shape:?} {dtype}",
                t.shape(),
                t.dtype()
            )));
        }
        Ok(())
    };
    let (o_shape, states_shape) = output_shapes(&dims);
    expect("o", o, &o_shape, inputs.v.dtype())?;
    let intermediate = match intermediate_states {
        Some(t) => {
            expect("intermediate_states", t, &states_shape, DType::F32)?;
            t.check_aligned(cuda, "intermediate_states", 16, DECODE_PIECES)?;
            t.device_address_mut(cuda)
        }
        None => 0,
    };
    let f32_pool = state_pool.dtype() == DType::F32;
    let pool_bytes = state_pool.dtype().size_in_bytes();
    let (name, tiles, threads, shared_mem_bytes) =
        match OneTokenKernel::select(&dims, cuda.multiprocessors()) {
            // One block of 8 warps per (row, head), the whole slab in shared memory.
            Some(OneTokenKernel::Bands) => (
                if f32_pool {
                    "gdn_decode_k128_v128_t1_bands_f32"
                } else {
                    "gdn_decode_k128_v128_t1_bands_bf16"
                },
                1,
                256,
                128 * 128 * pool_bytes,
            ),
            // One block per (row, head, 16 columns), the state in registers.
            Some(OneTokenKernel::Registers) => (
                if f32_pool {
                    "gdn_decode_k128_v128_t1_registers_f32"
                } else {
                    "gdn_decode_k128_v128_t1_registers_bf16"
                },
                8,
                THREADS,
                0,
            ),
            None => {
                let (name, vec, rows_per_thread) = general_kernel(&dims, f32_pool);
                // The slab's shared memory: rows x tile columns in the pool's dtype, plus an
                // f32 copy between tokens for a bf16 pool with T > 1.
                let slab_elems = rows_per_thread * THREADS as usize * vec;
                let between_tokens = if pool_bytes == 2 && dims.tokens > 1 {
                    slab_elems * 4
                } else {
                    0
                };
                (
                    name,
                    dims.value_dim.div_ceil(COL_GROUPS * vec),
                    THREADS,
                    slab_elems * pool_bytes + between_tokens,
                )
            }
        };
    let function = cuda.function(&SOURCE, name)?;
    if dims.batch > 65535 {
        return Err(Error::Unsupported(format!(
            "CUDA decode takes at most 65535 rows per call, got B = {}",
            dims.batch
        )));
    }
    state_pool.check_aligned(cuda, "state_pool", 16, DECODE_PIECES)?;
    let pool_address = state_pool.device_address_mut(cuda);
    let mut params = DecodeParams {
        q: inputs.q.device_address(cuda),
        k: inputs.k.device_address(cuda),
        v: inputs.v.device_address(cuda),
        slots: inputs.slot_indices.device_address(cuda),
        pool: pool_address,
        o: o.device_address_mut(cuda),
        intermediate,
        key_head_magic: key_head_magic(dims.value_heads / dims.key_heads),
        batch: dims.batch as i32,
        tokens: dims.tokens as i32,
        key_heads: dims.key_heads as i32,
        value_heads: dims.value_heads as i32,
        key_dim: dims.key_dim as i32,
        value_dim: dims.value_dim as i32,
        act_dtype: dtype_code(inputs.q.dtype()),
        out_dtype: dtype_code(inputs.v.dtype()),
        slot_dtype: dtype_code(inputs.slot_indices.dtype()),
        l2norm: i32::from(options.use_qk_l2norm),
        scale,
        // The pool's slot count (its first dimension), so that a replayed launch whose
        // indices were rewritten past it writes NaN rows instead of another slot's memory.
        pool_slots: state_pool.shape()[0] as i64,
        ..DecodeParams::default()
    };
    match inputs.gating {
        Gating::Direct { g, beta } => {
            params.g = g.device_address(cuda);
            params.beta = beta.device_address(cuda);
            params.g_dtype = dtype_code(g.dtype());
            params.beta_dtype = dtype_code(beta.dtype());
        }
        Gating::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => {
            params.fused_gating = 1;
            params.a = a.device_address(cuda);
            params.b = b.device_address(cuda);
            params.a_log = a_log.device_address(cuda);
            params.dt_bias = dt_bias.device_address(cuda);
            params.a_dtype = dtype_code(a.dtype());
            params.b_dtype = dtype_code(b.dtype());
            params.a_log_dtype = dtype_code(a_log.dtype());
            params.dt_bias_dtype = dtype_code(dt_bias.dtype());
        }
    }
    let config = LaunchConfig {
        grid_dim: (tiles as u32, dims.value_heads as u32, dims.batch as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared_mem_bytes as u32,
    };
    Ok(DecodeLaunch {
        params,
        function,
        config,
    })
}

/// The general kernel's entry point for these dimensions, with its columns and rows per
/// thread: K = V = 128 has entry points with the dimensions compiled in; otherwise rows per
/// thread are ceil(K / 16) rounded up to 4, 8 or 16, and 4 columns when V % 4 == 0, else 1.
fn general_kernel(dims: &GdnDims, f32_pool: bool) -> (&'static str, usize, usize) {
    if dims.key_dim == 128 && dims.value_dim == 128 {
        return if f32_pool {
            ("gdn_decode_k128_v128_f32", 4, 8)
        } else {
            ("gdn_decode_k128_v128_bf16", 8, 8)
        };
    }
    let vec = if dims.value_dim.is_multiple_of(4) {
        4
    } else {
        1
    };
    let rows_per_thread = match dims.key_dim.div_ceil(16) {
        0..=4 => 4,
        5..=8 => 8,
        _ => 16,
    };
    let name = match (rows_per_thread, vec, f32_pool) {
        (4, 4, true) => "gdn_decode_r4_v4_f32",
        (8, 4, true) => "gdn_decode_r8_v4_f32",
        (16, 4, true) => "gdn_decode_r16_v4_f32",
        (4, 1, true) => "gdn_decode_r4_v1_f32",
        (8, 1, true) => "gdn_decode_r8_v1_f32",
        (16, 1, true) => "gdn_decode_r16_v1_f32",
        (4, 4, false) => "gdn_decode_r4_v4_bf16",
        (8, 4, false) => "gdn_decode_r8_v4_bf16",
        (16, 4, false) => "gdn_decode_r16_v4_bf16",
        (4, 1, false) => "gdn_decode_r4_v1_bf16",
        (8, 1, false) => "gdn_decode_r8_v1_bf16",
        _ => "gdn_decode_r16_v1_bf16",
    };
    (name, vec, rows_per_thread)
}

/// The two one-token kernels at K = V = 128 (`kernels/gdn_decode_t1.cu`), chosen by grid size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneTokenKernel {
    /// A block per (row, head, 16 columns), the state read into registers: the shortest
    /// critical path, for grids too small to keep the memory system busy.
    Registers,
    /// A block per (row, head), each warp moving a band of rows with bulk copies: near the copy
    /// rate once every SM holds several slabs.
    Bands,
}

impl OneTokenKernel {
    /// The kernel for a call of these dimensions on a GPU with `multiprocessors` SMs, or `None`
    /// when the call is not T = 1 at K = V = 128 (the general kernel runs it).
    pub fn select(dims: &GdnDims, multiprocessors: usize) -> Option<Self> {
        if dims.tokens != 1 || dims.key_dim != 128 || dims.value_dim != 128 {
            return None;
        }
        // Registers up to two (row, head) pairs per SM (16 of its blocks), bands beyond: the
        // crossover measured on the H100 for both pool dtypes (docs/cuda-kernel-log.md).
        let heads = dims.batch * dims.value_heads;
        Some(if heads <= 2 * multiprocessors {
            OneTokenKernel::Registers
        } else {
            OneTokenKernel::Bands
        })
    }
}

/// ceil(2^32 / group): the kernels find a value head's key head as `head * magic >> 32`, which
/// equals `head / group` for every head below 2^16 (grid rows are at most 65535).
fn key_head_magic(group: usize) -> u64 {
    (1u64 << 32).div_ceil(group as u64)
}

/// The shapes of `o` (`[B, T, H, V]`) and of the intermediate states (`[B, T, H, K, V]`).
fn output_shapes(dims: &GdnDims) -> (Vec<usize>, Vec<usize>) {
    let rows = [dims.batch, dims.tokens, dims.value_heads];
    (
        [&rows[..], &[dims.value_dim]].concat(),
        [&rows[..], &[dims.key_dim, dims.value_dim]].concat(),
    )
}

/// Allocates poisoned outputs and runs a validated call.
fn run_validated(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &mut CudaTensor,
    options: &DecodeOptions,
    dims: GdnDims,
) -> Result<CudaDecodeOutput> {
    let (o_shape, states_shape) = output_shapes(&dims);
    let mut o = CudaTensor::poisoned(cuda, o_shape, inputs.v.dtype())?;
    let mut intermediate_states = if options.intermediate_states {
        Some(CudaTensor::poisoned(cuda, states_shape, DType::F32)?)
    } else {
        None
    };
    let launch = build_launch(
        cuda,
        inputs,
        state_pool,
        &options.gdn,
        dims,
        &mut o,
        intermediate_states.as_mut(),
    )?;
    // SAFETY: launched at once, while this function borrows every tensor it was prepared from.
    unsafe { launch.launch(cuda) }?;
    Ok(CudaDecodeOutput {
        o,
        intermediate_states,
    })
}

/// Runs GDN decode on the GPU, updating the addressed slots of `state_pool` in place; returns
/// `o` and, when asked, the intermediate states, both on the GPU. On a validation error
/// nothing has been launched.
pub fn gdn_decode(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &mut CudaTensor,
    options: &DecodeOptions,
) -> Result<CudaDecodeOutput> {
    let DecodeShapes { dims, .. } = validate_on_device(cuda, inputs, state_pool)?;
    run_validated(cuda, inputs, state_pool, options, dims)
}

/// [`gdn_decode`] after the contract's full check of the inputs' values (finite activations
/// and gates, slot indices), which copies them to the host first: for command-line use and
/// tests, where a wait per call does not matter.
pub fn gdn_decode_checked(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, CudaTensor>,
    state_pool: &mut CudaTensor,
    options: &DecodeOptions,
) -> Result<CudaDecodeOutput> {
    let shapes = check_device_decode(inputs, state_pool, &options.gdn, |t| t.download(cuda))?;
    run_validated(cuda, inputs, state_pool, options, shapes.dims)
}

/// GDN decode of host tensors on the GPU: the contract's full check on the host, the inputs and
/// the pool copied to the GPU, the results and the updated pool copied back (for files and
/// one-off calls; a serving loop keeps its tensors on the GPU). As on the CPU, a result that
/// overflowed f32 is an error, and the addressed slots then hold the overflowed states.
pub fn gdn_decode_host(
    cuda: &Cuda,
    inputs: &DecodeInputs<'_, HostTensor>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    decode_through_device(
        inputs,
        state_pool,
        options,
        |t| CudaTensor::upload(cuda, t),
        |t| t.download(cuda),
        |uploaded, pool, shapes| {
            let out = run_validated(cuda, uploaded, pool, options, shapes.dims)?;
            Ok((out.o, out.intermediate_states))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::key_head_magic;

    #[test]
    fn the_key_head_magic_divides_every_grid_row_exactly() {
        for group in (1..=64).chain([96, 128, 1000, 65535]) {
            let magic = key_head_magic(group);
            for head in 0..(1u64 << 16) {
                assert_eq!(
                    (head * magic) >> 32,
                    head / group as u64,
                    "head {head}, group {group}"
                );
            }
        }
    }
}
