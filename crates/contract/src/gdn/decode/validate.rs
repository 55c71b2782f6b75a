//! Validation for GDN decode, done once and in full before any slot of the pool is touched (so
//! a bad call never leaves a partial update), shared by every backend and the oracle:
//! [`check_decode_shapes`] reads only shapes and dtypes (tensors on any device),
//! [`slot_rows`] the slot indices, and [`prepare_decode_values`] checks the values of host
//! tensors and reads them as f32 (computing fused gates).

use super::{DecodeInputs, Gating, MAX_DECODE_TOKENS};
use crate::error::{Error, Result};
use crate::gdn::gating::{fused_gates, gate_values, head_values, log_decay_values};
use crate::gdn::prefill::GdnOptions;
use crate::gdn::shapes::{
    GdnDims, expect_activation, expect_float, expect_rank, expect_shape, gdn_dims,
};
use crate::tensor::{DType, TensorMeta, check_finite};
use crate::view::HostData;

pub use crate::gdn::shapes::resolve_scale;

/// Validated decode inputs read as f32 (q and k as given: the optional l2 norm is the
/// kernel's), ready for any kernel on the host.
#[derive(Clone, Debug)]
pub struct DecodeValues {
    pub dims: GdnDims,
    /// S: slots in the pool.
    pub slots: usize,
    /// The pool slot of each batch row, `None` for a skipped row (negative index).
    pub slot_of_row: Vec<Option<usize>>,
    /// `[B*T, Hg, K]`
    pub q: Vec<f32>,
    /// `[B*T, Hg, K]`
    pub k: Vec<f32>,
    /// `[B*T, H, V]`
    pub v: Vec<f32>,
    /// `[B*T, H]` log decay (given, or computed by fused gating).
    pub g: Vec<f32>,
    /// `[B*T, H]`
    pub beta: Vec<f32>,
    pub scale: f32,
    /// dtype of `o` (v's dtype).
    pub out_dtype: DType,
    /// dtype of the pool (f32 or bf16).
    pub pool_dtype: DType,
}

/// The sizes of a decode call, from its tensors' shapes and dtypes alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShapes {
    pub dims: GdnDims,
    /// S: slots in the pool.
    pub slots: usize,
}

/// Checks every shape and dtype of a decode call against the contract (no values are read,
/// so it serves tensors on any device): q, k `[B, T, Hg, K]` with T <= 16, v `[B, T, H, V]` in
/// q's dtype, float gates `[B, T, H]` (A_log, dt_bias `[H]`), the pool `[S, H, K, V]` in f32 or
/// bf16, and `slot_indices [B]` in i32 or i64.
pub fn check_decode_shapes<T: TensorMeta>(
    inputs: &DecodeInputs<'_, T>,
    pool: &(impl TensorMeta + ?Sized),
) -> Result<DecodeShapes> {
    let q = inputs.q;
    let dims = gdn_dims(q, inputs.v)?;
    if dims.tokens > MAX_DECODE_TOKENS {
        return Err(Error::shape(
            "q",
            format!(
                "decode takes at most {MAX_DECODE_TOKENS} tokens per row, got T = {} (use prefill for longer inputs)",
                dims.tokens
            ),
        ));
    }
    let dtype = q.dtype();
    expect_activation("k", inputs.k, q.shape(), "[B, T, Hg, K] (as q)", dtype)?;
    expect_activation(
        "v",
        inputs.v,
        &[dims.batch, dims.tokens, dims.value_heads, dims.value_dim],
        "[B, T, H, V]",
        dtype,
    )?;
    let gate_shape = [dims.batch, dims.tokens, dims.value_heads];
    let gate = |name: &str, t: &T, shape: &[usize], layout: &str| -> Result<()> {
        expect_float(name, t)?;
        expect_shape(name, t, shape, layout)
    };
    match inputs.gating {
        Gating::Direct { g, beta } => {
            gate("g", g, &gate_shape, "[B, T, H]")?;
            gate("beta", beta, &gate_shape, "[B, T, H]")?;
        }
        Gating::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => {
            gate("a", a, &gate_shape, "[B, T, H]")?;
            gate("b", b, &gate_shape, "[B, T, H]")?;
            gate("A_log", a_log, &[dims.value_heads], "[H]")?;
            gate("dt_bias", dt_bias, &[dims.value_heads], "[H]")?;
        }
    }
    let slots = check_pool(pool, &dims)?;
    let indices = inputs.slot_indices;
    if !matches!(indices.dtype(), DType::I32 | DType::I64) {
        return Err(Error::dtype("slot_indices", indices.dtype(), "i32 or i64"));
    }
    expect_shape("slot_indices", indices, &[dims.batch], "[B] (B from q)")?;
    Ok(DecodeShapes { dims, slots })
}

