//! `deltakv demo` on a machine with a GPU: the same prefill on CUDA, checked against the same
//! oracle heads with the GPU suite's tolerances (the tensor-core products take bf16 operands).

use deltakv::gdn::random::GdnCase;
use deltakv::gdn::{GdnOptions, PrefillMode};
use deltakv::metrics::rel_rms;
use deltakv::{Device, HostTensor, Result, gdn_prefill};
use std::time::Instant;

/// The GPU prefill's tolerances on o and the final state (rel_rms against the f64 oracle).
const GPU_TOLERANCE: f64 = 4e-3;

/// Runs the prefill on CUDA when a GPU is present and prints one line; `pick` and
/// `pick_state` select the oracle's heads. Returns whether it is within tolerance (true when
/// skipped).
pub fn run(
    case: &GdnCase,
    options: &GdnOptions,
    pick: &dyn Fn(&HostTensor) -> Result<Vec<f32>>,
    pick_state: &dyn Fn(&HostTensor) -> Vec<f32>,
    reference: &deltakv::gdn::oracle::GdnReference,
) -> Result<bool> {
    if let Err(e) = Device::Cuda.ensure_available() {
        println!("prefill on cuda: skipped ({e})");
        return Ok(true);
    }
    // The first call compiles the kernels; the second is timed.
    gdn_prefill(Device::Cuda, &case.inputs(), options, PrefillMode::Chunk)?;
    let started = Instant::now();
    let out = gdn_prefill(Device::Cuda, &case.inputs(), options, PrefillMode::Chunk)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let o_err = rel_rms(&pick(&out.o)?, &reference.o);
    let s_err = rel_rms(&pick_state(&out.final_state), &reference.final_state);
    let ok = o_err < GPU_TOLERANCE && s_err < GPU_TOLERANCE;
    println!(
        "prefill on cuda (tensor cores, with the copies to and from the GPU): {ms:.1} ms; o rel_rms {o_err:.2e}, final_state {s_err:.2e}: {}",
        if ok {
            format!("PASS (< {GPU_TOLERANCE:e})")
        } else {
            "FAIL: error above tolerance".to_string()
        }
    );
    Ok(ok)
}
