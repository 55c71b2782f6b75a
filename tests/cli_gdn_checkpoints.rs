//! `deltakv gdn --checkpoint-every N`: the checkpoints and their offsets land in the output
//! file exactly as the library returns them; a spacing that is not a positive multiple of 64
//! exits non-zero with one `error:` line and no output file; on wgpu (where built and present)
//! the file holds the wgpu library's checkpoints. And the facade's checkpointed
//! prefills (plain and pooled) on every device built in, against the f64 oracle (a device that
//! is missing prints one "skipped" line).

use deltakv::gdn::oracle::gdn_reference_checkpointed;
use deltakv::gdn::prefill::checkpoint::worst_checkpoint_error;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnInputs, GdnOptions, PrefillMode, gdn_prefill_checkpointed};
use deltakv::io::TensorFile;
use deltakv::{DType, HostTensor};
use deltakv::{Device, gdn_prefill_into_pool_checkpointed};
use std::path::PathBuf;
use std::process::Command;

fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "deltakv-cli-gdn-ckpt-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Three sequences (1, 200 and 64 tokens), Hg = 2, H = 4, K = V = 32, initial states.
fn case() -> GdnCase {
    let mut spec = GdnSpec::new(265, 2, 4, 32, 32);
    spec.seq_lens = Some(vec![1, 200, 64]);
    spec.with_initial_state = true;
    GdnCase::random(&spec, 11).unwrap()
}

/// Runs `deltakv gdn` on the case with `extra` flags: (success, stderr, output path).
fn run_gdn(test: &str, extra: &[&str]) -> (bool, String, PathBuf) {
    let dir = scratch_dir(test);
    let case = case();
    let mut file = TensorFile::new();
    for (name, t) in [
        ("q", case.q),
        ("k", case.k),
        ("v", case.v),
        ("g", case.g),
        ("beta", case.beta),
        ("initial_state", case.initial_state.unwrap()),
        ("cu_seqlens", case.cu_seqlens.unwrap()),
    ] {
        file.insert(name, t);
    }
    let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    let _ = std::fs::remove_file(&output);
    file.save(&input).unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_deltakv"))
        .args(["gdn", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(extra)
        .output()
        .unwrap();
    (
        result.status.success(),
        String::from_utf8_lossy(&result.stderr).into_owned(),
        output,
    )
}

#[test]
fn checkpoints_are_written_as_the_library_returns_them() {
    for (mode, flag) in [
        (PrefillMode::Chunk, "chunk"),
        (PrefillMode::Recurrent, "recurrent"),
    ] {
        let (ok, stderr, output) = run_gdn(flag, &["--checkpoint-every", "64", "--mode", flag]);
        assert!(ok, "{stderr}");
        let written = TensorFile::load(&output).unwrap();
        let case = case();
        let expected =
            gdn_prefill_checkpointed(&case.inputs(), &GdnOptions::default(), mode, Some(64))
                .unwrap()
                .checkpoints
                .unwrap();
        let states = written.require("checkpoints").unwrap();
        assert_eq!(states.dtype(), DType::F32);
        assert_eq!(states.shape(), &[3 + 1, 4, 32, 32]);
        assert_eq!(states, &expected.states);
        let offsets = written.require("checkpoint_offsets").unwrap();
        assert_eq!(
            offsets,
            &HostTensor::from_i64(vec![4], vec![0, 0, 3, 4]).unwrap()
        );
        std::fs::remove_dir_all(output.parent().unwrap()).ok();
    }
}

#[test]
fn no_checkpoints_without_the_flag() {
    let (ok, stderr, output) = run_gdn("none", &[]);
    assert!(ok, "{stderr}");
    let written = TensorFile::load(&output).unwrap();
    assert!(written.get("checkpoints").is_none());
    assert!(written.get("checkpoint_offsets").is_none());
    std::fs::remove_dir_all(output.parent().unwrap()).ok();
}

#[test]
fn a_spacing_off_the_chunk_size_is_refused() {
    for bad in ["0", "100"] {
        let (ok, stderr, output) = run_gdn(&format!("bad{bad}"), &["--checkpoint-every", bad]);
        assert!(!ok);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].starts_with("error: "), "{stderr}");
        assert!(lines[0].contains("multiple of 64"), "{stderr}");
        assert!(!output.exists());
        std::fs::remove_dir_all(output.parent().unwrap()).ok();
    }
}

