//! deltakv-wgpu: the wgpu backend of deltakv, WGSL compute shaders on Vulkan (Linux, Windows,
//! Android; Mesa's lavapipe in CI) and Metal (Apple).
//!
//! * [`Wgpu`]: the process's adapter, device and queue, and the pipelines, built at first use.
//!   The high-performance adapter by default; `DELTAKV_WGPU_ADAPTER` names another. Opening it
//!   never panics: a machine without one gets a one-line `DeviceUnavailable` error.
//! * [`WgpuTensor`]: tensors in wgpu storage buffers; explicit upload and download.
//! * [`gdn`]: GDN decode over a state pool that stays on the device, and the GDN prefill.
//! * [`kv`]: the paged compressed KV cache on the device, its encode, and flash-decoding
//!   attention over the packed codes (decode and causal chunk).
//!
//! A serving loop keeps the pool on the device and runs one validated call per step:
//!
//! ```no_run
//! use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
//! use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating};
//! use deltakv_wgpu::{Wgpu, WgpuTensor, gdn::gdn_decode};
//!
//! let wgpu = Wgpu::get()?; // "no wgpu adapter: ..." on a machine without one
//! // 8 sequences, one new token each, Qwen3-Next's shape; a pool of 10 slots.
//! let case = DecodeCase::random(&DecodeSpec::new(8, 1, 16, 32, 128, 128), 1)?;
//! let up = |t: &deltakv_contract::HostTensor| WgpuTensor::upload(wgpu, t);
//! let mut pool = up(&case.state_pool)?; // stays on the device, updated in place
//! let (q, k, v, slots) = (up(&case.q)?, up(&case.k)?, up(&case.v)?, up(&case.slot_indices)?);
//! let (g, beta) = (up(case.gate("g").unwrap())?, up(case.gate("beta").unwrap())?);
//! let inputs = DecodeInputs { q: &q, k: &k, v: &v, gating: Gating::Direct { g: &g, beta: &beta }, slot_indices: &slots };
//! let out = gdn_decode(wgpu, &inputs, &mut pool, &DecodeOptions::default())?;
//! let o = out.o.download(wgpu)?; // [8, 1, 32, 128], only when the caller asks
//! assert_eq!(o.shape(), &[8, 1, 32, 128]);
//! # Ok::<(), deltakv_contract::Error>(())
//! ```
//!
//! The `.wgsl` sources sit beside the Rust that launches them; [`SHADERS`] lists them, and a
//! test translates each one to Metal Shading Language with naga on every commit (the decode
//! kernel as the launcher builds it, its row loops written out by
//! `gdn::decode_sources::unrolled`).

pub mod coop;
pub mod gdn;
pub mod kv;
pub mod runtime;
mod scope;
pub mod tensor;
#[doc(hidden)]
pub mod testing;
pub mod timing;
pub mod unroll;

pub use runtime::{ShaderSource, Wgpu};
pub use tensor::WgpuTensor;

/// The values of a shader's `override` constants for one pipeline.
pub type Constants = &'static [(&'static str, f64)];

/// The recurrent kernel's constants as its launchers set them (rows per thread, column pairs,
/// bf16 state): the column-pair decode's 64-column tiles and narrow prefills' 16-column tiles.
const RECURRENT_CONSTANTS: &[Constants] = &[
    &[("ROWS", 4.0), ("COL_PAIRS", 8.0), ("STATE_BF16", 0.0)],
    &[("ROWS", 16.0), ("COL_PAIRS", 32.0), ("STATE_BF16", 0.0)],
    &[("ROWS", 16.0), ("COL_PAIRS", 32.0), ("STATE_BF16", 1.0)],
    &[("ROWS", 32.0), ("COL_PAIRS", 8.0), ("STATE_BF16", 0.0)],
];

/// The decode kernel's constants: 8 bands of 32 column quads, rows per thread at K <= 32, 64,
/// 128 and 256.
pub const BANDS_CONSTANTS: &[Constants] = &[
    &[("QUADS", 32.0), ("BANDS", 8.0), ("ROWS", 4.0)],
    &[("QUADS", 32.0), ("BANDS", 8.0), ("ROWS", 8.0)],
    &[("QUADS", 32.0), ("BANDS", 8.0), ("ROWS", 16.0)],
    &[("QUADS", 32.0), ("BANDS", 8.0), ("ROWS", 32.0)],
];

/// The chunked prefill's constants: decode's tile and the narrow one, K <= 128 and above.
const CHUNK_CONSTANTS: &[Constants] = &[
    &[
        ("ROWS", 16.0),
        ("COL_PAIRS", 8.0),
        ("STATE_BF16", 0.0),
        ("CHUNK_TOKENS", 16.0),
    ],
    &[
        ("ROWS", 16.0),
        ("COL_PAIRS", 32.0),
        ("STATE_BF16", 0.0),
        ("CHUNK_TOKENS", 16.0),
    ],
    &[
        ("ROWS", 32.0),
        ("COL_PAIRS", 8.0),
        ("STATE_BF16", 0.0),
        ("CHUNK_TOKENS", 8.0),
    ],
];

