//! # deltakv
//!
//! Kernels for serving hybrid linear-attention LLMs (Qwen3-Next, Qwen3.5/3.6 and kin):
//! Gated DeltaNet prefill and decode, and attention over a compressed KV cache.
//!
//! This crate is the facade: it picks a [`Device`] and forwards to a backend. The contract
//! (types, validation, the f64 oracles, random cases) is [`deltakv_contract`]; the CPU backend
//! (always built, also the numerical reference) is [`deltakv_cpu`]. [`gdn`] and [`kv`] gather
//! both: the contract's types and the CPU's entry points and caches. [`Tensor`] is a tensor
//! on one device (the host, or a GPU with the `cuda` feature), and [`gdn_decode_on_device`]
//! runs where its state pool is, returning its outputs there.
//!
//! ```
//! use deltakv::gdn::random::{GdnCase, GdnSpec};
//! use deltakv::gdn::{GdnOptions, PrefillMode};
//! use deltakv::{Device, gdn_prefill};
//!
//! // A Qwen3-Next-shaped layer (Hg = 16 key heads, H = 32 value heads, K = V = 128), 100 tokens.
//! let case = GdnCase::random(&GdnSpec::new(100, 16, 32, 128, 128), 1)?;
//! let out = gdn_prefill(Device::Cpu, &case.inputs(), &GdnOptions::default(), PrefillMode::Chunk)?;
//! assert_eq!(out.o.shape(), &[1, 100, 32, 128]);
//! assert_eq!(out.final_state.shape(), &[1, 32, 128, 128]);
//! # Ok::<(), deltakv::Error>(())
//! ```

pub use deltakv_contract::{
    DType, Error, HostData, HostDataMut, HostTensor, HostView, HostViewMut, Result, TensorData,
    TensorMeta, TensorSlice, TensorSliceMut, io, metrics, rng, tensor, view,
};
/// The bf16 / f16 element types of [`TensorData`], re-exported so callers use the same
/// version.
pub use half;

/// The README's and the docs' Rust code blocks, compiled and run as doctests so they cannot
/// drift from the API.
#[cfg(doctest)]
mod markdown_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/gdn-prefill.md")]
    struct GdnPrefill;
    #[doc = include_str!("../docs/gdn-decode.md")]
    struct GdnDecode;
    #[doc = include_str!("../docs/kv-cache.md")]
    struct KvCacheDoc;
    #[doc = include_str!("../docs/contract.md")]
    struct Contract;
    #[doc = include_str!("../docs/cuda.md")]
    struct CudaDoc;
    #[doc = include_str!("../docs/cuda-kernel-log.md")]
    struct CudaKernelLog;
}

/// Gated DeltaNet: the contract's types, validation, oracles and random cases
/// ([`deltakv_contract::gdn`]) and the CPU backend's entry points.
pub mod gdn {
    pub use deltakv_contract::gdn::*;
    pub use deltakv_cpu::gdn::{
        gdn_decode, gdn_decode_into, gdn_prefill, gdn_prefill_checkpointed,
    };
}

/// Compressed-KV attention: the contract's scheme, codec, merge math, oracle and random cases
/// ([`deltakv_contract::kv`]) and the CPU backend's caches and attention.
pub mod kv {
    pub use deltakv_contract::kv::book::PagedCache;
    pub use deltakv_contract::kv::*;
    pub use deltakv_cpu::kv::{
        AttnOptions, DenseKvCache, HeadStore, KvCache, KvOptions, KvOutput, MAX_BLOCK_TOKENS,
        Norms, PagedKvCache, attend_compressed, attend_dense, attend_paged, attention, cache,
        kv_attention,
    };
}

use gdn::PrefillMode;
use gdn::prefill::checkpoint::PrefillCheckpoints;
use gdn::{DecodeInputs, DecodeOptions, DecodeOutput, GdnDims, GdnInputs, GdnOptions, GdnOutput};

mod device_tensor;
#[cfg(feature = "cuda")]
mod kv_cuda;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kv_device;
#[cfg(feature = "wgpu")]
mod kv_wgpu;
mod on_device;

pub use device_tensor::Tensor;
pub use on_device::{DeviceDecodeOutput, gdn_decode_on_device};

