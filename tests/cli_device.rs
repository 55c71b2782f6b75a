//! `--device` end to end. Where a device cannot run an op (built without its backend, no GPU
//! on this machine, or an op the backend does not have yet), every command exits non-zero with
//! one `error:` line that says why, and writes no output. Where CUDA is present, `gdn-decode
//! --device cuda` writes what the CPU writes, to the tolerances of the decode suite, and so
//! do `kv --device cuda` and `kv --device wgpu` (within f32 rounding).

use deltakv::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv::io::TensorFile;
use deltakv::{DType, Device};
use std::path::PathBuf;
use std::process::Command;

fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("deltakv-cli-device-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn decode_file(pool_dtype: DType) -> (DecodeCase, TensorFile) {
    let mut spec = DecodeSpec::new(3, 2, 2, 4, 64, 64);
    spec.fused_gating = true;
    spec.raw_qk = true;
    spec.pool_dtype = pool_dtype;
    spec.skipped_rows = vec![1];
    let case = DecodeCase::random(&spec, 31).unwrap();
    let mut file = case.tensor_file();
    file.metadata
        .insert("use_qk_l2norm".to_string(), "true".to_string());
    (case, file)
}

/// The binary under test: Cargo's, or `DELTAKV_BIN` where the tests run away from the build
/// (the GPU check carries them to a machine without Rust).
fn binary() -> PathBuf {
    std::env::var_os("DELTAKV_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_deltakv")))
}

/// Runs `deltakv <command> --input IN --output OUT --device <device>` in a fresh folder;
/// returns (success, stderr, the output if one was written, files left in the folder).
fn run(
    test: &str,
    command: &str,
    device: &str,
    file: &TensorFile,
) -> (bool, String, Option<TensorFile>, usize) {
    let dir = scratch(test);
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    file.save(&input).unwrap();
    let mut deltakv = Command::new(binary());
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Mesa's lavapipe loads libwayland, which prints a line to stderr when this is unset.
        deltakv.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let result = deltakv
        .args([command, "--device", device, "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).to_string();
    let written = output.exists().then(|| TensorFile::load(&output).unwrap());
    let files = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).ok();
    (result.status.success(), stderr, written, files)
}

/// The reason this build and machine give for CUDA, or None when CUDA runs here.
fn cuda_unavailable() -> Option<String> {
    Device::Cuda.ensure_available().err().map(|e| e.to_string())
}

#[test]
fn an_unavailable_device_gets_one_line_and_no_output() {
    let (_, decode) = decode_file(DType::F32);
    let mut cases = Vec::new();
    // Every command runs on wgpu where it is available.
    if Device::Wgpu.ensure_available().is_err() {
        let wgpu_expected = if cfg!(feature = "wgpu") {
            "no wgpu adapter"
        } else {
            "deltakv was built without wgpu (cargo feature `wgpu`)"
        };
        for command in ["gdn-decode", "gdn", "kv"] {
            cases.push((command, "wgpu", wgpu_expected));
        }
    }
    let cuda_reason = cuda_unavailable();
    let cuda_expected = if cfg!(feature = "cuda") {
        "no CUDA device"
    } else {
        "deltakv was built without CUDA (cargo feature `cuda`)"
    };
    if cuda_reason.is_some() {
        cases.push(("gdn-decode", "cuda", cuda_expected));
        cases.push(("gdn", "cuda", cuda_expected));
        cases.push(("kv", "cuda", cuda_expected));
    }
    // Where CUDA or wgpu runs, every command runs on it (gdn, gdn-decode, kv).
    for (command, device, expected) in cases {
        let (ok, stderr, written, files) = run("unavailable", command, device, &decode);
        assert!(!ok, "{command} --device {device} succeeded");
        assert_eq!(stderr.lines().count(), 1, "{command} {device}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: device `{device}` is not available: ")),
            "{stderr}"
        );
        assert!(stderr.contains(expected), "{command} {device}: {stderr}");
        assert!(written.is_none(), "{command} {device} wrote an output");
        assert_eq!(files, 1, "{command} {device} left a file beside the input");
    }
}

