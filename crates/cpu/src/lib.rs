//! deltakv-cpu: the CPU backend of deltakv, and the numerical reference among the backends.
//!
//! Work is split over rayon's threads; the kernels pick AVX-512, AVX2 + FMA or portable code at
//! run time ([`simd`]). The contract (input types, validation, the f64 oracles, the rules a
//! kernel obeys) is `deltakv-contract`'s; this crate adds the kernels and the preparation they
//! need (widening inputs to f32, l2 norms, parallel finite scans).
//!
//! * [`gdn`]: Gated DeltaNet prefill (chunked and recurrent) and decode over a state pool.
//! * [`kv`]: the compressed and dense KV caches and flash-decoding attention over them.

pub mod gdn;
pub mod kv;
pub(crate) mod linalg;
pub(crate) mod rows;
pub(crate) mod scan;
pub mod simd;

pub use deltakv_contract::{Error, Result};
