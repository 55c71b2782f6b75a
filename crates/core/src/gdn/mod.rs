//! Gated DeltaNet (GDN) linear attention, FLA-compatible.
//!
//! Per sequence and value head `h` (reading key head `h / (H / Hg)`), with a K x V state S in
//! f32 and, for each token t in order:
//!
//! ```text
//! (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise        (use_qk_l2norm)
//! S   <- exp(g_t) * S
//! v'  <- beta_t * (v_t - S^T k_t)
//! S   <- S + k_t v'^T
//! o_t <- scale * S^T q_t                                            (scale = K^-0.5 by default)
//! ```
//!
//! Shapes are time-major: q, k `[B, T, Hg, K]`, v `[B, T, H, V]`, g and beta `[B, T, H]`,
//! states `[N, H, K, V]` f32, optional `cu_seqlens [N+1]` (then B == 1) splitting the token
//! axis into independent sequences.
//!
//! * [`prefill`] runs a whole prompt, with the chunked WY algorithm or the recurrence.
//! * [`decode`] advances a pool of states by 1..=16 tokens per sequence, in place.
//! * [`oracle`] is the same recurrence in f64, the reference every backend is tested against.

pub mod decode;
mod decode_avx512;
pub mod decode_check;
#[cfg(target_arch = "x86_64")]
mod decode_fused;
mod decode_kernel;
pub mod decode_oracle;
mod decode_pool;
pub mod decode_random;
pub mod decode_validate;
pub mod gating;
pub mod oracle;
pub mod prefill;
pub mod random;
pub(crate) mod recurrent_kernel;
pub mod validate;

mod chunk;

pub use decode::{DecodeInputs, DecodeOptions, DecodeOutput, Gating, gdn_decode, gdn_decode_into};
pub use prefill::{GdnInputs, GdnOptions, GdnOutput, PrefillMode, gdn_prefill};
pub use validate::GdnDims;
