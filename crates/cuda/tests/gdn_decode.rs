//! GDN decode on the GPU against the f64 oracle: the same suite and tolerances as the CPU
//! (`deltakv_contract::gdn::decode::check`), plus the GPU's own rules (validation before launch,
//! the pool staying on the device across steps). On a machine without a CUDA device every
//! test prints one "skipped (no CUDA device)" line and passes.

use deltakv_contract::gdn::decode::check::{
    BackendRun, DecodeCheck, check_options, check_refusals, check_refused_slot_rows, decode_suite,
    run_decode_check,
};
use deltakv_contract::gdn::decode::oracle::gdn_decode_reference;
use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, Gating, GdnDims};
use deltakv_contract::{DType, HostTensor, Result};
use deltakv_cuda::gdn::{OneTokenKernel, gdn_decode, gdn_decode_checked, prepare_decode_launch};
use deltakv_cuda::{Cuda, CudaTensor};
use std::io::Write;

/// The oracle's f64 pool as a host tensor of `like`'s shape and dtype (rounded to it), the
/// input of the oracle's next step.
fn f64_pool(like: &HostTensor, values: &[f64]) -> HostTensor {
    let values: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    HostTensor::from_f32_as(like.shape().to_vec(), &values, like.dtype()).unwrap()
}

fn device(test: &str) -> Option<&'static Cuda> {
    match Cuda::get() {
        Ok(cuda) => Some(cuda),
        Err(e) => {
            // Written to stderr directly, past the test harness's capture, so it shows.
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
            None
        }
    }
}

/// A case's tensors on the GPU.
struct DeviceCase {
    q: CudaTensor,
    k: CudaTensor,
    v: CudaTensor,
    gates: Vec<(String, CudaTensor)>,
    slots: CudaTensor,
    pool: CudaTensor,
}

impl DeviceCase {
    fn upload(cuda: &Cuda, case: &DecodeCase) -> Result<Self> {
        let up = |t: &HostTensor| CudaTensor::upload(cuda, t);
        Ok(Self {
            q: up(&case.q)?,
            k: up(&case.k)?,
            v: up(&case.v)?,
            gates: case
                .gates
                .iter()
                .map(|(n, t)| Ok((n.clone(), up(t)?)))
                .collect::<Result<_>>()?,
            slots: up(&case.slot_indices)?,
            pool: up(&case.state_pool)?,
        })
    }

    /// Runs one decode call; the pool is updated in place on the GPU.
    fn run(&mut self, cuda: &Cuda, opts: &DecodeOptions, checked: bool) -> Result<DecodeOutput> {
        let gates = &self.gates;
        let gating =
            Gating::from_lookup(|name| gates.iter().find(|(n, _)| n == name).map(|(_, t)| t))?;
        let inputs = DecodeInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gating,
            slot_indices: &self.slots,
        };
        let out = if checked {
            gdn_decode_checked(cuda, &inputs, &mut self.pool, opts)?
        } else {
            gdn_decode(cuda, &inputs, &mut self.pool, opts)?
        };
        Ok(DecodeOutput {
            o: out.o.download(cuda)?,
            intermediate_states: match out.intermediate_states {
                Some(t) => Some(t.download(cuda)?),
                None => None,
            },
        })
    }
}

fn gpu_backend(cuda: &'static Cuda) -> impl Fn(&DecodeCase, &DecodeOptions) -> Result<BackendRun> {
    move |case, opts| {
        let mut dev = DeviceCase::upload(cuda, case)?;
        let output = dev.run(cuda, opts, false)?;
        Ok(BackendRun {
            output,
            pool: dev.pool.download(cuda)?,
        })
    }
}

