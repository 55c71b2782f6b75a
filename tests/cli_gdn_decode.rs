//! `deltakv gdn-decode` end to end: outputs equal the library's, and every bad input gets one
//! error line, a non-zero exit and no output file.

use deltakv::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv::gdn::{DecodeOptions, GdnOptions, gdn_decode};
use deltakv::io::TensorFile;
use deltakv::{DType, HostTensor};
use std::path::PathBuf;
use std::process::Command;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("deltakv-cli-decode-{}-{name}", std::process::id()))
}

fn case_file(case: &DecodeCase, metadata: &[(&str, &str)]) -> TensorFile {
    let mut file = case.tensor_file();
    for (k, v) in metadata {
        file.metadata.insert(k.to_string(), v.to_string());
    }
    file
}

/// Runs the CLI on `file`; returns (success, stderr, output file if written).
fn run_cli(name: &str, file: &TensorFile) -> (bool, String, Option<TensorFile>) {
    let input = temp_path(&format!("{name}-in.safetensors"));
    let output = temp_path(&format!("{name}-out.safetensors"));
    file.save(&input).unwrap();
    let _ = std::fs::remove_file(&output);
    let result = Command::new(env!("CARGO_BIN_EXE_deltakv"))
        .args(["gdn-decode", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).to_string();
    let written = output.exists().then(|| TensorFile::load(&output).unwrap());
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&output);
    (result.status.success(), stderr, written)
}

#[test]
fn outputs_equal_the_library_call() {
    for (fused, pool_dtype, intermediate) in [(true, DType::F32, true), (false, DType::BF16, false)]
    {
        let mut spec = DecodeSpec::new(3, 4, 1, 2, 32, 48);
        spec.fused_gating = fused;
        spec.pool_dtype = pool_dtype;
        spec.raw_qk = true;
        spec.skipped_rows = vec![2];
        let case = DecodeCase::random(&spec, 11).unwrap();
        let flag = if intermediate { "true" } else { "false" };
        let file = case_file(
            &case,
            &[
                ("use_qk_l2norm", "true"),
                ("scale", "0.25"),
                ("intermediate_states", flag),
            ],
        );
        let (ok, stderr, out) = run_cli(&format!("ok-{fused}"), &file);
        assert!(ok, "{stderr}");
        let out = out.expect("output written");
        let mut pool = case.state_pool.clone();
        let expected = gdn_decode(
            &case.inputs().unwrap(),
            &mut pool,
            &DecodeOptions {
                gdn: GdnOptions {
                    scale: Some(0.25),
                    use_qk_l2norm: true,
                },
                intermediate_states: intermediate,
            },
        )
        .unwrap();
        assert_eq!(out.get("o"), Some(&expected.o));
        assert_eq!(out.get("state_pool"), Some(&pool));
        assert_eq!(out.get("state_pool").unwrap().dtype(), pool_dtype);
        assert_eq!(
            out.get("intermediate_states"),
            expected.intermediate_states.as_ref()
        );
    }
}

#[test]
fn bad_inputs_fail_with_one_line_and_no_output() {
    let spec = DecodeSpec::new(2, 2, 1, 2, 16, 16);
    let case = DecodeCase::random(&spec, 12).unwrap();
    let mut fused_spec = spec.clone();
    fused_spec.fused_gating = true;
    let fused = DecodeCase::random(&fused_spec, 13).unwrap();
    let long = DecodeCase::random(&DecodeSpec::new(1, 17, 1, 1, 16, 16), 14).unwrap();
    let mut nan_q = case.q.to_f32_vec("q").unwrap();
    nan_q[0] = f32::NAN;
    let nan_q = HostTensor::from_f32_as(case.q.shape().to_vec(), &nan_q, case.q.dtype()).unwrap();

    type Edit = Box<dyn Fn(&mut TensorFile)>;
    let cases: Vec<(&str, &DecodeCase, Edit, &str)> = vec![
        (
            "range",
            &case,
            Box::new(|f| {
                f.insert(
                    "slot_indices",
                    HostTensor::from_i32(vec![2], vec![0, 4]).unwrap(),
                )
            }),
            "slot_indices[1] = 4 is out of range for a state pool of 4 slots",
        ),
        (
            "dup",
            &case,
            Box::new(|f| {
                f.insert(
                    "slot_indices",
                    HostTensor::from_i64(vec![2], vec![3, 3]).unwrap(),
                )
            }),
            "rows 0 and 1 both address slot 3",
        ),
        (
            "long",
            &long,
            Box::new(|_| {}),
            "decode takes at most 16 tokens per row, got T = 17",
        ),
        (
            "half",
            &fused,
            Box::new(|f| {
                f.tensors.remove("dt_bias");
            }),
            "fused gating needs a, b, A_log and dt_bias, but `dt_bias` missing",
        ),
        (
            "shape",
            &case,
            Box::new(|f| {
                f.insert(
                    "state_pool",
                    HostTensor::from_f32(vec![4, 2, 16, 8], vec![0.0; 4 * 2 * 128]).unwrap(),
                )
            }),
            "tensor `state_pool`: expected shape [4, 2, 16, 16]",
        ),
        (
            "dtype",
            &case,
            Box::new(|f| {
                let g = f.get("g").unwrap().to_f32_vec("g").unwrap();
                f.insert(
                    "g",
                    HostTensor::from_i32(vec![2, 2, 2], g.iter().map(|&x| x as i32).collect())
                        .unwrap(),
                )
            }),
            "tensor `g` has dtype i32, expected f32, f16 or bf16",
        ),
        (
            "nan",
            &case,
            Box::new(move |f| f.insert("q", nan_q.clone())),
            "tensor `q` holds a non-finite value (NaN) at flat index 0",
        ),
        (
            "missing",
            &case,
            Box::new(|f| {
                f.tensors.remove("state_pool");
            }),
            "missing tensor `state_pool`",
        ),
    ];
    for (name, case, edit, message) in cases {
        let mut file = case_file(case, &[]);
        edit(&mut file);
        let (ok, stderr, out) = run_cli(&format!("bad-{name}"), &file);
        assert!(!ok, "{name}: succeeded");
        assert!(out.is_none(), "{name}: wrote an output file");
        assert_eq!(stderr.lines().count(), 1, "{name}: `{stderr}`");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{name}: `{stderr}` lacks `{message}`"
        );
    }
}
