//! CUDA arrays from Python (cargo feature `cuda`): the caller's device memory, borrowed through
//! DLPack, runs deltakv's CUDA kernels in place, on the caller's stream.
//!
//! The stream rule: every call names one CUDA stream (the Python layer passes the caller's
//! current stream: `torch.cuda.current_stream(device).cuda_stream`, CuPy's current stream, or
//! `stream=`). That integer goes to each input's `__dlpack__(stream=...)`, so the producer
//! orders its pending writes before it, and deltakv's kernels, scratch allocations and small
//! copies are all queued on that same stream (cudarc wraps the caller's `CUstream` handle,
//! [`Cuda::on_stream`]): the call is ordered after the caller's earlier work and before its
//! later work with no event and no device-wide synchronisation. The one host wait is the
//! contract's index check: decode reads `slot_indices` (B integers) and a varlen prefill reads
//! `cu_seqlens` to the host before launching, which waits for the caller's stream up to the
//! call (never for other streams).
//!
//! Results are deltakv's own device buffers, allocated (stream-ordered) on the caller's stream
//! and exported through DLPack; when the consumer imports them on another stream, that stream
//! waits on an event recorded after the work. Their deleter frees them on the caller's stream.

use crate::dlpack::{Borrowed, Device};
use crate::export::Exported;
use crate::gdn::PrefillResults;
use crate::to_py_err;
use deltakv::cuda::gdn::{PrefillStates, Split, gdn_decode, gdn_prefill_checkpointed};
use deltakv::cuda::{Cuda, CudaTensor};
use deltakv::gdn::prefill::validate::check_prefill_meta;
use deltakv::gdn::{
    DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions, MAX_DECODE_TOKENS, MAX_HEAD_DIM,
    PrefillMode,
};
use deltakv::{DType, HostTensor};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::ffi::c_void;

/// deltakv's CUDA device with its kernels, launching on one caller's stream.
pub struct Launcher {
    cuda: Cuda,
    stream: i64,
    device: Device,
}

impl Launcher {
    /// Opens deltakv's GPU (a machine without the driver or a GPU: `RuntimeError` with the
    /// one-line reason) and checks that the arrays' `device` is it. `stream` is the DLPack
    /// stream integer of the caller's stream (None: 1, the legacy default stream).
    pub fn new(device: Device, stream: Option<i64>) -> PyResult<Self> {
        let cuda = Cuda::get().map_err(to_py_err)?;
        if cuda.ordinal() as i32 != device.id {
            return Err(PyValueError::new_err(format!(
                "the tensors are on {device}, but deltakv's CUDA device is cuda:{} (DELTAKV_CUDA_DEVICE picks it)",
                cuda.ordinal()
            )));
        }
        let stream = stream.unwrap_or(1);
        if stream < 1 {
            return Err(PyValueError::new_err(format!(
                "stream {stream} is not a CUDA stream (1: the legacy default stream, 2: the per-thread default stream, else a cudaStream_t)"
            )));
        }
        cuda.context().bind_to_thread().map_err(|e| {
            to_py_err(deltakv::cuda::runtime::driver_error(
                "binding the context",
                e,
            ))
        })?;
        // SAFETY: the DLPack protocol's stream integers are CUstream handles of the caller's
        // context (1 and 2 are the driver's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD); the
        // caller keeps its stream alive while it uses the results (PyTorch never destroys its
        // streams).
        let cuda = unsafe { cuda.on_stream(stream as usize as *mut c_void as _) };
        Ok(Self {
            cuda,
            stream,
            device,
        })
    }

    /// The stream integer to pass to `__dlpack__`.
    pub fn stream(&self) -> i64 {
        self.stream
    }

    /// deltakv's GPU, launching on the caller's stream.
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    /// A result of this call's work, exported on the caller's device and stream.
    pub fn result(&self, tensor: CudaTensor) -> Exported {
        Exported::cuda(DeviceResult {
            tensor,
            cuda: self.handle(),
            stream: self.stream,
            consumer: None,
            device: self.device,
        })
    }

    fn handle(&self) -> Cuda {
        // SAFETY: the same stream as `self.cuda`, under the same contract.
        unsafe { self.cuda.on_stream(self.cuda.stream().cu_stream()) }
    }
}

/// A caller's CUDA array as a tensor over its memory (no copy).
pub fn device_tensor(b: &Borrowed) -> PyResult<CudaTensor> {
    // SAFETY: the capsule held by `b` keeps the allocation alive for the call; DLPack gave its
    // address, shape and dtype, and `import` checked it is C-contiguous and aligned.
    unsafe { CudaTensor::from_device_ptr(b.address() as u64, b.shape().to_vec(), b.dtype()) }
        .map_err(to_py_err)
}

fn device_tensor_opt(b: Option<&Borrowed>) -> PyResult<Option<CudaTensor>> {
    b.map(device_tensor).transpose()
}

