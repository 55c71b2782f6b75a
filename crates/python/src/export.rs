//! Results out through DLPack, without copies: [`Exported`] owns a result's memory (the
//! kernel's host `Vec`, or its CUDA buffer) and hands it out once through `__dlpack__` as a
//! DLPack 1.0 `DLManagedTensorVersioned` or a legacy `DLManagedTensor`, whose deleter frees
//! it; `numpy.from_dlpack` / `torch.from_dlpack` wrap that memory where it is.

use crate::dlpack::{
    DEVICE_CPU, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    Device, LEGACY, VERSIONED, dlpack_dtype,
};
use deltakv::DType;
use deltakv::half::{bf16, f16};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::c_void;

/// A result's elements, owned until `__dlpack__` hands them to the consumer.
pub enum Owned {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Owned {
    fn dtype(&self) -> DType {
        match self {
            Owned::F32(_) => DType::F32,
            Owned::F16(_) => DType::F16,
            Owned::BF16(_) => DType::BF16,
        }
    }

    fn data_ptr(&mut self) -> *mut c_void {
        match self {
            Owned::F32(v) => v.as_mut_ptr().cast(),
            Owned::F16(v) => v.as_mut_ptr().cast(),
            Owned::BF16(v) => v.as_mut_ptr().cast(),
        }
    }
}

impl From<deltakv::TensorData> for Owned {
    fn from(data: deltakv::TensorData) -> Self {
        match data {
            deltakv::TensorData::F32(v) => Owned::F32(v),
            deltakv::TensorData::F16(v) => Owned::F16(v),
            deltakv::TensorData::BF16(v) => Owned::BF16(v),
            // The ops return float tensors only.
            deltakv::TensorData::I32(v) => Owned::F32(v.into_iter().map(|x| x as f32).collect()),
            deltakv::TensorData::I64(v) => Owned::F32(v.into_iter().map(|x| x as f32).collect()),
        }
    }
}

/// A result's memory: host elements, or a buffer on a CUDA GPU.
pub enum Payload {
    Host(Owned),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::DeviceResult),
}

impl Payload {
    fn dtype(&self) -> DType {
        match self {
            Payload::Host(o) => o.dtype(),
            #[cfg(feature = "cuda")]
            Payload::Cuda(r) => r.dtype(),
        }
    }

    fn device(&self) -> Device {
        match self {
            Payload::Host(_) => Device::CPU,
            #[cfg(feature = "cuda")]
            Payload::Cuda(r) => r.device(),
        }
    }

    fn data_ptr(&mut self) -> *mut c_void {
        match self {
            Payload::Host(o) => o.data_ptr(),
            #[cfg(feature = "cuda")]
            Payload::Cuda(r) => r.data_ptr(),
        }
    }
}

/// What a managed tensor owns: the memory and the shape it points into.
struct Context {
    /// Held, not read: the memory `dl_tensor.data` points into, freed with the context.
    _elements: Payload,
    shape: Vec<i64>,
}

unsafe extern "C" fn delete_managed(m: *mut DLManagedTensor) {
    // SAFETY: `m` and its context were made by `Box::into_raw` in `Exported::__dlpack__`, and
    // a DLPack consumer calls the deleter exactly once.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx.cast::<Context>()));
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: as `delete_managed`.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx.cast::<Context>()));
    }
}

/// Runs the deleter of a capsule that no consumer took (still named "dltensor" or
/// "dltensor_versioned").
unsafe extern "C" fn delete_unused_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python on a capsule we made; IsValid sets no exception.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*m).deleter {
                deleter(m);
            }
        } else if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*m).deleter {
                deleter(m);
            }
        }
    }
}

/// A result of a deltakv call, exported once through DLPack (host or CUDA memory). The Python
/// layer passes it to the caller's `from_dlpack` (`numpy`, `torch`, ...) right away.
#[pyclass(module = "deltakv._deltakv", name = "Exported")]
pub struct Exported {
    elements: Option<(Payload, Vec<usize>)>,
}

impl Exported {
    pub fn new(elements: Owned, shape: Vec<usize>) -> Self {
        Self {
            elements: Some((Payload::Host(elements), shape)),
        }
    }

