//! Kernel timing for benchmarks: launches captured into a CUDA graph, replayed between two
//! CUDA events, so the figure is GPU time per launch with no host launch overhead (as
//! `triton.testing.do_bench_cudagraph` times FLA's kernels).

use crate::runtime::{Cuda, driver_error};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use deltakv_contract::Result;

/// Median GPU microseconds per launch of `launch` over `samples` replays of a graph holding
/// `per_graph` launches back to back (after two warm-up replays).
pub fn median_graph_us(
    cuda: &Cuda,
    per_graph: usize,
    samples: usize,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let stream = cuda.stream();
    // One eager launch first: compiles and loads the kernel outside the capture.
    launch()?;
    cuda.synchronize()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| driver_error("starting a graph capture", e))?;
    let captured = (0..per_graph).try_for_each(|_| launch());
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph
        .map_err(|e| driver_error("ending a graph capture", e))?
        .ok_or_else(|| {
            driver_error(
                "a graph capture",
                cudarc::driver::DriverError(
                    cudarc::driver::sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                ),
            )
        })?;
    let event = || {
        cuda.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("creating an event", e))
    };
    let (start, end) = (event()?, event()?);
    for _ in 0..2 {
        graph
            .launch()
            .map_err(|e| driver_error("replaying a graph", e))?;
    }
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        start
            .record(stream)
            .map_err(|e| driver_error("recording an event", e))?;
        graph
            .launch()
            .map_err(|e| driver_error("replaying a graph", e))?;
        end.record(stream)
            .map_err(|e| driver_error("recording an event", e))?;
        end.synchronize()
            .map_err(|e| driver_error("waiting for an event", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| driver_error("reading an event time", e))?;
        times.push(f64::from(ms) * 1e3 / per_graph as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Median GPU microseconds of a device-to-device copy of `bytes` bytes (graph replays, as
/// [`median_graph_us`]): the memory-bandwidth floor benchmarks compare against.
pub fn median_copy_us(cuda: &Cuda, bytes: usize) -> Result<f64> {
    let stream = cuda.stream();
    let alloc = || {
        stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| driver_error(&format!("allocating {bytes} bytes on the GPU"), e))
    };
    let (src, mut dst) = (alloc()?, alloc()?);
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let from = src.device_ptr(stream).0;
    let to = dst.device_ptr_mut(stream).0;
    median_graph_us(cuda, 5, 20, || {
        // SAFETY: both buffers hold `bytes` bytes, do not overlap, and outlive the graph.
        unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, bytes, stream.cu_stream()) }
            .map_err(|e| driver_error("copying on the GPU", e))
    })
}
