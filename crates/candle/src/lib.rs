//! # deltakv-candle
//!
//! deltakv's Gated DeltaNet as candle ops, so a candle model runs deltakv's kernels on its own
//! tensors (no copies in or out: the kernels read candle's CPU storage in place, a state pool
//! is updated in place, and the results become candle tensors without a copy).
//!
//! * [`gdn_prefill`]: FLA's `chunk_gated_delta_rule` (or the token-by-token recurrence): a
//!   `CustomOp3` over `(q, k, v)` that reads g, beta and the optional initial state and
//!   `cu_seqlens` from the op. Returns `(o, final_state)`.
//! * [`gdn_decode`]: 1..=16 new tokens per row over a state pool `[S, H, K, V]` (f32 or bf16),
//!   an `InplaceOp3` on the pool (slot indices, fused gating, intermediate states). Returns `o`.
//! * [`qwen3_next`]: one Qwen3-Next Gated DeltaNet layer written in candle on these ops (the
//!   example `qwen3_next_gdn` runs it).
//!
//! The math, shapes and rules are deltakv's contract (`docs/contract.md`); errors carry
//! deltakv's one-line message. CPU tensors run deltakv's CPU kernels; with the `candle-cuda` feature
//! (candle's CUDA build beside deltakv's CUDA backend) CUDA tensors run deltakv's CUDA kernels
//! on candle's memory and stream, with outputs in buffers candle owns. Without it a CUDA
//! tensor gets candle's "no cuda implementation for deltakv-gdn-..." error.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use deltakv::gdn::{GdnOptions, PrefillMode};
//!
//! let dev = Device::Cpu;
//! let (b, t, hg, h, k, v) = (1, 70, 2, 4, 32, 16);
//! let q = Tensor::randn(0f32, 1.0, (b, t, hg, k), &dev)?;
//! let kk = Tensor::randn(0f32, 1.0, (b, t, hg, k), &dev)?;
//! let vv = Tensor::randn(0f32, 1.0, (b, t, h, v), &dev)?;
//! let g = Tensor::rand(-1f32, -0.01, (b, t, h), &dev)?;
//! let beta = Tensor::rand(0f32, 1.0, (b, t, h), &dev)?;
//! let options = GdnOptions { scale: None, use_qk_l2norm: true };
//! let (o, state) = deltakv_candle::gdn_prefill(
//!     &q, &kk, &vv, &g, &beta, None, None, &options, PrefillMode::Chunk,
//! )?;
//! assert_eq!(o.dims(), &[1, 70, 4, 16]);
//! assert_eq!(state.dims(), &[1, 4, 32, 16]);
//! # Ok::<(), candle_core::Error>(())
//! ```

#[cfg(feature = "candle-cuda")]
mod cuda;
mod ops;
pub mod qwen3_next;

pub use ops::{Gates, gdn_decode, gdn_prefill};
