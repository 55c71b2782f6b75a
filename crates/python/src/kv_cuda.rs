//! The paged compressed KV cache on a CUDA GPU as a Python class (cargo feature `cuda`): keys
//! and values appended from the caller's device arrays (read in place, encoded into pages on
//! the GPU), attention of the caller's device queries, on the caller's stream (the stream rule
//! of module `cuda`).

use crate::cuda::{Launcher, device_tensor};
use crate::dlpack::{Borrowed, DEVICE_CUDA, Device, call_device};
use crate::export::Exported;
use crate::{record_buffers, to_py_err};
use deltakv::cuda::Cuda;
use deltakv::cuda::kv::{CudaPagedKvCache, attend};
use deltakv::kv::{PagedCache, PagedLayout};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, Ordering};

/// A paged compressed KV cache on the GPU: `batch` sequences of up to `max_tokens` tokens each,
/// in pages of `page_tokens`; each key and value vector stored as a norm and `bits_k` /
/// `bits_v`-bit codes, byte for byte what the CPU's paged cache holds.
#[pyclass(module = "deltakv._deltakv", name = "CudaKvCache")]
pub struct CudaKvCache {
    cache: CudaPagedKvCache,
    device: Device,
    /// The stream the cache was made on (its buffers are freed there) and a handle on it.
    home: Cuda,
    home_stream: i64,
    /// The stream of the latest append or attend (a DLPack stream integer).
    last_stream: AtomicI64,
}

