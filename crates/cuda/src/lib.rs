//! deltakv-cuda: the CUDA backend of deltakv.
//!
//! * [`Cuda`]: the process's GPU, its stream, and the kernels, compiled by NVRTC at first use
//!   for the device's architecture (`sm_90a` on Hopper). Opening it never panics: a machine
//!   without the driver, a GPU or NVRTC gets a one-line `DeviceUnavailable` error.
//! * [`CudaTensor`]: tensors in GPU memory; explicit upload and download.
//! * [`gdn`]: GDN prefill on tensor cores (from initial states or a state pool) and decode over
//!   a state pool that stays on the GPU.
//! * [`kv`]: the paged compressed KV cache on the GPU, its encode and flash-decoding over it.
//!
//! A serving loop keeps the pool on the GPU and launches one validated call per step:
//!
//! ```no_run
//! use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
//! use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating};
//! use deltakv_cuda::{Cuda, CudaTensor, gdn::gdn_decode};
//!
//! let cuda = Cuda::get()?; // "no CUDA device: ..." on a machine without one
//! // 8 sequences, one new token each, Qwen3-Next's shape; a pool of 10 slots.
//! let case = DecodeCase::random(&DecodeSpec::new(8, 1, 16, 32, 128, 128), 1)?;
//! let up = |t: &deltakv_contract::HostTensor| CudaTensor::upload(cuda, t);
//! let mut pool = up(&case.state_pool)?; // stays on the GPU, updated in place
//! let (q, k, v, slots) = (up(&case.q)?, up(&case.k)?, up(&case.v)?, up(&case.slot_indices)?);
//! let (g, beta) = (up(case.gate("g").unwrap())?, up(case.gate("beta").unwrap())?);
//! let inputs = DecodeInputs { q: &q, k: &k, v: &v, gating: Gating::Direct { g: &g, beta: &beta }, slot_indices: &slots };
//! let out = gdn_decode(cuda, &inputs, &mut pool, &DecodeOptions::default())?;
//! let o = out.o.download(cuda)?; // [8, 1, 32, 128], only when the caller asks
//! assert_eq!(o.shape(), &[8, 1, 32, 128]);
//! # Ok::<(), deltakv_contract::Error>(())
//! ```
//!
//! The `.cu` sources are in `kernels/`; [`compile::SOURCES`] lists them, and CI compiles each
//! one for `sm_90a` without a GPU.

pub mod compile;
pub mod gdn;
pub mod kv;
pub mod runtime;
pub mod tensor;
pub mod timing;

pub use runtime::Cuda;
pub use tensor::CudaTensor;
