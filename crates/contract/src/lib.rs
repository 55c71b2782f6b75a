//! deltakv-contract: what every deltakv backend computes and the rules it obeys, written once.
//!
//! * [`tensor`]: dtypes, host tensors, the [`tensor::TensorMeta`] view validation reads, and
//!   the finite scans the "finite in, finite out" rule needs.
//! * [`view`]: host tensors over borrowed memory ([`view::HostView`], [`view::HostViewMut`])
//!   and the [`view::HostData`] trait that validation and the CPU kernels read through.
//! * [`error`]: the one error type.
//! * [`gdn`]: Gated DeltaNet prefill and decode: input types, shape validation, value rules
//!   (the log-decay bound, the reset gate, fused gating), the f64 oracles, random cases and the
//!   decode check suite every backend runs.
//! * [`kv`]: the compressed KV cache's scheme, codebooks, rotation and codec (bit packing and
//!   its padding), the split-K softmax merge, exact f64 attention and random cases.
//! * [`io`]: the safetensors interchange; [`metrics`]: `rel_rms`; [`rng`]: the seeded
//!   generator behind every random case.
//!
//! The crate holds no kernels: no threads, no SIMD and no `unsafe`. The CPU backend
//! (`deltakv-cpu`) and the GPU backends depend on it; the `deltakv` crate is the facade.

#![forbid(unsafe_code)]

pub mod env;
pub mod error;
pub mod gdn;
pub mod io;
pub mod kv;
pub mod metrics;
pub mod rng;
pub mod tensor;
pub mod view;

pub use error::{Error, Result};
pub use tensor::{DType, HostTensor, TensorData, TensorMeta, TensorSpec};
pub use view::{HostData, HostDataMut, HostView, HostViewMut, TensorSlice, TensorSliceMut};
