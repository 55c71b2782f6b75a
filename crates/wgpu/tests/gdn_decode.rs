//! GDN decode on wgpu against the f64 oracle: the same suite and tolerances as the CPU
//! (`deltakv_contract::gdn::decode::check`), plus the device's own rules (validation before
//! dispatch, the pool staying on the device across steps). On a machine without an adapter
//! every test prints one "skipped (no wgpu adapter)" line and passes, except in CI.

mod common;

use deltakv_contract::gdn::decode::check::{
    BackendRun, check_options, check_refusals, check_refused_slot_rows, decode_suite,
    run_decode_check,
};
use deltakv_contract::gdn::decode::oracle::gdn_decode_reference;
use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, DecodeOutput, Gating};
use deltakv_contract::{HostTensor, Result};
use deltakv_wgpu::gdn::{DecodeTile, gdn_decode, gdn_decode_checked, prepare_decode_launch_tiled};
use deltakv_wgpu::{Wgpu, WgpuTensor};

/// The oracle's f64 pool as a host tensor of `like`'s shape and dtype (rounded to it), the
/// input of the oracle's next step.
fn f64_pool(like: &HostTensor, values: &[f64]) -> HostTensor {
    let values: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    HostTensor::from_f32_as(like.shape().to_vec(), &values, like.dtype()).unwrap()
}

/// A case's inputs on the device.
struct DeviceInputs {
    q: WgpuTensor,
    k: WgpuTensor,
    v: WgpuTensor,
    gates: Vec<(String, WgpuTensor)>,
    slots: WgpuTensor,
}

impl DeviceInputs {
    /// The call's inputs, the gating found by name.
    fn get(&self) -> Result<DecodeInputs<'_, WgpuTensor>> {
        let gates = &self.gates;
        let gating =
            Gating::from_lookup(|name| gates.iter().find(|(n, _)| n == name).map(|(_, t)| t))?;
        Ok(DecodeInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gating,
            slot_indices: &self.slots,
        })
    }
}

/// A case's tensors on the device: its inputs and its pool.
struct DeviceCase {
    inputs: DeviceInputs,
    pool: WgpuTensor,
}

impl DeviceCase {
    fn upload(wgpu: &Wgpu, case: &DecodeCase) -> Result<Self> {
        let up = |t: &HostTensor| WgpuTensor::upload(wgpu, t);
        Ok(Self {
            inputs: DeviceInputs {
                q: up(&case.q)?,
                k: up(&case.k)?,
                v: up(&case.v)?,
                gates: case
                    .gates
                    .iter()
                    .map(|(n, t)| Ok((n.clone(), up(t)?)))
                    .collect::<Result<_>>()?,
                slots: up(&case.slot_indices)?,
            },
            pool: up(&case.state_pool)?,
        })
    }

    /// Runs one decode call; the pool is updated in place on the device.
    fn run(&mut self, wgpu: &Wgpu, opts: &DecodeOptions, checked: bool) -> Result<DecodeOutput> {
        let inputs = self.inputs.get()?;
        let out = if checked {
            gdn_decode_checked(wgpu, &inputs, &mut self.pool, opts)?
        } else {
            gdn_decode(wgpu, &inputs, &mut self.pool, opts)?
        };
        Ok(DecodeOutput {
            o: out.o.download(wgpu)?,
            intermediate_states: match out.intermediate_states {
                Some(t) => Some(t.download(wgpu)?),
                None => None,
            },
        })
    }
}

fn device_backend(
    wgpu: &'static Wgpu,
) -> impl Fn(&DecodeCase, &DecodeOptions) -> Result<BackendRun> {
    move |case, opts| {
        let mut dev = DeviceCase::upload(wgpu, case)?;
        let output = dev.run(wgpu, opts, false)?;
        Ok(BackendRun {
            output,
            pool: dev.pool.download(wgpu)?,
        })
    }
}