/// Where an op runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The portable CPU backend (rayon + runtime-dispatched SIMD). Always available.
    #[default]
    Cpu,
    /// NVIDIA GPUs through CUDA (cargo feature `cuda`): GDN prefill and decode.
    Cuda,
    /// Vulkan / Metal through wgpu (cargo feature `wgpu`): GDN decode and prefill, and
    /// compressed-KV attention.
    Wgpu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Wgpu => "wgpu",
        }
    }

    /// Every device, in the order the command line lists them.
    pub const ALL: [Device; 3] = [Device::Cpu, Device::Cuda, Device::Wgpu];

    /// Ok if ops can run on this device here, else a `DeviceUnavailable` error that says why:
    /// the backend was not built in, or (CUDA) the driver, a GPU or NVRTC is missing.
    pub fn ensure_available(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda => deltakv_cuda::Cuda::get().map(drop),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => Err(Error::DeviceUnavailable {
                device: self.name().to_string(),
                reason: "deltakv was built without CUDA (cargo feature `cuda`)".to_string(),
            }),
            #[cfg(feature = "wgpu")]
            Device::Wgpu => deltakv_wgpu::Wgpu::get().map(drop),
            #[cfg(not(feature = "wgpu"))]
            Device::Wgpu => Err(Error::DeviceUnavailable {
                device: self.name().to_string(),
                reason: "deltakv was built without wgpu (cargo feature `wgpu`)".to_string(),
            }),
        }
    }
}

impl Device {
    /// Ok if `op` runs on this device in this build: the device is available and its backend
    /// implements the op (CUDA and wgpu have GDN prefill and decode and compressed-KV
    /// attention).
    pub fn ensure_runs(self, op: &str) -> Result<()> {
        self.ensure_available()?;
        let implemented = match self {
            Device::Cpu => true,
            Device::Cuda | Device::Wgpu => {
                op == "gdn decode" || op == "gdn prefill" || op == "compressed-KV attention"
            }
        };
        if implemented {
            Ok(())
        } else {
            Err(Error::DeviceUnavailable {
                device: self.name().to_string(),
                reason: format!(
                    "{op} is not implemented on {self} yet (CUDA and wgpu have GDN prefill and decode and compressed-KV attention)"
                ),
            })
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            "wgpu" => Ok(Device::Wgpu),
            other => Err(Error::InvalidValue(format!(
                "unknown device `{other}` (expected {})",
                Device::ALL.map(Device::name).join(", ")
            ))),
        }
    }
}

/// The CUDA prefill runs the chunked algorithm only.
#[cfg(feature = "cuda")]
fn cuda_chunked_only(mode: PrefillMode) -> Result<()> {
    match mode {
        PrefillMode::Chunk => Ok(()),
        PrefillMode::Recurrent => Err(Error::Unsupported(
            "the CUDA prefill runs the chunked algorithm only (mode chunk); the recurrent mode \
             is the CPU's cross-check"
                .to_string(),
        )),
    }
}

/// GDN prefill on `device`; see [`gdn`] for the math and shapes. (The CPU's
/// [`gdn::gdn_prefill`] also takes [`HostView`]s over a caller's memory, read in place.)
pub fn gdn_prefill(
    device: Device,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
) -> Result<GdnOutput> {
    gdn_prefill_checkpointed(device, inputs, options, mode, None)
}

/// [`gdn_prefill`] that also returns (in [`GdnOutput::checkpoints`]) the state every
/// `checkpoint_every` tokens of each sequence, for prefix caching and rollback: a positive
/// multiple of 64; the layout is [`gdn::prefill::checkpoint`]'s. On every device (CUDA and wgpu
/// in chunked mode).
pub fn gdn_prefill_checkpointed(
    device: Device,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    checkpoint_every: Option<usize>,
) -> Result<GdnOutput> {
    device.ensure_runs("gdn prefill")?;
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda => {
            cuda_chunked_only(mode)?;
            deltakv_cuda::gdn::gdn_prefill_host_checkpointed(
                deltakv_cuda::Cuda::get()?,
                inputs,
                options,
                deltakv_cuda::gdn::Split::Auto,
                checkpoint_every,
            )
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu => deltakv_wgpu::gdn::gdn_prefill_checkpointed(
            deltakv_wgpu::Wgpu::get()?,
            inputs,
            options,
            mode,
            checkpoint_every,
        ),
        _ => deltakv_cpu::gdn::gdn_prefill_checkpointed(inputs, options, mode, checkpoint_every),
    }
}

