//! The ops on candle's CUDA tensors (cargo feature `candle-cuda`): deltakv's CUDA kernels read
//! candle's device memory in place and write into buffers candle owns, on candle's stream.
//!
//! candle and deltakv share cudarc and the device's primary context, so a candle `CudaSlice`
//! address is a valid deltakv device address. Every launch, scratch allocation and small copy
//! of a call is queued on the stream of the candle device that holds the operands
//! ([`deltakv_cuda::Cuda::on_stream`]), so the call is ordered after candle's earlier work and
//! before its later work with no event and no device-wide wait. The one host wait is the
//! contract's index check: a varlen prefill reads `cu_seqlens` and a decode reads
//! `slot_indices` to the host before launching. Values are not checked on the device (no copy
//! of the activations to the host): inputs that overflow f32 give non-finite outputs, as in
//! deltakv's other device-tensor paths.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};
use candle_core::{CudaDevice, CudaStorage, Error, Layout, Result, Shape, Storage};
use deltakv::DType;
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions};
use deltakv_cuda::gdn::{PrefillExtras, PrefillLaunch, PrefillStates, prepare_decode_launch};
use deltakv_cuda::{Cuda, CudaTensor};

fn err(e: deltakv::Error) -> Error {
    Error::Msg(e.to_string())
}

/// deltakv's GPU, launching on `device`'s stream. Errors when deltakv opened another GPU.
pub(crate) fn launcher(device: &CudaDevice) -> Result<Cuda> {
    let cuda = Cuda::get().map_err(err)?;
    let ordinal = match candle_core::backend::BackendDevice::location(device) {
        candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
        other => return Err(Error::Msg(format!("{other:?} is not a CUDA device"))),
    };
    if cuda.ordinal() != ordinal {
        return Err(Error::Msg(format!(
            "the tensors are on cuda:{ordinal}, but deltakv's CUDA device is cuda:{} (DELTAKV_CUDA_DEVICE picks it)",
            cuda.ordinal()
        )));
    }
    cuda.context().bind_to_thread().map_err(|e| {
        err(deltakv_cuda::runtime::driver_error(
            "binding the context",
            e,
        ))
    })?;
    let stream = device.cuda_stream();
    // SAFETY: candle's stream belongs to the device's primary context (the one deltakv opened:
    // same ordinal) and outlives the call; every buffer allocated through the handle is freed
    // on it before the call returns or handed to candle, which frees on the same stream.
    Ok(unsafe { cuda.on_stream(stream.cu_stream()) })
}

/// A contiguous candle CUDA storage viewed as a deltakv device tensor, with the guard that
/// orders candle's event tracking around the use (dropped after the launch is queued).
pub(crate) struct Borrowed<'a> {
    pub tensor: CudaTensor,
    _guard: SyncOnDrop<'a>,
}

/// The address, dtype and element size of a storage's slice (`None`: a dtype deltakv does not
/// read).
fn slice_ptr<'a>(
    slice: &'a CudaStorageSlice,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Option<(u64, SyncOnDrop<'a>, DType)> {
    Some(match slice {
        CudaStorageSlice::F32(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, g, DType::F32)
        }
        CudaStorageSlice::F16(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, g, DType::F16)
        }
        CudaStorageSlice::BF16(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, g, DType::BF16)
        }
        CudaStorageSlice::I32(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, g, DType::I32)
        }
        CudaStorageSlice::I64(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, g, DType::I64)
        }
        _ => return None,
    })
}

/// The mutable counterpart of [`slice_ptr`] (a pool or an output buffer).
fn slice_ptr_mut<'a>(
    slice: &'a mut CudaStorageSlice,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Option<(u64, SyncOnDrop<'a>, DType)> {
    Some(match slice {
        CudaStorageSlice::F32(s) => {
            let (p, g) = s.device_ptr_mut(stream);
            (p, g, DType::F32)
        }
        CudaStorageSlice::F16(s) => {
            let (p, g) = s.device_ptr_mut(stream);
            (p, g, DType::F16)
        }
        CudaStorageSlice::BF16(s) => {
            let (p, g) = s.device_ptr_mut(stream);
            (p, g, DType::BF16)
        }
        _ => return None,
    })
}

