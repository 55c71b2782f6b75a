//! Device time of a dispatch for benchmarks: `per_sample` back-to-back dispatches recorded in
//! one submission, timed from submission to the queue going idle; the median over `samples`
//! of (elapsed / per_sample). What remains of submission overhead is spread over the batch.

use crate::runtime::Wgpu;
use deltakv_contract::Result;
use std::time::Instant;

/// The median time of one dispatch in microseconds. `submit(n)` must queue `n` back-to-back
/// dispatches without waiting.
pub fn median_dispatch_us(
    wgpu: &Wgpu,
    per_sample: usize,
    samples: usize,
    submit: impl Fn(usize) -> Result<()>,
) -> Result<f64> {
    // Warm-up: pipelines built, buffers resident, clocks up.
    submit(per_sample)?;
    wgpu.synchronize()?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        let started = Instant::now();
        submit(per_sample)?;
        wgpu.synchronize()?;
        times.push(started.elapsed().as_secs_f64() * 1e6 / per_sample.max(1) as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The device-to-device copy rate in TB/s (bytes read plus bytes written per second), from
/// back-to-back buffer copies of `bytes` (capped by the adapter's largest buffer): the ceiling
/// that a memory-bound kernel's traffic is compared with.
pub fn copy_tb_per_s(wgpu: &Wgpu, bytes: u64) -> Result<f64> {
    let size = bytes.min(wgpu.device().limits().max_buffer_size) / 4 * 4;
    let make = || {
        wgpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("deltakv copy rate"),
            size,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    };
    let (src, dst) = (make(), make());
    wgpu.check("allocating the copy-rate buffers")?;
    let us = median_dispatch_us(wgpu, 20, 9, |n| {
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        for _ in 0..n {
            encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        wgpu.queue().submit([encoder.finish()]);
        wgpu.check("copying buffers")
    })?;
    Ok(2.0 * size as f64 / (us * 1e-6) / 1e12)
}