#[test]
fn the_decode_suite_against_the_oracle_on_the_gpu() {
    let Some(cuda) = device("decode suite") else {
        return;
    };
    println!("device: {} ({})", cuda.name(), cuda.arch());
    let backend = gpu_backend(cuda);
    let mut worst = [0f64; 3];
    for case in decode_suite() {
        let e = run_decode_check(&case, &backend).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{}: o {:.3e}, intermediate {:.3e}, pool {:.3e}",
            case.name, e.o, e.intermediate_states, e.pool
        );
        for (w, x) in worst.iter_mut().zip([e.o, e.intermediate_states, e.pool]) {
            if x.is_finite() {
                *w = w.max(x);
            }
        }
        // Without intermediate states: the same o and pool as with them.
        let c = DecodeCase::random(&case.spec, case.seed).unwrap();
        let with = backend(&c, &check_options(&case, true)).unwrap();
        let without = backend(&c, &check_options(&case, false)).unwrap();
        assert!(without.output.intermediate_states.is_none());
        assert_eq!(without.output.o, with.output.o, "{}: o", case.name);
        assert_eq!(without.pool, with.pool, "{}: pool", case.name);
    }
    println!(
        "worst rel_rms: o {:.3e}, intermediate {:.3e}, pool {:.3e}",
        worst[0], worst[1], worst[2]
    );
}

/// The K = V = 128, T = 1 kernels are chosen by grid size: B = 2 and B = 8 (Qwen3-Next's 32
/// value heads) run the registers kernel, B = 17 and B = 64 the bands kernel. Each, for both
/// pool dtypes, against the oracle over every input dtype, both gatings, with and without l2
/// norm, and i32 and i64 slots (their loads are issued before any is waited for, so each
/// dtype's path is its own code).
#[test]
fn every_one_token_kernel_over_every_input_form() {
    let Some(cuda) = device("one-token kernels") else {
        return;
    };
    let kernel_of = |batch: usize| {
        let dims = GdnDims {
            batch,
            tokens: 1,
            key_heads: 16,
            value_heads: 32,
            key_dim: 128,
            value_dim: 128,
        };
        OneTokenKernel::select(&dims, cuda.multiprocessors())
    };
    let batches = [2, 8, 17, 64];
    let kernels: Vec<_> = batches.iter().map(|&b| kernel_of(b)).collect();
    for kernel in [OneTokenKernel::Registers, OneTokenKernel::Bands] {
        assert!(
            kernels.contains(&Some(kernel)),
            "no batch size of this test runs {kernel:?}: {kernels:?}"
        );
    }
    let mut worst = [0f64; 3];
    let mut seed = 9500;
    for (&batch, kernel) in batches.iter().zip(&kernels) {
        for pool_dtype in [DType::F32, DType::BF16] {
            for (dtype, fused_gating, use_qk_l2norm, i64_slots) in [
                (DType::BF16, true, true, false),
                (DType::F16, false, true, true),
                (DType::F32, true, false, false),
                (DType::BF16, false, false, true),
            ] {
                seed += 1;
                let mut spec = DecodeSpec::new(batch, 1, 16, 32, 128, 128);
                spec.pool_dtype = pool_dtype;
                spec.dtype = dtype;
                spec.fused_gating = fused_gating;
                spec.raw_qk = use_qk_l2norm;
                spec.skipped_rows = vec![1];
                let check = DecodeCheck {
                    name: format!(
                        "Qwen3-Next B={batch} ({kernel:?}) pool {pool_dtype}, {dtype} inputs, {} gating, l2 norm {use_qk_l2norm}, {} slots",
                        if fused_gating { "fused" } else { "direct" },
                        if i64_slots { "i64" } else { "i32" }
                    ),
                    spec,
                    use_qk_l2norm,
                    seed,
                };
                let backend = gpu_backend(cuda);
                let widened = |case: &DecodeCase, opts: &DecodeOptions| {
                    let mut case = case.clone();
                    if i64_slots {
                        let slots = case.slot_indices.to_i64_vec("slot_indices")?;
                        case.slot_indices =
                            HostTensor::from_i64(case.slot_indices.shape().to_vec(), slots)?;
                    }
                    backend(&case, opts)
                };
                let e = run_decode_check(&check, &widened).unwrap_or_else(|e| panic!("{e}"));
                for (w, x) in worst.iter_mut().zip([e.o, e.intermediate_states, e.pool]) {
                    *w = w.max(x);
                }
            }
        }
    }
    println!(
        "one-token kernels, 32 cases: worst rel_rms o {:.3e}, intermediate {:.3e}, pool {:.3e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn steps_on_the_gpu_pool_match_oracle_steps() {
    let Some(cuda) = device("serving loop") else {
        return;
    };
    // Qwen3-Next's shape, fused gating, l2 norm: eight steps with the pool left on the GPU.
    let mut spec = DecodeSpec::new(5, 1, 16, 32, 128, 128);
    spec.fused_gating = true;
    spec.raw_qk = true;
    spec.skipped_rows = vec![2];
    let opts = DecodeOptions {
        gdn: deltakv_contract::gdn::GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        },
        intermediate_states: false,
    };
    let first = DecodeCase::random(&spec, 7000).unwrap();
    // The oracle's pool after each step, carried in f64.
    let mut reference_pool = first.state_pool.to_f64_vec("pool").unwrap();
    let mut gpu_pool = CudaTensor::upload(cuda, &first.state_pool).unwrap();
    for step in 0..8u64 {
        let case = DecodeCase::random(&spec, 7000 + step).unwrap();
        let pool_before = f64_pool(&first.state_pool, &reference_pool);
        let reference =
            gdn_decode_reference(&case.inputs().unwrap(), &pool_before, &opts.gdn).unwrap();
        reference_pool = reference.state_pool;
        let mut dev = DeviceCase::upload(cuda, &case).unwrap();
        std::mem::swap(&mut dev.pool, &mut gpu_pool);
        let gpu = dev.run(cuda, &opts, true).unwrap();
        std::mem::swap(&mut dev.pool, &mut gpu_pool);
        let err = deltakv_contract::metrics::rel_rms(&gpu.o.to_f32_vec("o").unwrap(), &reference.o);
        assert!(
            err < 2e-3,
            "step {step}: o differs from the oracle by {err:.3e}"
        );
    }
    let gpu_pool = gpu_pool.download(cuda).unwrap();
    let err =
        deltakv_contract::metrics::rel_rms(&gpu_pool.to_f32_vec("pool").unwrap(), &reference_pool);
    println!("8 steps on the GPU pool: pool rel_rms against the oracle {err:.3e}");
    assert!(
        err < 1e-5,
        "pool after 8 steps differs from the oracle by {err:.3e}"
    );
}