/// Checks the pool's dtype and shape `[S, H, K, V]`; returns S.
pub fn check_pool(pool: &(impl TensorMeta + ?Sized), dims: &GdnDims) -> Result<usize> {
    if !matches!(pool.dtype(), DType::F32 | DType::BF16) {
        return Err(Error::dtype("state_pool", pool.dtype(), "f32 or bf16"));
    }
    expect_rank("state_pool", pool, 4, "[S, H, K, V]")?;
    let slots = pool.shape()[0];
    expect_shape(
        "state_pool",
        pool,
        &[slots, dims.value_heads, dims.key_dim, dims.value_dim],
        "[S, H, K, V] (H from v, K from q, V from v)",
    )?;
    Ok(slots)
}

/// Reads `slot_indices [B]` (i32 or i64): negative means skip; otherwise each index must be
/// below `slots` and appear at most once.
pub fn slot_rows(
    indices: &(impl HostData + ?Sized),
    batch: usize,
    slots: usize,
) -> Result<Vec<Option<usize>>> {
    if !matches!(indices.dtype(), DType::I32 | DType::I64) {
        return Err(Error::dtype("slot_indices", indices.dtype(), "i32 or i64"));
    }
    expect_shape("slot_indices", indices, &[batch], "[B] (B from q)")?;
    let values = indices.values().to_i64_vec("slot_indices")?;
    let mut rows = Vec::with_capacity(batch);
    for (row, &index) in values.iter().enumerate() {
        if index < 0 {
            rows.push(None);
        } else if index as u64 >= slots as u64 {
            return Err(Error::InvalidValue(format!(
                "slot_indices[{row}] = {index} is out of range for a state pool of {slots} slots"
            )));
        } else {
            rows.push(Some(index as usize));
        }
    }
    let mut used: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .filter_map(|(row, slot)| slot.map(|s| (s, row)))
        .collect();
    used.sort_unstable();
    if let Some(w) = used.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidValue(format!(
            "slot_indices: rows {} and {} both address slot {} (each slot may be used by one row per call)",
            w[0].1, w[1].1, w[0].0
        )));
    }
    Ok(rows)
}

/// Validates decode inputs against the pool (shape and dtype only; the pool's values are not
/// read: a serving engine owns it) and reads them as f32.
pub fn prepare_decode<T: HostData>(
    inputs: &DecodeInputs<'_, T>,
    pool: &(impl TensorMeta + ?Sized),
    options: &GdnOptions,
) -> Result<DecodeValues> {
    let shapes = check_decode_shapes(inputs, pool)?;
    prepare_decode_values(inputs, shapes, pool.dtype(), options)
}

/// The value half of [`prepare_decode`], for inputs whose shapes [`check_decode_shapes`]
/// accepted (against a pool of dtype `pool_dtype`, wherever it lives): finite activations and
/// gates (g <= 0), slot indices in range and distinct, a finite scale; reads them as f32.
pub fn prepare_decode_values<T: HostData>(
    inputs: &DecodeInputs<'_, T>,
    shapes: DecodeShapes,
    pool_dtype: DType,
    options: &GdnOptions,
) -> Result<DecodeValues> {
    let DecodeShapes { dims, slots } = shapes;
    let q = inputs.q;
    let dtype = q.dtype();
    let (batch, tokens, value_heads, key_dim, value_dim) = (
        dims.batch,
        dims.tokens,
        dims.value_heads,
        dims.key_dim,
        dims.value_dim,
    );
    let q_values = activation_values("q", q, q.shape(), "[B, T, Hg, K]", dtype)?;
    let k_values = activation_values("k", inputs.k, q.shape(), "[B, T, Hg, K] (as q)", dtype)?;
    let v_values = activation_values(
        "v",
        inputs.v,
        &[batch, tokens, value_heads, value_dim],
        "[B, T, H, V]",
        dtype,
    )?;
    let gate_shape = [batch, tokens, value_heads];
    let (g, beta) = match inputs.gating {
        Gating::Direct { g, beta } => (
            log_decay_values(g, &gate_shape, "[B, T, H]")?,
            gate_values("beta", beta, &gate_shape, "[B, T, H]")?,
        ),
        Gating::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => {
            let a = gate_values("a", a, &gate_shape, "[B, T, H]")?;
            let b = gate_values("b", b, &gate_shape, "[B, T, H]")?;
            let a_log = head_values("A_log", a_log)?;
            let dt_bias = head_values("dt_bias", dt_bias)?;
            let (g, beta) = fused_gates(&a, &b, &a_log, &dt_bias);
            check_finite("g (from fused gating)", &g)?;
            (g, beta)
        }
    };
    let slot_of_row = slot_rows(inputs.slot_indices, batch, slots)?;
    let scale = resolve_scale(options, key_dim)?;
    Ok(DecodeValues {
        dims,
        slots,
        slot_of_row,
        q: q_values,
        k: k_values,
        v: v_values,
        g,
        beta,
        scale,
        out_dtype: inputs.v.dtype(),
        pool_dtype,
    })
}

/// Reads q/k/v-like activations: shape, dtype (must equal `dtype`) and finiteness.
fn activation_values(
    name: &str,
    t: &impl HostData,
    expected: &[usize],
    layout: &str,
    dtype: DType,
) -> Result<Vec<f32>> {
    expect_activation(name, t, expected, layout, dtype)?;
    let values = t.values().to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}