/// The arrays of a prefill call, borrowed on the GPU.
pub struct PrefillArrays<'a> {
    pub q: &'a Borrowed,
    pub k: &'a Borrowed,
    pub v: &'a Borrowed,
    pub g: &'a Borrowed,
    pub beta: &'a Borrowed,
    pub initial_state: Option<&'a Borrowed>,
    pub cu_seqlens: Option<&'a Borrowed>,
}

/// GDN prefill on the GPU: the chunked kernels, or for `PrefillMode::Recurrent` with
/// `T <= 16` tokens per row and no `cu_seqlens` the decode kernels (the token-by-token
/// recurrence in f32, from a copy of `initial_state`); longer recurrent calls take the chunked
/// kernels (the same function, bf16 products). Returns `o`, the final state when asked, and
/// the state every `checkpoint_every` tokens when asked (chunked form only) with its
/// per-sequence offsets.
pub fn prefill(
    py: Python<'_>,
    launcher: &Launcher,
    mode: PrefillMode,
    arrays: &PrefillArrays<'_>,
    options: &GdnOptions,
    output_final_state: bool,
    checkpoint_every: Option<usize>,
) -> PyResult<PrefillResults> {
    let [q, k, v, g, beta] =
        [arrays.q, arrays.k, arrays.v, arrays.g, arrays.beta].map(device_tensor);
    let (q, k, v, g, beta) = (q?, k?, v?, g?, beta?);
    let initial_state = device_tensor_opt(arrays.initial_state)?;
    let cu_seqlens = device_tensor_opt(arrays.cu_seqlens)?;
    let inputs = GdnInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        initial_state: initial_state.as_ref(),
        cu_seqlens: cu_seqlens.as_ref(),
    };
    let cuda = &launcher.cuda;
    let shape = q.shape();
    let recurrent_by_decode = mode == PrefillMode::Recurrent
        && checkpoint_every.is_none()
        && cu_seqlens.is_none()
        && shape.len() == 4
        && (1..=MAX_DECODE_TOKENS).contains(&shape[1])
        && v.shape().len() == 4
        && shape[3] <= MAX_HEAD_DIM
        && v.shape()[3] <= MAX_HEAD_DIM;
    let (o, final_state, checkpoints) = py
        .detach(|| {
            if recurrent_by_decode {
                recurrent_by_decode_kernels(cuda, &inputs, options)
                    .map(|(o, state)| (o, Some(state), None))
            } else {
                let states = PrefillStates::Separate { output_final_state };
                gdn_prefill_checkpointed(
                    cuda,
                    &inputs,
                    options,
                    states,
                    checkpoint_every,
                    Split::Auto,
                )
                .map(|out| (out.o, out.final_state, out.checkpoints))
            }
        })
        .map_err(to_py_err)?;
    let final_state = final_state.filter(|_| output_final_state);
    Ok(PrefillResults {
        o: launcher.result(o),
        final_state: final_state.map(|s| launcher.result(s)),
        checkpoints: checkpoints.map(|c| (launcher.result(c.states), c.plan.offsets)),
    })
}

/// The recurrence of a short prefill (`T <= 16`, no `cu_seqlens`) by the decode kernels: row b
/// advances slot b of a pool `[B, H, K, V]` f32 that starts as a copy of `initial_state` (or
/// zeros); the pool is then the final state.
fn recurrent_by_decode_kernels(
    cuda: &Cuda,
    inputs: &GdnInputs<'_, CudaTensor>,
    options: &GdnOptions,
) -> deltakv::Result<(CudaTensor, CudaTensor)> {
    let shapes = check_prefill_meta(inputs, options, None)?;
    let dims = shapes.dims;
    let mut pool = match inputs.initial_state {
        Some(s) => s.copy(cuda)?,
        None => CudaTensor::zeros(
            cuda,
            vec![dims.batch, dims.value_heads, dims.key_dim, dims.value_dim],
            DType::F32,
        )?,
    };
    let slots: Vec<i32> = (0..dims.batch as i32).collect();
    let slots = CudaTensor::upload(cuda, &HostTensor::from_i32(vec![dims.batch], slots)?)?;
    let decode_inputs = DecodeInputs {
        q: inputs.q,
        k: inputs.k,
        v: inputs.v,
        gating: Gating::Direct {
            g: inputs.g,
            beta: inputs.beta,
        },
        slot_indices: &slots,
    };
    let options = DecodeOptions {
        gdn: options.clone(),
        intermediate_states: false,
    };
    let out = gdn_decode(cuda, &decode_inputs, &mut pool, &options)?;
    Ok((out.o, pool))
}