/// `address` advanced to element `start` of `layout`, as a tensor of `layout`'s shape.
fn at_layout(name: &str, address: u64, dtype: DType, layout: &Layout) -> Result<CudaTensor> {
    let (start, _) = crate::ops::range(name, layout)?;
    let address = address + (start * dtype.size_in_bytes()) as u64;
    // SAFETY: candle's layout lies inside its storage, which the caller's lock keeps alive
    // for the call; the storage is on deltakv's device (checked by `launcher`).
    unsafe { CudaTensor::from_device_ptr(address, layout.dims().to_vec(), dtype) }.map_err(err)
}

/// A candle CUDA operand, read in place.
pub(crate) fn borrow<'a>(
    name: &str,
    storage: &'a CudaStorage,
    layout: &Layout,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<Borrowed<'a>> {
    let (address, guard, dtype) = slice_ptr(&storage.slice, stream).ok_or_else(|| {
        Error::Msg(format!(
            "tensor `{name}` has dtype {:?}; deltakv reads f32, f16, bf16, i32 and i64",
            storage.dtype()
        ))
    })?;
    Ok(Borrowed {
        tensor: at_layout(name, address, dtype, layout)?,
        _guard: guard,
    })
}

/// A candle CUDA buffer deltakv writes in place (a pool, or an output allocated here).
pub(crate) fn borrow_mut<'a>(
    name: &str,
    storage: &'a mut CudaStorage,
    layout: &Layout,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<Borrowed<'a>> {
    let dtype = storage.dtype();
    let (address, guard, dtype) = slice_ptr_mut(&mut storage.slice, stream).ok_or_else(|| {
        Error::Msg(format!(
            "tensor `{name}` has dtype {dtype:?}; deltakv writes f32, f16 and bf16"
        ))
    })?;
    Ok(Borrowed {
        tensor: at_layout(name, address, dtype, layout)?,
        _guard: guard,
    })
}

/// A tensor the op reads besides its candle operands, on `device`, read in place.
fn borrow_extra<'a>(
    name: &str,
    storage: &'a Storage,
    layout: &Layout,
    device: &CudaDevice,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<Borrowed<'a>> {
    borrow(name, cuda_storage(name, storage, device)?, layout, stream)
}

/// The CUDA storage of a tensor the op reads besides its candle operands, on `device`.
pub(crate) fn cuda_storage<'a>(
    name: &str,
    storage: &'a Storage,
    device: &CudaDevice,
) -> Result<&'a CudaStorage> {
    match storage {
        Storage::Cuda(s) if candle_core::backend::BackendDevice::same_device(&s.device, device) => {
            Ok(s)
        }
        _ => Err(Error::Msg(format!(
            "tensor `{name}` is not on the CUDA device of q, k and v"
        ))),
    }
}

/// Writes through a tensor the op allocated before the call (its final state or intermediate
/// states): the read lock candle hands out is the only one, and nothing reads the tensor
/// before the op returns it.
pub(crate) fn output_buffer<'a>(
    name: &str,
    storage: &'a Storage,
    layout: &Layout,
    device: &CudaDevice,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<Borrowed<'a>> {
    let storage = cuda_storage(name, storage, device)?;
    borrow(name, storage, layout, stream)
}

/// Allocates `shape` of `dtype` on `device` (uninitialised: the kernels write every element).
pub(crate) fn alloc(device: &CudaDevice, shape: &Shape, dtype: DType) -> Result<CudaStorage> {
    let dtype = match dtype {
        DType::F32 => candle_core::DType::F32,
        DType::F16 => candle_core::DType::F16,
        DType::BF16 => candle_core::DType::BF16,
        other => {
            return Err(Error::Msg(format!(
                "deltakv does not write {other} outputs"
            )));
        }
    };
    // SAFETY: the kernel writes every element before candle reads the storage.
    unsafe { candle_core::backend::BackendDevice::alloc_uninit(device, shape, dtype) }
}

