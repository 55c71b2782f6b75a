//! DLPack on the CPU, both ways, without copies.
//!
//! In: [`Borrowed::import`] asks an object for its `__dlpack__` capsule (DLPack 1.x
//! `DLManagedTensorVersioned` when the producer speaks it, else the legacy `DLManagedTensor`),
//! checks device, dtype, layout (C-contiguous only) and alignment, and views the producer's
//! memory as a [`HostView`] / [`HostViewMut`]. The capsule is held until the view is dropped;
//! it is never renamed "used", so the producer's own capsule destructor runs the deleter then.
//!
//! Out: [`Exported`] owns a result's elements (the kernel's output `Vec`) and hands them out
//! once through `__dlpack__` as a legacy `DLManagedTensor` whose deleter frees the `Vec`;
//! `numpy.from_dlpack` / `torch.from_dlpack` wrap that memory without a copy.
//!
//! The struct layouts are those of `dlpack.h` (v1.0); only the CPU device is accepted here.

use deltakv::half::{bf16, f16};
use deltakv::{DType, HostView, HostViewMut, TensorSlice, TensorSliceMut};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ffi::{CStr, c_void};

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

fn dlpack_dtype(dtype: DType) -> DLDataType {
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

/// A caller's array, viewed in place: its capsule (kept alive, so the memory is), the address,
/// shape and dtype of its elements, and whether the producer marked it read-only.
pub struct Borrowed {
    name: String,
    _capsule: Py<PyAny>,
    data: *mut u8,
    shape: Vec<usize>,
    dtype: DType,
    read_only: bool,
}

impl Borrowed {
    /// Views `obj` (anything with `__dlpack__` on the CPU) in place. A non-contiguous or
    /// misaligned array, another device or an unknown dtype is a `ValueError` naming `name`.
    pub fn import(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        if !obj.hasattr("__dlpack__")? {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is a {}, expected an array with __dlpack__ (numpy, torch, ...)",
                obj.get_type().name()?
            )));
        }
        if obj.hasattr("__dlpack_device__")? {
            let (device, _id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
            if device != DEVICE_CPU {
                return Err(PyValueError::new_err(format!(
                    "tensor `{name}` is not on the CPU (DLPack device type {device}); deltakv's Python functions run on the CPU in this build"
                )));
            }
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
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
        if tensor.device.device_type != DEVICE_CPU {
            return Err(PyValueError::new_err(format!(
                "tensor `{name}` is not on the CPU (DLPack device type {})",
                tensor.device.device_type
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
        if self.read_only {
            return Err(PyValueError::new_err(format!(
                "tensor `{}` is read-only, but the call writes it in place",
                self.name
            )));
        }
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

/// What a legacy managed tensor owns: the elements and the shape it points into.
struct Context {
    /// Held, not read: the memory `dl_tensor.data` points into, freed with the context.
    _elements: Owned,
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

/// A result of a deltakv call, exported once through DLPack (CPU memory). The Python layer
/// passes it to the caller's `from_dlpack` (`numpy`, `torch`, ...) right away.
#[pyclass(module = "deltakv._deltakv", name = "Exported")]
pub struct Exported {
    elements: Option<(Owned, Vec<usize>)>,
}

impl Exported {
    pub fn new(elements: Owned, shape: Vec<usize>) -> Self {
        Self {
            elements: Some((elements, shape)),
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
}

#[pymethods]
impl Exported {
    /// A DLPack capsule over the elements (CPU, writable): a `DLManagedTensorVersioned` (1.0)
    /// when the consumer passes `max_version >= (1, 0)`, else a legacy `DLManagedTensor`. The
    /// consumer owns them from then on. A second call is a `BufferError`.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &mut self,
        py: Python<'_>,
        stream: Option<Py<PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream; // CPU memory: nothing to order.
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        if dl_device.is_some_and(|(device, _)| device != DEVICE_CPU) {
            return Err(PyBufferError::new_err(
                "deltakv's results are on the CPU and are not copied to another device",
            ));
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
        let dtype = elements.dtype();
        let data = elements.data_ptr();
        let mut context = Box::new(Context {
            _elements: elements,
            shape: shape.iter().map(|&d| d as i64).collect(),
        });
        let dl_tensor = DLTensor {
            data,
            device: DLDevice {
                device_type: DEVICE_CPU,
                device_id: 0,
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

    /// `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DEVICE_CPU, 0)
    }
}
