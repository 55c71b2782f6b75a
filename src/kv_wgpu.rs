//! `deltakv kv --device wgpu`: the file-level compressed-KV op on the wgpu device. The inputs are
//! validated and scanned on the host as on the CPU (`deltakv_cpu::kv::op`), k and v are
//! uploaded in their dtype and encoded into a paged cache on the device (pages of 64 tokens), q
//! attends causally there, and `o` comes back f32. The exact path (`--exact`) is CPU-only.

use deltakv_contract::kv::inputs::{KvInputs, KvMode, validate};
use deltakv_contract::kv::{KvScheme, PagedLayout};
use deltakv_contract::tensor::{HostTensor, check_result_finite};
use deltakv_contract::{Error, Result};
use deltakv_cpu::kv::{KvOptions, KvOutput};
use deltakv_wgpu::kv::{WgpuPagedKvCache, attend};
use deltakv_wgpu::{Wgpu, WgpuTensor};

/// Tokens per page of the cache built for one file.
const PAGE_TOKENS: usize = 64;

pub(crate) fn kv_attention_wgpu(inputs: &KvInputs<'_>, options: &KvOptions) -> Result<KvOutput> {
    let dims = validate(inputs, options.mode)?;
    let KvMode::Compressed { bits_k, bits_v } = options.mode else {
        return Err(Error::DeviceUnavailable {
            device: "wgpu".to_string(),
            reason: "exact attention (--exact) is not implemented on wgpu yet".to_string(),
        });
    };
    // The values the sequences hold, and q, are checked as the CPU checks them.
    let row = dims.hkv * dims.d;
    for (name, t) in [("k", inputs.k), ("v", inputs.v)] {
        for b in 0..dims.batch {
            let start = b * dims.tokens * row;
            if let Some((i, x)) = t
                .data()
                .first_non_finite_in(start..start + dims.seq_lens[b] * row)
            {
                return Err(deltakv_contract::tensor::non_finite_input(name, i, x));
            }
        }
    }
    inputs.q.check_finite("q")?;
    let wgpu = Wgpu::get()?;
    let scheme = KvScheme {
        dim: dims.d,
        kv_heads: dims.hkv,
        bits_k,
        bits_v,
        norm_dtype: options.norm_dtype,
        codebook: options.codebook,
        seed: options.seed,
    };
    let layout = PagedLayout::new(scheme, PAGE_TOKENS)?;
    let max_pages = layout.pages_for(dims.tokens).max(1);
    let mut cache =
        WgpuPagedKvCache::new(wgpu, layout, dims.batch, max_pages, dims.batch * max_pages)?;
    let (k, v) = (
        WgpuTensor::upload(wgpu, inputs.k)?,
        WgpuTensor::upload(wgpu, inputs.v)?,
    );
    cache.append(wgpu, &k, &v, &dims.seq_lens)?;
    let q = WgpuTensor::upload(wgpu, inputs.q)?;
    let scale = inputs.scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
    let o: HostTensor = attend(wgpu, &cache, &q, Some(scale))?.download(wgpu)?;
    check_result_finite(
        "o",
        &o,
        "b, tq, hq, d",
        "q or v too large: a score or a weighted sum of values left f32's range",
    )?;
    let cache_bytes =
        dims.seq_lens.iter().sum::<usize>() * dims.hkv * scheme.bytes_per_token_head();
    Ok(KvOutput { o, cache_bytes })
}
