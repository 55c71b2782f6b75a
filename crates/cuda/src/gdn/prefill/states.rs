//! Where a prefill call's states come from and go: the caller's `initial_state` and
//! `final_state` tensors, or a state pool read and written in place through slot indices.

use super::prepared::{expect_buffer, upload_i64};
use crate::runtime::Cuda;
use crate::tensor::CudaTensor;
use deltakv_contract::gdn::prefill::pool::{pool_slots, refuse_initial_state};
use deltakv_contract::gdn::{GdnDims, GdnInputs};
use deltakv_contract::{DType, Result};

/// Where the states of a call come from and go.
pub enum PrefillStates<'a> {
    /// `inputs.initial_state` (or zeros) in; a new final state out when `output_final_state`.
    Separate { output_final_state: bool },
    /// A pool `[slots, H, K, V]` f32: sequence `n` starts from slot `slot_indices[n]` and its
    /// final state is written back there, in place (no gather or scatter).
    Pool {
        pool: &'a mut CudaTensor,
        slot_indices: &'a CudaTensor,
    },
}

/// The device addresses the kernels read initial states from and write final states to (0:
/// none), and for a pool, each sequence's slot (on the device for the kernels, and on the
/// host for the relay's final copies).
pub(super) struct StateSources {
    pub initial: u64,
    pub final_address: u64,
    pub state_rows: Option<CudaTensor>,
    pub slots: Option<Vec<i64>>,
}

/// Checks the call's state tensors against `state_shape` (`[N, H, K, V]`) and finds their
/// addresses.
pub(super) fn state_sources(
    cuda: &Cuda,
    inputs: &GdnInputs<'_, CudaTensor>,
    states: &mut PrefillStates<'_>,
    final_state: Option<&mut CudaTensor>,
    state_shape: &[usize; 4],
    dims: &GdnDims,
) -> Result<StateSources> {
    match states {
        PrefillStates::Separate { .. } => {
            let final_address = match final_state {
                Some(f) => {
                    expect_buffer("final_state", f, state_shape, DType::F32)?;
                    f.device_address_mut(cuda)
                }
                None => 0,
            };
            Ok(StateSources {
                initial: inputs.initial_state.map_or(0, |s| s.device_address(cuda)),
                final_address,
                state_rows: None,
                slots: None,
            })
        }
        PrefillStates::Pool { pool, slot_indices } => {
            refuse_initial_state(inputs.initial_state.is_some())?;
            let rows: Vec<i64> =
                pool_slots(&**pool, &slot_indices.download(cuda)?, dims, state_shape[0])?
                    .into_iter()
                    .map(|slot| slot as i64)
                    .collect();
            let address = pool.device_address_mut(cuda);
            Ok(StateSources {
                initial: address,
                final_address: address,
                state_rows: Some(upload_i64(cuda, rows.clone())?),
                slots: Some(rows),
            })
        }
    }
}
