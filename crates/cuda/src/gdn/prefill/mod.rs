//! GDN chunked prefill on CUDA tensor cores: a whole prompt through the recurrence, from
//! optional initial states to the final states, with the contract's semantics (see
//! `deltakv_contract::gdn`): GQA/GVA, any T, varlen `cu_seqlens`, l2 norm, scale, bf16/f16/f32
//! inputs, K and V up to 256.
//!
//! The algorithm and its kernels are described at the top of `kernels/gdn_prefill.cu`: a
//! parallel pass per chunk (A, its inverse, W and U), then the state pass that writes the
//! outputs; a long sequence with few heads is split into segments walked in parallel, by a
//! two-level scan or by the relay (see `plan`).
//!
//! Precision: the products take bf16 operands with f32 accumulation (q, k and v are rounded to
//! bf16 after the l2 norm, W and U are stored in bf16, the state enters the products in bf16);
//! the state, the decays, the triangular inverse and the segment combine stay f32.
//!
//! Validation before launch: shapes and dtypes (the contract's check) and `cu_seqlens` (copied
//! to the host). Values on the device are not scanned (NaN, g > 0): [`gdn_prefill_host`] runs
//! the contract's full check on host inputs.

mod checkpoint;
mod host;
mod kernels;
mod launch;
mod operand;
mod plan;
mod prepared;
mod relay;
mod states;
mod switches;

pub use checkpoint::CudaCheckpoints;
pub use host::{
    gdn_prefill_host, gdn_prefill_host_checkpointed, gdn_prefill_host_into_pool,
    gdn_prefill_host_into_pool_checkpointed,
};
pub use plan::Split;
pub use prepared::{PrefillExtras, PrefillLaunch};
pub use states::PrefillStates;

use crate::compile::KernelSource;
use crate::runtime::Cuda;
use crate::tensor::CudaTensor;
use deltakv_contract::gdn::{GdnInputs, GdnOptions};
use deltakv_contract::{DType, Result};

/// The prefill kernels' source: the state walks (lockstep, overlapped, lead), the transition,
/// the combine and the convert kernel.
pub const SOURCE: KernelSource = KernelSource {
    name: "gdn_prefill",
    text: concat!(
        include_str!("../../../kernels/gdn_prefill.cu"),
        include_str!("../../../kernels/gdn_prefill_wgmma.cu"),
        include_str!("../../../kernels/gdn_prefill_state.cu"),
        include_str!("../../../kernels/gdn_prefill_overlap.cu"),
        include_str!("../../../kernels/gdn_prefill_lead_regs.cu")
    ),
};

/// The prepare kernels (`gdn_prefill_prepare_mma_*`: A, T = (I + A)^-1 with T's blocks below
/// its diagonal on tensor cores, W and U), a module of their own.
pub const SOURCE_PREPARE_MMA: KernelSource = KernelSource {
    name: "gdn_prefill_prepare_mma",
    text: concat!(
        include_str!("../../../kernels/gdn_prefill.cu"),
        include_str!("../../../kernels/gdn_prefill_inverse.cu"),
        include_str!("../../../kernels/gdn_prefill_prepare.cu")
    ),
};

/// Prefill results on the GPU.
#[derive(Debug)]
pub struct CudaPrefillOutput {
    /// `[B, T, H, V]` in v's dtype.
    pub o: CudaTensor,
    /// `[N, H, K, V]` f32, when asked.
    pub final_state: Option<CudaTensor>,
    /// The state every `checkpoint_every` tokens, when asked.
    pub checkpoints: Option<CudaCheckpoints>,
}

/// Prefill on device tensors: validates shapes (see the module docs), runs the kernels on
/// deltakv's stream and returns `o` and, when `states` asks, the final state.
pub fn gdn_prefill(
    cuda: &Cuda,
    inputs: &GdnInputs<'_, CudaTensor>,
    options: &GdnOptions,
    states: PrefillStates<'_>,
) -> Result<CudaPrefillOutput> {
    gdn_prefill_checkpointed(cuda, inputs, options, states, None, Split::Auto)
}

/// [`gdn_prefill`] that also returns the state every `checkpoint_every` tokens of each
/// sequence (a positive multiple of 64; the contract's layout,
/// `deltakv_contract::gdn::prefill::checkpoint`), and may force how long sequences are split
/// for the state pass (`split`; [`Split::Auto`]: chosen from the GPU's size).
pub fn gdn_prefill_checkpointed(
    cuda: &Cuda,
    inputs: &GdnInputs<'_, CudaTensor>,
    options: &GdnOptions,
    mut states: PrefillStates<'_>,
    checkpoint_every: Option<usize>,
    split: Split,
) -> Result<CudaPrefillOutput> {
    let dims = deltakv_contract::gdn::shapes::gdn_dims(inputs.q, inputs.v)?;
    let mut o = CudaTensor::poisoned(
        cuda,
        vec![dims.batch, dims.tokens, dims.value_heads, dims.value_dim],
        inputs.v.dtype(),
    )?;
    let mut final_state = match &states {
        PrefillStates::Separate {
            output_final_state: true,
        } => {
            let sequences = match inputs.cu_seqlens {
                Some(cu) => cu.shape().first().copied().unwrap_or(1).saturating_sub(1),
                None => dims.batch,
            };
            Some(CudaTensor::poisoned(
                cuda,
                vec![sequences, dims.value_heads, dims.key_dim, dims.value_dim],
                DType::F32,
            )?)
        }
        _ => None,
    };
    let launch = PrefillLaunch::new(
        cuda,
        inputs,
        options,
        &mut states,
        &mut o,
        final_state.as_mut(),
        PrefillExtras {
            checkpoint_every,
            split,
        },
    )?;
    // SAFETY: launched at once, while this function borrows every tensor it was prepared from.
    unsafe { launch.launch(cuda) }?;
    Ok(CudaPrefillOutput {
        o,
        final_state,
        checkpoints: launch.into_checkpoints(),
    })
}
