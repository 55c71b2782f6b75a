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
