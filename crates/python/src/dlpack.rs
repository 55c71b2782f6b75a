//! DLPack's structs and the import of a caller's array, without a copy.
//!
//! [`device_of`] reads where an array lives (`__dlpack_device__`): the CPU or a CUDA GPU.
//! [`Borrowed::import`] then asks the array for its `__dlpack__` capsule (DLPack 1.x
//! `DLManagedTensorVersioned` when the producer speaks it, else the legacy `DLManagedTensor`),
//! passing the stream deltakv's work will be queued on for a CUDA array (the DLPack stream
//! handshake: the producer orders its pending writes before that stream), checks device,
//! dtype, layout (C-contiguous only) and alignment, and keeps the address. The capsule is held
//! until the [`Borrowed`] is dropped; it is never renamed "used", so the producer's own capsule
//! destructor runs the deleter then. CPU arrays are read as a [`HostView`] / [`HostViewMut`];
//! CUDA arrays become borrowed `CudaTensor`s (module `cuda`).
//!
//! The struct layouts are those of `dlpack.h` (v1.0). Results go out through `export`.

use deltakv::half::{bf16, f16};
use deltakv::{DType, HostView, HostViewMut, TensorSlice, TensorSliceMut};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::{CStr, c_void};

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

pub(crate) const LEGACY: &CStr = c"dltensor";
pub(crate) const VERSIONED: &CStr = c"dltensor_versioned";

/// Where an array's memory is: DLPack's `(device_type, device_id)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Device {
    pub kind: i32,
    pub id: i32,
}

impl Device {
    pub const CPU: Device = Device {
        kind: DEVICE_CPU,
        id: 0,
    };

    pub fn is_cpu(self) -> bool {
        self.kind == DEVICE_CPU
    }

    pub fn is_cuda(self) -> bool {
        self.kind == DEVICE_CUDA
    }

    fn same(self, other: Device) -> bool {
        self.kind == other.kind && (self.is_cpu() || self.id == other.id)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            DEVICE_CPU => write!(f, "the CPU"),
            DEVICE_CUDA => write!(f, "cuda:{}", self.id),
            kind => write!(f, "DLPack device type {kind} (id {})", self.id),
        }
    }
}