#[test]
fn gdn_decode_on_cuda_writes_what_the_cpu_writes() {
    if let Some(reason) = cuda_unavailable() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "gdn-decode --device cuda: skipped (no CUDA device): {reason}"
        );
        return;
    }
    for pool_dtype in [DType::F32, DType::BF16] {
        let (_, file) = decode_file(pool_dtype);
        let (ok, stderr, cpu, _) = run("cpu", "gdn-decode", "cpu", &file);
        assert!(ok, "{stderr}");
        let (ok, stderr, gpu, _) = run("gpu", "gdn-decode", "cuda", &file);
        assert!(ok, "{stderr}");
        let (cpu, gpu) = (cpu.unwrap(), gpu.unwrap());
        for (name, tolerance) in [("o", 2e-3), ("state_pool", 4e-3)] {
            let a = gpu.get(name).unwrap().to_f32_vec(name).unwrap();
            let b = cpu.get(name).unwrap().to_f64_vec(name).unwrap();
            let err = deltakv::metrics::rel_rms(&a, &b);
            assert!(
                err < tolerance,
                "{name} ({pool_dtype} pool): rel_rms {err:.3e}"
            );
        }
    }
}

/// `gdn-decode` and `gdn` on wgpu write what the CPU writes, to the decode suite's and the
/// prefill tests' tolerances.
#[test]
fn gdn_and_gdn_decode_on_wgpu_write_what_the_cpu_writes() {
    if let Err(e) = Device::Wgpu.ensure_available() {
        if cfg!(feature = "wgpu") && std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("no wgpu adapter in CI, where lavapipe is installed: {e}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "--device wgpu: skipped: {e}");
        return;
    }
    for pool_dtype in [DType::F32, DType::BF16] {
        let (_, file) = decode_file(pool_dtype);
        let (ok, stderr, cpu, _) = run("cpu", "gdn-decode", "cpu", &file);
        assert!(ok, "{stderr}");
        let (ok, stderr, on_wgpu, _) = run("wgpu", "gdn-decode", "wgpu", &file);
        assert!(ok, "{stderr}");
        let (cpu, on_wgpu) = (cpu.unwrap(), on_wgpu.unwrap());
        for (name, tolerance) in [("o", 2e-3), ("state_pool", 4e-3)] {
            let a = on_wgpu.get(name).unwrap().to_f32_vec(name).unwrap();
            let b = cpu.get(name).unwrap().to_f64_vec(name).unwrap();
            let err = deltakv::metrics::rel_rms(&a, &b);
            assert!(
                err < tolerance,
                "{name} ({pool_dtype} pool): rel_rms {err:.3e}"
            );
        }
    }
    let mut spec = deltakv::gdn::random::GdnSpec::new(70, 1, 2, 64, 48);
    spec.seq_lens = Some(vec![1, 40, 29]);
    spec.with_initial_state = true;
    let case = deltakv::gdn::random::GdnCase::random(&spec, 12).unwrap();
    let mut file = TensorFile::new();
    for (name, t) in [
        ("q", &case.q),
        ("k", &case.k),
        ("v", &case.v),
        ("g", &case.g),
        ("beta", &case.beta),
    ] {
        file.insert(name, t.clone());
    }
    file.insert("initial_state", case.initial_state.clone().unwrap());
    file.insert("cu_seqlens", case.cu_seqlens.clone().unwrap());
    let (ok, stderr, cpu, _) = run("gdn-cpu", "gdn", "cpu", &file);
    assert!(ok, "{stderr}");
    let (ok, stderr, on_wgpu, _) = run("gdn-wgpu", "gdn", "wgpu", &file);
    assert!(ok, "{stderr}");
    let (cpu, on_wgpu) = (cpu.unwrap(), on_wgpu.unwrap());
    for (name, tolerance) in [("o", 2e-3), ("final_state", 1e-4)] {
        let a = on_wgpu.get(name).unwrap().to_f32_vec(name).unwrap();
        let b = cpu.get(name).unwrap().to_f64_vec(name).unwrap();
        let err = deltakv::metrics::rel_rms(&a, &b);
        assert!(err < tolerance, "gdn {name}: rel_rms {err:.3e}");
    }
}

/// A ragged compressed-KV input: q [3, 2, 8, 128] bf16, k and v [3, 300, 2, 128] bf16, seq_lens.
fn kv_file() -> TensorFile {
    use deltakv::HostTensor;
    let mut rng = deltakv::rng::Rng::new(5);
    let (b, tq, hq, t, hkv, d) = (3, 2, 8, 300, 2, 128);
    let tensor = |shape: Vec<usize>, n: usize, rng: &mut deltakv::rng::Rng| {
        HostTensor::from_f32_as(shape, &rng.normal_vec(n, 1.0), DType::BF16).unwrap()
    };
    let mut file = TensorFile::new();
    file.insert("q", tensor(vec![b, tq, hq, d], b * tq * hq * d, &mut rng));
    file.insert("k", tensor(vec![b, t, hkv, d], b * t * hkv * d, &mut rng));
    file.insert("v", tensor(vec![b, t, hkv, d], b * t * hkv * d, &mut rng));
    file.insert(
        "seq_lens",
        HostTensor::from_i32(vec![b], vec![300, 2, 65]).unwrap(),
    );
    file
}

#[test]
fn kv_on_cuda_writes_what_the_cpu_writes() {
    if let Some(reason) = cuda_unavailable() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "kv --device cuda: skipped (no CUDA device): {reason}"
        );
        return;
    }
    let file = kv_file();
    let (ok, stderr, cpu, _) = run("kv-cpu", "kv", "cpu", &file);
    assert!(ok, "{stderr}");
    let (ok, stderr, gpu, _) = run("kv-gpu", "kv", "cuda", &file);
    assert!(ok, "{stderr}");
    let (cpu, gpu) = (cpu.unwrap(), gpu.unwrap());
    let a = gpu.get("o").unwrap().to_f32_vec("o").unwrap();
    let b = cpu.get("o").unwrap().to_f64_vec("o").unwrap();
    let err = deltakv::metrics::rel_rms(&a, &b);
    assert!(
        err < 1e-5,
        "kv --device cuda against --device cpu: rel_rms {err:.3e}"
    );
    println!("kv --device cuda against --device cpu: rel_rms {err:.2e}");
    assert_eq!(
        gpu.metadata.get("cache_bytes"),
        cpu.metadata.get("cache_bytes")
    );
}

