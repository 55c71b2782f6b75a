//! deltakv-cuda: the CUDA backend of deltakv.
//!
//! * [`Cuda`]: the process's GPU, its stream, and the kernels, compiled by NVRTC at first use
//!   for the device's architecture (`sm_90a` on Hopper). Opening it never panics: a machine
//!   without the driver, a GPU or NVRTC gets a one-line `DeviceUnavailable` error.
//! * [`CudaTensor`]: tensors in GPU memory; explicit upload and download.
//! * [`gdn`]: GDN decode over a state pool that stays on the GPU.
//!
//! The `.cu` sources are in `kernels/`; [`compile::SOURCES`] lists them, and CI compiles each
//! one for `sm_90a` without a GPU.

pub mod compile;
pub mod gdn;
pub mod runtime;
pub mod tensor;
pub mod timing;

pub use runtime::Cuda;
pub use tensor::CudaTensor;
