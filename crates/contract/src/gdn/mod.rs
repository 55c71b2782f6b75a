//! Gated DeltaNet (GDN) linear attention, FLA-compatible: what every backend computes.
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
//! * [`prefill`]: a whole prompt: inputs, validation, the f64 oracle, random cases.
//! * [`decode`]: 1..=16 tokens per sequence over a pool of states updated in place: inputs,
//!   validation, the f64 oracle, random cases and the check suite every backend runs.
//! * [`gating`]: the rules on the decay (`g <= 0`, the reset gate) and fused gating.
//! * [`recurrence`]: the recurrence above in f64, one token at a time, which both oracles run.
//! * [`shapes`]: the sizes of a call and the shape rules prefill and decode share.
//!
//! The prefill's oracle and random cases are also reachable as [`oracle`] and [`random`].

pub mod decode;
pub mod gating;
pub mod prefill;
pub mod recurrence;
pub mod shapes;

pub use decode::{
    DecodeInputs, DecodeOptions, DecodeOutput, DecodeTensors, Gating, MAX_DECODE_TOKENS,
};
pub use prefill::{GdnInputs, GdnOptions, GdnOutput, PrefillMode, oracle, random};
pub use shapes::{GdnDims, MAX_HEAD_DIM};

/// The likely cause named when a GDN result overflows f32 from finite inputs (see
/// [`crate::tensor::overflowed_result`]).
pub const GDN_OVERFLOW_CAUSE: &str =
    "v, beta, k or the initial state too large for the state to stay within f32's range";
