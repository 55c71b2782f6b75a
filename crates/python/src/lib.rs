//! The native half of deltakv's Python package (`deltakv._deltakv`); the public functions,
//! their FLA signatures and docstrings are in `python/deltakv/__init__.py`.
//!
//! Tensors cross the boundary through DLPack (module `dlpack`): inputs are read in place
//! (C-contiguous CPU arrays, or CUDA arrays with the cargo feature `cuda`; no copy), a state
//! pool is updated in place, and results are the kernels' own output buffers handed to the
//! caller's `from_dlpack` (module `export`; no copy either).
//!
//! * `gdn`: GDN prefill and decode over a state pool, on the CPU or (module `cuda`) the GPU,
//!   ordered on the caller's CUDA stream.
//! * `kv`: the compressed KV cache class; `kv_cuda` (feature `cuda`): the paged one on a GPU.

#[cfg(feature = "cuda")]
mod cuda;
mod dlpack;
mod export;
mod gdn;
mod kv;
#[cfg(feature = "cuda")]
mod kv_cuda;

use deltakv::Error;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::cell::RefCell;

/// deltakv's error as the Python exception of its kind, with the same one-line message:
/// `NotImplementedError` for what deltakv does not support, `RuntimeError` for a device or
/// backend failure, `ValueError` for everything about the inputs.
pub(crate) fn to_py_err(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Unsupported(_) => PyNotImplementedError::new_err(message),
        Error::DeviceUnavailable { .. } | Error::Backend { .. } | Error::Io { .. } => {
            PyRuntimeError::new_err(message)
        }
        _ => PyValueError::new_err(message),
    }
}

thread_local! {
    /// (name, address) of every buffer the last call on this thread handed to a kernel.
    static LAST_CALL_BUFFERS: RefCell<Vec<(String, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Records the buffers a call passes to its kernel (replacing the previous call's).
pub(crate) fn record_buffers(buffers: Vec<(String, usize)>) {
    LAST_CALL_BUFFERS.with_borrow_mut(|b| *b = buffers);
}

/// `[(name, address)]`: the address of the first element of every buffer that the last
/// deltakv call on this thread handed to its kernel: the callers' own memory when nothing was
/// copied. What the tests compare with `x.ctypes.data` / `x.data_ptr()`.
#[pyfunction]
fn last_call_buffers() -> Vec<(String, usize)> {
    LAST_CALL_BUFFERS.with_borrow(|b| b.clone())
}

/// The native module `deltakv._deltakv`.
#[pymodule]
fn _deltakv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gdn::gdn_prefill, m)?)?;
    m.add_function(wrap_pyfunction!(gdn::gdn_prefill_checkpointed, m)?)?;
    m.add_function(wrap_pyfunction!(gdn::gdn_decode, m)?)?;
    m.add_function(wrap_pyfunction!(last_call_buffers, m)?)?;
    m.add_class::<export::Exported>()?;
    m.add("CUDA_BUILT", cfg!(feature = "cuda"))?;
    m.add_class::<kv::KvCache>()?;
    #[cfg(feature = "cuda")]
    m.add_class::<kv_cuda::CudaKvCache>()?;
    Ok(())
}
