//! `deltakv kv --device cuda`: the file-level compressed-KV op on the GPU. Checked on the host
//! (`kv_device`), k and v are uploaded in their dtype and encoded into a paged cache on the GPU,
//! q attends causally there, and `o` comes back f32.

use crate::kv_device::DeviceKvCall;
use deltakv_contract::Result;
use deltakv_contract::kv::inputs::KvInputs;
use deltakv_cpu::kv::{KvOptions, KvOutput};
use deltakv_cuda::kv::{CudaPagedKvCache, attend};
use deltakv_cuda::{Cuda, CudaTensor};

pub(crate) fn kv_attention_cuda(inputs: &KvInputs<'_>, options: &KvOptions) -> Result<KvOutput> {
    let call = DeviceKvCall::new("cuda", inputs, options)?;
    let cuda = Cuda::get()?;
    let (batch, pages) = (call.dims.batch, call.max_pages);
    let mut cache = CudaPagedKvCache::new(cuda, call.layout, batch, pages, batch * pages)?;
    let (k, v) = (
        CudaTensor::upload(cuda, inputs.k)?,
        CudaTensor::upload(cuda, inputs.v)?,
    );
    cache.append(cuda, &k, &v, &call.dims.seq_lens)?;
    let q = CudaTensor::upload(cuda, inputs.q)?;
    call.output(attend(cuda, &cache, &q, Some(call.scale))?.download(cuda)?)
}