#[test]
fn bad_calls_are_refused_before_launch_and_leave_the_pool_alone() {
    let Some(cuda) = device("bad calls") else {
        return;
    };
    check_refusals(&|case, checked| {
        let mut dev = DeviceCase::upload(cuda, case).unwrap();
        let outcome = (dev.run(cuda, &DecodeOptions::default(), checked))
            .map(|_| ())
            .map_err(|e| e.to_string());
        (outcome, dev.pool.download(cuda).unwrap())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A prepared launch replayed after its slot indices were rewritten on the device (the host
/// check cannot see that): an index past the pool touches no slot and leaves NaN in its row's
/// o, a negative one zeros; every other row and the whole pool are what a checked call with
/// that row skipped gives, bit for bit. Each decode kernel: one token at a small and a large
/// batch (the register and band kernels at Qwen3-Next's heads), and three tokens.
#[test]
fn a_replayed_launch_refuses_slot_indices_past_the_pool() {
    let Some(cuda) = device("replayed slot indices") else {
        return;
    };
    for (batch, tokens, seed) in [(4, 1, 9601), (64, 1, 9602), (5, 3, 9603)] {
        let spec = DecodeSpec::new(batch, tokens, 16, 32, 128, 128);
        let case = DecodeCase::random(&spec, seed).unwrap();
        let opts = DecodeOptions::default();
        let mut dev = DeviceCase::upload(cuda, &case).unwrap();
        let slot_count = dev.pool.shape()[0] as i64;
        let mut o = CudaTensor::zeros(cuda, vec![batch, tokens, 32, 128], case.v.dtype()).unwrap();
        let gates = &dev.gates;
        let gating =
            Gating::from_lookup(|name| gates.iter().find(|(n, _)| n == name).map(|(_, t)| t))
                .unwrap();
        let inputs = DecodeInputs {
            q: &dev.q,
            k: &dev.k,
            v: &dev.v,
            gating,
            slot_indices: &dev.slots,
        };
        let launch =
            prepare_decode_launch(cuda, &inputs, &mut dev.pool, &opts.gdn, &mut o, None).unwrap();
        // Row 1 skipped, row 2 past the pool.
        let mut slots = case.slot_indices.to_i64_vec("slot_indices").unwrap();
        slots[1] = -1;
        slots[2] = slot_count + 7;
        let rewritten =
            HostTensor::from_i32(vec![batch], slots.iter().map(|&s| s as i32).collect()).unwrap();
        dev.slots.copy_from_host(cuda, &rewritten).unwrap();
        // SAFETY: every tensor the launch was prepared from is alive in `dev` and `o`; the
        // rewritten indices are the point of the test (the kernel's own range check).
        unsafe { launch.launch(cuda) }.unwrap();
        cuda.synchronize().unwrap();
        let got_o = o.download(cuda).unwrap();
        let got_pool = dev.pool.download(cuda).unwrap();
        // The same rows through a checked call, row 2 skipped.
        let mut skipped = case.clone();
        slots[2] = -1;
        skipped.slot_indices =
            HostTensor::from_i32(vec![batch], slots.iter().map(|&s| s as i32).collect()).unwrap();
        let mut reference = DeviceCase::upload(cuda, &skipped).unwrap();
        let want = reference.run(cuda, &opts, false).unwrap();
        check_refused_slot_rows(&got_o, &want.o, 2, 1)
            .unwrap_or_else(|e| panic!("B={batch} T={tokens}: {e}"));
        assert_eq!(
            got_pool,
            reference.pool.download(cuda).unwrap(),
            "B={batch} T={tokens}: the pool differs from the checked call's"
        );
        let dims = GdnDims {
            batch,
            tokens,
            key_heads: 16,
            value_heads: 32,
            key_dim: 128,
            value_dim: 128,
        };
        let kernel = OneTokenKernel::select(&dims, cuda.multiprocessors());
        println!(
            "B={batch} T={tokens} ({kernel:?}): the row past the pool is NaN, the pool untouched by it"
        );
    }
}

#[test]
fn borrowed_views_are_checked_without_a_gpu() {
    for (address, fragment) in [
        (0u64, "non-null"),
        (6, "aligned to its 4-byte f32 elements"),
    ] {
        // SAFETY: the view is refused before any use of the address.
        let err = unsafe { CudaTensor::from_device_ptr(address, vec![2, 3], DType::F32) }
            .unwrap_err()
            .to_string();
        assert!(err.contains(fragment), "{err}");
    }
    // SAFETY: as above (a shape whose byte count overflows).
    let err = unsafe { CudaTensor::from_device_ptr(256, vec![usize::MAX, 4], DType::F32) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("too large"), "{err}");
}

#[test]
fn decode_through_borrowed_views_updates_the_callers_memory_in_place() {
    let Some(cuda) = device("borrowed views") else {
        return;
    };
    let mut spec = DecodeSpec::new(4, 1, 16, 32, 128, 128);
    spec.fused_gating = true;
    let case = DecodeCase::random(&spec, 9900).unwrap();
    let opts = DecodeOptions::default();
    // Reference: the same call on deltakv-owned tensors.
    let mut owned = DeviceCase::upload(cuda, &case).unwrap();
    let expected_o = owned.run(cuda, &opts, false).unwrap().o;
    let expected_pool = owned.pool.download(cuda).unwrap();
    // The "engine's" buffers: allocated elsewhere, wrapped without a copy.
    let engine = DeviceCase::upload(cuda, &case).unwrap();
    let view = |t: &CudaTensor| {
        // SAFETY: `t` is a live allocation of exactly this shape in deltakv's context and
        // outlives the view; nothing else uses it meanwhile.
        unsafe { CudaTensor::from_device_ptr(t.device_ptr(cuda), t.shape().to_vec(), t.dtype()) }
            .unwrap()
    };
    let mut borrowed = DeviceCase {
        q: view(&engine.q),
        k: view(&engine.k),
        v: view(&engine.v),
        gates: engine
            .gates
            .iter()
            .map(|(n, t)| (n.clone(), view(t)))
            .collect(),
        slots: view(&engine.slots),
        pool: view(&engine.pool),
    };
    assert!(borrowed.pool.is_borrowed() && !engine.pool.is_borrowed());
    let o = borrowed.run(cuda, &opts, false).unwrap().o;
    assert_eq!(o, expected_o, "o through borrowed views");
    // The engine's own pool buffer holds the update: no copy was made.
    assert_eq!(engine.pool.download(cuda).unwrap(), expected_pool);
    assert_eq!(borrowed.pool.download(cuda).unwrap(), expected_pool);
}
