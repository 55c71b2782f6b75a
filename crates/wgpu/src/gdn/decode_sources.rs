//! The decode kernel's WGSL as the launcher builds it: `decode_bands.wgsl` (contiguous row
//! bands, sums through workgroup memory) with the loops over a thread's rows written out row
//! by row for the rows per thread of the call's K.
//!
//! The kernel keeps a thread's rows of the state in a function-scope array indexed by the row
//! loops' counter. A driver's compiler that does not unroll those loops keeps the array in
//! local (off-chip) memory, as NVIDIA's Vulkan driver did on the H100 (docs/wgpu.md); written
//! out, the array is indexed by constants only.

use crate::runtime::ShaderSource;
use crate::unroll::Unroll;
use deltakv_contract::Result;

/// Declares one bands shader: the dtype helpers, the shared bindings, the state pool's
/// accessors, then the kernel (no subgroup operations).
macro_rules! bands_source {
    ($name:literal, $state:literal) => {
        ShaderSource {
            name: $name,
            text: concat!(
                include_str!("../dtype.wgsl"),
                include_str!("gdn_common.wgsl"),
                include_str!("store_o.wgsl"),
                include_str!($state),
                include_str!("decode_bands.wgsl")
            ),
            entry_point: "gdn_decode_bands",
        }
    };
}

/// The bands kernel over an f32 pool.
pub const BANDS_F32: ShaderSource = bands_source!("gdn_decode_bands_f32", "decode_state_f32.wgsl");
/// The bands kernel over a bf16 pool.
pub const BANDS_BF16: ShaderSource =
    bands_source!("gdn_decode_bands_bf16", "decode_state_bf16.wgsl");

/// The loops over a thread's rows, as the decode kernel writes them.
pub fn row_loops(rows: u32) -> Unroll {
    Unroll {
        header: "for (var i = 0u; i < ROWS; i++) {",
        counter: "i",
        trips: rows,
    }
}

/// `source` with its row loops written out for `rows` rows per thread (kept for the process).
pub fn unrolled(source: &ShaderSource, rows: u32) -> Result<ShaderSource> {
    crate::unroll::unrolled(source, &[row_loops(rows)])
}
