//! `deltakv kv` end to end through the built binary: a good run, and every bad-input case
//! gives one clear error line, a non-zero exit and no output file.

use deltakv::io::TensorFile;
use deltakv::metrics::rel_rms;
use deltakv::rng::Rng;
use deltakv::{DType, HostTensor};
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("deltakv-kv-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// q [B, Tq, Hq, D], k and v [B, T, Hkv, D].
fn write_input(path: &Path, q: [usize; 4], kv: [usize; 4], dtype: DType, poison_k: bool) {
    let mut rng = Rng::new(3);
    let mut file = TensorFile::new();
    let n = |s: [usize; 4]| s.iter().product::<usize>();
    file.insert(
        "q",
        HostTensor::from_f32_as(q.to_vec(), &rng.normal_vec(n(q), 1.0), dtype).unwrap(),
    );
    let mut k = rng.normal_vec(n(kv), 1.0);
    if poison_k {
        k[5] = f32::NAN;
    }
    file.insert(
        "k",
        HostTensor::from_f32_as(kv.to_vec(), &k, dtype).unwrap(),
    );
    file.insert(
        "v",
        HostTensor::from_f32_as(kv.to_vec(), &rng.normal_vec(n(kv), 1.0), dtype).unwrap(),
    );
    file.save(path).unwrap();
}

fn run(input: &Path, output: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltakv"))
        .arg("kv")
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn compressed_and_exact_runs_write_o_and_cache_bytes() {
    let d = dir("good");
    let input = d.join("in.safetensors");
    write_input(&input, [2, 3, 8, 128], [2, 200, 2, 128], DType::BF16, false);
    let exact_out = d.join("exact.safetensors");
    let (ok, err) = run(&input, &exact_out, &["--exact"]);
    assert!(ok, "{err}");
    let exact = TensorFile::load(&exact_out).unwrap();
    let o_exact = exact.require("o").unwrap();
    assert_eq!(o_exact.shape(), &[2, 3, 8, 128]);
    assert_eq!(o_exact.dtype(), DType::F32);
    let reference: Vec<f64> = o_exact
        .to_f32_vec("o")
        .unwrap()
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    let exact_bytes: usize = exact.metadata["cache_bytes"].parse().unwrap();
    assert_eq!(exact_bytes, 2 * 200 * 2 * 128 * 8);
    for (bits, tol) in [(["4", "2"], 0.45), (["8", "8"], 0.01)] {
        let out = d.join(format!("c{}.safetensors", bits[0]));
        let (ok, err) = run(
            &input,
            &out,
            &["--bits-k", bits[0], "--bits-v", bits[1], "--seed", "9"],
        );
        assert!(ok, "{err}");
        let file = TensorFile::load(&out).unwrap();
        let o = file.require("o").unwrap().to_f32_vec("o").unwrap();
        let e = rel_rms(&o, &reference);
        assert!(e < tol, "{bits:?}: rel_rms {e}");
        let bytes: usize = file.metadata["cache_bytes"].parse().unwrap();
        let b: usize = bits.iter().map(|s| s.parse::<usize>().unwrap()).sum();
        assert_eq!(bytes, 2 * 200 * 2 * (128 * b / 8 + 8));
    }
}

#[test]
fn bad_inputs_get_one_clear_error_line_and_no_output() {
    let d = dir("bad");
    type Case<'a> = (
        &'a str,
        [usize; 4],
        [usize; 4],
        bool,
        &'a [&'a str],
        &'a str,
    );
    let cases: [Case<'_>; 7] = [
        (
            "heads",
            [1, 1, 6, 64],
            [1, 8, 4, 64],
            false,
            &[],
            "not a multiple of Hkv = 4",
        ),
        (
            "tq",
            [1, 9, 4, 64],
            [1, 8, 2, 64],
            false,
            &[],
            "Tq = 9 new queries exceeds the T = 8",
        ),
        (
            "nan",
            [1, 1, 4, 64],
            [1, 8, 2, 64],
            true,
            &[],
            "tensor `k` holds a non-finite value",
        ),
        (
            "dim",
            [1, 1, 4, 32],
            [1, 8, 2, 32],
            false,
            &[],
            "head dim D = 32",
        ),
        (
            "bits",
            [1, 1, 4, 64],
            [1, 8, 2, 64],
            false,
            &["--bits-k", "5"],
            "bits-k = 5",
        ),
        (
            "shape",
            [1, 1, 4, 64],
            [1, 8, 2, 80],
            false,
            &[],
            "disagrees with q",
        ),
        (
            "aura",
            [1, 1, 4, 64],
            [1, 8, 2, 64],
            false,
            &["--codebook", "aura"],
            "aura",
        ),
    ];
    for (name, q, kv, poison, extra, expect) in cases {
        let input = d.join(format!("{name}.safetensors"));
        let output = d.join(format!("{name}-out.safetensors"));
        write_input(&input, q, kv, DType::F32, poison);
        let (ok, err) = run(&input, &output, extra);
        assert!(!ok, "{name}: expected failure");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: {err}");
        assert!(lines[0].starts_with("error: "), "{name}: {err}");
        assert!(err.contains(expect), "{name}: `{err}` lacks `{expect}`");
        assert!(!output.exists(), "{name}: output written");
    }
    // Rank and missing tensors.
    let input = d.join("rank.safetensors");
    let mut file = TensorFile::new();
    file.insert(
        "q",
        HostTensor::from_f32(vec![4, 64], vec![0.0; 256]).unwrap(),
    );
    file.insert(
        "k",
        HostTensor::from_f32(vec![1, 4, 1, 64], vec![0.0; 256]).unwrap(),
    );
    file.save(&input).unwrap();
    let output = d.join("rank-out.safetensors");
    let (ok, err) = run(&input, &output, &[]);
    assert!(!ok && err.contains("missing tensor `v`"), "{err}");
    file.insert(
        "v",
        HostTensor::from_f32(vec![1, 4, 1, 64], vec![0.0; 256]).unwrap(),
    );
    file.save(&input).unwrap();
    let (ok, err) = run(&input, &output, &[]);
    assert!(!ok && err.contains("expected 4 dims"), "{err}");
    assert!(!output.exists());
}
