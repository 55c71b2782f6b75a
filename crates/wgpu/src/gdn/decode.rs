//! GDN decode on wgpu: T = 1..=16 new tokens per sequence over a state pool that stays on the
//! device and is updated in place, in one dispatch per call.
//!
//! The math, layouts and rules are the contract's (see `deltakv_contract::gdn::decode`): row `b`
//! reads and writes slot `slot_indices[b]`, a negative index skips the row (zero output, no slot
//! touched), f32 or bf16 pool (bf16 with an even V) with f32 arithmetic, optional fused gating,
//! l2 norm and intermediate states. The shader is `decode_bands.wgsl` (bands of rows, 16-byte
//! state accesses, V a multiple of 4), else `recurrent.wgsl` (column pairs); [`DecodeTile`]
//! picks one for comparisons.
//!
//! Validation before dispatch: every shape and dtype (the contract's own check), and the slot
//! indices, which are copied to the host (B integers) to reject out-of-range and duplicate
//! slots before the pool is touched. Values on the device are not scanned for NaN;
//! [`gdn_decode_checked`] does it, and [`gdn_decode_host`] runs host tensors with it.

use super::recurrent::{Kernel, RecurrentCall, RecurrentLaunch, Rows};
use crate::runtime::Wgpu;
use crate::tensor::WgpuTensor;
use deltakv_contract::gdn::decode::through::{check_device_decode, decode_through_device};
use deltakv_contract::gdn::decode::validate::{
    DecodeShapes, check_decode_shapes, resolve_scale, slot_rows,
};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, GdnDims, GdnOptions};
use deltakv_contract::{DType, Error, HostTensor, Result};

/// Decode results on the device (the pool itself is updated in place).
#[derive(Debug)]
pub struct WgpuDecodeOutput {
    /// `[B, T, H, V]` in v's dtype; zeros for skipped rows.
    pub o: WgpuTensor,
    /// `[B, T, H, K, V]` f32 when asked; zeros for skipped rows.
    pub intermediate_states: Option<WgpuTensor>,
}

/// The kernel of a decode call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeTile {
    /// [`DecodeTile::Bands`] where V is a multiple of 4, else [`DecodeTile::Pairs`].
    #[default]
    Auto,
    /// `decode_bands.wgsl`: 8 bands of contiguous rows, 32 column quads per workgroup (256
    /// invocations), the loops over a thread's rows written out row by row (V a multiple of
    /// 4). The fastest of the forms measured on the H100 (docs/wgpu.md).
    Bands,
    /// `recurrent.wgsl`: threads own column pairs, 64 columns per workgroup (any V).
    Pairs,
}

impl DecodeTile {
    /// Every tile but `Auto`, for comparisons (tests, the benchmark).
    pub const COMPARED: [DecodeTile; 2] = [DecodeTile::Bands, DecodeTile::Pairs];

    /// The tile's short name (`auto`, `bands`, `pairs`).
    pub fn label(self) -> &'static str {
        match self {
            DecodeTile::Auto => "auto",
            DecodeTile::Bands => "bands",
            DecodeTile::Pairs => "pairs",
        }
    }

    fn kernel(self, value_dim: usize) -> Kernel {
        match self {
            DecodeTile::Auto if value_dim.is_multiple_of(4) => Kernel::Bands,
            DecodeTile::Bands => Kernel::Bands,
            // 64 columns per workgroup: each row group's 32 threads read 256 contiguous bytes
            // of an f32 state row.
            DecodeTile::Auto | DecodeTile::Pairs => Kernel::Pairs { col_pairs: 32 },
        }
    }
}

/// A validated decode call, ready to submit any number of times (each submission advances the
/// addressed slots again). The slot indices were checked when it was prepared; values written
/// into that tensor in place since must still pass the check (each below the pool's slot count
/// or negative, no two rows on one slot): the shader does not check them again, and WGSL's
/// bounds clamping would turn an index past the pool into a silent write to its last slot.
pub struct DecodeLaunch {
    launch: RecurrentLaunch,
}

impl DecodeLaunch {
    /// Queues `repeat` back-to-back dispatches in one submission.
    pub fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        self.launch.submit(wgpu, repeat)
    }
}

/// The shapes of `o` (`[B, T, H, V]`) and of the intermediate states (`[B, T, H, K, V]`).
fn output_shapes(dims: &GdnDims) -> (Vec<usize>, Vec<usize>) {
    let rows = [dims.batch, dims.tokens, dims.value_heads];
    (
        [&rows[..], &[dims.value_dim]].concat(),
        [&rows[..], &[dims.key_dim, dims.value_dim]].concat(),
    )
}

/// Shapes and dtypes (the contract's check) and slot indices of a call on device tensors.
fn validate_on_device(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &WgpuTensor,
) -> Result<DecodeShapes> {
    let shapes = check_decode_shapes(inputs, state_pool)?;
    let indices = inputs.slot_indices.download(wgpu)?;
    slot_rows(&indices, shapes.dims.batch, shapes.slots)?;
    Ok(shapes)
}

