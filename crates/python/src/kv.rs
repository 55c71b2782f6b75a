//! The compressed KV cache of one attention layer as a Python class: append keys and values
//! (encoded on the way in), attend with new queries (flash-decoding over the packed codes),
//! and the bytes it holds.

use crate::dlpack::Borrowed;
use crate::export::{Exported, Owned};
use crate::{record_buffers, to_py_err};
use deltakv::kv::{AttnOptions, CodebookKind, KvScheme, NormDType, attend_compressed};
use deltakv::{DType, HostData};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A compressed KV cache (CPU): per sequence and KV head, each key and value vector stored
/// as a norm and `bits_k` / `bits_v`-bit codebook indices of its rotated direction.
#[pyclass(module = "deltakv._deltakv", name = "KvCache")]
pub struct KvCache {
    cache: deltakv::kv::KvCache,
}

/// The scheme of a cache from the Python constructor's arguments.
pub(crate) fn scheme(
    dim: usize,
    kv_heads: usize,
    bits_k: u32,
    bits_v: u32,
    seed: u64,
    norms: &str,
    codebook: &str,
) -> PyResult<KvScheme> {
    let norm_dtype = match norms {
        "f32" => NormDType::F32,
        "f16" => NormDType::F16,
        other => {
            return Err(PyValueError::new_err(format!(
                "norms `{other}`: expected f32 or f16"
            )));
        }
    };
    let codebook: CodebookKind = codebook.parse().map_err(to_py_err)?;
    Ok(KvScheme {
        norm_dtype,
        codebook,
        seed,
        ..KvScheme::new(dim, kv_heads, bits_k, bits_v)
    })
}

/// The f32 elements of `b`, or a `ValueError` naming it and its shape layout.
fn f32_values<'a>(b: &'a Borrowed, layout: &str) -> PyResult<&'a [f32]> {
    if b.dtype() != DType::F32 {
        return Err(PyValueError::new_err(format!(
            "tensor `{}` has dtype {}, expected float32 {layout}",
            b.name(),
            b.dtype()
        )));
    }
    let view = b.view()?;
    Ok(view.slice().as_f32().expect("checked f32"))
}

#[pymethods]
impl KvCache {
    #[new]
    #[pyo3(signature = (dim, kv_heads, batch, bits_k = 4, bits_v = 2, seed = 0, norms = "f32", codebook = "lloyd-max"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dim: usize,
        kv_heads: usize,
        batch: usize,
        bits_k: u32,
        bits_v: u32,
        seed: u64,
        norms: &str,
        codebook: &str,
    ) -> PyResult<Self> {
        let scheme = scheme(dim, kv_heads, bits_k, bits_v, seed, norms, codebook)?;
        let cache = deltakv::kv::KvCache::new(scheme, batch).map_err(to_py_err)?;
        Ok(Self { cache })
    }

    /// Appends `n` tokens to sequence `seq`: `k`, `v` `[n, kv_heads, dim]` float32, read in
    /// place.
    fn append(
        &mut self,
        py: Python<'_>,
        seq: usize,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (k, v) = (
            Borrowed::import_host("k", k, "deltakv's KvCache")?,
            Borrowed::import_host("v", v, "deltakv's KvCache")?,
        );
        let (kf, vf) = (
            f32_values(&k, "[n, kv_heads, dim]")?,
            f32_values(&v, "[n, kv_heads, dim]")?,
        );
        let layout = [self.cache.scheme().kv_heads, self.cache.scheme().dim];
        for b in [&k, &v] {
            if b.shape().len() != 3 || b.shape()[1..] != layout {
                return Err(PyValueError::new_err(format!(
                    "tensor `{}` has shape {:?}, expected [n, kv_heads={}, dim={}]",
                    b.name(),
                    b.shape(),
                    layout[0],
                    layout[1]
                )));
            }
        }
        record_buffers(vec![
            ("k".into(), kf.as_ptr() as usize),
            ("v".into(), vf.as_ptr() as usize),
        ]);
        let cache = &mut self.cache;
        py.detach(|| cache.append(seq, kf, vf)).map_err(to_py_err)
    }

    /// Attention of `q` `[B, Tq, Hq, dim]` float32 (read in place) over the cache: query `i`
    /// of sequence `b` sits at position `len_b - Tq + i` and sees keys `0..=len_b - Tq + i`
    /// (Tq = 1 is decode). Returns o `[B, Tq, Hq, dim]` float32.
    #[pyo3(signature = (q, scale = None))]
    fn attend(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        scale: Option<f32>,
    ) -> PyResult<Exported> {
        let q = Borrowed::import_host("q", q, "deltakv's KvCache")?;
        let qf = f32_values(&q, "[B, Tq, Hq, dim]")?;
        let s = self.cache.scheme();
        let shape = q.shape().to_vec();
        if shape.len() != 4 || shape[0] != self.cache.batch() || shape[3] != s.dim {
            return Err(PyValueError::new_err(format!(
                "tensor `q` has shape {shape:?}, expected [B={}, Tq, Hq, dim={}]",
                self.cache.batch(),
                s.dim
            )));
        }
        let scale = scale.unwrap_or((s.dim as f32).powf(-0.5));
        record_buffers(vec![("q".into(), q.view()?.values().as_ptr() as usize)]);
        let cache = &self.cache;
        let o = py
            .detach(|| {
                attend_compressed(
                    cache,
                    qf,
                    shape[1],
                    shape[2],
                    scale,
                    &AttnOptions::default(),
                )
            })
            .map_err(to_py_err)?;
        Ok(Exported::new(Owned::F32(o), shape))
    }

    /// Bytes of codes and norms held, keys and values, over every sequence and head.
    fn bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Tokens cached for sequence `seq`.
    fn seq_len(&self, seq: usize) -> PyResult<usize> {
        self.cache.seq_len(seq).map_err(to_py_err)
    }

    #[getter]
    fn dim(&self) -> usize {
        self.cache.scheme().dim
    }

    #[getter]
    fn kv_heads(&self) -> usize {
        self.cache.scheme().kv_heads
    }

    #[getter]
    fn batch(&self) -> usize {
        self.cache.batch()
    }

    #[getter]
    fn bits_k(&self) -> u32 {
        self.cache.scheme().bits_k
    }

    #[getter]
    fn bits_v(&self) -> u32 {
        self.cache.scheme().bits_v
    }
}
