//! Device time of a dispatch for benchmarks: `per_sample` back-to-back dispatches recorded in
//! one submission, timed from submission to the queue going idle; the median over `samples`
//! of (elapsed / per_sample). What remains of submission overhead is spread over the batch.
//! The copy rates are the reference for memory-bound kernels.
//!
//! Before its samples, each timing dispatches the work itself for at least [`WARM_UP`]: NVIDIA's
//! driver lowers the H100's SM clock from 1980 to 345 MHz after well under a second of idling
//! and raises it again only after some hundreds of milliseconds of Vulkan work (nvidia-smi at
//! 100 ms steps, `tools/gpu-check.sh wgpu-clocks`), so samples taken right after the host's
//! own work (making inputs, uploads) can run at a fraction of the clock.

use crate::runtime::{ShaderSource, Wgpu};
use deltakv_contract::Result;
use std::time::{Duration, Instant};

/// How long each timing dispatches its work before the samples that count.
pub const WARM_UP: Duration = Duration::from_millis(1000);

/// The median time of one dispatch in microseconds. `submit(n)` must queue `n` back-to-back
/// dispatches without waiting.
pub fn median_dispatch_us(
    wgpu: &Wgpu,
    per_sample: usize,
    samples: usize,
    submit: impl Fn(usize) -> Result<()>,
) -> Result<f64> {
    // Warm-up: pipelines built, buffers resident, clocks up.
    let warming = Instant::now();
    loop {
        submit(per_sample)?;
        wgpu.synchronize()?;
        if warming.elapsed() >= WARM_UP {
            break;
        }
    }
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

/// The copy shader behind [`copy_rates`].
pub const COPY: ShaderSource = ShaderSource {
    name: "copy_words",
    text: include_str!("copy.wgsl"),
    entry_point: "copy_words",
};

/// Device-to-device copy rates in TB/s (bytes read plus bytes written per second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyRates {
    /// `copy.wgsl`: 16-byte loads and stores, 4 per thread.
    pub shader: f64,
    /// `copy_buffer_to_buffer` (the driver's copy).
    pub buffer: f64,
}

impl CopyRates {
    /// The faster of the two: the ceiling a memory-bound kernel's traffic is compared with.
    pub fn best(&self) -> f64 {
        self.shader.max(self.buffer)
    }
}

/// The best device-to-device copy rate in TB/s (see [`copy_rates`]).
pub fn copy_tb_per_s(wgpu: &Wgpu, bytes: u64) -> Result<f64> {
    Ok(copy_rates(wgpu, bytes)?.best())
}

/// The device-to-device copy rates from back-to-back copies of `bytes` (capped by the
/// adapter's largest buffer and storage binding), through the copy shader and through
/// `copy_buffer_to_buffer`.
pub fn copy_rates(wgpu: &Wgpu, bytes: u64) -> Result<CopyRates> {
    let limits = wgpu.device().limits();
    let size = bytes
        .min(limits.max_buffer_size)
        .min(limits.max_storage_buffer_binding_size)
        / 16
        * 16;
    let make = || {
        wgpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("deltakv copy rate"),
            size,
            usage: wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let scope = wgpu.error_scope();
    let (src, dst) = (make(), make());
    scope.finish("allocating the copy-rate buffers")?;
    let rate = |us: f64| 2.0 * size as f64 / (us * 1e-6) / 1e12;
    let buffer_us = median_dispatch_us(wgpu, 20, 9, |n| {
        let scope = wgpu.error_scope();
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        for _ in 0..n {
            encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        wgpu.queue().submit([encoder.finish()]);
        scope.finish("copying buffers")
    })?;

    let words = size / 16;
    let groups = words.div_ceil(256 * 4);
    let row = groups.min(u64::from(limits.max_compute_workgroups_per_dimension));
    let rows = groups.div_ceil(row.max(1));
    let pipeline = wgpu.pipeline(&COPY, &[])?;
    let params: Vec<u8> = [words as u32, row as u32, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let uniform = wgpu.buffer_with("copy params", &params, wgpu::BufferUsages::UNIFORM)?;
    let scope = wgpu.error_scope();
    let bind_group = wgpu.device().create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("copy"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: dst.as_entire_binding(),
            },
        ],
    });
    scope.finish("binding the copy shader")?;
    let shader_us = median_dispatch_us(wgpu, 20, 9, |n| {
        let scope = wgpu.error_scope();
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            for _ in 0..n {
                pass.dispatch_workgroups(row as u32, rows as u32, 1);
            }
        }
        wgpu.queue().submit([encoder.finish()]);
        scope.finish("running the copy shader")
    })?;
    Ok(CopyRates {
        shader: rate(shader_us),
        buffer: rate(buffer_us),
    })
}