/// The two-pass prefill's state pass: its default shapes (16-column tiles with 32 row groups,
/// 32-column tiles with 16) and the others a `StatePlan` selects, a transition walk, and an
/// outputs walk that stores checkpoints.
const CHUNKS_STATE_CONSTANTS: &[Constants] = &[
    &[
        ("VT", 32.0),
        ("ROW_GROUPS", 16.0),
        ("ROW_BLOCKS", 2.0),
        ("STATE_KP4", 32.0),
    ],
    &[
        ("VT", 16.0),
        ("ROW_GROUPS", 16.0),
        ("ROW_BLOCKS", 2.0),
        ("STATE_KP4", 32.0),
    ],
    &[
        ("VT", 16.0),
        ("ROW_GROUPS", 16.0),
        ("ROW_BLOCKS", 4.0),
        ("STATE_KP4", 64.0),
    ],
    &[
        ("VT", 32.0),
        ("ROW_GROUPS", 8.0),
        ("ROW_BLOCKS", 8.0),
        ("STATE_KP4", 64.0),
    ],
    &[
        ("VT", 16.0),
        ("ROW_GROUPS", 32.0),
        ("ROW_BLOCKS", 1.0),
        ("STATE_KP4", 32.0),
    ],
    &[
        ("VT", 32.0),
        ("ROW_GROUPS", 16.0),
        ("ROW_BLOCKS", 2.0),
        ("STATE_KP4", 32.0),
        ("WALK", 1.0),
    ],
    &[
        ("VT", 16.0),
        ("ROW_GROUPS", 8.0),
        ("ROW_BLOCKS", 4.0),
        ("STATE_KP4", 32.0),
        ("CKPT", 1.0),
    ],
];

/// Every shader of the backend, with sets of its `override` constants (each set is one
/// pipeline).
pub const SHADERS: &[(ShaderSource, &[Constants])] = &[
    (gdn::decode_sources::BANDS_F32, BANDS_CONSTANTS),
    (gdn::decode_sources::BANDS_BF16, BANDS_CONSTANTS),
    (gdn::recurrent::SOURCE_SUBGROUP, RECURRENT_CONSTANTS),
    (gdn::recurrent::SOURCE_SHARED, RECURRENT_CONSTANTS),
    (gdn::recurrent::CHUNK_SUBGROUP, CHUNK_CONSTANTS),
    (gdn::recurrent::CHUNK_SHARED, CHUNK_CONSTANTS),
    (gdn::chunks::PREPARE, &[&[]]),
    (
        gdn::chunks::PREPARE_STAGED,
        &[
            &[("KW", 64.0), ("VW", 64.0), ("HALF_DTYPE", 2.0)],
            &[("KW", 32.0), ("VW", 48.0), ("HALF_DTYPE", 1.0)],
        ],
    ),
    (gdn::chunks::STATE, CHUNKS_STATE_CONSTANTS),
    (
        gdn::chunks::STATE_STAGED,
        &[
            &[("VT", 16.0), ("STATE_KP4", 32.0), ("WALK", 0.0)],
            &[("VT", 16.0), ("STATE_KP4", 16.0), ("WALK", 0.0)],
            &[("VT", 16.0), ("STATE_KP4", 32.0), ("WALK", 1.0)],
            &[("VT", 16.0), ("STATE_KP4", 16.0), ("WALK", 1.0)],
            &[("VT", 16.0), ("STATE_KP4", 32.0), ("CKPT", 1.0)],
        ],
    ),
    (gdn::chunks::COMBINE, &[&[]]),
    (tensor::FILL, &[&[]]),
    (timing::COPY, &[&[]]),
    (kv::SOURCE_ENCODE, &[&[]]),
    (kv::SOURCE_ATTEND_SUBGROUP, KV_ATTEND_CONSTANTS),
    (kv::SOURCE_ATTEND_SHARED, KV_ATTEND_CONSTANTS),
    (kv::SOURCE_MERGE, &[&[]]),
];

/// The attention's constants: every pair of bit widths at d = 128 (8 lanes per token), and the
/// lane counts of d = 64 and d = 256.
pub const KV_ATTEND_CONSTANTS: &[Constants] = &[
    &[("BITS_K", 2.0), ("BITS_V", 2.0), ("LANES", 8.0)],
    &[("BITS_K", 2.0), ("BITS_V", 3.0), ("LANES", 8.0)],
    &[("BITS_K", 2.0), ("BITS_V", 4.0), ("LANES", 8.0)],
    &[("BITS_K", 2.0), ("BITS_V", 8.0), ("LANES", 8.0)],
    &[("BITS_K", 3.0), ("BITS_V", 2.0), ("LANES", 8.0)],
    &[("BITS_K", 3.0), ("BITS_V", 3.0), ("LANES", 8.0)],
    &[("BITS_K", 3.0), ("BITS_V", 4.0), ("LANES", 8.0)],
    &[("BITS_K", 3.0), ("BITS_V", 8.0), ("LANES", 8.0)],
    &[("BITS_K", 4.0), ("BITS_V", 2.0), ("LANES", 8.0)],
    &[("BITS_K", 4.0), ("BITS_V", 3.0), ("LANES", 8.0)],
    &[("BITS_K", 4.0), ("BITS_V", 4.0), ("LANES", 8.0)],
    &[("BITS_K", 4.0), ("BITS_V", 8.0), ("LANES", 8.0)],
    &[("BITS_K", 8.0), ("BITS_V", 2.0), ("LANES", 8.0)],
    &[("BITS_K", 8.0), ("BITS_V", 3.0), ("LANES", 8.0)],
    &[("BITS_K", 8.0), ("BITS_V", 4.0), ("LANES", 8.0)],
    &[("BITS_K", 8.0), ("BITS_V", 8.0), ("LANES", 8.0)],
    &[("BITS_K", 4.0), ("BITS_V", 2.0), ("LANES", 4.0)],
    &[("BITS_K", 4.0), ("BITS_V", 2.0), ("LANES", 16.0)],
];