/// GDN prefill whose initial states are read from, and final states written to, the slots
/// `slot_indices [N]` of `state_pool [slots, H, K, V]` f32, so a prompt's states land where the
/// decode steps read them; returns `o`. `inputs.initial_state` must be `None`; the pool changes
/// only when the call succeeded. With host tensors on `Device::Cuda` or `Device::Wgpu` the pool
/// travels to the device and back; a serving loop keeps it there and calls
/// [`cuda::gdn::gdn_prefill`] with `PrefillStates::Pool`, or `wgpu::gdn::gdn_prefill_into_pool`
/// with the pool `wgpu::gdn::gdn_decode` advances.
pub fn gdn_prefill_into_pool(
    device: Device,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
) -> Result<HostTensor> {
    gdn_prefill_into_pool_checkpointed(
        device,
        inputs,
        options,
        mode,
        state_pool,
        slot_indices,
        None,
    )
    .map(|(o, _)| o)
}

/// [`gdn_prefill_into_pool`] that also returns the state every `checkpoint_every` tokens of each
/// sequence (see [`gdn_prefill_checkpointed`]).
pub fn gdn_prefill_into_pool_checkpointed(
    device: Device,
    inputs: &GdnInputs<'_>,
    options: &GdnOptions,
    mode: PrefillMode,
    state_pool: &mut HostTensor,
    slot_indices: &HostTensor,
    checkpoint_every: Option<usize>,
) -> Result<(HostTensor, Option<PrefillCheckpoints>)> {
    device.ensure_runs("gdn prefill")?;
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda => {
            cuda_chunked_only(mode)?;
            deltakv_cuda::gdn::gdn_prefill_host_into_pool_checkpointed(
                deltakv_cuda::Cuda::get()?,
                inputs,
                options,
                state_pool,
                slot_indices,
                checkpoint_every,
                deltakv_cuda::gdn::Split::Auto,
            )
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu => deltakv_wgpu::gdn::gdn_prefill_host_into_pool(
            deltakv_wgpu::Wgpu::get()?,
            inputs,
            options,
            mode,
            state_pool,
            slot_indices,
            checkpoint_every,
        ),
        _ => deltakv_cpu::gdn::gdn_prefill_into_pool_checkpointed(
            inputs,
            options,
            mode,
            state_pool,
            slot_indices,
            checkpoint_every,
        ),
    }
}

/// GDN decode on `device`: advances the slots of `state_pool` addressed by the inputs by
/// 1..=16 tokens per row, in place; see [`gdn::decode`] for the math and layouts.
///
/// With host tensors on `Device::Cuda`, the inputs and the pool are copied to the GPU and the
/// results back (a convenience for files and tests); a serving loop keeps its pool on the GPU
/// and calls [`cuda::gdn::gdn_decode`] with [`cuda::CudaTensor`]s instead.
pub fn gdn_decode(
    device: Device,
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    device.ensure_runs("gdn decode")?;
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda => deltakv_cuda::gdn::gdn_decode_host(
            deltakv_cuda::Cuda::get()?,
            inputs,
            state_pool,
            options,
        ),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => deltakv_wgpu::gdn::gdn_decode_host(
            deltakv_wgpu::Wgpu::get()?,
            inputs,
            state_pool,
            options,
        ),
        _ => deltakv_cpu::gdn::gdn_decode(inputs, state_pool, options),
    }
}

/// [`gdn_decode`] into caller-owned f32 buffers (`o [B, T, H, V]`, optional
/// `intermediate_states [B, T, H, K, V]`), reused step after step by a serving loop.
pub fn gdn_decode_into(
    device: Device,
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &GdnOptions,
    o: &mut [f32],
    intermediate_states: Option<&mut [f32]>,
) -> Result<GdnDims> {
    device.ensure_runs("gdn decode into host buffers")?;
    deltakv_cpu::gdn::gdn_decode_into(inputs, state_pool, options, o, intermediate_states)
}

/// The CUDA backend: device tensors ([`cuda::CudaTensor`]) and the ops that take them.
#[cfg(feature = "cuda")]
pub use deltakv_cuda as cuda;

/// The wgpu backend: device tensors ([`wgpu::WgpuTensor`]) and the ops that take them.
#[cfg(feature = "wgpu")]
pub use deltakv_wgpu as wgpu;

/// Compressed-KV (or exact) attention over a safetensors-style input on `device`; see
/// [`kv`] for the math and shapes.
pub fn kv_attention(
    device: Device,
    inputs: &kv::KvInputs<'_>,
    options: &kv::KvOptions,
) -> Result<kv::KvOutput> {
    device.ensure_runs("compressed-KV attention")?;
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda => kv_cuda::kv_attention_cuda(inputs, options),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => kv_wgpu::kv_attention_wgpu(inputs, options),
        _ => deltakv_cpu::kv::kv_attention(inputs, options),
    }
}
