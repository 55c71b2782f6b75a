//! Gated DeltaNet on CUDA. The math and layouts are the contract's, in `deltakv_contract::gdn`.

pub mod decode;
pub mod prefill;

pub use decode::{
    CudaDecodeOutput, DecodeLaunch, OneTokenKernel, gdn_decode, gdn_decode_checked,
    gdn_decode_host, prepare_decode_launch,
};
pub use prefill::{
    CudaCheckpoints, CudaPrefillOutput, PrefillExtras, PrefillLaunch, PrefillStates, Split,
    gdn_prefill, gdn_prefill_checkpointed, gdn_prefill_host, gdn_prefill_host_checkpointed,
    gdn_prefill_host_into_pool, gdn_prefill_host_into_pool_checkpointed,
};