/// Validates a decode call and prepares its dispatch, writing into `o` (`[B, T, H, V]`, v's
/// dtype) and, when given, `intermediate_states` (`[B, T, H, K, V]` f32).
pub fn prepare_decode_launch(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &mut WgpuTensor,
    options: &GdnOptions,
    o: &mut WgpuTensor,
    intermediate_states: Option<&mut WgpuTensor>,
) -> Result<DecodeLaunch> {
    prepare_decode_launch_tiled(
        wgpu,
        inputs,
        state_pool,
        options,
        o,
        intermediate_states,
        DecodeTile::Auto,
    )
}

/// [`prepare_decode_launch`] with the kernel and tile given (for comparing them).
pub fn prepare_decode_launch_tiled(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &mut WgpuTensor,
    options: &GdnOptions,
    o: &mut WgpuTensor,
    intermediate_states: Option<&mut WgpuTensor>,
    tile: DecodeTile,
) -> Result<DecodeLaunch> {
    let DecodeShapes { dims, .. } = validate_on_device(wgpu, inputs, state_pool)?;
    build_launch(
        wgpu,
        inputs,
        state_pool,
        options,
        dims,
        o,
        intermediate_states.map(|t| &*t),
        tile,
    )
}

#[allow(clippy::too_many_arguments)]
fn build_launch(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &WgpuTensor,
    options: &GdnOptions,
    dims: GdnDims,
    o: &WgpuTensor,
    intermediate_states: Option<&WgpuTensor>,
    tile: DecodeTile,
) -> Result<DecodeLaunch> {
    let scale = resolve_scale(options, dims.key_dim)?;
    let expect = |name: &str, t: &WgpuTensor, shape: &[usize], dtype: DType| -> Result<()> {
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
    if let Some(t) = intermediate_states {
        expect("intermediate_states", t, &states_shape, DType::F32)?;
    }
    let gates = inputs.gating.tensors();
    let launch = RecurrentLaunch::new(
        wgpu,
        &RecurrentCall {
            dims,
            rows: dims.batch,
            q: inputs.q,
            k: inputs.k,
            v: inputs.v,
            gates: &gates,
            row_source: Rows::Slots(inputs.slot_indices),
            state: state_pool,
            o,
            intermediate: intermediate_states,
            scale,
            l2norm: options.use_qk_l2norm,
            kernel: tile.kernel(dims.value_dim),
        },
    )?;
    Ok(DecodeLaunch { launch })
}

/// Allocates poisoned outputs and runs a validated call.
fn run_validated(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &mut WgpuTensor,
    options: &DecodeOptions,
    dims: GdnDims,
) -> Result<WgpuDecodeOutput> {
    let (o_shape, states_shape) = output_shapes(&dims);
    let o = WgpuTensor::poisoned(wgpu, o_shape, inputs.v.dtype())?;
    let intermediate_states = if options.intermediate_states {
        Some(WgpuTensor::poisoned(wgpu, states_shape, DType::F32)?)
    } else {
        None
    };
    build_launch(
        wgpu,
        inputs,
        state_pool,
        &options.gdn,
        dims,
        &o,
        intermediate_states.as_ref(),
        DecodeTile::Auto,
    )?
    .submit(wgpu, 1)?;
    Ok(WgpuDecodeOutput {
        o,
        intermediate_states,
    })
}

/// Runs GDN decode on the device, updating the addressed slots of `state_pool` in place;
/// returns `o` and, when asked, the intermediate states, both on the device. On a validation
/// error nothing has been dispatched.
pub fn gdn_decode(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &mut WgpuTensor,
    options: &DecodeOptions,
) -> Result<WgpuDecodeOutput> {
    let DecodeShapes { dims, .. } = validate_on_device(wgpu, inputs, state_pool)?;
    run_validated(wgpu, inputs, state_pool, options, dims)
}

/// [`gdn_decode`] after the contract's full check of the inputs' values (finite activations
/// and gates, slot indices), which copies them to the host first: for command-line use and
/// tests, where a wait per call does not matter.
pub fn gdn_decode_checked(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, WgpuTensor>,
    state_pool: &mut WgpuTensor,
    options: &DecodeOptions,
) -> Result<WgpuDecodeOutput> {
    let shapes = check_device_decode(inputs, state_pool, &options.gdn, |t| t.download(wgpu))?;
    run_validated(wgpu, inputs, state_pool, options, shapes.dims)
}

/// GDN decode of host tensors on the device: the contract's full check on the host, the inputs
/// and the pool copied to the device, the results and the updated pool copied back (for files
/// and one-off calls). As on the CPU, a result that overflowed f32 is an error.
pub fn gdn_decode_host(
    wgpu: &Wgpu,
    inputs: &DecodeInputs<'_, HostTensor>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    decode_through_device(
        inputs,
        state_pool,
        options,
        |t| WgpuTensor::upload(wgpu, t),
        |t| t.download(wgpu),
        |uploaded, pool, shapes| {
            let out = run_validated(wgpu, uploaded, pool, options, shapes.dims)?;
            Ok((out.o, out.intermediate_states))
        },
    )
}
