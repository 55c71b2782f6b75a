//! Compressed-KV attention on the CPU: the caches a serving loop appends to and the
//! flash-decoding kernels that read them. The scheme, codec, merge math and oracle are the
//! contract's (`deltakv_contract::kv`).
//!
//! * [`cache`]: the compressed ([`KvCache`]) and dense f32 ([`DenseKvCache`], the exact
//!   baseline) caches for a batch of sequences.
//! * [`attention`]: decode (Tq = 1) and causal-chunk (Tq > 1) attention over either.
//! * [`paged`]: the paged cache (the contract's page layout and block table) and attention
//!   over it.
//! * [`op`]: the file-level operation behind `deltakv kv` (validate, encode, attend).
//! * `kernel`: pass 1 of flash-decoding on one block of tokens (portable, AVX2, AVX-512).

pub mod attention;
pub mod cache;
mod kernel;
pub mod op;
pub mod paged;

pub use attention::{AttnOptions, MAX_BLOCK_TOKENS, attend_compressed, attend_dense};
pub use cache::{DenseKvCache, HeadStore, KvCache, Norms};
/// The cache's accessors (layout, lengths, block table, ...), from the contract.
pub use deltakv_contract::kv::book::PagedCache;
pub use op::{KvOptions, KvOutput, check_attention_output, kv_attention};
pub use paged::{PagedKvCache, attend_paged};
