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
    // AURA's published d = 128 tables are a named codebook; its 4-bit table is coarser.
    for (bits, tol, book) in [
        (["4", "2"], 0.45, "lloyd-max"),
        (["8", "8"], 0.01, "lloyd-max"),
        (["4", "2"], 0.5, "aura"),
    ] {
        let out = d.join(format!("c{}-{book}.safetensors", bits[0]));
        let (ok, err) = run(
            &input,
            &out,
            &[
                "--bits-k",
                bits[0],
                "--bits-v",
                bits[1],
                "--seed",
                "9",
                "--codebook",
                book,
            ],
        );
        assert!(ok, "{err}");
        let file = TensorFile::load(&out).unwrap();
        let o = file.require("o").unwrap().to_f32_vec("o").unwrap();
        let e = rel_rms(&o, &reference);
        assert!(e < tol, "{bits:?} {book}: rel_rms {e}");
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
    let cases: [Case<'_>; 6] = [
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

/// A ragged batch padded to T with `seq_lens`: each sequence's output equals a run on that
/// sequence alone, truncated to its length; NaN padding is never read; bad lengths are errors.
#[test]
fn ragged_batch_with_seq_lens_equals_each_sequence_alone() {
    let d = dir("ragged");
    let (t, tq, hq, hkv, dim) = (50, 2, 4, 2, 64);
    let lens = [50usize, 17, 2];
    let mut rng = Rng::new(11);
    let q = rng.normal_vec(lens.len() * tq * hq * dim, 1.0);
    let mut k = rng.normal_vec(lens.len() * t * hkv * dim, 1.0);
    let mut v = rng.normal_vec(lens.len() * t * hkv * dim, 1.0);
    let row = hkv * dim;
    for (b, &len) in lens.iter().enumerate() {
        // Padding rows hold NaN: reading any of them would poison the output.
        k[(b * t + len) * row..(b + 1) * t * row].fill(f32::NAN);
        v[(b * t + len) * row..(b + 1) * t * row].fill(f32::NAN);
    }
    let save = |path: &Path,
                q: &[f32],
                k: &[f32],
                v: &[f32],
                b: usize,
                t: usize,
                lens: Option<&[usize]>| {
        let mut file = TensorFile::new();
        file.insert(
            "q",
            HostTensor::from_f32(vec![b, tq, hq, dim], q.to_vec()).unwrap(),
        );
        file.insert(
            "k",
            HostTensor::from_f32(vec![b, t, hkv, dim], k.to_vec()).unwrap(),
        );
        file.insert(
            "v",
            HostTensor::from_f32(vec![b, t, hkv, dim], v.to_vec()).unwrap(),
        );
        if let Some(lens) = lens {
            let lens: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
            file.insert(
                "seq_lens",
                HostTensor::from_i32(vec![lens.len()], lens).unwrap(),
            );
        }
        file.save(path).unwrap();
    };
    let input = d.join("in.safetensors");
    save(&input, &q, &k, &v, lens.len(), t, Some(&lens));
    for mode in [
        &["--exact"][..],
        &["--bits-k", "4", "--bits-v", "3", "--seed", "5"],
    ] {
        let output = d.join("out.safetensors");
        let (ok, err) = run(&input, &output, mode);
        assert!(ok, "{mode:?}: {err}");
        let file = TensorFile::load(&output).unwrap();
        let o = file.require("o").unwrap().to_f32_vec("o").unwrap();
        assert!(
            o.iter().all(|x| x.is_finite()),
            "{mode:?}: padding was read"
        );
        let mut bytes = 0;
        for (b, &len) in lens.iter().enumerate() {
            let alone = d.join(format!("alone{b}.safetensors"));
            let qs = &q[b * tq * hq * dim..(b + 1) * tq * hq * dim];
            let held = b * t * row..(b * t + len) * row;
            save(&alone, qs, &k[held.clone()], &v[held], 1, len, None);
            let alone_out = d.join(format!("alone{b}-out.safetensors"));
            let (ok, err) = run(&alone, &alone_out, mode);
            assert!(ok, "{mode:?} alone {b}: {err}");
            let single = TensorFile::load(&alone_out).unwrap();
            bytes += single.metadata["cache_bytes"].parse::<usize>().unwrap();
            let reference: Vec<f64> = single
                .require("o")
                .unwrap()
                .to_f32_vec("o")
                .unwrap()
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let e = rel_rms(&o[b * tq * hq * dim..(b + 1) * tq * hq * dim], &reference);
            assert!(e < 1e-6, "{mode:?} sequence {b}: rel_rms {e:.3e}");
        }
        assert_eq!(
            file.metadata["cache_bytes"].parse::<usize>().unwrap(),
            bytes
        );
    }
    // A length below Tq, above T, or a wrong shape: one error line, no output.
    for (name, bad) in [
        ("short", &[50usize, 1, 2][..]),
        ("long", &[51, 2, 2]),
        ("shape", &[50, 2]),
    ] {
        let input = d.join(format!("{name}.safetensors"));
        save(&input, &q, &k, &v, lens.len(), t, Some(bad));
        let output = d.join(format!("{name}-out.safetensors"));
        let (ok, err) = run(&input, &output, &[]);
        assert!(!ok && err.lines().count() == 1, "{name}: {err}");
        assert!(err.contains("seq_lens"), "{name}: {err}");
        assert!(!output.exists(), "{name}: output written");
    }
}
