//! The CLI's hardening, end to end through the built binary: an output that is the input (by
//! any path or link) is refused before anything is read, failed runs leave the directory as it
//! was (input intact, no output, no temporary file, a user's `OUT.tmp` untouched), inputs are
//! read from the header first, f64 gates are accepted, ignored input draws a warning, finite
//! inputs that overflow are an error, and bench arguments are checked before any run.

use deltakv::HostTensor;
use deltakv::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::io::TensorFile;
use deltakv::rng::Rng;
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "deltakv-cli-hardening-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sorted file names in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn deltakv(args: &[&std::ffi::OsStr]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_deltakv"))
        .args(args)
        .output()
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run_file_op(op: &str, input: &Path, output: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        std::ffi::OsStr::new(op),
        "--input".as_ref(),
        input.as_os_str(),
        "--output".as_ref(),
        output.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    deltakv(&args)
}

/// Exit code 1, exactly one stderr line `error: ...` holding `fragment`.
fn assert_one_error(run: &Run, fragment: &str) {
    assert_eq!(run.code, Some(1), "stderr: {}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{:?}", run.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(
        lines[0].contains(fragment),
        "{:?} lacks {fragment:?}",
        lines[0]
    );
}

/// B = 1, T = 70, Hg = 2, H = 4, K = V = 32, bf16, l2 norm.
fn gdn_case() -> GdnCase {
    let mut spec = GdnSpec::new(70, 2, 4, 32, 32);
    spec.raw_qk = true;
    GdnCase::random(&spec, 5).unwrap()
}

fn gdn_file(case: &GdnCase) -> TensorFile {
    let mut file = TensorFile::new();
    file.insert("q", case.q.clone());
    file.insert("k", case.k.clone());
    file.insert("v", case.v.clone());
    file.insert("g", case.g.clone());
    file.insert("beta", case.beta.clone());
    file.metadata.insert("use_qk_l2norm".into(), "true".into());
    file
}

fn with_value(t: &HostTensor, flat: Option<usize>, value: f32) -> HostTensor {
    let mut values = t.to_f32_vec("x").unwrap();
    match flat {
        Some(i) => values[i] = value,
        None => values.fill(value),
    }
    HostTensor::from_f32_as(t.shape().to_vec(), &values, t.dtype()).unwrap()
}

#[test]
fn output_equal_to_the_input_by_any_path_is_refused_before_reading() {
    let dir = scratch_dir("same");
    let input = dir.join("in.safetensors");
    gdn_file(&gdn_case()).save(&input).unwrap();
    let original = std::fs::read(&input).unwrap();
    let hard = dir.join("hard.safetensors");
    std::fs::hard_link(&input, &hard).unwrap();
    let mut aliases = vec![input.clone(), dir.join(".").join("in.safetensors"), hard];
    #[cfg(unix)]
    {
        let soft = dir.join("soft.safetensors");
        std::os::unix::fs::symlink(&input, &soft).unwrap();
        aliases.push(soft);
    }
    let before = entries(&dir);
    for op in ["gdn", "gdn-decode", "kv"] {
        for output in &aliases {
            let run = run_file_op(op, &input, output, &[]);
            assert_one_error(
                &run,
                &format!(
                    "--output {} is the same file as --input {}; writing it would destroy the input",
                    output.display(),
                    input.display()
                ),
            );
            assert_eq!(std::fs::read(&input).unwrap(), original, "{op}");
            assert_eq!(entries(&dir), before, "{op} {}", output.display());
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_output_directory_that_does_not_exist_fails_before_the_work() {
    let dir = scratch_dir("nodir");
    let input = dir.join("in.safetensors");
    gdn_file(&gdn_case()).save(&input).unwrap();
    let output = dir.join("absent").join("out.safetensors");
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_one_error(
        &run,
        &format!(
            "--output {}: the directory {} does not exist",
            output.display(),
            dir.join("absent").display()
        ),
    );
    let run = run_file_op("gdn", &input, &dir, &[]);
    assert_one_error(&run, &format!("--output {} is a directory", dir.display()));
    assert_eq!(entries(&dir), ["in.safetensors"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_directory_as_input_and_a_block_out_of_range_are_refused_up_front() {
    let dir = scratch_dir("dirinput");
    let run = run_file_op("gdn", &dir, &dir.join("out.safetensors"), &[]);
    assert_one_error(&run, "is a directory, not a safetensors file");
    for output in ["newname/", "./"] {
        let run = run_file_op("gdn", &dir, Path::new(output), &[]);
        assert_one_error(&run, &format!("--output `{output}` names no file"));
    }
    for block in ["0", "70000"] {
        let run = run_file_op(
            "kv",
            &dir.join("absent.safetensors"),
            &dir.join("out.safetensors"),
            &["--block-tokens", block],
        );
        // Refused by the argument parser, before the (absent) input is looked at.
        assert_eq!(run.code, Some(2), "stderr: {}", run.stderr);
        assert!(
            run.stderr
                .contains(&format!("{block} is outside 1..=65536")),
            "{}",
            run.stderr
        );
    }
    assert!(entries(&dir).is_empty());
    std::fs::remove_dir_all(dir).ok();
}

/// Runs `gdn` on `file` in a directory that also holds a user's `out.safetensors.tmp`; a
/// failure must leave exactly the input and that file, both unchanged.
fn gdn_fails_cleanly(test: &str, file: &TensorFile, fragment: &str) {
    let dir = scratch_dir(test);
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    let user_tmp = dir.join("out.safetensors.tmp");
    file.save(&input).unwrap();
    std::fs::write(&user_tmp, b"keep me").unwrap();
    let original = std::fs::read(&input).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_one_error(&run, fragment);
    assert_eq!(
        entries(&dir),
        ["in.safetensors", "out.safetensors.tmp"],
        "{test}"
    );
    assert_eq!(std::fs::read(&input).unwrap(), original);
    assert_eq!(std::fs::read(&user_tmp).unwrap(), b"keep me");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn positive_log_decay_is_refused_with_its_position() {
    let case = gdn_case();
    let mut file = gdn_file(&case);
    // T = 70, H = 4: flat index 9 * 4 + 2 is token 9, head 2.
    file.insert("g", with_value(&case.g, Some(9 * 4 + 2), 80.0));
    gdn_fails_cleanly(
        "g80",
        &file,
        "tensor `g` holds a positive log decay (80) at [b, t, h] = [0, 9, 2]: g must be <= 0",
    );
}

#[test]
fn overflowing_finite_inputs_are_an_error_not_a_nan_file() {
    let case = gdn_case();
    let mut file = gdn_file(&case);
    file.insert("beta", with_value(&case.beta, None, 1e30));
    file.insert("v", with_value(&case.v, None, 1e30));
    gdn_fails_cleanly("overflow", &file, "the result `o` holds a non-finite value");
}

#[test]
fn a_good_run_keeps_a_users_tmp_file_and_leaves_no_other() {
    let dir = scratch_dir("good");
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    let user_tmp = dir.join("out.safetensors.tmp");
    gdn_file(&gdn_case()).save(&input).unwrap();
    std::fs::write(&user_tmp, b"keep me").unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stderr, "");
    assert_eq!(
        entries(&dir),
        ["in.safetensors", "out.safetensors", "out.safetensors.tmp"]
    );
    assert_eq!(std::fs::read(&user_tmp).unwrap(), b"keep me");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_large_unrelated_tensor_is_never_read() {
    let dir = scratch_dir("unrelated");
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    let mut file = TensorFile::new();
    file.insert(
        "weights",
        HostTensor::from_f32(vec![4 << 20], vec![0.0; 4 << 20]).unwrap(),
    );
    file.save(&input).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_one_error(&run, "missing tensor `q`");
    assert_eq!(run.stderr, "error: missing tensor `q`\n");
    // With the needed tensors present, the unrelated one is skipped with a warning.
    let mut file = gdn_file(&gdn_case());
    file.insert(
        "weights",
        HostTensor::from_f32(vec![4 << 20], vec![0.0; 4 << 20]).unwrap(),
    );
    file.save(&input).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "warning: ignoring unexpected tensor `weights`\n"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unknown_metadata_keys_draw_a_warning() {
    let dir = scratch_dir("metadata");
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    let mut file = gdn_file(&gdn_case());
    file.metadata.remove("use_qk_l2norm");
    file.metadata.insert("use_qk_l2_norm".into(), "true".into());
    file.save(&input).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "warning: ignoring unexpected metadata key `use_qk_l2_norm` (known: scale, use_qk_l2norm)\n"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// safetensors bytes of the given (name, dtype, shape, little-endian data) entries, with
/// `metadata` (a JSON object's members, e.g. `"scale":"0.5"`) as `__metadata__`.
fn raw_safetensors(metadata: &str, entries: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = format!("{{\"__metadata__\":{{{metadata}}}");
    let mut offset = 0;
    for (name, dtype, shape, data) in entries {
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            shape.join(","),
            offset + data.len()
        ));
        offset += data.len();
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for (_, _, _, data) in entries {
        bytes.extend_from_slice(data);
    }
    bytes
}

#[test]
fn f64_gates_give_the_same_output_as_f32_gates() {
    let dir = scratch_dir("f64");
    let case = gdn_case();
    let input = dir.join("in.safetensors");
    let reference = dir.join("ref.safetensors");
    let output = dir.join("out.safetensors");
    gdn_file(&case).save(&input).unwrap();
    let run = run_file_op("gdn", &input, &reference, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let as_f64 = |t: &HostTensor| -> Vec<u8> {
        let values = t.to_f32_vec("x").unwrap();
        values
            .iter()
            .flat_map(|&x| f64::from(x).to_le_bytes())
            .collect()
    };
    let entries: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = vec![
        ("q", "BF16", case.q.shape().to_vec(), case.q.to_le_bytes()),
        ("k", "BF16", case.k.shape().to_vec(), case.k.to_le_bytes()),
        ("v", "BF16", case.v.shape().to_vec(), case.v.to_le_bytes()),
        ("g", "F64", case.g.shape().to_vec(), as_f64(&case.g)),
        (
            "beta",
            "F64",
            case.beta.shape().to_vec(),
            as_f64(&case.beta),
        ),
    ];
    let metadata = "\"use_qk_l2norm\":\"true\"";
    std::fs::write(&input, raw_safetensors(metadata, &entries)).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let (a, b) = (
        TensorFile::load(&reference).unwrap(),
        TensorFile::load(&output).unwrap(),
    );
    assert_eq!(a.tensors, b.tensors);
    // A finite f64 beyond f32's range is refused, naming the tensor and the index.
    let mut big = case.beta.to_f32_vec("beta").unwrap();
    big[3] = 0.0;
    let mut big: Vec<u8> = big
        .iter()
        .flat_map(|&x| f64::from(x).to_le_bytes())
        .collect();
    big[3 * 8..4 * 8].copy_from_slice(&1e300f64.to_le_bytes());
    let mut entries = entries;
    entries[4].3 = big;
    std::fs::write(&input, raw_safetensors(metadata, &entries)).unwrap();
    std::fs::remove_file(&output).unwrap();
    let run = run_file_op("gdn", &input, &output, &[]);
    assert_one_error(
        &run,
        "tensor `beta` (f64, read as f32) holds 1e300 at flat index 3, beyond f32's range",
    );
    assert!(!output.exists());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn decode_with_every_row_skipped_warns() {
    let dir = scratch_dir("skipped");
    let mut spec = DecodeSpec::new(2, 1, 1, 2, 32, 32);
    spec.skipped_rows = vec![0, 1];
    let case = DecodeCase::random(&spec, 7).unwrap();
    let mut file = case.tensor_file();
    file.metadata
        .insert("intermediate_states".into(), "true".into());
    let input = dir.join("in.safetensors");
    let output = dir.join("out.safetensors");
    file.save(&input).unwrap();
    let run = run_file_op("gdn-decode", &input, &output, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "warning: every slot index is negative, so every row is skipped: o, intermediate_states will be all zeros and state_pool unchanged\n"
    );
    let out = TensorFile::load(&output).unwrap();
    assert_eq!(out.require("state_pool").unwrap(), &case.state_pool);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn kv_keys_whose_square_overflows_f32_match_the_exact_run() {
    let dir = scratch_dir("kvbig");
    let (t, hq, hkv, d) = (64, 4, 2, 128);
    let mut rng = Rng::new(11);
    let mut q = rng.normal_vec(hq * d, 1.0);
    (0..hq).for_each(|h| q[h * d] = 1.0);
    let mut k = rng.normal_vec(t * hkv * d, 1.0);
    (0..hkv).for_each(|h| k[(30 * hkv + h) * d] = 3e19);
    let v = rng.normal_vec(t * hkv * d, 1.0);
    let mut file = TensorFile::new();
    file.insert("q", HostTensor::from_f32(vec![1, 1, hq, d], q).unwrap());
    file.insert("k", HostTensor::from_f32(vec![1, t, hkv, d], k).unwrap());
    file.insert("v", HostTensor::from_f32(vec![1, t, hkv, d], v).unwrap());
    let input = dir.join("in.safetensors");
    file.save(&input).unwrap();
    let read_o = |path: &Path| -> Vec<f32> {
        TensorFile::load(path)
            .unwrap()
            .require("o")
            .unwrap()
            .to_f32_vec("o")
            .unwrap()
    };
    let (exact, compressed) = (dir.join("exact.safetensors"), dir.join("c.safetensors"));
    let run = run_file_op("kv", &input, &exact, &["--exact"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = run_file_op(
        "kv",
        &input,
        &compressed,
        &["--bits-k", "4", "--bits-v", "8"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let reference: Vec<f64> = read_o(&exact).iter().map(|&x| f64::from(x)).collect();
    let err = deltakv::metrics::rel_rms(&read_o(&compressed), &reference);
    // The hot key takes all the weight: what remains is the 8-bit value codec's own error.
    assert!(err < 0.02, "rel_rms {err:.4} against the exact run");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn device_help_is_given_everywhere() {
    for op in [
        &["gdn"][..],
        &["gdn-decode"],
        &["kv"],
        &["bench", "gdn"],
        &["bench", "kv"],
    ] {
        let mut args: Vec<&std::ffi::OsStr> = op.iter().map(std::ffi::OsStr::new).collect();
        args.push("--help".as_ref());
        let run = deltakv(&args);
        assert_eq!(run.code, Some(0), "{op:?}");
        let line = run
            .stdout
            .lines()
            .skip_while(|l| !l.contains("--device"))
            .nth(1)
            .unwrap_or("");
        assert!(line.contains("Where to run"), "{op:?}: {}", run.stdout);
    }
}

#[test]
fn bench_arguments_are_checked_before_any_run() {
    let dir = scratch_dir("bench");
    let bad_json = dir.join("absent").join("b.json");
    let cases: Vec<(Vec<std::ffi::OsString>, String)> = vec![
        (
            ["bench", "gdn", "--decode-batches", "1,0"]
                .map(Into::into)
                .to_vec(),
            "--decode-batches: sizes must be at least 1, got 0".into(),
        ),
        (
            vec![
                "bench".into(),
                "gdn".into(),
                "--json".into(),
                bad_json.clone().into(),
            ],
            format!(
                "--json {}: the directory {} does not exist",
                bad_json.display(),
                dir.join("absent").display()
            ),
        ),
        (
            vec![
                "bench".into(),
                "kv".into(),
                "--json".into(),
                dir.clone().into(),
            ],
            format!("--json {} is a directory", dir.display()),
        ),
        (
            ["bench", "kv", "--bits-k", "5"].map(Into::into).to_vec(),
            "bits-k = 5 (supported bit widths: 2, 3, 4, 8)".into(),
        ),
        (
            ["bench", "kv", "--hq", "6", "--hkv", "4"]
                .map(Into::into)
                .to_vec(),
            "--hq 6 must be a positive multiple of --hkv 4".into(),
        ),
    ];
    for (args, fragment) in cases {
        let started = std::time::Instant::now();
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let run = deltakv(&args);
        assert_one_error(&run, &fragment);
        assert_eq!(run.stdout, "", "{args:?}");
        assert!(
            started.elapsed().as_secs() < 5,
            "{args:?} ran before failing"
        );
    }
    assert_eq!(entries(&dir), Vec::<String>::new());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bench_kv_prints_only_what_it_measured() {
    let run = deltakv(
        &[
            "bench",
            "kv",
            "--contexts",
            "16384",
            "--hq",
            "32",
            "--hkv",
            "8",
        ]
        .map(std::ffi::OsStr::new),
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stdout.contains("llama"), "{}", run.stdout);
    assert!(
        run.stdout.contains("ctx  16384: compressed 4/2"),
        "{}",
        run.stdout
    );
}
