//! The native half of deltakv's Python package (`deltakv._deltakv`); the public functions and
//! their FLA signatures are in `python/deltakv/__init__.py`, which calls `gdn_prefill` here.
//!
//! Tensors cross the boundary as C-contiguous NumPy arrays (`__array_interface__`): each input
//! is read in place and decoded once into a `HostTensor` (the one copy of the inputs that the
//! Rust API's owned tensors require); each output is written once into a Python `bytearray`
//! that the Python side wraps as a NumPy array without a further copy. The abi3 build (CPython
//! >= 3.9) cannot use the buffer protocol, hence the array interface.

use deltakv::gdn::{GdnInputs, GdnOptions, PrefillMode};
use deltakv::{DType, Device, Error, HostTensor, TensorData};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyTuple};

/// deltakv's error as the Python exception of its kind, with the same one-line message:
/// `NotImplementedError` for what deltakv does not support, `RuntimeError` for a device or
/// backend failure, `ValueError` for everything about the inputs.
fn to_py_err(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Unsupported(_) => PyNotImplementedError::new_err(message),
        Error::DeviceUnavailable { .. } | Error::Backend { .. } | Error::Io { .. } => {
            PyRuntimeError::new_err(message)
        }
        _ => PyValueError::new_err(message),
    }
}

fn parse_dtype(name: &str, dtype: &str) -> PyResult<DType> {
    match dtype {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        "i32" => Ok(DType::I32),
        "i64" => Ok(DType::I64),
        other => Err(PyValueError::new_err(format!(
            "tensor `{name}`: unknown dtype tag `{other}`"
        ))),
    }
}

/// Reads the C-contiguous little-endian NumPy array `array` as a [`HostTensor`] of `dtype`
/// (bf16 arrives as its uint16 bits), copying its elements once.
fn read_array(name: &str, array: &Bound<'_, PyAny>, dtype: &str) -> PyResult<HostTensor> {
    let dtype = parse_dtype(name, dtype)?;
    let interface = array.getattr("__array_interface__")?;
    let interface = interface.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "tensor `{name}`: __array_interface__ is not a dict"
        ))
    })?;
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        interface.get_item(key)?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "tensor `{name}`: __array_interface__ lacks `{key}`"
            ))
        })
    };
    if !get("strides")?.is_none() {
        return Err(PyValueError::new_err(format!(
            "tensor `{name}` is not C-contiguous"
        )));
    }
    // The element type the dtype tag promises, little-endian (`|` only for one-byte types).
    let expected = match dtype {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
    };
    let typestr: String = get("typestr")?.extract()?;
    if typestr != expected {
        return Err(PyValueError::new_err(format!(
            "tensor `{name}`: array typestr `{typestr}` is not `{expected}` ({dtype})"
        )));
    }
    let width = dtype.size_in_bytes();
    let shape: Vec<usize> = get("shape")?.extract()?;
    let data = get("data")?;
    let data = data.cast::<PyTuple>().map_err(|_| {
        PyValueError::new_err(format!(
            "tensor `{name}`: array data is not a (pointer, readonly) tuple"
        ))
    })?;
    let address: usize = data.get_item(0)?.extract()?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(width))
        .ok_or_else(|| {
            PyValueError::new_err(format!("tensor `{name}`: shape {shape:?} overflows"))
        })?;
    let bytes: &[u8] = if count == 0 {
        &[]
    } else if address == 0 {
        return Err(PyValueError::new_err(format!(
            "tensor `{name}`: array data pointer is null"
        )));
    } else {
        // SAFETY: `array` is a live, C-contiguous array (strides None) whose data pointer,
        // shape and element width come from its own `__array_interface__`, so `count` bytes
        // from `address` are its elements; the reference we hold keeps it alive, and nothing
        // writes to it while we read (the GIL is held until the copy below is done).
        unsafe { std::slice::from_raw_parts(address as *const u8, count) }
    };
    HostTensor::from_le_bytes(shape, dtype, bytes).map_err(to_py_err)
}

fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
    }
}

fn write_le<const W: usize, T: Copy>(dst: &mut [u8], src: &[T], to_bytes: impl Fn(T) -> [u8; W]) {
    for (d, &x) in dst.chunks_exact_mut(W).zip(src) {
        d.copy_from_slice(&to_bytes(x));
    }
}

/// `(shape, dtype tag, bytearray)`: the tensor's elements written once, little-endian, into a
/// new `bytearray`.
fn export(py: Python<'_>, t: &HostTensor) -> PyResult<Py<PyAny>> {
    let nbytes = t.len() * t.dtype().size_in_bytes();
    let buffer = PyByteArray::new_with(py, nbytes, |dst| {
        match t.data() {
            TensorData::F32(v) => write_le(dst, v, f32::to_le_bytes),
            TensorData::F16(v) => write_le(dst, v, |x| x.to_le_bytes()),
            TensorData::BF16(v) => write_le(dst, v, |x| x.to_le_bytes()),
            TensorData::I32(v) => write_le(dst, v, i32::to_le_bytes),
            TensorData::I64(v) => write_le(dst, v, i64::to_le_bytes),
        }
        Ok(())
    })?;
    let out = (t.shape().to_vec(), dtype_tag(t.dtype()), buffer).into_pyobject(py)?;
    Ok(out.into_any().unbind())
}

/// GDN prefill on the CPU. Each tensor argument is `(array, dtype tag)` with a C-contiguous
/// NumPy array; returns `((shape, dtype, bytearray) of o, (shape, dtype, bytearray) of the
/// final state)`. `mode` is `"chunk"` or `"recurrent"`.
#[pyfunction]
#[pyo3(signature = (mode, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm))]
#[allow(clippy::too_many_arguments)]
fn gdn_prefill(
    py: Python<'_>,
    mode: &str,
    q: (Bound<'_, PyAny>, String),
    k: (Bound<'_, PyAny>, String),
    v: (Bound<'_, PyAny>, String),
    g: (Bound<'_, PyAny>, String),
    beta: (Bound<'_, PyAny>, String),
    scale: Option<f32>,
    initial_state: Option<(Bound<'_, PyAny>, String)>,
    cu_seqlens: Option<(Bound<'_, PyAny>, String)>,
    use_qk_l2norm: bool,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let mode = match mode {
        "chunk" => PrefillMode::Chunk,
        "recurrent" => PrefillMode::Recurrent,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown prefill mode `{other}` (expected chunk or recurrent)"
            )));
        }
    };
    let q = read_array("q", &q.0, &q.1)?;
    let k = read_array("k", &k.0, &k.1)?;
    let v = read_array("v", &v.0, &v.1)?;
    let g = read_array("g", &g.0, &g.1)?;
    let beta = read_array("beta", &beta.0, &beta.1)?;
    let initial_state = initial_state
        .map(|(a, d)| read_array("initial_state", &a, &d))
        .transpose()?;
    let cu_seqlens = cu_seqlens
        .map(|(a, d)| read_array("cu_seqlens", &a, &d))
        .transpose()?;
    let options = GdnOptions {
        scale,
        use_qk_l2norm,
    };
    let out = py
        .detach(|| {
            let inputs = GdnInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                initial_state: initial_state.as_ref(),
                cu_seqlens: cu_seqlens.as_ref(),
            };
            deltakv::gdn_prefill(Device::Cpu, &inputs, &options, mode)
        })
        .map_err(to_py_err)?;
    Ok((export(py, &out.o)?, export(py, &out.final_state)?))
}

/// The native module `deltakv._deltakv`.
#[pymodule]
fn _deltakv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gdn_prefill, m)?)?;
    Ok(())
}
