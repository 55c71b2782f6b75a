//! The form in which the prefill kernels read their inputs (bf16 rows padded to the compiled
//! K and V, q and k l2-normalised when asked, f32 gates), and the conversion launches that
//! produce it when a caller's tensor is not already in that form.

use crate::gdn::decode::dtype_code;
use crate::runtime::Cuda;
use crate::tensor::CudaTensor;
use cudarc::driver::DeviceRepr;
use deltakv_contract::{DType, Result};

/// Mirrors `struct ConvertParams` in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ConvertParams {
    src: u64,
    dst: u64,
    rows: i64,
    dim: i32,
    pad: i32,
    src_dtype: i32,
    to_f32: i32,
    normalize: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for ConvertParams {}

/// A copy of one input in the form the kernels read (bf16 padded rows, or f32 gates), made on
/// every launch.
pub(super) struct Conversion {
    pub(super) params: ConvertParams,
    pub(super) blocks: u32,
}

/// How one input becomes what the kernels read.
#[derive(Clone, Copy)]
pub(super) struct OperandForm {
    /// Elements per row of the input.
    pub(super) dim: usize,
    /// Elements per row the kernels read (zero-padded).
    pub(super) pad: usize,
    pub(super) dtype: DType,
    /// l2-normalise each row.
    pub(super) normalize: bool,
}

/// The input `t` as the kernels read it: itself when it already has `form`, else a scratch
/// buffer filled by a conversion at every launch.
pub(super) fn kernel_operand(
    cuda: &Cuda,
    t: &CudaTensor,
    form: OperandForm,
    conversions: &mut Vec<Conversion>,
    buffers: &mut Vec<CudaTensor>,
) -> Result<u64> {
    let OperandForm {
        dim,
        pad,
        dtype,
        normalize,
    } = form;
    let rows = t.shape().iter().product::<usize>() / dim.max(1);
    if t.dtype() == dtype && dim == pad && !normalize {
        return Ok(t.device_address(cuda));
    }
    // The conversion kernel writes every row and its padding.
    let scratch = CudaTensor::scratch(cuda, vec![rows, pad], dtype)?;
    let params = ConvertParams {
        src: t.device_address(cuda),
        dst: scratch.device_address(cuda),
        rows: rows as i64,
        dim: dim as i32,
        pad: pad as i32,
        src_dtype: dtype_code(t.dtype()),
        to_f32: i32::from(dtype == DType::F32),
        normalize: i32::from(normalize),
    };
    // One warp per row, eight per block.
    let blocks = rows.div_ceil(8).clamp(1, 65535) as u32;
    conversions.push(Conversion { params, blocks });
    let address = params.dst;
    buffers.push(scratch);
    Ok(address)
}

/// A scratch copy of bf16 `t` (rows of `pad` elements) that the prepare kernel fills with the
/// l2-normalised rows as it reads them: returns (the input's address, the copy's address).
pub(super) fn normalized_copy(
    cuda: &Cuda,
    t: &CudaTensor,
    pad: usize,
    buffers: &mut Vec<CudaTensor>,
) -> Result<(u64, u64)> {
    let rows = t.shape().iter().product::<usize>() / pad.max(1);
    // The prepare kernel writes every row (every token is in one chunk; K = pad).
    let scratch = CudaTensor::scratch(cuda, vec![rows, pad], DType::BF16)?;
    let address = scratch.device_address(cuda);
    buffers.push(scratch);
    Ok((t.device_address(cuda), address))
}
