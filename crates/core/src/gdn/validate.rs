//! Shape, dtype and value validation for GDN inputs, written once and shared by every backend
//! and by the oracle. It also widens inputs to f32 and applies the optional l2 norm once per key
//! head (not once per value head).

use super::prefill::{GdnInputs, GdnOptions};
use crate::error::{Error, Result};
use crate::rows::bf16_widen;
use crate::tensor::{DType, HostTensor, TensorData, TensorMeta};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Largest supported head dimension for K and V.
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
    pub fn group(&self) -> usize {
        self.value_heads / self.key_heads
    }

    /// The key head that value head `value_head` reads.
    pub fn key_head_of(&self, value_head: usize) -> usize {
        value_head / self.group()
    }
}

/// One independent sequence: rows `start..start + len` of the flattened `B * T` token axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    pub start: usize,
    pub len: usize,
}

/// Validated inputs. q, k and v stay in their own dtype and are widened to f32 row by row as
/// kernels gather them (no full-size f32 copies); gates are small and widened up front.
#[derive(Clone, Debug)]
pub struct PreparedGdn<'a> {
    pub dims: GdnDims,
    pub seqs: Vec<SeqSpan>,
    /// `[B*T, Hg, K]`
    pub q: &'a TensorData,
    /// `[B*T, Hg, K]`
    pub k: &'a TensorData,
    /// `[B*T, H, V]`
    pub v: &'a TensorData,
    /// `[B*T, H]`
    pub g: Vec<f32>,
    /// `[B*T, H]`
    pub beta: Vec<f32>,
    /// `[N, H, K, V]`
    pub initial_state: Option<&'a [f32]>,
    pub scale: f32,
    /// Normalise q and k rows as they are read.
    pub use_qk_l2norm: bool,
    /// dtype of `o` (v's dtype).
    pub out_dtype: DType,
}

impl PreparedGdn<'_> {
    /// Query row of token `row` (flattened B*T index) for `key_head`, widened (and normalised).
    #[inline]
    pub fn read_q(&self, row: usize, key_head: usize, dst: &mut [f32]) {
        self.read_key_like(self.q, row, key_head, dst);
    }

    /// Key row, as [`Self::read_q`].
    #[inline]
    pub fn read_k(&self, row: usize, key_head: usize, dst: &mut [f32]) {
        self.read_key_like(self.k, row, key_head, dst);
    }

    #[inline(always)]
    fn read_key_like(&self, data: &TensorData, row: usize, key_head: usize, dst: &mut [f32]) {
        let kd = self.dims.key_dim;
        widen_into(
            data,
            (row * self.dims.key_heads + key_head) * kd,
            &mut dst[..kd],
        );
        if self.use_qk_l2norm {
            l2_normalize_row(&mut dst[..kd]);
        }
    }

    /// Value row of token `row` for `value_head`, widened.
    #[inline]
    pub fn read_v(&self, row: usize, value_head: usize, dst: &mut [f32]) {
        let vd = self.dims.value_dim;
        widen_into(
            self.v,
            (row * self.dims.value_heads + value_head) * vd,
            &mut dst[..vd],
        );
    }
}

/// Widens `dst.len()` elements of a float tensor, starting at `offset`, into `dst`.
#[inline]
pub fn widen_into(src: &TensorData, offset: usize, dst: &mut [f32]) {
    let n = dst.len();
    match src {
        TensorData::F32(v) => dst.copy_from_slice(&v[offset..offset + n]),
        // bf16 is the top half of an f32; a plain shift (exact, vectorisable) instead of
        // `half`'s NaN-quieting scalar path. Inputs are validated finite.
        TensorData::BF16(v) => {
            for (d, s) in dst.iter_mut().zip(&v[offset..offset + n]) {
                *d = bf16_widen(*s);
            }
        }
        TensorData::F16(v) => v[offset..offset + n].convert_to_f32_slice(dst),
        // Validation admits only float tensors here.
        TensorData::I32(_) | TensorData::I64(_) => dst.fill(f32::NAN),
    }
}

