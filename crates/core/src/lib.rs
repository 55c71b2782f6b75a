//! deltakv-core: dtypes, host tensors, errors, validation, the f64 oracles and the CPU
//! backend of deltakv. See the `deltakv` crate for the device-level facade and the CLI.

pub mod error;
pub mod gdn;
pub mod io;
pub mod kv;
pub(crate) mod linalg;
pub mod metrics;
pub mod rng;
pub(crate) mod rows;
pub mod simd;
pub mod tensor;

pub use error::{Error, Result};
pub use tensor::{DType, HostTensor, TensorData};
