//! Validation for GDN decode, done once and in full before any slot of the pool is touched (so
//! a bad call never leaves a partial update), shared by the CPU kernel and the oracle. It also
//! widens the inputs to f32, computes fused gates, and applies the optional l2 norm once per key
//! head.

use super::decode::{DecodeInputs, Gating};
use super::gating::fused_gates;
use super::prefill::GdnOptions;
use super::validate::{
    GdnDims, activation_values, check_finite, expect_rank, expect_shape, gate_values, gdn_dims,
    l2_normalize_row, log_decay_values,
};
use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor};

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
fn head_values(name: &str, t: &HostTensor, heads: usize) -> Result<Vec<f32>> {
    if !t.dtype().is_float() {
        return Err(Error::dtype(name, t.dtype(), "f32, f16 or bf16"));
    }
    expect_shape(name, t, &[heads], "[H]")?;
    let values = t.to_f32_vec(name)?;
    check_finite(name, &values)?;
    Ok(values)
}

/// Checks the pool's dtype and shape `[S, H, K, V]`; returns S.
pub fn check_pool(pool: &HostTensor, dims: &GdnDims) -> Result<usize> {
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

/// Validates decode inputs against the pool (shape and dtype only; the pool's values are not
/// read) and widens them to f32.
pub fn prepare_decode(
    inputs: &DecodeInputs<'_>,
    pool: &HostTensor,
    options: &GdnOptions,
) -> Result<PreparedDecode> {
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
    if tokens > MAX_DECODE_TOKENS {
        return Err(Error::shape(
            "q",
            format!(
                "decode takes at most {MAX_DECODE_TOKENS} tokens per row, got T = {tokens} (use prefill for longer inputs)"
            ),
        ));
    }
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
            let a_log = head_values("A_log", a_log, value_heads)?;
            let dt_bias = head_values("dt_bias", dt_bias, value_heads)?;
            let (g, beta) = fused_gates(&a, &b, &a_log, &dt_bias);
            check_finite("g (from fused gating)", &g)?;
            (g, beta)
        }
    };
    let slots = check_pool(pool, &dims)?;
    let slot_of_row = slot_rows(inputs.slot_indices, batch, slots)?;
    let scale = options.scale.unwrap_or(1.0 / (key_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidValue(format!(
            "scale must be finite, got {scale}"
        )));
    }
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
        pool_dtype: pool.dtype(),
    })
}
