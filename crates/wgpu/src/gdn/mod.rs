//! Gated DeltaNet on wgpu. The math and layouts are the contract's, in `deltakv_contract::gdn`.

mod chunk_sources;
mod chunk_table;
pub mod chunks;
pub mod decode;
pub mod decode_sources;
pub mod prefill;
mod prefill_states;
pub mod recurrent;
mod state_plan;

pub use chunks::{ChunkPasses, PrepareKernel, StateKernel, StatePlan};
pub use decode::{
    DecodeLaunch, DecodeTile, WgpuDecodeOutput, gdn_decode, gdn_decode_checked, gdn_decode_host,
    prepare_decode_launch, prepare_decode_launch_tiled,
};
pub use prefill::{PreparedPrefill, gdn_prefill, gdn_prefill_checkpointed, gdn_prefill_planned};
pub use prefill_states::{gdn_prefill_host_into_pool, gdn_prefill_into_pool};

/// Refuses a tensor with 2^32 elements or more: the shaders index with 32-bit element offsets,
/// which would wrap where a binding may exceed 4 GiB (Metal; Vulkan caps bindings below it).
fn check_indexable<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a crate::tensor::WgpuTensor)>,
) -> deltakv_contract::Result<()> {
    for (name, tensor) in tensors {
        crate::kv::cache::u32_of(name, tensor.shape().iter().product())?;
    }
    Ok(())
}