/// `kv --device wgpu` (the paged cache on the wgpu device) writes what the CPU writes.
#[test]
fn kv_on_wgpu_writes_what_the_cpu_writes() {
    if let Err(e) = Device::Wgpu.ensure_available() {
        if cfg!(feature = "wgpu") && std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("no wgpu adapter in CI, where lavapipe is installed: {e}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "kv --device wgpu: skipped: {e}");
        return;
    }
    let file = kv_file();
    let (ok, stderr, cpu, _) = run("kv-cpu-w", "kv", "cpu", &file);
    assert!(ok, "{stderr}");
    let (ok, stderr, gpu, _) = run("kv-wgpu", "kv", "wgpu", &file);
    assert!(ok, "{stderr}");
    let (cpu, gpu) = (cpu.unwrap(), gpu.unwrap());
    let a = gpu.get("o").unwrap().to_f32_vec("o").unwrap();
    let b = cpu.get("o").unwrap().to_f64_vec("o").unwrap();
    let err = deltakv::metrics::rel_rms(&a, &b);
    assert!(
        err < 1e-5,
        "kv --device wgpu against --device cpu: rel_rms {err:.3e}"
    );
    println!("kv --device wgpu against --device cpu: rel_rms {err:.2e}");
    assert_eq!(
        gpu.metadata.get("cache_bytes"),
        cpu.metadata.get("cache_bytes")
    );
}