/// The device of `obj` from its `__dlpack_device__` (an array without one is taken to be on
/// the CPU; its capsule is checked on import).
pub fn device_of(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    if !obj.hasattr("__dlpack_device__")? {
        return Ok(Device::CPU);
    }
    let (kind, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    Ok(Device { kind, id })
}

/// The one device of a call's arrays (`None` entries are absent optional arguments): an array
/// on another device than the first is a `ValueError` naming both, and so is a device that
/// deltakv does not run on (neither the CPU nor a CUDA GPU).
pub fn call_device(arrays: &[(&str, Option<&Bound<'_, PyAny>>)]) -> PyResult<Device> {
    let mut first: Option<(&str, Device)> = None;
    for (name, obj) in arrays {
        let Some(obj) = obj else { continue };
        let device = device_of(obj)?;
        if !device.is_cpu() && !device.is_cuda() {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is on {device}; deltakv runs on the CPU and on CUDA GPUs"
            )));
        }
        match first {
            None => first = Some((name, device)),
            Some((first_name, first_device)) if !first_device.same(device) => {
                return Err(PyValueError::new_err(format!(
                    "tensor `{name}` is on {device} but `{first_name}` is on {first_device}; every tensor of a call must be on one device"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(first.map_or(Device::CPU, |(_, d)| d))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

#[repr(C)]
pub(crate) struct DLTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: *mut i64,
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

#[repr(C)]
pub(crate) struct DLManagedTensor {
    pub(crate) dl_tensor: DLTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub(crate) struct DLPackVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

#[repr(C)]
pub(crate) struct DLManagedTensorVersioned {
    pub(crate) version: DLPackVersion,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub(crate) flags: u64,
    pub(crate) dl_tensor: DLTensor,
}

pub(crate) fn dlpack_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

fn parse_dtype(name: &str, t: DLDataType) -> PyResult<DType> {
    match (t.code, t.bits, t.lanes) {
        (2, 32, 1) => Ok(DType::F32),
        (2, 16, 1) => Ok(DType::F16),
        (4, 16, 1) => Ok(DType::BF16),
        (0, 32, 1) => Ok(DType::I32),
        (0, 64, 1) => Ok(DType::I64),
        (code, bits, lanes) => {
            let kind = match code {
                0 => "int",
                1 => "uint",
                2 => "float",
                4 => "bfloat",
                5 => "complex",
                6 => "bool",
                _ => "code",
            };
            let lanes = if lanes == 1 {
                String::new()
            } else {
                format!(" x{lanes} lanes")
            };
            Err(PyValueError::new_err(format!(
                "tensor `{name}` has dtype {kind}{bits}{lanes}; deltakv reads float32, float16, bfloat16, int32 and int64"
            )))
        }
    }
}

/// A caller's array, borrowed in place: its capsule (kept alive, so the memory is), the
/// device and address, shape and dtype of its elements, and whether the producer marked it
/// read-only.
pub struct Borrowed {
    name: String,
    _capsule: Py<PyAny>,
    device: Device,
    data: *mut u8,
    shape: Vec<usize>,
    dtype: DType,
    read_only: bool,
}

// SAFETY: the raw address is only dereferenced by deltakv's kernels while the capsule (a Python
// object, kept alive by `self`) holds the memory; moving the handle to the thread that runs
// the kernel with the GIL released changes nothing about that.
unsafe impl Send for Borrowed {}

impl Borrowed {
    /// Views `obj` (anything with `__dlpack__` on the CPU) in place; an array on a GPU is a
    /// `ValueError` naming `name` and `what` (the part of deltakv that runs on the CPU only).
    pub fn import_host(name: &str, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Self> {
        let device = device_of(obj)?;
        if !device.is_cpu() {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is on {device}; {what} runs on the CPU"
            )));
        }
        Self::import(name, obj, Device::CPU, None)
    }

    /// Borrows `obj` in place on `device` (what [`call_device`] found). For a CUDA array,
    /// `stream` (a DLPack stream integer: 1 the legacy default stream, 2 the per-thread default
    /// stream, else a `CUstream` handle) is passed to `__dlpack__`, so the producer orders its
    /// pending work on the array before that stream. A non-contiguous or misaligned array, a
    /// capsule on another device or an unknown dtype is a `ValueError` naming `name`.
    pub fn import(
        name: &str,
        obj: &Bound<'_, PyAny>,
        device: Device,
        stream: Option<i64>,
    ) -> PyResult<Self> {
        let py = obj.py();
        if !obj.hasattr("__dlpack__")? {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is a {}, expected an array with __dlpack__ (numpy, torch, ...)",
                obj.get_type().name()?
            )));
        }
        let kwargs = PyDict::new(py);
        if device.is_cuda() {
            kwargs.set_item("stream", stream.unwrap_or(1))?;
        }
        let plain = kwargs.copy()?;
        kwargs.set_item("max_version", (1, 0))?;
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // A producer older than DLPack 1.0 takes no max_version.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                obj.call_method("__dlpack__", (), Some(&plain))?
            }
            Err(e) => return Err(e),
        };
        let raw = capsule.as_ptr();
        // SAFETY: `raw` is a live object (we hold `capsule`); the IsValid and GetPointer calls
        // with a name matched first set no exception. A valid capsule of either name points to
        // a managed tensor of that layout (the DLPack protocol), alive until its deleter runs,
        // which cannot happen before the capsule is destroyed (we never rename it "used").
        let (tensor, read_only) = unsafe {
            if ffi::PyCapsule_IsValid(raw, VERSIONED.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(raw, VERSIONED.as_ptr())
                    as *const DLManagedTensorVersioned;
                if (*m).version.major != 1 {
                    return Err(PyValueError::new_err(format!(
                        "tensor `{name}`: DLPack version {}.{} is not supported (1.x is)",
                        (*m).version.major,
                        (*m).version.minor
                    )));
                }
                (&(*m).dl_tensor, (*m).flags & FLAG_READ_ONLY != 0)
            } else if ffi::PyCapsule_IsValid(raw, LEGACY.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(raw, LEGACY.as_ptr()) as *const DLManagedTensor;
                (&(*m).dl_tensor, false)
            } else {
                return Err(PyValueError::new_err(format!(
                    "tensor `{name}`: __dlpack__ did not return an unused DLPack capsule"
                )));
            }
        };
        let found = Device {
            kind: tensor.device.device_type,
            id: tensor.device.device_id,
        };
        if !found.same(device) {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}`: its DLPack capsule is on {found}, expected {device}"
            )));
        }
        let dtype = parse_dtype(name, tensor.dtype)?;
        let ndim = usize::try_from(tensor.ndim)
            .map_err(|_| PyValueError::new_err(format!("tensor `{name}`: negative ndim")))?;
        // SAFETY: DLPack gives `ndim` shape entries (and strides, when not null).
        let (dims, strides) = unsafe {
            let dims: &[i64] = if ndim == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(tensor.shape, ndim)
            };
            let strides: Option<&[i64]> = if tensor.strides.is_null() || ndim == 0 {
                None
            } else {
                Some(std::slice::from_raw_parts(tensor.strides, ndim))
            };
            (dims, strides)
        };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                PyValueError::new_err(format!("tensor `{name}`: negative dim in {dims:?}"))
            })?;
        if let Some(strides) = strides.filter(|s| !is_c_contiguous(&shape, s)) {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is not C-contiguous (shape {shape:?}, element strides {strides:?}); deltakv reads arrays in place: pass a contiguous one (np.ascontiguousarray(x), x.contiguous())"
            )));
        }
        let offset = usize::try_from(tensor.byte_offset).map_err(|_| {
            PyValueError::new_err(format!("tensor `{name}`: byte_offset overflows"))
        })?;
        let data = (tensor.data as *mut u8).wrapping_add(offset);
        let count: usize = shape.iter().product();
        if count > 0 && (data.is_null() || (data as usize) % dtype.size_in_bytes() != 0) {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}`: data address {data:p} is null or not aligned to its {dtype} elements"
            )));
        }
        Ok(Self {
            name: name.to_string(),
            _capsule: capsule.unbind(),
            device,
            data,
            shape,
            dtype,
            read_only,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Err unless the array may be written in place (the producer did not mark it read-only).
    pub fn check_writable(&self) -> PyResult<()> {
        if self.read_only {
            return Err(PyValueError::new_err(format!(
                "tensor `{}` is read-only, but the call writes it in place",
                self.name
            )));
        }
        Ok(())
    }

    /// Err unless the memory is host memory (a view of device memory would be read by the
    /// CPU).
    fn check_host(&self) -> PyResult<()> {
        if !self.device.is_cpu() {
            return Err(PyValueError::new_err(format!(
                "tensor `{}` is on {}, not on the CPU",
                self.name, self.device
            )));
        }
        Ok(())
    }

    /// The address of the first element.
    pub fn address(&self) -> usize {
        self.data as usize
    }

    /// The byte range `[start, end)` of the elements.
    fn byte_range(&self) -> (usize, usize) {
        let len: usize = self.shape.iter().product::<usize>() * self.dtype.size_in_bytes();
        (self.address(), self.address() + len)
    }

    /// Err when this array's bytes overlap `other`'s (an input that aliases the pool that a
    /// call writes).
    pub fn check_disjoint(&self, other: &Borrowed) -> PyResult<()> {
        let (a0, a1) = self.byte_range();
        let (b0, b1) = other.byte_range();
        if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
            return Err(PyValueError::new_err(format!(
                "tensor `{}` overlaps `{}` in memory; the call writes `{}` in place",
                self.name, other.name, other.name
            )));
        }
        Ok(())
    }

    /// The elements, read in place.
    pub fn view(&self) -> PyResult<HostView<'_>> {
        self.check_host()?;
        let n: usize = self.shape.iter().product();
        // SAFETY: `import` checked the address is non-null and aligned (or n == 0, where a
        // dangling aligned pointer stands in) and C-contiguous, so `n` elements of `dtype`
        // follow it; the capsule we hold keeps them alive for the borrow of `self`.
        let data = unsafe {
            match self.dtype {
                DType::F32 => TensorSlice::F32(slice(self.data, n)),
                DType::F16 => TensorSlice::F16(slice::<f16>(self.data, n)),
                DType::BF16 => TensorSlice::BF16(slice::<bf16>(self.data, n)),
                DType::I32 => TensorSlice::I32(slice(self.data, n)),
                DType::I64 => TensorSlice::I64(slice(self.data, n)),
            }
        };
        HostView::new(self.shape.clone(), data).map_err(crate::to_py_err)
    }

    /// The elements, to be written in place (a state pool). A read-only array is a
    /// `ValueError`.
    pub fn view_mut(&mut self) -> PyResult<HostViewMut<'_>> {
        self.check_host()?;
        self.check_writable()?;
        let n: usize = self.shape.iter().product();
        // SAFETY: as in `view`; `&mut self` makes this the only view handed out, and the
        // caller checked no other input of the call overlaps it (`check_disjoint`).
        let data = unsafe {
            match self.dtype {
                DType::F32 => TensorSliceMut::F32(slice_mut(self.data, n)),
                DType::F16 => TensorSliceMut::F16(slice_mut::<f16>(self.data, n)),
                DType::BF16 => TensorSliceMut::BF16(slice_mut::<bf16>(self.data, n)),
                DType::I32 => TensorSliceMut::I32(slice_mut(self.data, n)),
                DType::I64 => TensorSliceMut::I64(slice_mut(self.data, n)),
            }
        };
        HostViewMut::new(self.shape.clone(), data).map_err(crate::to_py_err)
    }
}

/// # Safety
/// `n > 0` elements of `T` at `data`, aligned and alive for `'a`.
unsafe fn slice<'a, T>(data: *mut u8, n: usize) -> &'a [T] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(data.cast::<T>(), n) }
}

/// # Safety
/// As [`slice`], and nothing else reads or writes them for `'a`.
unsafe fn slice_mut<'a, T>(data: *mut u8, n: usize) -> &'a mut [T] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(data.cast::<T>(), n) }
}

/// True when element `strides` describe a row-major layout of `shape` (a dim of size 1 may
/// have any stride).
fn is_c_contiguous(shape: &[usize], strides: &[i64]) -> bool {
    let mut expected: i64 = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d == 0 {
            return true;
        }
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d as i64);
    }
    true
}
