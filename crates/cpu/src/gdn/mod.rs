//! Gated DeltaNet on the CPU: the math, layouts and rules are the contract's
//! (`deltakv_contract::gdn`).
//!
//! * [`prefill`]: a whole prompt, with the chunked WY algorithm or the recurrence.
//! * [`decode`]: 1..=16 tokens per sequence over a pool of states, in place.
//! * `recurrent`: the step on one column block of a state, which the recurrent prefill and
//!   decode share.

pub mod decode;
pub mod prefill;
pub(crate) mod recurrent;

pub use decode::{gdn_decode, gdn_decode_into};
pub use prefill::{
    gdn_prefill, gdn_prefill_checkpointed, gdn_prefill_into_pool,
    gdn_prefill_into_pool_checkpointed,
};
