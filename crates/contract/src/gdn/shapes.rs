//! The sizes of a GDN call and the shape and dtype rules prefill and decode share. Everything
//! here reads only shapes, dtypes and options (through [`TensorMeta`]), so it serves tensors
//! on any device.

use super::prefill::GdnOptions;
use crate::error::{Error, Result};
use crate::tensor::{DType, TensorMeta};

/// Largest supported head dimension for K and V. Every backend keeps a K x V state (up to
/// 256 KiB in f32) per value head, and the kernels size their tiles for it.
pub const MAX_HEAD_DIM: usize = 256;

/// The sizes of one GDN call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDims {
    /// B: batch rows of the input tensors (1 with cu_seqlens).
    pub batch: usize,
    /// T: tokens per batch row.
    pub tokens: usize,
    /// Hg: query/key heads.
    pub key_heads: usize,
    /// H: value heads (a multiple of Hg).
    pub value_heads: usize,
    /// K: query/key head dimension.
    pub key_dim: usize,
    /// V: value head dimension.
    pub value_dim: usize,
}

impl GdnDims {
    /// Value heads per key head.
    #[inline]
    pub fn group(&self) -> usize {
        self.value_heads / self.key_heads.max(1)
    }

    /// The key head that value head `value_head` reads.
    #[inline]
    pub fn key_head_of(&self, value_head: usize) -> usize {
        value_head / self.group().max(1)
    }
}

pub(crate) fn expect_rank(
    name: &str,
    t: &(impl TensorMeta + ?Sized),
    rank: usize,
    layout: &str,
) -> Result<()> {
    if t.shape().len() != rank {
        return Err(Error::shape(
            name,
            format!("expected {rank} dims {layout}, got shape {:?}", t.shape()),
        ));
    }
    Ok(())
}

pub(crate) fn expect_float(name: &str, t: &(impl TensorMeta + ?Sized)) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(Error::dtype(name, t.dtype(), "f32, f16 or bf16"));
    }
    Ok(())
}

pub(crate) fn expect_shape(
    name: &str,
    t: &(impl TensorMeta + ?Sized),
    expected: &[usize],
    layout: &str,
) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::shape(
            name,
            format!("expected shape {expected:?} {layout}, got {:?}", t.shape()),
        ));
    }
    Ok(())
}

/// The shape and dtype (must equal `dtype`, q's) of a q/k/v-like activation.
pub(crate) fn expect_activation(
    name: &str,
    t: &(impl TensorMeta + ?Sized),
    expected: &[usize],
    layout: &str,
    dtype: DType,
) -> Result<()> {
    expect_shape(name, t, expected, layout)?;
    if t.dtype() != dtype {
        return Err(Error::dtype(
            name,
            t.dtype(),
            &format!("{dtype} (the dtype of q)"),
        ));
    }
    Ok(())
}

/// Checks the head counts and head dims shared by prefill and decode: all positive,
/// `H % Hg == 0` (value head h reads key head `h / (H / Hg)`) and `K, V <=` [`MAX_HEAD_DIM`].
pub fn check_heads(
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
) -> Result<()> {
    if key_heads == 0 || value_heads == 0 || key_dim == 0 || value_dim == 0 {
        return Err(Error::InvalidValue(format!(
            "head counts and dims must be positive (Hg={key_heads}, H={value_heads}, K={key_dim}, V={value_dim})"
        )));
    }
    if !value_heads.is_multiple_of(key_heads) {
        return Err(Error::InvalidValue(format!(
            "value heads H={value_heads} is not a multiple of key heads Hg={key_heads}"
        )));
    }
    if key_dim > MAX_HEAD_DIM || value_dim > MAX_HEAD_DIM {
        return Err(Error::Unsupported(format!(
            "head dims K={key_dim}, V={value_dim}: at most {MAX_HEAD_DIM} is supported"
        )));
    }
    Ok(())
}

/// The sizes of a call from q `[B, T, Hg, K]` and v `[B, T, H, V]`: ranks, a float q,
/// B, T >= 1 and the head rules. The other tensors are checked against the result.
pub fn gdn_dims(q: &(impl TensorMeta + ?Sized), v: &(impl TensorMeta + ?Sized)) -> Result<GdnDims> {
    expect_rank("q", q, 4, "[B, T, Hg, K]")?;
    expect_float("q", q)?;
    let (batch, tokens, key_heads, key_dim) =
        (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    if batch == 0 || tokens == 0 {
        return Err(Error::shape(
            "q",
            format!("B and T must be at least 1, got shape {:?}", q.shape()),
        ));
    }
    expect_rank("v", v, 4, "[B, T, H, V]")?;
    let (value_heads, value_dim) = (v.shape()[2], v.shape()[3]);
    check_heads(key_heads, value_heads, key_dim, value_dim)?;
    Ok(GdnDims {
        batch,
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
    })
}

/// The output scale of a call: the given one (finite) or K^-0.5.
pub fn resolve_scale(options: &GdnOptions, key_dim: usize) -> Result<f32> {
    let scale = options.scale.unwrap_or(1.0 / (key_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidValue(format!(
            "scale must be finite, got {scale}"
        )));
    }
    Ok(scale)
}
