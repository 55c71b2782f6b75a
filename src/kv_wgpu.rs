//! `deltakv kv --device wgpu`: the file-level compressed-KV op on the wgpu device. Checked on the
//! host (`kv_device`), k and v are uploaded in their dtype and encoded into a paged cache on the
//! device, q attends causally there, and `o` comes back f32.

use crate::kv_device::DeviceKvCall;
use deltakv_contract::Result;
use deltakv_contract::kv::inputs::KvInputs;
use deltakv_cpu::kv::{KvOptions, KvOutput};
use deltakv_wgpu::kv::{WgpuPagedKvCache, attend};
use deltakv_wgpu::{Wgpu, WgpuTensor};

pub(crate) fn kv_attention_wgpu(inputs: &KvInputs<'_>, options: &KvOptions) -> Result<KvOutput> {
    let call = DeviceKvCall::new("wgpu", inputs, options)?;
    let wgpu = Wgpu::get()?;
    let (batch, pages) = (call.dims.batch, call.max_pages);
    let mut cache = WgpuPagedKvCache::new(wgpu, call.layout, batch, pages, batch * pages)?;
    let (k, v) = (
        WgpuTensor::upload(wgpu, inputs.k)?,
        WgpuTensor::upload(wgpu, inputs.v)?,
    );
    cache.append(wgpu, &k, &v, &call.dims.seq_lens)?;
    let q = WgpuTensor::upload(wgpu, inputs.q)?;
    call.output(attend(wgpu, &cache, &q, Some(call.scale))?.download(wgpu)?)
}
