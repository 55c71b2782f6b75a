//! Parallel finite scans of large tensors: the contract's serial scan
//! ([`TensorSlice::first_non_finite_in`]) run over blocks on rayon's threads, with the
//! contract's errors. Inputs of a prefill and the results of every op are scanned this way.

use deltakv_contract::Result;
use deltakv_contract::tensor::{HostTensor, non_finite_input, overflowed_result};
use deltakv_contract::view::TensorSlice;
use rayon::prelude::*;

/// Elements per scanned block.
const BLOCK: usize = 1 << 16;

/// Flat index and value of the first NaN or infinity of a float tensor (`None` for integers).
pub(crate) fn first_non_finite(data: TensorSlice<'_>) -> Option<(usize, f32)> {
    (0..data.len().div_ceil(BLOCK))
        .into_par_iter()
        .find_map_first(|b| data.first_non_finite_in(b * BLOCK..(b + 1) * BLOCK))
}

/// Fails on the first non-finite element of input `name`.
pub(crate) fn check_finite(name: &str, data: TensorSlice<'_>) -> Result<()> {
    first_non_finite(data).map_or(Ok(()), |(i, x)| Err(non_finite_input(name, i, x)))
}

/// Fails on the first non-finite element of a result computed from finite inputs, naming the
/// tensor, its position (labelled by `axes`) and the likely `cause`.
pub(crate) fn check_result_finite(
    name: &str,
    t: &HostTensor,
    axes: &str,
    cause: &str,
) -> Result<()> {
    match first_non_finite(t.data().as_slice()) {
        None => Ok(()),
        Some((i, x)) => Err(overflowed_result(name, t.shape(), axes, i, x, cause)),
    }
}