impl CudaKvCache {
    /// The GPU and stream of a call on `arrays`, which must be on this cache's GPU.
    fn launcher(
        &self,
        arrays: &[(&str, Option<&Bound<'_, PyAny>>)],
        stream: Option<i64>,
    ) -> PyResult<Launcher> {
        let device = call_device(arrays)?;
        if device != self.device {
            return Err(PyValueError::new_err(format!(
                "tensor `{}` is on {device}, but this CudaKvCache is on {}",
                arrays[0].0, self.device
            )));
        }
        let launcher = Launcher::new(device, stream)?;
        self.last_stream.store(launcher.stream(), Ordering::Relaxed);
        Ok(launcher)
    }
}

impl Drop for CudaKvCache {
    fn drop(&mut self) {
        // The buffers are freed on the stream the cache was made on, when `cache` drops after
        // this: that stream first waits for the work of the latest call's stream, so the
        // memory pool cannot hand the pages out again while that work still reads them. A
        // failure has nowhere to go; cudarc keeps it for the context's next check.
        let last = self.last_stream.load(Ordering::Relaxed);
        let context = self.home.context();
        let _ = context.bind_to_thread();
        if last != self.home_stream {
            // SAFETY: the stream of a call outlives the call's use of the cache (the stream
            // rule); the wrapper never destroys it.
            let last = unsafe { context.wrap_borrowed_stream(last as usize as *mut c_void as _) };
            if let Ok(event) = last.record_event(None) {
                let _ = self.home.stream().wait(&event);
            }
        }
    }
}

#[pymethods]
impl CudaKvCache {
    #[new]
    #[pyo3(signature = (dim, kv_heads, batch, max_tokens, bits_k = 4, bits_v = 2, seed = 0, norms = "f32", codebook = "lloyd-max", page_tokens = 64, device = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dim: usize,
        kv_heads: usize,
        batch: usize,
        max_tokens: usize,
        bits_k: u32,
        bits_v: u32,
        seed: u64,
        norms: &str,
        codebook: &str,
        page_tokens: usize,
        device: Option<i32>,
        stream: Option<i64>,
    ) -> PyResult<Self> {
        let scheme = crate::kv::scheme(dim, kv_heads, bits_k, bits_v, seed, norms, codebook)?;
        let id = match device {
            Some(id) => id,
            None => Cuda::get().map_err(to_py_err)?.ordinal() as i32,
        };
        let device = Device {
            kind: DEVICE_CUDA,
            id,
        };
        let launcher = Launcher::new(device, stream)?;
        let layout = PagedLayout::new(scheme, page_tokens).map_err(to_py_err)?;
        let max_pages = max_tokens.div_ceil(page_tokens.max(1));
        let cache =
            CudaPagedKvCache::new(launcher.cuda(), layout, batch, max_pages, batch * max_pages)
                .map_err(to_py_err)?;
        let home_stream = launcher.stream();
        // SAFETY: the stream the cache was made on, under the launcher's contract.
        let home = unsafe {
            launcher
                .cuda()
                .on_stream(launcher.cuda().stream().cu_stream())
        };
        Ok(Self {
            cache,
            device,
            home,
            home_stream,
            last_stream: AtomicI64::new(home_stream),
        })
    }

    /// Appends `new_lens[b]` tokens (all `Tn` when None) of `k`, `v` `[B, Tn, kv_heads, dim]`
    /// (f32, f16 or bf16 on the GPU, read in place) to sequence b, for every b. Refuses,
    /// changing nothing, a non-finite input (it waits for the GPU to know).
    #[pyo3(signature = (k, v, new_lens = None, stream = None))]
    fn append(
        &mut self,
        py: Python<'_>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        new_lens: Option<Vec<usize>>,
        stream: Option<i64>,
    ) -> PyResult<()> {
        let launcher = self.launcher(&[("k", Some(k)), ("v", Some(v))], stream)?;
        let import = |name, obj| Borrowed::import(name, obj, self.device, Some(launcher.stream()));
        let (k, v) = (import("k", k)?, import("v", v)?);
        record_buffers(vec![("k".into(), k.address()), ("v".into(), v.address())]);
        let (kt, vt) = (device_tensor(&k)?, device_tensor(&v)?);
        let new_lens = match new_lens {
            Some(lens) => lens,
            None => match kt.shape() {
                [b, tn, ..] => vec![*tn; *b],
                shape => {
                    return Err(PyValueError::new_err(format!(
                        "tensor `k` has shape {shape:?}, expected [B, Tn, kv_heads, dim]"
                    )));
                }
            },
        };
        let cache = &mut self.cache;
        let cuda = launcher.cuda();
        py.detach(|| cache.append(cuda, &kt, &vt, &new_lens))
            .map_err(to_py_err)
    }

    /// Attention of `q` `[B, Tq, Hq, dim]` (f32, f16 or bf16 on the GPU, read in place) over
    /// the cache, causal over each sequence's last Tq positions. Returns o `[B, Tq, Hq, dim]`
    /// f32 on the GPU.
    #[pyo3(signature = (q, scale = None, stream = None))]
    fn attend(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        scale: Option<f32>,
        stream: Option<i64>,
    ) -> PyResult<Exported> {
        let launcher = self.launcher(&[("q", Some(q))], stream)?;
        let q = Borrowed::import("q", q, self.device, Some(launcher.stream()))?;
        let qt = device_tensor(&q)?;
        let (cache, cuda) = (&self.cache, launcher.cuda());
        let o = py
            .detach(|| attend(cuda, cache, &qt, scale))
            .map_err(to_py_err)?;
        let mut o = launcher.result(o);
        record_buffers(vec![("q".into(), q.address()), ("o".into(), o.address())]);
        Ok(o)
    }

    /// Bytes of codes and norms held (the tokens appended, keys and values, every sequence
    /// and head; pages are allocated up front for `max_tokens`).
    fn bytes(&self) -> usize {
        let s = self.cache.layout().scheme;
        self.cache.lens().iter().sum::<usize>() * s.kv_heads * s.bytes_per_token_head()
    }

    /// Tokens cached for sequence `seq`.
    fn seq_len(&self, seq: usize) -> PyResult<usize> {
        self.cache.lens().get(seq).copied().ok_or_else(|| {
            PyValueError::new_err(format!(
                "sequence {seq} is out of range (batch {})",
                self.cache.batch()
            ))
        })
    }

    #[getter]
    fn dim(&self) -> usize {
        self.cache.layout().scheme.dim
    }

    #[getter]
    fn kv_heads(&self) -> usize {
        self.cache.layout().scheme.kv_heads
    }

    #[getter]
    fn batch(&self) -> usize {
        self.cache.batch()
    }

    #[getter]
    fn device(&self) -> i32 {
        self.device.id
    }
}
