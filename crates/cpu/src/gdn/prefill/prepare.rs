//! The CPU's preparation of a prefill call: the contract's validation (shapes first, then
//! values, with q, k and v scanned for NaN in parallel), after which kernels read q, k and v
//! in their own dtype, widened to f32 row by row as they gather them (no full-size f32
//! copies), with the optional l2 norm applied once per key head (not once per value head).

use crate::scan::check_finite;
use deltakv_contract::gdn::prefill::validate::{
    PrefillGates, PrefillShapes, SeqSpan, check_prefill_shapes, prefill_gates,
};
use deltakv_contract::gdn::{GdnDims, GdnInputs, GdnOptions};
use deltakv_contract::tensor::{DType, bf16_widen};
use deltakv_contract::view::{HostData, TensorSlice};
use deltakv_contract::{Error, Result};
use half::slice::HalfFloatSliceExt;

/// Validated inputs. q, k and v stay in their own dtype and are widened to f32 row by row as
/// kernels gather them (no full-size f32 copies); gates are small and widened up front.
#[derive(Clone, Debug)]
pub(crate) struct PreparedGdn<'a> {
    pub dims: GdnDims,
    pub seqs: Vec<SeqSpan>,
    /// `[B*T, Hg, K]`
    pub q: TensorSlice<'a>,
    /// `[B*T, Hg, K]`
    pub k: TensorSlice<'a>,
    /// `[B*T, H, V]`
    pub v: TensorSlice<'a>,
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
    pub(crate) fn read_q(&self, row: usize, key_head: usize, dst: &mut [f32]) {
        self.read_key_like(self.q, row, key_head, dst);
    }

    /// Key row, as [`Self::read_q`].
    #[inline]
    pub(crate) fn read_k(&self, row: usize, key_head: usize, dst: &mut [f32]) {
        self.read_key_like(self.k, row, key_head, dst);
    }

    #[inline(always)]
    fn read_key_like(&self, data: TensorSlice<'_>, row: usize, key_head: usize, dst: &mut [f32]) {
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
    pub(crate) fn read_v(&self, row: usize, value_head: usize, dst: &mut [f32]) {
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
pub(crate) fn widen_into(src: TensorSlice<'_>, offset: usize, dst: &mut [f32]) {
    let n = dst.len();
    match src {
        TensorSlice::F32(v) => dst.copy_from_slice(&v[offset..offset + n]),
        // bf16 is the top half of an f32; a plain shift (exact, vectorisable) instead of
        // `half`'s NaN-quieting scalar path. Inputs are validated finite.
        TensorSlice::BF16(v) => {
            for (d, s) in dst.iter_mut().zip(&v[offset..offset + n]) {
                *d = bf16_widen(*s);
            }
        }
        TensorSlice::F16(v) => v[offset..offset + n].convert_to_f32_slice(dst),
        // Validation admits only float tensors here.
        TensorSlice::I32(_) | TensorSlice::I64(_) => dst.fill(f32::NAN),
    }
}

/// `x / sqrt(|x|^2 + 1e-6)` in place.
#[inline]
pub(crate) fn l2_normalize_row(row: &mut [f32]) {
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

/// Validates prefill inputs (the contract's rules, in its order) and prepares them for the
/// kernels.
pub(crate) fn prepare_prefill<'a, T: HostData>(
    inputs: &GdnInputs<'a, T>,
    options: &GdnOptions,
) -> Result<PreparedGdn<'a>> {
    let PrefillShapes { dims, seqs, scale } = check_prefill_shapes(inputs, options)?;
    for (name, t) in [("q", inputs.q), ("k", inputs.k), ("v", inputs.v)] {
        check_finite(name, t.values())?;
    }
    let PrefillGates { g, beta } = prefill_gates(inputs, &dims)?;
    let initial_state = match inputs.initial_state {
        None => None,
        Some(s) => {
            check_finite("initial_state", s.values())?;
            let values = s.values().as_f32();
            Some(values.ok_or_else(|| Error::dtype("initial_state", s.dtype(), "f32"))?)
        }
    };
    Ok(PreparedGdn {
        dims,
        seqs,
        q: inputs.q.values(),
        k: inputs.k.values(),
        v: inputs.v.values(),
        g,
        beta,
        initial_state,
        scale,
        use_qk_l2norm: options.use_qk_l2norm,
        out_dtype: inputs.v.dtype(),
    })
}
