//! The rules of a prefill call, in the order every backend checks them: first everything that
//! reads only shapes, dtypes, options and `cu_seqlens` ([`check_prefill_shapes`]), then the
//! values: finite q, k and v (a backend scans them its own way, see [`validate_prefill`] for
//! the serial scan), the gates ([`prefill_gates`]: g finite and <= 0, beta finite) and a finite
//! initial state. Nothing is written before all of them pass.

use super::{GdnInputs, GdnOptions};
use crate::error::{Error, Result};
use crate::gdn::gating::{gate_values, log_decay_values};
use crate::gdn::shapes::{
    GdnDims, expect_activation, expect_float, expect_shape, gdn_dims, resolve_scale,
};
use crate::tensor::{DType, TensorMeta, non_finite_input};
use crate::view::HostData;

/// One independent sequence: rows `start..start + len` of the flattened `B * T` token axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    pub start: usize,
    pub len: usize,
}

impl SeqSpan {
    /// Sequences of lengths `lens` laid one after another from row 0 (as `cu_seqlens` lays them).
    pub fn back_to_back(lens: &[usize]) -> Vec<SeqSpan> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let span = SeqSpan { start, len };
                start += len;
                span
            })
            .collect()
    }
}

/// What [`check_prefill_shapes`] establishes about a call.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillShapes {
    pub dims: GdnDims,
    /// The N sequences (B of them without `cu_seqlens`).
    pub seqs: Vec<SeqSpan>,
    /// The output scale (given or K^-0.5), finite.
    pub scale: f32,
}

/// The gates of a call, `[B*T, H]` f32: g finite and <= 0, beta finite.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillGates {
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
}

/// Checks every shape and dtype of a prefill call and reads `cu_seqlens`: q, k `[B, T, Hg, K]`
/// and v `[B, T, H, V]` in one float dtype, float g and beta `[B, T, H]`, the head rules,
/// `cu_seqlens` (B == 1, starting at 0, strictly increasing, ending at T), `initial_state`
/// `[N, H, K, V]` f32, and a finite scale.
pub fn check_prefill_shapes<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
) -> Result<PrefillShapes> {
    let offsets = match inputs.cu_seqlens {
        Some(cu) => Some(cu.values().to_i64_vec("cu_seqlens")?),
        None => None,
    };
    check_prefill_meta(inputs, options, offsets.as_deref())
}

/// [`check_prefill_shapes`] for tensors of any backend: the values of `cu_seqlens` come
/// separately (`cu_offsets`, read by the caller from wherever the tensor lives), and only the
/// shape and dtype of each tensor are read.
pub fn check_prefill_meta<T: TensorMeta>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
    cu_offsets: Option<&[i64]>,
) -> Result<PrefillShapes> {
    let q = inputs.q;
    let dims = gdn_dims(q, inputs.v)?;
    let dtype = q.dtype();
    expect_activation("q", q, q.shape(), "[B, T, Hg, K]", dtype)?;
    expect_activation("k", inputs.k, q.shape(), "[B, T, Hg, K] (as q)", dtype)?;
    let (batch, tokens, heads) = (dims.batch, dims.tokens, dims.value_heads);
    expect_activation(
        "v",
        inputs.v,
        &[batch, tokens, heads, dims.value_dim],
        "[B, T, H, V]",
        dtype,
    )?;
    for (name, gate) in [("g", inputs.g), ("beta", inputs.beta)] {
        expect_float(name, gate)?;
        expect_shape(name, gate, &[batch, tokens, heads], "[B, T, H]")?;
    }
    let seqs = match (inputs.cu_seqlens, cu_offsets) {
        (Some(cu), Some(offsets)) => sequence_spans(Some((cu.shape(), offsets)), batch, tokens)?,
        (None, _) => sequence_spans(None, batch, tokens)?,
        (Some(_), None) => {
            return Err(Error::InvalidValue(
                "cu_seqlens given without its values (a backend bug)".to_string(),
            ));
        }
    };
    if let Some(s) = inputs.initial_state {
        if s.dtype() != DType::F32 {
            return Err(Error::dtype("initial_state", s.dtype(), "f32"));
        }
        expect_shape(
            "initial_state",
            s,
            &[seqs.len(), heads, dims.key_dim, dims.value_dim],
            "[N, H, K, V]",
        )?;
    }
    let scale = resolve_scale(options, dims.key_dim)?;
    Ok(PrefillShapes { dims, seqs, scale })
}

/// Reads the gates of a call whose shapes passed: g finite and <= 0 (naming the position of a
/// positive one), beta finite.
pub fn prefill_gates<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    dims: &GdnDims,
) -> Result<PrefillGates> {
    let shape = [dims.batch, dims.tokens, dims.value_heads];
    Ok(PrefillGates {
        g: log_decay_values(inputs.g, &shape, "[B, T, H]")?,
        beta: gate_values("beta", inputs.beta, &shape, "[B, T, H]")?,
    })
}

/// Every rule of a prefill call, scanning values serially: [`check_prefill_shapes`], finite
/// q, k and v, [`prefill_gates`], a finite initial state.
pub fn validate_prefill<T: HostData>(
    inputs: &GdnInputs<'_, T>,
    options: &GdnOptions,
) -> Result<(PrefillShapes, PrefillGates)> {
    let shapes = check_prefill_shapes(inputs, options)?;
    for (name, t) in [("q", inputs.q), ("k", inputs.k), ("v", inputs.v)] {
        check_values_finite(name, t)?;
    }
    let gates = prefill_gates(inputs, &shapes.dims)?;
    if let Some(s) = inputs.initial_state {
        check_values_finite("initial_state", s)?;
    }
    Ok((shapes, gates))
}

/// Fails on the first NaN or infinity of `t` (a serial scan), naming it.
fn check_values_finite(name: &str, t: &impl HostData) -> Result<()> {
    let values = t.values();
    match values.first_non_finite_in(0..values.len()) {
        None => Ok(()),
        Some((i, x)) => Err(non_finite_input(name, i, x)),
    }
}

/// Splits the token axis into sequences from optional `cu_seqlens` (its shape and values).
fn sequence_spans(
    cu_seqlens: Option<(&[usize], &[i64])>,
    batch: usize,
    tokens: usize,
) -> Result<Vec<SeqSpan>> {
    let Some((cu_shape, offsets)) = cu_seqlens else {
        return Ok((0..batch)
            .map(|b| SeqSpan {
                start: b * tokens,
                len: tokens,
            })
            .collect());
    };
    if cu_shape.len() != 1 || offsets.len() < 2 {
        return Err(Error::shape(
            "cu_seqlens",
            format!("expected 1 dim [N+1] with N >= 1, got shape {cu_shape:?}"),
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
    let last = offsets[offsets.len() - 1];
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
