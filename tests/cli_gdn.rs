//! `deltakv gdn` end to end: a good file round-trips against the library, and every bad
//! input exits non-zero with one clear line on stderr and no output file.

use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnOptions, PrefillMode};
use deltakv::io::TensorFile;
use deltakv::{DType, HostTensor};
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("deltakv-cli-gdn-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small valid problem: B = 1, T = 70, Hg = 2, H = 4, K = V = 32, two sequences.
fn good_file() -> TensorFile {
    let mut spec = GdnSpec::new(70, 2, 4, 32, 32);
    spec.seq_lens = Some(vec![1, 69]);
    spec.with_initial_state = true;
    let case = GdnCase::random(&spec, 5).unwrap();
    let mut file = TensorFile::new();
    file.insert("q", case.q);
    file.insert("k", case.k);
    file.insert("v", case.v);
    file.insert("g", case.g);
    file.insert("beta", case.beta);
    file.insert("initial_state", case.initial_state.unwrap());
    file.insert("cu_seqlens", case.cu_seqlens.unwrap());
    file.metadata.insert("scale".into(), "0.2".into());
    file.metadata.insert("use_qk_l2norm".into(), "true".into());
    file
}

fn run_gdn(dir: &Path, file: &TensorFile, extra: &[&str]) -> (bool, String, PathBuf) {
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
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

fn expect_error(test: &str, file: TensorFile, fragment: &str) {
    expect_error_with(test, file, &[], fragment);
}

fn expect_error_with(test: &str, file: TensorFile, extra: &[&str], fragment: &str) {
    let dir = scratch_dir(test);
    let (ok, stderr, output) = run_gdn(&dir, &file, extra);
    assert!(!ok, "{test}: expected failure");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{test}: expected one stderr line, got {stderr:?}"
    );
    assert!(lines[0].starts_with("error: "), "{test}: {stderr}");
    assert!(
        lines[0].contains(fragment),
        "{test}: {:?} lacks {fragment:?}",
        lines[0]
    );
    assert!(!stderr.contains("panicked"), "{test}: {stderr}");
    assert!(!output.exists(), "{test}: output file was written");
    std::fs::remove_dir_all(dir).ok();
}

fn replace(mut file: TensorFile, name: &str, tensor: HostTensor) -> TensorFile {
    file.insert(name, tensor);
    file
}

fn f32_tensor(shape: Vec<usize>, value: f32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32(shape, vec![value; n]).unwrap()
}

#[test]
fn good_input_matches_the_library() {
    let dir = scratch_dir("good");
    let file = good_file();
    for (mode, flag) in [
        (PrefillMode::Chunk, "chunk"),
        (PrefillMode::Recurrent, "recurrent"),
    ] {
        let (ok, stderr, output) = run_gdn(&dir, &file, &["--mode", flag]);
        assert!(ok, "{stderr}");
        let written = TensorFile::load(&output).unwrap();
        let inputs = deltakv::gdn::GdnInputs {
            q: file.require("q").unwrap(),
            k: file.require("k").unwrap(),
            v: file.require("v").unwrap(),
            g: file.require("g").unwrap(),
            beta: file.require("beta").unwrap(),
            initial_state: file.get("initial_state"),
            cu_seqlens: file.get("cu_seqlens"),
        };
        let options = GdnOptions {
            scale: Some(0.2),
            use_qk_l2norm: true,
        };
        let expected = deltakv::gdn::gdn_prefill(&inputs, &options, mode).unwrap();
        assert_eq!(written.require("o").unwrap(), &expected.o);
        assert_eq!(
            written.require("final_state").unwrap(),
            &expected.final_state
        );
        assert_eq!(written.require("o").unwrap().dtype(), DType::BF16);
        assert_eq!(
            written.require("final_state").unwrap().shape(),
            &[2, 4, 32, 32]
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn missing_tensor() {
    let mut file = good_file();
    file.tensors.remove("beta");
    expect_error("missing", file, "missing tensor `beta`");
}

#[test]
fn wrong_shape() {
    expect_error(
        "shape",
        replace(good_file(), "g", f32_tensor(vec![1, 69, 4], -0.1)),
        "tensor `g`: expected shape [1, 70, 4]",
    );
    expect_error(
        "rank",
        replace(good_file(), "q", f32_tensor(vec![70, 2, 32], 0.1)),
        "tensor `q`: expected 4 dims",
    );
}

#[test]
fn wrong_dtype() {
    expect_error(
        "dtype-g",
        replace(
            good_file(),
            "g",
            HostTensor::from_i32(vec![1, 70, 4], vec![0; 280]).unwrap(),
        ),
        "tensor `g` has dtype i32",
    );
    expect_error(
        "dtype-v",
        replace(good_file(), "v", f32_tensor(vec![1, 70, 4, 32], 0.5)),
        "tensor `v` has dtype f32, expected bf16",
    );
    expect_error(
        "dtype-state",
        replace(
            good_file(),
            "initial_state",
            HostTensor::from_f32_as(vec![2, 4, 32, 32], &[0.0; 8192], DType::BF16).unwrap(),
        ),
        "tensor `initial_state` has dtype bf16, expected f32",
    );
}

#[test]
fn non_finite_gates() {
    let mut g = good_file().require("g").unwrap().to_f32_vec("g").unwrap();
    g[17] = f32::NAN;
    expect_error(
        "nan-g",
        replace(
            good_file(),
            "g",
            HostTensor::from_f32(vec![1, 70, 4], g).unwrap(),
        ),
        "tensor `g` holds a non-finite value (NaN) at flat index 17",
    );
    let mut beta = good_file()
        .require("beta")
        .unwrap()
        .to_f32_vec("beta")
        .unwrap();
    beta[3] = f32::INFINITY;
    expect_error(
        "inf-beta",
        replace(
            good_file(),
            "beta",
            HostTensor::from_f32(vec![1, 70, 4], beta).unwrap(),
        ),
        "tensor `beta` holds a non-finite value (inf)",
    );
}

#[test]
fn heads_not_a_multiple() {
    let mut file = good_file();
    file.insert(
        "q",
        HostTensor::from_f32_as(vec![1, 70, 3, 32], &[0.1; 6720], DType::BF16).unwrap(),
    );
    file.insert(
        "k",
        HostTensor::from_f32_as(vec![1, 70, 3, 32], &[0.1; 6720], DType::BF16).unwrap(),
    );
    expect_error(
        "gqa",
        file,
        "value heads H=4 is not a multiple of key heads Hg=3",
    );
}

#[test]
fn head_dim_too_large() {
    let mut file = good_file();
    let n = 70 * 2 * 300;
    file.insert(
        "q",
        HostTensor::from_f32_as(vec![1, 70, 2, 300], &vec![0.1; n], DType::BF16).unwrap(),
    );
    file.insert(
        "k",
        HostTensor::from_f32_as(vec![1, 70, 2, 300], &vec![0.1; n], DType::BF16).unwrap(),
    );
    expect_error("kdim", file, "at most 256 is supported");
}

#[test]
fn bad_cu_seqlens() {
    expect_error(
        "cu-order",
        replace(
            good_file(),
            "cu_seqlens",
            HostTensor::from_i32(vec![3], vec![0, 40, 40]).unwrap(),
        ),
        "cu_seqlens must be strictly increasing",
    );
    expect_error(
        "cu-end",
        replace(
            good_file(),
            "cu_seqlens",
            HostTensor::from_i64(vec![3], vec![0, 1, 60]).unwrap(),
        ),
        "cu_seqlens must end at T = 70, got 60",
    );
    expect_error(
        "cu-start",
        replace(
            good_file(),
            "cu_seqlens",
            HostTensor::from_i32(vec![3], vec![1, 2, 70]).unwrap(),
        ),
        "cu_seqlens must start at 0",
    );
    expect_error(
        "cu-dtype",
        replace(good_file(), "cu_seqlens", f32_tensor(vec![3], 1.0)),
        "tensor `cu_seqlens` has dtype f32, expected i32 or i64",
    );
    // Two batch rows with cu_seqlens.
    let mut spec = GdnSpec::new(35, 2, 4, 32, 32);
    spec.batch = 2;
    let case = GdnCase::random(&spec, 6).unwrap();
    let mut file = TensorFile::new();
    for (name, t) in [
        ("q", case.q),
        ("k", case.k),
        ("v", case.v),
        ("g", case.g),
        ("beta", case.beta),
    ] {
        file.insert(name, t);
    }
    file.insert(
        "cu_seqlens",
        HostTensor::from_i32(vec![2], vec![0, 35]).unwrap(),
    );
    expect_error(
        "cu-batch",
        file,
        "varlen input needs batch size B == 1, got B = 2",
    );
}

#[test]
fn initial_state_of_the_wrong_n() {
    expect_error(
        "state-n",
        replace(
            good_file(),
            "initial_state",
            f32_tensor(vec![1, 4, 32, 32], 0.0),
        ),
        "tensor `initial_state`: expected shape [2, 4, 32, 32]",
    );
}

#[test]
fn bad_metadata_and_files() {
    let mut file = good_file();
    file.metadata.insert("use_qk_l2norm".into(), "maybe".into());
    expect_error("meta", file, "metadata `use_qk_l2norm`");

    let dir = scratch_dir("garbage");
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    std::fs::write(&input, b"definitely not safetensors").unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_deltakv"))
        .args(["gdn", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success());
    assert!(stderr.contains("not a valid safetensors file"), "{stderr}");
    assert!(!output.exists());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unavailable_device() {
    expect_error_with(
        "cuda",
        good_file(),
        &["--device", "cuda"],
        "device `cuda` is not available",
    );
}
