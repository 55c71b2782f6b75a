//! `deltakv kv --device cuda|wgpu`: what the file-level compressed-KV op does on the host around
//! a device's own steps (`kv_cuda`, `kv_wgpu`). The inputs are validated and scanned as on the
//! CPU (`deltakv_cpu::kv::op`), the cache gets a paged layout of 64-token pages for the file's
//! tokens, and `o` (f32, back from the device) is checked for values that left f32's range. The
//! exact path (`--exact`) is CPU-only.

use deltakv_contract::kv::PagedLayout;
use deltakv_contract::kv::inputs::{KvDims, KvInputs, KvMode, check_held_finite, validate};
use deltakv_contract::kv::paged::attention_scale;
use deltakv_contract::tensor::HostTensor;
use deltakv_contract::{Error, Result};
use deltakv_cpu::kv::{KvOptions, KvOutput, check_attention_output};

/// Tokens per page of the cache built for one file.
const PAGE_TOKENS: usize = 64;

/// A checked call, ready for the device: the inputs' sizes, the cache's layout and pages per
/// sequence, and the attention scale.
pub(crate) struct DeviceKvCall {
    pub dims: KvDims,
    pub layout: PagedLayout,
    pub max_pages: usize,
    pub scale: f32,
}

impl DeviceKvCall {
    /// Validates the call for `device` ("cuda" or "wgpu") and scans the values the sequences
    /// hold, and q, as the CPU does.
    pub fn new(device: &str, inputs: &KvInputs<'_>, options: &KvOptions) -> Result<Self> {
        let dims = validate(inputs, options.mode)?;
        let KvMode::Compressed { bits_k, bits_v } = options.mode else {
            return Err(Error::DeviceUnavailable {
                device: device.to_string(),
                reason: format!("exact attention (--exact) is not implemented on {device} yet"),
            });
        };
        check_held_finite(inputs, &dims)?;
        inputs.q.check_finite("q")?;
        let layout = PagedLayout::new(options.scheme(&dims, bits_k, bits_v), PAGE_TOKENS)?;
        let max_pages = layout.pages_for(dims.tokens).max(1);
        let scale = attention_scale(inputs.scale, dims.d)?;
        Ok(Self {
            dims,
            layout,
            max_pages,
            scale,
        })
    }

    /// The op's output from the device's `o`, refused where a value left f32's range.
    pub fn output(&self, o: HostTensor) -> Result<KvOutput> {
        check_attention_output(&o)?;
        let cache_bytes = self.dims.seq_lens.iter().sum::<usize>()
            * self.dims.hkv
            * self.layout.scheme.bytes_per_token_head();
        Ok(KvOutput { o, cache_bytes })
    }
}
