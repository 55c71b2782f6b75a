//! The chunked prefill's shaders as the launcher builds them (`chunks.rs`): each pass's WGSL is
//! the dtype helpers, the shared bindings and helpers of `chunks.wgsl`, then the pieces its
//! kernel uses, in that order.

use crate::runtime::ShaderSource;

/// The dtype helpers and `chunks.wgsl`, then `pieces` (files beside this one).
macro_rules! chunk_text {
    ($($piece:literal),*) => {
        concat!(
            include_str!("../dtype.wgsl"),
            include_str!("chunks.wgsl")
            $(, include_str!($piece))*
        )
    };
}

/// [`chunk_text`] with the state walks' common pieces (the walk, o's rows and their store)
/// before `pieces`.
macro_rules! state_text {
    ($($piece:literal),*) => {
        chunk_text!("chunks_state.wgsl", "chunks_o.wgsl", "store_o.wgsl" $(, $piece)*)
    };
}

/// The prepare pass.
pub const PREPARE: ShaderSource = ShaderSource {
    name: "gdn_chunk_prepare",
    text: chunk_text!(),
    entry_point: "gdn_chunk_prepare",
};

/// The prepare pass for 16-bit q, k and v with K and V even and at most 128, the chunk's rows
/// staged in workgroup memory (`chunks_prepare_staged.wgsl`).
pub const PREPARE_STAGED: ShaderSource = ShaderSource {
    name: "gdn_chunk_prepare_staged",
    text: chunk_text!("chunks_prepare_staged.wgsl"),
    entry_point: "gdn_chunk_prepare_staged",
};

/// The state pass (`WALK` 0: the outputs walk; 1: the transition walk of segments).
pub const STATE: ShaderSource = ShaderSource {
    name: "gdn_chunk_state",
    text: state_text!(),
    entry_point: "gdn_chunk_state",
};

/// The state pass with W, Qd and Kd staged in workgroup memory (both walks), the tile of S in
/// columns.
pub const STATE_STAGED: ShaderSource = ShaderSource {
    name: "gdn_chunk_state_staged",
    text: state_text!("staged_s_columns.wgsl", "chunks_state_staged.wgsl"),
    entry_point: "gdn_chunk_state_staged",
};

/// The state pass on cooperative matrices (`chunks_state_coop.wgsl`; both walks).
pub const STATE_COOP: ShaderSource = ShaderSource {
    name: "gdn_chunk_state_coop",
    text: concat!(
        include_str!("../coop_enable.wgsl"),
        include_str!("../coop_split_step.wgsl"),
        include_str!("../dtype.wgsl"),
        include_str!("chunks.wgsl"),
        include_str!("chunks_state.wgsl"),
        include_str!("chunks_o_plain.wgsl"),
        include_str!("chunks_state_coop.wgsl")
    ),
    entry_point: "gdn_chunk_state_coop",
};

/// The entry states of split sequences' segments, between the two walks.
pub const COMBINE: ShaderSource = ShaderSource {
    name: "gdn_chunk_combine",
    text: state_text!("chunks_combine.wgsl"),
    entry_point: "gdn_chunk_combine",
};