/// `x / sqrt(|x|^2 + 1e-6)` in place.
#[inline]
pub fn l2_normalize_row(row: &mut [f32]) {
    // Eight partial sums, so the reduction vectorises (a single f32 sum stays serial).
    let mut lanes = [0.0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x * x;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    let sum = lanes.iter().sum::<f32>() + tail;
    let inv = 1.0 / (sum + 1e-6).sqrt();
    row.iter_mut().for_each(|x| *x *= inv);
}

/// Fails on the first non-finite element of a float tensor (scanned in parallel, no copy).
pub fn check_finite_data(name: &str, data: &TensorData) -> Result<()> {
    match first_non_finite_data(data) {
        None => Ok(()),
        Some((i, x)) => Err(Error::InvalidValue(format!(
            "tensor `{name}` holds a non-finite value ({x}) at flat index {i}"
        ))),
    }
}

/// Checks a result computed from validated (finite) inputs: a NaN or infinity there means an
/// intermediate overflowed f32. The error names the tensor, the position (labelled by
/// `axes`, e.g. `"b, t, h, v"`) and the likely `cause`.
pub fn check_result_finite(name: &str, t: &HostTensor, axes: &str, cause: &str) -> Result<()> {
    match first_non_finite_data(t.data()) {
        None => Ok(()),
        Some((i, x)) => Err(Error::InvalidValue(format!(
            "the result `{name}` holds a non-finite value ({x}) at [{axes}] = {:?} although every input was finite: an intermediate overflowed f32 ({cause})",
            unravel(i, t.shape())
        ))),
    }
}

/// The likely cause named by [`check_result_finite`] for GDN results.
pub const GDN_OVERFLOW_CAUSE: &str =
    "v, beta, k or the initial state too large for the state to stay within f32's range";

/// The multi-index of flat index `i` in a row-major tensor of `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (slot, &extent) in index.iter_mut().zip(shape).rev() {
        let extent = extent.max(1);
        *slot = i % extent;
        i /= extent;
    }
    index
}

