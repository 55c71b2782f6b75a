//! GDN prefill with an initial state on a caller's stream ([`Cuda::on_stream`], as the Python
//! package runs on PyTorch's current stream), against the f64 oracle: on deltakv's own stream,
//! on the legacy default stream, and on a borrowed non-blocking stream (what
//! `torch.cuda.Stream()` creates) where the caller's pending work (a GPU spin, then the write of
//! the initial state into a buffer that held NaN) precedes the call, so a read ordered on any
//! other stream sees NaN. Each case also runs through the lockstep state pass (asked for by
//! checkpoints), so a wrong figure says whether the stream or the state pass is at fault. Every
//! figure is printed before any assertion. Shapes: the Python side-stream test's (B 2, T 200,
//! K = V = 128, l2, f32 and bf16), varlen, a segmented (two-level scan) one and the same relayed
//! (whose first segments run on a second stream forked from the caller's). On a machine
//! without a CUDA device the test prints one "skipped (no CUDA device)" line and passes.

use cudarc::driver::sys::CUstream;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use deltakv_contract::gdn::oracle::{GdnReference, gdn_reference};
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnInputs, GdnOptions};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, Result};
use deltakv_cuda::compile::KernelSource;
use deltakv_cuda::gdn::{PrefillStates, Split, gdn_prefill_checkpointed};
use deltakv_cuda::{Cuda, CudaTensor};
use std::io::Write;

/// The bounds of the prefill suite (`gdn_prefill.rs`): bf16 products, f32 state.
const TOLERANCE: f64 = 4.0e-3;

/// A kernel that keeps its stream busy for `cycles` clock ticks (a caller's earlier work).
const SPIN: KernelSource = KernelSource {
    name: "stream_test_spin",
    text: r#"
extern "C" __global__ void stream_test_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"#,
};

/// About 50 ms at the H100's 1.98 GHz: long enough that anything not ordered after it runs
/// first.
const SPIN_CYCLES: i64 = 100_000_000;

/// The driver's `CU_STREAM_LEGACY` handle.
const LEGACY_STREAM: usize = 0x1;

fn device(test: &str) -> Option<&'static Cuda> {
    match Cuda::get() {
        Ok(cuda) => Some(cuda),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
            None
        }
    }
}

/// One problem of the test, uploaded on deltakv's stream.
struct Uploaded {
    q: CudaTensor,
    k: CudaTensor,
    v: CudaTensor,
    g: CudaTensor,
    beta: CudaTensor,
    initial_state: CudaTensor,
    cu_seqlens: Option<CudaTensor>,
}

impl Uploaded {
    fn new(cuda: &Cuda, case: &GdnCase) -> Result<Self> {
        let up = |t| CudaTensor::upload(cuda, t);
        let initial = case
            .initial_state
            .as_ref()
            .expect("every case has an initial state");
        let uploaded = Self {
            q: up(&case.q)?,
            k: up(&case.k)?,
            v: up(&case.v)?,
            g: up(&case.g)?,
            beta: up(&case.beta)?,
            initial_state: up(initial)?,
            cu_seqlens: case.cu_seqlens.as_ref().map(up).transpose()?,
        };
        cuda.synchronize()?;
        Ok(uploaded)
    }

    /// The inputs, reading the initial state from `initial_state`.
    fn inputs<'a>(&'a self, initial_state: &'a CudaTensor) -> GdnInputs<'a, CudaTensor> {
        GdnInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: Some(initial_state),
            cu_seqlens: self.cu_seqlens.as_ref(),
        }
    }
}

/// Runs the prefill on `on` (the overlapped state pass where it exists, or with `lockstep`
/// the lockstep pass, which checkpoints every 64 tokens ask for) and returns the errors of o
/// and the final state against the oracle. The results are read back on `on`.
fn run(
    on: &Cuda,
    inputs: &GdnInputs<'_, CudaTensor>,
    options: &GdnOptions,
    reference: &GdnReference,
    lockstep: bool,
    split: Split,
) -> Result<(f64, f64)> {
    let states = PrefillStates::Separate {
        output_final_state: true,
    };
    let checkpoint_every = lockstep.then_some(64);
    let out = gdn_prefill_checkpointed(on, inputs, options, states, checkpoint_every, split)?;
    let o = out.o.download(on)?.to_f32_vec("o")?;
    let final_state = out
        .final_state
        .as_ref()
        .expect("the final state was asked for")
        .download(on)?;
    Ok((
        rel_rms(&o, &reference.o),
        rel_rms(final_state.as_f32().unwrap_or(&[]), &reference.final_state),
    ))
}

