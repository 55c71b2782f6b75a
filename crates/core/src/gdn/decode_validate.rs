//! Validation for GDN decode, done once and in full before any slot of the pool is touched (so
//! a bad call never leaves a partial update), shared by the CPU kernel and the oracle. It also
//! widens the inputs to f32, computes fused gates, and applies the optional l2 norm once per key
//! head.

use super::decode::{DecodeInputs, Gating};
use super::gating::fused_gates;
use super::prefill::GdnOptions;
use super::validate::{
    GdnDims, activation_values, check_finite, expect_activation, expect_float, expect_rank,
    expect_shape, gate_values, gdn_dims, l2_normalize_row, log_decay_values,
};
use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor, TensorMeta};

/// Most new tokens per row in one decode call (speculative decoding drafts are short).
pub const MAX_DECODE_TOKENS: usize = 16;

/// Validated decode inputs widened to f32, ready for any kernel.
#[derive(Clone, Debug)]
pub struct PreparedDecode {
    pub dims: GdnDims,
    /// S: slots in the pool.
    pub slots: usize,
    /// The pool slot of each batch row, `None` for a skipped row (negative index).
    pub slot_of_row: Vec<Option<usize>>,
    /// `[B*T, Hg, K]`, l2-normalised when asked.
    pub q: Vec<f32>,
    /// `[B*T, Hg, K]`, l2-normalised when asked.
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

/// Reads a per-head `[H]` parameter (A_log, dt_bias) as finite f32.
fn head_values(name: &str, t: &HostTensor) -> Result<Vec<f32>> {
    let values = t.to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
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
    pool: &T,
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
pub fn slot_rows(indices: &HostTensor, batch: usize, slots: usize) -> Result<Vec<Option<usize>>> {
    if !matches!(indices.dtype(), DType::I32 | DType::I64) {
        return Err(Error::dtype("slot_indices", indices.dtype(), "i32 or i64"));
    }
    expect_shape("slot_indices", indices, &[batch], "[B] (B from q)")?;
    let values = indices.to_i64_vec("slot_indices")?;
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

/// Validates decode inputs against the pool (shape and dtype only; the pool's values are not
/// read) and widens them to f32.
pub fn prepare_decode(
    inputs: &DecodeInputs<'_>,
    pool: &HostTensor,
    options: &GdnOptions,
) -> Result<PreparedDecode> {
    let shapes = check_decode_shapes(inputs, pool)?;
    prepare_decode_values(inputs, shapes, pool.dtype(), options)
}

/// The value half of [`prepare_decode`], for inputs whose shapes [`check_decode_shapes`]
/// accepted (against a pool of dtype `pool_dtype`, wherever it lives): finite activations and
/// gates, slot indices in range and distinct, a finite scale; widens to f32 and applies the
/// l2 norm.
pub fn prepare_decode_values(
    inputs: &DecodeInputs<'_>,
    shapes: DecodeShapes,
    pool_dtype: DType,
    options: &GdnOptions,
) -> Result<PreparedDecode> {
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
    let mut q_values = activation_values("q", q, q.shape(), "[B, T, Hg, K]", dtype)?;
    let mut k_values = activation_values("k", inputs.k, q.shape(), "[B, T, Hg, K] (as q)", dtype)?;
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
    if options.use_qk_l2norm {
        for values in [&mut q_values, &mut k_values] {
            values.chunks_exact_mut(key_dim).for_each(l2_normalize_row);
        }
    }
    Ok(PreparedDecode {
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