/// Index and value of the first non-finite element of a float tensor (None for integers).
fn first_non_finite_data(data: &TensorData) -> Option<(usize, f32)> {
    /// Index of the first element whose exponent bits are all ones (inf or NaN). Blocks are
    /// tested with a branch-free OR (vectorisable) and searched only when one is flagged.
    fn first_bad<T: Copy + Sync>(
        values: &[T],
        exponent_all_ones: impl Fn(T) -> bool + Sync,
    ) -> Option<usize> {
        const BLOCK: usize = 1 << 16;
        values
            .par_chunks(BLOCK)
            .enumerate()
            .find_map_first(|(b, chunk)| {
                let flagged = chunk
                    .iter()
                    .fold(false, |acc, &x| acc | exponent_all_ones(x));
                if flagged {
                    chunk
                        .iter()
                        .position(|&x| exponent_all_ones(x))
                        .map(|i| b * BLOCK + i)
                } else {
                    None
                }
            })
    }
    match data {
        TensorData::F32(v) => {
            first_bad(v, |x| x.to_bits() & 0x7f80_0000 == 0x7f80_0000).map(|i| (i, v[i]))
        }
        TensorData::BF16(v) => {
            first_bad(v, |x| x.to_bits() & 0x7f80 == 0x7f80).map(|i| (i, v[i].to_f32()))
        }
        TensorData::F16(v) => {
            first_bad(v, |x| x.to_bits() & 0x7c00 == 0x7c00).map(|i| (i, v[i].to_f32()))
        }
        TensorData::I32(_) | TensorData::I64(_) => None,
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

pub use crate::tensor::check_finite;

/// Checks the head counts and head dims shared by prefill and decode.
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

/// Splits the token axis into sequences from optional `cu_seqlens`.
fn sequence_spans(
    cu_seqlens: Option<&HostTensor>,
    batch: usize,
    tokens: usize,
) -> Result<Vec<SeqSpan>> {
    let Some(cu) = cu_seqlens else {
        return Ok((0..batch)
            .map(|b| SeqSpan {
                start: b * tokens,
                len: tokens,
            })
            .collect());
    };
    let offsets = cu.to_i64_vec("cu_seqlens")?;
    if cu.shape().len() != 1 || offsets.len() < 2 {
        return Err(Error::shape(
            "cu_seqlens",
            format!(
                "expected 1 dim [N+1] with N >= 1, got shape {:?}",
                cu.shape()
            ),
        ));
    }
    if batch != 1 {
        return Err(Error::shape(
            "cu_seqlens",
            format!("varlen input needs batch size B == 1, got B = {batch}"),
        ));
    }
    if offsets[0] != 0 {
        return Err(Error::InvalidValue(format!(
            "cu_seqlens must start at 0, got {}",
            offsets[0]
        )));
    }
    if let Some(i) = (1..offsets.len()).find(|&i| offsets[i] <= offsets[i - 1]) {
        return Err(Error::InvalidValue(format!(
            "cu_seqlens must be strictly increasing, but entry {i} ({}) <= entry {} ({})",
            offsets[i],
            i - 1,
            offsets[i - 1]
        )));
    }
    let last = *offsets.last().unwrap();
    if last != tokens as i64 {
        return Err(Error::InvalidValue(format!(
            "cu_seqlens must end at T = {tokens}, got {last}"
        )));
    }
    Ok(offsets
        .windows(2)
        .map(|w| SeqSpan {
            start: w[0] as usize,
            len: (w[1] - w[0]) as usize,
        })
        .collect())
}

/// Reads a `[.., H]` gate tensor (g or beta) as f32, checking shape and finiteness.
pub fn gate_values(
    name: &str,
    t: &HostTensor,
    expected: &[usize],
    layout: &str,
) -> Result<Vec<f32>> {
    expect_float(name, t)?;
    expect_shape(name, t, expected, layout)?;
    let values = t.to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}

/// Largest accepted log decay. `exp(g)` multiplies the state at every token, so g > 0 grows it
/// without bound (and overflows the chunked path's within-chunk decay ratios); every gating in
/// use (Qwen3-Next's `-exp(A_log) * softplus(.)`, Mamba's, FLA's `logsigmoid`) gives g <= 0.
pub const MAX_LOG_DECAY: f32 = 0.0;

/// Reads the log decay `g` `[B, T, H]` ([`gate_values`]) and rejects any value above
/// [`MAX_LOG_DECAY`], naming its position.
pub fn log_decay_values(t: &HostTensor, expected: &[usize], layout: &str) -> Result<Vec<f32>> {
    let values = gate_values("g", t, expected, layout)?;
    if let Some(i) = values.iter().position(|&x| x > MAX_LOG_DECAY) {
        return Err(Error::InvalidValue(format!(
            "tensor `g` holds a positive log decay ({}) at [b, t, h] = {:?}: g must be <= 0 (the state is multiplied by exp(g) at every token, so g > 0 grows it without bound)",
            values[i],
            unravel(i, expected)
        )));
    }
    Ok(values)
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

/// Reads q/k/v-like activations: shape, dtype (must equal `dtype`) and finiteness.
pub fn activation_values(
    name: &str,
    t: &HostTensor,
    expected: &[usize],
    layout: &str,
    dtype: DType,
) -> Result<Vec<f32>> {
    expect_activation(name, t, expected, layout, dtype)?;
    let values = t.to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}

/// Checks a q/k/v-like activation in place (no copy): shape, dtype and finiteness.
pub fn check_activation(
    name: &str,
    t: &HostTensor,
    expected: &[usize],
    layout: &str,
    dtype: DType,
) -> Result<()> {
    expect_activation(name, t, expected, layout, dtype)?;
    check_finite_data(name, t.data())
}

/// The sizes of a call from q `[B, T, Hg, K]` and v `[B, T, H, V]`: ranks, a float q,
/// B, T >= 1 and the head rules. Shared by prefill and decode; the other tensors are checked
/// against the result.
pub(crate) fn gdn_dims(
    q: &(impl TensorMeta + ?Sized),
    v: &(impl TensorMeta + ?Sized),
) -> Result<GdnDims> {
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

/// Validates prefill inputs.
pub fn prepare_prefill<'a>(
    inputs: &GdnInputs<'a>,
    options: &GdnOptions,
) -> Result<PreparedGdn<'a>> {
    let q = inputs.q;
    let dims = gdn_dims(q, inputs.v)?;
    let dtype = q.dtype();
    let (batch, tokens, value_heads, key_dim, value_dim) = (
        dims.batch,
        dims.tokens,
        dims.value_heads,
        dims.key_dim,
        dims.value_dim,
    );
    check_activation("q", q, q.shape(), "[B, T, Hg, K]", dtype)?;
    check_activation("k", inputs.k, q.shape(), "[B, T, Hg, K] (as q)", dtype)?;
    check_activation(
        "v",
        inputs.v,
        &[batch, tokens, value_heads, value_dim],
        "[B, T, H, V]",
        dtype,
    )?;
    let gate_shape = [batch, tokens, value_heads];
    let g = log_decay_values(inputs.g, &gate_shape, "[B, T, H]")?;
    let beta = gate_values("beta", inputs.beta, &gate_shape, "[B, T, H]")?;
    let seqs = sequence_spans(inputs.cu_seqlens, batch, tokens)?;
    let initial_state = match inputs.initial_state {
        None => None,
        Some(s) => {
            if s.dtype() != DType::F32 {
                return Err(Error::dtype("initial_state", s.dtype(), "f32"));
            }
            expect_shape(
                "initial_state",
                s,
                &[seqs.len(), value_heads, key_dim, value_dim],
                "[N, H, K, V]",
            )?;
            let values = s.as_f32().expect("dtype checked above");
            check_finite("initial_state", values)?;
            Some(values)
        }
    };
    let scale = options.scale.unwrap_or(1.0 / (key_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidValue(format!(
            "scale must be finite, got {scale}"
        )));
    }
    Ok(PreparedGdn {
        dims,
        seqs,
        q: q.data(),
        k: inputs.k.data(),
        v: inputs.v.data(),
        g,
        beta,
        initial_state,
        scale,
        use_qk_l2norm: options.use_qk_l2norm,
        out_dtype: inputs.v.dtype(),
    })
}