/// Queues on `stream` a GPU spin, then the copy of `source` into `target` (which holds NaN
/// until then): a caller's pending writes to the initial state.
fn write_behind_a_spin(
    cuda: &Cuda,
    stream: &Cuda,
    source: &CudaTensor,
    target: &mut CudaTensor,
) -> Result<()> {
    let spin = cuda.function(&SPIN, "stream_test_spin")?;
    let mut builder = stream.stream().launch_builder(&spin);
    builder.arg(&SPIN_CYCLES);
    let config = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let fail = |what: &str, e| deltakv_cuda::runtime::driver_error(what, e);
    // SAFETY: the kernel takes one i64 and touches no memory.
    unsafe { builder.launch(config) }.map_err(|e| fail("launching the spin", e))?;
    let (src, dst) = (source.device_ptr(stream), target.device_ptr(stream));
    // SAFETY: both buffers hold the same `byte_len` bytes and do not overlap; the copy is
    // queued on `stream`, which the test synchronises before either buffer is dropped.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(
            dst,
            src,
            source.byte_len(),
            stream.stream().cu_stream(),
        )
    }
    .map_err(|e| fail("copying the initial state", e))
}

fn options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

#[test]
fn prefill_with_an_initial_state_on_a_borrowed_stream() {
    let Some(cuda) = device("prefill_with_an_initial_state_on_a_borrowed_stream") else {
        return;
    };
    // The caller's stream: non-blocking (as PyTorch's side streams), on deltakv's context,
    // owned by the test and alive past every buffer allocated on it.
    let side = cuda.context().new_stream().expect("creating a stream");
    // SAFETY: `side` and the legacy default stream are streams of deltakv's context; `side`
    // outlives every handle and buffer of the test (dropped last).
    let caller = unsafe { cuda.on_stream(side.cu_stream()) };
    let legacy = unsafe { cuda.on_stream(LEGACY_STREAM as CUstream) };

    let mut python_f32 = GdnSpec::new(200, 2, 4, 128, 128);
    python_f32.batch = 2;
    python_f32.dtype = DType::F32;
    python_f32.raw_qk = true;
    python_f32.with_initial_state = true;
    let mut python_bf16 = python_f32.clone();
    python_bf16.dtype = DType::BF16;
    let mut varlen = GdnSpec::new(1 + 70 + 129, 1, 2, 64, 64);
    varlen.seq_lens = Some(vec![1, 70, 129]);
    varlen.with_initial_state = true;
    // One sequence of 16 chunks over 8 blocks: the two-level scan (combine reads the state).
    let mut segmented = GdnSpec::new(1000, 2, 4, 128, 64);
    segmented.raw_qk = true;
    segmented.with_initial_state = true;
    let auto = Split::Auto;
    let cases = [
        (
            "B2 T200 K=V=128 l2 f32 (the Python test's)",
            python_f32,
            true,
            61,
            auto,
        ),
        ("B2 T200 K=V=128 l2 bf16", python_bf16, true, 62, auto),
        ("varlen K=V=64", varlen, false, 63, auto),
        (
            "segmented T1000 K128 V64 l2",
            segmented.clone(),
            true,
            64,
            auto,
        ),
        (
            "relayed T1000 K128 V64 l2",
            segmented,
            true,
            65,
            Split::Relay(11),
        ),
    ];

    let mut failures = Vec::new();
    for (name, spec, l2, seed, split) in cases {
        let case = GdnCase::random(&spec, seed).unwrap();
        let options = options(l2);
        let reference = gdn_reference(&case.inputs(), &options).unwrap();
        let uploaded = Uploaded::new(cuda, &case).unwrap();
        for lockstep in [false, true] {
            let pass = if lockstep { "lockstep" } else { "default pass" };
            let inputs = uploaded.inputs(&uploaded.initial_state);
            let mut figures = vec![
                (
                    "deltakv's stream",
                    run(cuda, &inputs, &options, &reference, lockstep, split),
                ),
                (
                    "legacy stream",
                    run(&legacy, &inputs, &options, &reference, lockstep, split),
                ),
                (
                    "borrowed stream",
                    run(&caller, &inputs, &options, &reference, lockstep, split),
                ),
            ];
            // The borrowed stream with the caller's pending writes: the initial state is a
            // NaN buffer until the side stream, behind a spin, copies the values into it.
            let mut pending =
                CudaTensor::poisoned(cuda, uploaded.initial_state.shape().to_vec(), DType::F32)
                    .unwrap();
            cuda.synchronize().unwrap();
            let behind = write_behind_a_spin(cuda, &caller, &uploaded.initial_state, &mut pending)
                .and_then(|()| {
                    let inputs = uploaded.inputs(&pending);
                    run(&caller, &inputs, &options, &reference, lockstep, split)
                });
            figures.push(("borrowed stream, pending writes", behind));
            caller.synchronize().unwrap();
            for (stream, figure) in figures {
                match figure {
                    Ok((o, s)) => {
                        eprintln!("{name}, {pass}, {stream}: o {o:.3e}, final state {s:.3e}");
                        // `!(x < bound)` also catches NaN.
                        if !(o < TOLERANCE && s < TOLERANCE) {
                            failures.push(format!("{name}, {pass}, {stream}: o {o:.3e}, {s:.3e}"));
                        }
                    }
                    Err(e) => failures.push(format!("{name}, {pass}, {stream}: {e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "failed: {failures:#?}");
    drop((caller, legacy));
    drop(side);
}