#[test]
fn checkpoints_on_wgpu_from_the_command_line() {
    if let Err(e) = Device::Wgpu.ensure_available() {
        eprintln!("checkpoints_on_wgpu_from_the_command_line: skipped: {e}");
        return;
    }
    let (ok, stderr, output) = run_gdn("wgpu", &["--checkpoint-every", "64", "--device", "wgpu"]);
    assert!(ok, "{stderr}");
    let written = TensorFile::load(&output).unwrap();
    let case = case();
    let expected = deltakv::gdn_prefill_checkpointed(
        Device::Wgpu,
        &case.inputs(),
        &GdnOptions::default(),
        PrefillMode::Chunk,
        Some(64),
    )
    .unwrap()
    .checkpoints
    .unwrap();
    // The same kernels on the same inputs: the file holds the library's result exactly.
    assert_eq!(written.require("checkpoints").unwrap(), &expected.states);
    assert_eq!(
        written.require("checkpoint_offsets").unwrap(),
        &HostTensor::from_i64(vec![4], vec![0, 0, 3, 4]).unwrap()
    );
    let reference = gdn_reference_checkpointed(
        &case.inputs(),
        &GdnOptions::default(),
        &[0, 1, 2, 3],
        Some(64),
    )
    .unwrap();
    let states = expected.states.as_f32().unwrap();
    let err = worst_checkpoint_error(states, &reference.checkpoints, 4);
    assert!(
        err < 1e-4,
        "wgpu checkpoints from the command line: {err:.3e}"
    );
    std::fs::remove_dir_all(output.parent().unwrap()).ok();
    // The token-loop mode takes no checkpoints on wgpu: one error line, no file.
    let (ok, stderr, output) = run_gdn(
        "wgpu-recurrent",
        &[
            "--checkpoint-every",
            "64",
            "--device",
            "wgpu",
            "--mode",
            "recurrent",
        ],
    );
    assert!(!ok);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("error: ") && l.contains("chunked prefill")),
        "{stderr}"
    );
    assert!(!output.exists());
    std::fs::remove_dir_all(output.parent().unwrap()).ok();
}

#[test]
fn the_facade_checkpoints_on_every_device() {
    let case = case();
    let options = GdnOptions::default();
    let reference =
        gdn_reference_checkpointed(&case.inputs(), &options, &[0, 1, 2, 3], Some(64)).unwrap();
    let initial = case.initial_state.as_ref().unwrap();
    // The pooled call: the case's initial states in slots 2, 0, 1 of a pool of 3.
    let state_len = 4 * 32 * 32;
    let init = initial.as_f32().unwrap();
    let slots = [2usize, 0, 1];
    let mut pool_values = vec![0.0f32; 3 * state_len];
    for (n, &slot) in slots.iter().enumerate() {
        pool_values[slot * state_len..][..state_len]
            .copy_from_slice(&init[n * state_len..][..state_len]);
    }
    let slot_tensor =
        HostTensor::from_i64(vec![3], slots.iter().map(|&s| s as i64).collect()).unwrap();
    let no_initial = GdnInputs {
        initial_state: None,
        ..case.inputs()
    };
    for device in Device::ALL {
        if let Err(e) = device.ensure_available() {
            eprintln!("facade checkpoints on {device}: skipped: {e}");
            continue;
        }
        let tolerance = if device == Device::Cpu { 1e-6 } else { 4e-3 };
        let plain = deltakv::gdn_prefill_checkpointed(
            device,
            &case.inputs(),
            &options,
            PrefillMode::Chunk,
            Some(64),
        );
        let states = plain.unwrap().checkpoints.unwrap().states;
        let err = worst_checkpoint_error(states.as_f32().unwrap(), &reference.checkpoints, 4);
        eprintln!("facade checkpoints on {device}: worst {err:.3e}");
        assert!(err < tolerance, "{device}: {err:.3e}");
        let mut pool = HostTensor::from_f32(vec![3, 4, 32, 32], pool_values.clone()).unwrap();
        let (_, pooled) = gdn_prefill_into_pool_checkpointed(
            device,
            &no_initial,
            &options,
            PrefillMode::Chunk,
            &mut pool,
            &slot_tensor,
            Some(64),
        )
        .unwrap();
        let pooled = pooled.unwrap().states;
        let err = worst_checkpoint_error(pooled.as_f32().unwrap(), &reference.checkpoints, 4);
        eprintln!("facade pooled checkpoints on {device}: worst {err:.3e}");
        assert!(err < tolerance, "{device} pooled: {err:.3e}");
    }
}