    pub fn from_tensor(t: deltakv::HostTensor) -> Self {
        let shape = t.shape().to_vec();
        let data = match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => t.into_data(),
            _ => unreachable!("the ops return float tensors"),
        };
        Self::new(Owned::from(data), shape)
    }

    #[cfg(feature = "cuda")]
    pub fn cuda(result: crate::cuda::DeviceResult) -> Self {
        let shape = result.shape().to_vec();
        Self {
            elements: Some((Payload::Cuda(result), shape)),
        }
    }

    /// The address of the first element (host or device), before the export: what the
    /// consumer's array will point to.
    pub fn address(&mut self) -> usize {
        self.elements
            .as_mut()
            .map_or(0, |(payload, _)| payload.data_ptr() as usize)
    }
}

#[pymethods]
impl Exported {
    /// A DLPack capsule over the elements (writable): a `DLManagedTensorVersioned` (1.0) when
    /// the consumer passes `max_version >= (1, 0)`, else a legacy `DLManagedTensor`. The
    /// consumer owns them from then on. A second call is a `BufferError`. For a CUDA result,
    /// `stream` is the consumer's stream (DLPack: None or 1 the legacy default stream, 2 the
    /// per-thread default stream, -1 no ordering); when it is not the stream deltakv's work was
    /// queued on, that stream is made to wait for the work (an event, no host wait).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &mut self,
        py: Python<'_>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let device = match &self.elements {
            Some((payload, _)) => payload.device(),
            None => {
                return Err(PyBufferError::new_err(
                    "this deltakv result was already exported",
                ));
            }
        };
        let wanted = dl_device.map(|(kind, id)| Device { kind, id });
        if let Some(wanted) = wanted
            .filter(|w| w.kind != device.kind || (device.kind != DEVICE_CPU && w.id != device.id))
        {
            return Err(PyBufferError::new_err(format!(
                "deltakv's result is on {device} and is not copied to {wanted}"
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "deltakv exports its results without copies (copy=True is not supported)",
            ));
        }
        let (mut elements, shape) = self
            .elements
            .take()
            .ok_or_else(|| PyBufferError::new_err("this deltakv result was already exported"))?;
        match &mut elements {
            Payload::Host(_) => {} // CPU memory: nothing to order.
            #[cfg(feature = "cuda")]
            Payload::Cuda(result) => {
                if let Err(e) = result.order_before(stream.unwrap_or(1)) {
                    self.elements = Some((elements, shape));
                    return Err(e);
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = stream;
        let dtype = elements.dtype();
        let data = elements.data_ptr();
        let mut context = Box::new(Context {
            _elements: elements,
            shape: shape.iter().map(|&d| d as i64).collect(),
        });
        let dl_tensor = DLTensor {
            data,
            device: DLDevice {
                device_type: device.kind,
                device_id: device.id,
            },
            ndim: shape.len() as i32,
            dtype: dlpack_dtype(dtype),
            shape: context.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let manager_ctx = Box::into_raw(context).cast();
        // SAFETY: a capsule over our managed tensor, with a static name and a destructor that
        // frees it only if no consumer took it; on failure we free it ourselves.
        unsafe {
            let capsule = if versioned {
                let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx,
                    deleter: Some(delete_versioned),
                    flags: 0,
                    dl_tensor,
                }));
                let capsule = ffi::PyCapsule_New(
                    managed.cast(),
                    VERSIONED.as_ptr(),
                    Some(delete_unused_capsule),
                );
                if capsule.is_null() {
                    delete_versioned(managed);
                }
                capsule
            } else {
                let managed = Box::into_raw(Box::new(DLManagedTensor {
                    dl_tensor,
                    manager_ctx,
                    deleter: Some(delete_managed),
                }));
                let capsule = ffi::PyCapsule_New(
                    managed.cast(),
                    LEGACY.as_ptr(),
                    Some(delete_unused_capsule),
                );
                if capsule.is_null() {
                    delete_managed(managed);
                }
                capsule
            };
            if capsule.is_null() {
                return Err(PyErr::fetch(py));
            }
            Ok(Py::from_owned_ptr(py, capsule))
        }
    }

    /// `(kDLCPU, 0)`, or `(kDLCUDA, device)` for a result on a GPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let device = self
            .elements
            .as_ref()
            .map_or(Device::CPU, |(payload, _)| payload.device());
        (device.kind, device.id)
    }
}
