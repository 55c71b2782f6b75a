//! Gated DeltaNet on CUDA. The math and layouts are the contract's, in `deltakv_core::gdn`.

pub mod decode;

pub use decode::{
    CudaDecodeOutput, DecodeLaunch, gdn_decode, gdn_decode_checked, prepare_decode_launch,
};