/// The arrays of a decode call, borrowed on the GPU (the gates as `Gating::from_parts` takes
/// them: g, beta, a, b, A_log, dt_bias).
pub struct DecodeArrays<'a> {
    pub q: &'a Borrowed,
    pub k: &'a Borrowed,
    pub v: &'a Borrowed,
    pub state_pool: &'a Borrowed,
    pub slot_indices: &'a Borrowed,
    pub gates: [Option<&'a Borrowed>; 6],
}

/// GDN decode on the GPU over the caller's pool, in place. Returns `(o, intermediate states
/// when asked)`.
pub fn decode(
    py: Python<'_>,
    launcher: &Launcher,
    arrays: &DecodeArrays<'_>,
    options: &DecodeOptions,
) -> PyResult<(Exported, Option<Exported>)> {
    arrays.state_pool.check_writable()?;
    let [q, k, v, slots] = [arrays.q, arrays.k, arrays.v, arrays.slot_indices].map(device_tensor);
    let (q, k, v, slots) = (q?, k?, v?, slots?);
    let mut pool = device_tensor(arrays.state_pool)?;
    let gates = arrays
        .gates
        .map(device_tensor_opt)
        .into_iter()
        .collect::<PyResult<Vec<_>>>()?;
    let gating = Gating::from_parts(
        gates[0].as_ref(),
        gates[1].as_ref(),
        gates[2].as_ref(),
        gates[3].as_ref(),
        gates[4].as_ref(),
        gates[5].as_ref(),
    )
    .map_err(to_py_err)?;
    let inputs = DecodeInputs {
        q: &q,
        k: &k,
        v: &v,
        gating,
        slot_indices: &slots,
    };
    let cuda = &launcher.cuda;
    let out = py
        .detach(|| gdn_decode(cuda, &inputs, &mut pool, options))
        .map_err(to_py_err)?;
    Ok((
        launcher.result(out.o),
        out.intermediate_states.map(|t| launcher.result(t)),
    ))
}

/// A result in deltakv's device memory, with the stream its work was queued on and the stream
/// its consumer imported it on.
pub struct DeviceResult {
    tensor: CudaTensor,
    cuda: Cuda,
    stream: i64,
    /// The consumer's stream (a DLPack stream integer) when it is not `stream`: the memory is
    /// freed on `stream` only after the work queued there when the consumer lets it go.
    consumer: Option<i64>,
    device: Device,
}

impl DeviceResult {
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn data_ptr(&self) -> *mut c_void {
        self.tensor.device_ptr(&self.cuda) as usize as *mut c_void
    }

    /// Orders the consumer's `stream` (a DLPack stream integer; -1: no ordering) after the work
    /// that wrote the result: an event recorded on the work's stream, waited for on the
    /// consumer's (no host wait). Nothing to do on the work's own stream.
    pub fn order_before(&mut self, stream: i64) -> PyResult<()> {
        // 0 is not a DLPack stream number; a consumer that passes its null stream handle
        // means the legacy default stream.
        let stream = if stream == 0 { 1 } else { stream };
        if stream == -1 || stream == self.stream {
            return Ok(());
        }
        if stream < 1 {
            return Err(PyValueError::new_err(format!(
                "stream {stream} is not a CUDA stream"
            )));
        }
        let fail = |what: &str, e| to_py_err(deltakv::cuda::runtime::driver_error(what, e));
        let context = self.cuda.context();
        context
            .bind_to_thread()
            .map_err(|e| fail("binding the context", e))?;
        let event = self
            .cuda
            .stream()
            .record_event(None)
            .map_err(|e| fail("recording an event after deltakv's work", e))?;
        // SAFETY: the consumer passed a live stream of this device (the DLPack protocol);
        // cudarc's wrapper never destroys it.
        let consumer = unsafe { context.wrap_borrowed_stream(stream as usize as *mut c_void as _) };
        consumer
            .wait(&event)
            .map_err(|e| fail("ordering the consumer's stream after deltakv's work", e))?;
        self.consumer = Some(stream);
        Ok(())
    }
}

impl Drop for DeviceResult {
    fn drop(&mut self) {
        // The consumer's deleter may run on any thread: make the context current there before
        // the buffer is freed (stream-ordered, on the stream of the work, when `tensor` drops
        // after this). A consumer on another stream may still have work queued there that
        // reads the buffer (torch frees a tensor as soon as its last reference goes, in its
        // current stream's order): the work stream first waits for that work, so the memory
        // pool cannot hand the buffer out again under it. A failure here has nowhere to go;
        // cudarc keeps it for the context's next check.
        let context = self.cuda.context();
        let _ = context.bind_to_thread();
        if let Some(consumer) = self.consumer.filter(|&s| s != self.stream) {
            // SAFETY: the consumer's stream outlives its use of the result (the DLPack
            // contract); the wrapper never destroys it.
            let consumer =
                unsafe { context.wrap_borrowed_stream(consumer as usize as *mut c_void as _) };
            if let Ok(event) = consumer.record_event(None) {
                let _ = self.cuda.stream().wait(&event);
            }
        }
    }
}