#[test]
fn the_decode_suite_against_the_oracle_on_wgpu() {
    let Some(wgpu) = common::device("decode suite") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let backend = device_backend(wgpu);
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

/// Runs a case with the kernel and tile `tile` (poisoned outputs, one submission).
fn tiled_backend(
    wgpu: &'static Wgpu,
    tile: DecodeTile,
) -> impl Fn(&DecodeCase, &DecodeOptions) -> Result<BackendRun> {
    move |case, opts| {
        let mut dev = DeviceCase::upload(wgpu, case)?;
        let inputs = dev.inputs.get()?;
        let [b, t, h, vd] = case.v.shape().try_into().expect("v is [B, T, H, V]");
        let kd = case.k.shape()[3];
        let mut o = WgpuTensor::poisoned(wgpu, vec![b, t, h, vd], case.v.dtype())?;
        let mut states = match opts.intermediate_states {
            true => Some(WgpuTensor::poisoned(
                wgpu,
                vec![b, t, h, kd, vd],
                deltakv_contract::DType::F32,
            )?),
            false => None,
        };
        prepare_decode_launch_tiled(
            wgpu,
            &inputs,
            &mut dev.pool,
            &opts.gdn,
            &mut o,
            states.as_mut(),
            tile,
        )?
        .submit(wgpu, 1)?;
        Ok(BackendRun {
            output: DecodeOutput {
                o: o.download(wgpu)?,
                intermediate_states: states.map(|s| s.download(wgpu)).transpose()?,
            },
            pool: dev.pool.download(wgpu)?,
        })
    }
}

#[test]
fn every_decode_tile_against_the_oracle() {
    let Some(wgpu) = common::device("decode tiles") else {
        return;
    };
    for tile in DecodeTile::COMPARED {
        let name = tile.label();
        let backend = tiled_backend(wgpu, tile);
        let mut worst = [0f64; 3];
        let mut ran = 0;
        for case in decode_suite() {
            if tile == DecodeTile::Bands && !case.spec.value_dim.is_multiple_of(4) {
                // The bands kernel refuses V not a multiple of 4 (Auto takes `pairs` there).
                let c = DecodeCase::random(&case.spec, case.seed).unwrap();
                match backend(&c, &check_options(&case, false)) {
                    Err(e) => assert!(e.to_string().contains("multiple of 4"), "{e}"),
                    Ok(_) => panic!("{name} ran V = {}", case.spec.value_dim),
                }
                continue;
            }
            let e = run_decode_check(&case, &backend).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (w, x) in worst.iter_mut().zip([e.o, e.intermediate_states, e.pool]) {
                if x.is_finite() {
                    *w = w.max(x);
                }
            }
            ran += 1;
        }
        assert!(ran > 30, "{name}: only {ran} cases ran");
        println!(
            "{name}: {ran} cases, worst rel_rms: o {:.3e}, intermediate {:.3e}, pool {:.3e}",
            worst[0], worst[1], worst[2]
        );
    }
}

#[test]
fn steps_on_the_device_pool_match_oracle_steps() {
    let Some(wgpu) = common::device("serving loop") else {
        return;
    };
    // Qwen3-Next's shape, fused gating, l2 norm: eight steps with the pool left on the device.
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
    let mut device_pool = WgpuTensor::upload(wgpu, &first.state_pool).unwrap();
    for step in 0..8u64 {
        let case = DecodeCase::random(&spec, 7000 + step).unwrap();
        let pool_before = f64_pool(&first.state_pool, &reference_pool);
        let reference =
            gdn_decode_reference(&case.inputs().unwrap(), &pool_before, &opts.gdn).unwrap();
        reference_pool = reference.state_pool;
        let mut dev = DeviceCase::upload(wgpu, &case).unwrap();
        std::mem::swap(&mut dev.pool, &mut device_pool);
        let on_device = dev.run(wgpu, &opts, true).unwrap();
        std::mem::swap(&mut dev.pool, &mut device_pool);
        let err =
            deltakv_contract::metrics::rel_rms(&on_device.o.to_f32_vec("o").unwrap(), &reference.o);
        assert!(
            err < 2e-3,
            "step {step}: o differs from the oracle by {err:.3e}"
        );
    }
    let device_pool = device_pool.download(wgpu).unwrap();
    let err = deltakv_contract::metrics::rel_rms(
        &device_pool.to_f32_vec("pool").unwrap(),
        &reference_pool,
    );
    println!("8 steps on the device pool: pool rel_rms against the oracle {err:.3e}");
    assert!(
        err < 1e-5,
        "pool after 8 steps differs from the oracle by {err:.3e}"
    );
}

#[test]
fn bad_calls_are_refused_before_launch_and_leave_the_pool_alone() {
    let Some(wgpu) = common::device("bad calls") else {
        return;
    };
    check_refusals(&|case, checked| {
        let mut dev = DeviceCase::upload(wgpu, case).unwrap();
        let outcome = (dev.run(wgpu, &DecodeOptions::default(), checked))
            .map(|_| ())
            .map_err(|e| e.to_string());
        (outcome, dev.pool.download(wgpu).unwrap())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_tensor_beyond_one_storage_binding_is_refused_by_name() {
    let Some(wgpu) = common::device("binding limit") else {
        return;
    };
    // Intermediate states [B, 16, 1, 128, 128] f32 one state larger than the largest binding.
    let limits = wgpu.device().limits();
    let state_bytes = 128 * 128 * 4;
    let states = limits.max_storage_buffer_binding_size as usize / state_bytes + 1;
    let batch = states.div_ceil(16);
    let bytes = (batch * 16 * state_bytes) as u64;
    if bytes > limits.max_buffer_size {
        println!(
            "binding limit: skipped (the adapter's largest buffer holds less than one binding plus a state)"
        );
        return;
    }
    let spec = DecodeSpec::new(batch, 16, 1, 1, 128, 128);
    let case = DecodeCase::random(&spec, 5).unwrap();
    let mut dev = DeviceCase::upload(wgpu, &case).unwrap();
    let pool_before = dev.pool.download(wgpu).unwrap();
    let inputs = dev.inputs.get().unwrap();
    let mut o = WgpuTensor::zeros(wgpu, vec![batch, 16, 1, 128], case.v.dtype()).unwrap();
    let mut states = WgpuTensor::zeros(
        wgpu,
        vec![batch, 16, 1, 128, 128],
        deltakv_contract::DType::F32,
    )
    .unwrap();
    let refused = prepare_decode_launch_tiled(
        wgpu,
        &inputs,
        &mut dev.pool,
        &DecodeOptions::default().gdn,
        &mut o,
        Some(&mut states),
        DecodeTile::Auto,
    );
    let message = refused
        .err()
        .expect("intermediate states beyond one binding accepted")
        .to_string();
    assert!(
        message.contains("intermediate states") && message.contains("largest storage binding"),
        "{message}"
    );
    assert_eq!(
        dev.pool.download(wgpu).unwrap(),
        pool_before,
        "the pool changed"
    );
    println!("binding limit: {message}");
}

/// A prepared launch submitted after its slot indices were rewritten on the device (the host
/// check cannot see that): an index past the pool touches no slot (wgpu's clamped indexing
/// would have written the last one) and leaves NaN in its row's o, a negative one zeros; every
/// other row and the whole pool are what a call with that row skipped gives, bit for bit. Both
/// tiles, one token and three, and i64 indices (one past 2^32, so its high word is set).
#[test]
fn a_replayed_launch_refuses_slot_indices_past_the_pool() {
    let Some(wgpu) = common::device("replayed slot indices") else {
        return;
    };
    let batch = 5;
    for tile in DecodeTile::COMPARED {
        for (tokens, wide) in [(1, false), (3, false), (1, true)] {
            let spec = DecodeSpec::new(batch, tokens, 2, 4, 32, 64);
            let mut case = DecodeCase::random(&spec, 9700 + tokens as u64).unwrap();
            let mut slots = case.slot_indices.to_i64_vec("slot_indices").unwrap();
            if wide {
                case.slot_indices = HostTensor::from_i64(vec![batch], slots.clone()).unwrap();
            }
            let opts = DecodeOptions::default();
            let mut dev = DeviceCase::upload(wgpu, &case).unwrap();
            let slot_count = dev.pool.shape()[0] as i64;
            let mut o =
                WgpuTensor::poisoned(wgpu, vec![batch, tokens, 4, 64], case.v.dtype()).unwrap();
            let inputs = dev.inputs.get().unwrap();
            let launch = prepare_decode_launch_tiled(
                wgpu,
                &inputs,
                &mut dev.pool,
                &opts.gdn,
                &mut o,
                None,
                tile,
            )
            .unwrap();
            slots[1] = -1;
            slots[2] = if wide { (1 << 33) + 1 } else { slot_count + 3 };
            let bytes: Vec<u8> = if wide {
                slots.iter().flat_map(|s| s.to_le_bytes()).collect()
            } else {
                slots
                    .iter()
                    .flat_map(|&s| (s as i32).to_le_bytes())
                    .collect()
            };
            wgpu.queue()
                .write_buffer(dev.inputs.slots.buffer(), 0, &bytes);
            launch.submit(wgpu, 1).unwrap();
            let got_o = o.download(wgpu).unwrap();
            let got_pool = dev.pool.download(wgpu).unwrap();
            let mut skipped = case.clone();
            slots[2] = -1;
            skipped.slot_indices = HostTensor::from_i64(vec![batch], slots.clone()).unwrap();
            // The same tile, so that the rows compare bit for bit.
            let mut reference = DeviceCase::upload(wgpu, &skipped).unwrap();
            let mut want_o =
                WgpuTensor::poisoned(wgpu, vec![batch, tokens, 4, 64], case.v.dtype()).unwrap();
            let reference_inputs = reference.inputs.get().unwrap();
            prepare_decode_launch_tiled(
                wgpu,
                &reference_inputs,
                &mut reference.pool,
                &opts.gdn,
                &mut want_o,
                None,
                tile,
            )
            .unwrap()
            .submit(wgpu, 1)
            .unwrap();
            let want_o = want_o.download(wgpu).unwrap();
            let name = tile.label();
            check_refused_slot_rows(&got_o, &want_o, 2, 1)
                .unwrap_or_else(|e| panic!("{name} T={tokens}: {e}"));
            assert_eq!(
                got_pool,
                reference.pool.download(wgpu).unwrap(),
                "{name} T={tokens}: the pool differs from the checked call's"
            );
        }
    }
    println!("replayed slot indices: rows past the pool NaN, pools untouched by them");
}
