//! The wgpu part of the compressed-KV demo (with `--features wgpu` on a machine with a Vulkan
//! or Metal adapter): the same keys, values and query encoded into the paged cache on the
//! device and attended there, checked against the ideal codec (f64 attention over the CPU
//! codec's decoded vectors), with device times from batched dispatches.

use deltakv::kv::{KvScheme, PagedLayout};
use deltakv::metrics::rel_rms;
use deltakv::wgpu::kv::{WgpuAttnOptions, WgpuPagedKvCache, prepare_attend};
use deltakv::wgpu::timing::median_dispatch_us;
use deltakv::wgpu::{Wgpu, WgpuTensor};
use deltakv::{HostTensor, Result};

/// Runs the step on the device; prints one line; returns whether it passes (true when
/// skipped).
pub fn run(
    keys: &[f32],
    values: &[f32],
    q: &[f32],
    (context, hq, hkv, d): (usize, usize, usize, usize),
    scheme: KvScheme,
    ideal: &[f64],
    rule: f64,
) -> Result<bool> {
    let wgpu = match Wgpu::get() {
        Ok(wgpu) => wgpu,
        Err(reason) => {
            println!("  compressed KV on wgpu: skipped ({reason})");
            return Ok(true);
        }
    };
    let layout = PagedLayout::new(scheme, 64)?;
    let pages = layout.pages_for(context);
    let mut cache = WgpuPagedKvCache::new(wgpu, layout, 1, pages, pages)?;
    let up = |x: &[f32], shape: Vec<usize>| {
        WgpuTensor::upload(wgpu, &HostTensor::from_f32(shape, x.to_vec())?)
    };
    let (k, v) = (
        up(keys, vec![1, context, hkv, d])?,
        up(values, vec![1, context, hkv, d])?,
    );
    cache.append(wgpu, &k, &v, &[context])?;
    let q = up(q, vec![1, 1, hq, d])?;
    let launch = prepare_attend(wgpu, &cache, &q, None, &WgpuAttnOptions::default())?;
    let attend_us = median_dispatch_us(wgpu, 5, 5, |n| launch.submit(wgpu, n))?;
    let o = launch.output().download(wgpu)?.to_f32_vec("o")?;
    let err = rel_rms(&o, ideal);
    let ok = err < rule && o.iter().all(|x| x.is_finite());
    println!(
        "  compressed KV on wgpu ({}): decode attention {attend_us:.1} us (device time); against the ideal codec {err:.1e} {}",
        wgpu.name(),
        if ok { "PASS" } else { "FAIL" }
    );
    Ok(ok)
}
