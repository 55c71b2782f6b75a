//! GDN prefill: a whole prompt through the recurrence of [`super`], from optional initial
//! states to the final states.
//!
//! * [`validate`]: the shape and value rules of a call.
//! * [`oracle`]: the f64 reference.
//! * [`random`]: seeded random problems.
//! * [`pool`]: the rules of a prefill over a state pool.
//! * [`checkpoint`]: optional state checkpoints every N tokens, and their layout.

pub mod check;
pub mod checkpoint;
pub mod oracle;
pub mod pool;
pub mod random;
pub mod validate;

use crate::tensor::HostTensor;
use checkpoint::PrefillCheckpoints;

/// The tensors of one prefill call (see the module docs of [`crate::gdn`] for shapes). `T` is
/// the tensor type of the backend: [`HostTensor`] on the host (owned), or a
/// [`crate::view::HostView`] over a caller's memory.
#[derive(Debug)]
pub struct GdnInputs<'a, T = HostTensor> {
    pub q: &'a T,
    pub k: &'a T,
    pub v: &'a T,
    pub g: &'a T,
    pub beta: &'a T,
    pub initial_state: Option<&'a T>,
    pub cu_seqlens: Option<&'a T>,
}

impl<T> Clone for GdnInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for GdnInputs<'_, T> {}

/// Scalar options shared by prefill and decode.
#[derive(Clone, Debug, Default)]
pub struct GdnOptions {
    /// Output scale; `None` means `K^-0.5`.
    pub scale: Option<f32>,
    /// Normalise q and k per head before use (FLA's `use_qk_l2norm_in_kernel`).
    pub use_qk_l2norm: bool,
}

/// Which prefill algorithm to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillMode {
    /// The chunked WY algorithm (64-token chunks, matrix products); the fast path.
    #[default]
    Chunk,
    /// Token-by-token recurrence; fine for short sequences, and an independent cross-check.
    Recurrent,
}

/// Prefill results.
#[derive(Clone, Debug)]
pub struct GdnOutput {
    /// `[B, T, H, V]` in v's dtype.
    pub o: HostTensor,
    /// `[N, H, K, V]` f32.
    pub final_state: HostTensor,
    /// The states every `checkpoint_every` tokens, when asked ([`checkpoint`]).
    pub checkpoints: Option<PrefillCheckpoints>,
}