/// The prefill on candle CUDA tensors: `o` in a new candle buffer, the final state into
/// `final_state` (allocated by the caller, `[N, H, K, V]` f32).
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill<'a>(
    (q, lq): (&CudaStorage, &Layout),
    (k, lk): (&CudaStorage, &Layout),
    (v, lv): (&CudaStorage, &Layout),
    (g, lg): (&'a Storage, &Layout),
    (beta, lb): (&'a Storage, &Layout),
    initial_state: Option<(&'a Storage, &Layout)>,
    cu_seqlens: Option<(&'a Storage, &Layout)>,
    final_state: (&Storage, &Layout),
    options: &GdnOptions,
) -> Result<(CudaStorage, Shape)> {
    let device = &q.device;
    let cuda = launcher(device)?;
    let stream = device.cuda_stream();
    let extra =
        |name: &str, (s, l): (&'a Storage, &Layout)| borrow_extra(name, s, l, device, &stream);
    let (bq, bk, bv) = (
        borrow("q", q, lq, &stream)?,
        borrow("k", k, lk, &stream)?,
        borrow("v", v, lv, &stream)?,
    );
    let (bg, bb) = (extra("g", (g, lg))?, extra("beta", (beta, lb))?);
    let initial = initial_state
        .map(|s| extra("initial_state", s))
        .transpose()?;
    let cu = cu_seqlens.map(|s| extra("cu_seqlens", s)).transpose()?;
    let mut state = output_buffer("final_state", final_state.0, final_state.1, device, &stream)?;
    let o_shape = Shape::from(lv.dims().to_vec());
    let mut o_storage = alloc(device, &o_shape, bv.tensor.dtype())?;
    {
        let o_layout = Layout::contiguous(o_shape.clone());
        let mut o = borrow_mut("o", &mut o_storage, &o_layout, &stream)?;
        let inputs = GdnInputs {
            q: &bq.tensor,
            k: &bk.tensor,
            v: &bv.tensor,
            g: &bg.tensor,
            beta: &bb.tensor,
            initial_state: initial.as_ref().map(|b| &b.tensor),
            cu_seqlens: cu.as_ref().map(|b| &b.tensor),
        };
        let mut states = PrefillStates::Separate {
            output_final_state: true,
        };
        let launch = PrefillLaunch::new(
            &cuda,
            &inputs,
            options,
            &mut states,
            &mut o.tensor,
            Some(&mut state.tensor),
            PrefillExtras::default(),
        )
        .map_err(err)?;
        // SAFETY: launched at once, while this function borrows every tensor it was
        // prepared from (candle frees on the stream the launch is queued on).
        unsafe { launch.launch(&cuda) }.map_err(err)?;
    }
    Ok((o_storage, o_shape))
}

/// The decode on candle CUDA tensors, the pool updated in place; `o` and the intermediate
/// states go into buffers the caller allocated.
pub(crate) struct DecodeBuffers<'a> {
    pub o: (&'a Storage, &'a Layout),
    pub intermediate_states: Option<(&'a Storage, &'a Layout)>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn decode<'a>(
    (pool, lpool): (&mut CudaStorage, &Layout),
    (q, lq): (&CudaStorage, &Layout),
    (k, lk): (&CudaStorage, &Layout),
    (v, lv): (&'a Storage, &Layout),
    (slots, lslots): (&'a Storage, &Layout),
    gates: &[(&'static str, &'a Storage, &Layout)],
    outputs: DecodeBuffers<'_>,
    options: &DecodeOptions,
) -> Result<()> {
    let device = q.device.clone();
    let cuda = launcher(&device)?;
    let stream = device.cuda_stream();
    let extra = |name: &str, s: &'a Storage, l: &Layout| borrow_extra(name, s, l, &device, &stream);
    let (bq, bk) = (borrow("q", q, lq, &stream)?, borrow("k", k, lk, &stream)?);
    let (bv, bslots) = (extra("v", v, lv)?, extra("slot_indices", slots, lslots)?);
    let gate_views = gates
        .iter()
        .map(|(name, s, l)| extra(name, s, l))
        .collect::<Result<Vec<_>>>()?;
    let gating = Gating::from_lookup(|name| {
        gates
            .iter()
            .position(|(n, _, _)| *n == name)
            .map(|i| &gate_views[i].tensor)
    })
    .map_err(err)?;
    let inputs = DecodeInputs {
        q: &bq.tensor,
        k: &bk.tensor,
        v: &bv.tensor,
        gating,
        slot_indices: &bslots.tensor,
    };
    let mut o = output_buffer("o", outputs.o.0, outputs.o.1, &device, &stream)?;
    let mut states = outputs
        .intermediate_states
        .map(|(s, l)| output_buffer("intermediate_states", s, l, &device, &stream))
        .transpose()?;
    let mut pool = borrow_mut("state_pool", pool, lpool, &stream)?;
    let launch = prepare_decode_launch(
        &cuda,
        &inputs,
        &mut pool.tensor,
        &options.gdn,
        &mut o.tensor,
        states.as_mut().map(|s| &mut s.tensor),
    )
    .map_err(err)?;
    // SAFETY: launched at once, while this function borrows every tensor it was prepared from.
    unsafe { launch.launch(&cuda) }.map_err(err)
}
