//! The CUDA part of the compressed-KV demo (with `--features cuda` on a machine with a GPU):
//! the same keys, values and query encoded into the paged cache on the GPU and attended there,
//! checked against the ideal codec (f64 attention over the CPU codec's decoded vectors: the
//! GPU's codes are the CPU's bit for bit), with GPU times from CUDA-graph replays.

use deltakv::cuda::kv::{CudaAttnOptions, CudaPagedKvCache, prepare_attend};
use deltakv::cuda::timing::median_graph_us;
use deltakv::cuda::{Cuda, CudaTensor};
use deltakv::kv::{KvScheme, PagedLayout};
use deltakv::metrics::rel_rms;
use deltakv::{HostTensor, Result};

/// Runs the step on the GPU; prints one line; returns whether it passes (true when skipped).
#[allow(clippy::too_many_arguments)]
pub fn run(
    keys: &[f32],
    values: &[f32],
    q: &[f32],
    (context, hq, hkv, d): (usize, usize, usize, usize),
    scheme: KvScheme,
    ideal: &[f64],
    rule: f64,
) -> Result<bool> {
    let cuda = match Cuda::get() {
        Ok(cuda) => cuda,
        Err(reason) => {
            println!("  compressed KV on cuda: skipped ({reason})");
            return Ok(true);
        }
    };
    let layout = PagedLayout::new(scheme, 64)?;
    let pages = layout.pages_for(context);
    let mut cache = CudaPagedKvCache::new(cuda, layout, 1, pages, pages)?;
    let up = |x: &[f32], shape: Vec<usize>| {
        CudaTensor::upload(cuda, &HostTensor::from_f32(shape, x.to_vec())?)
    };
    let (k, v) = (
        up(keys, vec![1, context, hkv, d])?,
        up(values, vec![1, context, hkv, d])?,
    );
    let encode = cache
        .prepare_append(cuda, &k, &v, &[context])?
        .expect("tokens");
    // SAFETY: the cache and the chunks live through the timing, the cache unchanged until
    // the append below (each replay writes the same tokens again).
    let encode_us = median_graph_us(cuda, 5, 10, || unsafe { encode.launch(cuda) })?;
    cache.append(cuda, &k, &v, &[context])?;
    let q = up(q, vec![1, 1, hq, d])?;
    let launch = prepare_attend(cuda, &cache, &q, None, &CudaAttnOptions::default())?;
    // SAFETY: the cache and q live through the timing, the cache unchanged.
    let attend_us = median_graph_us(cuda, 20, 20, || unsafe { launch.launch(cuda) })?;
    let o = launch.output().download(cuda)?.to_f32_vec("o")?;
    let err = rel_rms(&o, ideal);
    let ok = err < rule && o.iter().all(|x| x.is_finite());
    println!(
        "  compressed KV on cuda ({}): encode {encode_us:.1} us, decode attention {attend_us:.1} us (GPU time); against the ideal codec {err:.1e} {}",
        cuda.name(),
        if ok { "PASS" } else { "FAIL" }
    );
    Ok(ok)
}
