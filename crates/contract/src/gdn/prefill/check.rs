//! The prefill test suite's cases, written once for every backend: sequence lengths around the
//! chunk size, a batch with initial states, varlen with length-one sequences, GQA ratios (more
//! value heads per key head than one prepare block takes too), K != V and odd dims, strong and
//! zero decay, beta 0 and 1, f32 / f16 inputs with a custom scale, f32 at K = V = 128, and
//! gates so negative they reset the state. Each backend runs every case against the f64 oracle
//! with its own tolerances (the CPU's f32 path, CUDA's bf16 tensor cores and wgpu's f32 shaders
//! round differently).

use super::GdnOptions;
use super::random::{BetaFill, GdnCase, GdnSpec};
use crate::error::Result;
use crate::tensor::{DType, HostTensor};

/// One named case of the suite: a random problem from `spec` drawn with `seed`.
#[derive(Clone, Debug)]
pub struct PrefillCheck {
    pub name: String,
    pub spec: GdnSpec,
    pub options: GdnOptions,
    pub seed: u64,
}

/// Options with the default scale and, when `l2`, the l2 norm of q and k in the kernel.
pub fn l2_options(l2: bool) -> GdnOptions {
    GdnOptions {
        scale: None,
        use_qk_l2norm: l2,
    }
}

/// Every case of the suite (see the module docs), each with its own seed.
pub fn prefill_suite() -> Vec<PrefillCheck> {
    let mut cases = Vec::new();
    let mut add = |name: &str, spec: &GdnSpec, options: GdnOptions, seed: u64| {
        cases.push(PrefillCheck {
            name: name.to_string(),
            spec: spec.clone(),
            options,
            seed,
        })
    };
    for (i, tokens) in [1, 63, 64, 65, 1000].into_iter().enumerate() {
        let spec = GdnSpec::new(tokens, 2, 4, 64, 64);
        add(
            &format!("T={tokens}"),
            &spec,
            l2_options(false),
            100 + i as u64,
        );
    }
    let mut spec = GdnSpec::new(130, 2, 4, 64, 48);
    spec.batch = 2;
    spec.with_initial_state = true;
    spec.raw_qk = true;
    add("B=2 init l2", &spec, l2_options(true), 7);
    // 4 x 16 heads x 4 tiles of 32 columns: wgpu's state pass takes its wide tiles.
    let mut spec = GdnSpec::new(70, 4, 16, 64, 128);
    spec.batch = 4;
    spec.with_initial_state = true;
    add("wide tiles", &spec, l2_options(false), 10);
    let mut spec = GdnSpec::new(1 + 70 + 1 + 129, 1, 2, 64, 64);
    spec.seq_lens = Some(vec![1, 70, 1, 129]);
    spec.with_initial_state = true;
    add("varlen", &spec, l2_options(false), 8);
    spec.with_initial_state = false;
    spec.raw_qk = true;
    add("varlen l2", &spec, l2_options(true), 9);
    for ratio in [1, 2, 3, 4] {
        let spec = GdnSpec::new(97, 2, 2 * ratio, 32, 40);
        add(
            &format!("GQA {ratio}"),
            &spec,
            l2_options(false),
            20 + ratio as u64,
        );
    }
    // More value heads per key head than one CUDA prepare block takes (four): 2 x 3 and 2 x 4
    // blocks per key head, the l2 norm written by the first.
    for ratio in [6, 8] {
        let mut spec = GdnSpec::new(97, 2, 2 * ratio, 64, 40);
        spec.raw_qk = true;
        add(
            &format!("GQA {ratio} l2"),
            &spec,
            l2_options(true),
            24 + ratio as u64,
        );
    }
    add(
        "K=64 V=256",
        &GdnSpec::new(150, 1, 2, 64, 256),
        l2_options(false),
        30,
    );
    let mut spec = GdnSpec::new(150, 1, 2, 100, 100);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    add("K=V=100", &spec, l2_options(true), 31);
    add(
        "K=256 V=96",
        &GdnSpec::new(70, 1, 1, 256, 96),
        l2_options(false),
        32,
    );
    // Odd V with bf16 o: neighbouring heads' outputs share 4-byte words.
    let mut spec = GdnSpec::new(65, 1, 3, 37, 31);
    spec.with_initial_state = true;
    add("K=37 V=31", &spec, l2_options(false), 33);
    let mut spec = GdnSpec::new(70, 1, 2, 256, 64);
    spec.raw_qk = true;
    add("K=256 l2", &spec, l2_options(true), 34);
    let mut spec = GdnSpec::new(65, 1, 2, 128, 64);
    spec.raw_qk = true;
    spec.dtype = DType::F16;
    add("f16 l2", &spec, l2_options(true), 35);
    let mut spec = GdnSpec::new(300, 2, 4, 128, 128);
    spec.raw_qk = true;
    spec.with_initial_state = true;
    add("K=V=128 l2 init", &spec, l2_options(true), 36);
    let mut spec = GdnSpec::new(200, 1, 2, 64, 64);
    spec.gate_scale = 10.0;
    add("strong decay", &spec, l2_options(false), 40);
    spec.gate_scale = 0.0;
    add("no decay", &spec, l2_options(false), 41);
    spec.gate_scale = 1.0;
    spec.beta = BetaFill::Constant(0.0);
    spec.with_initial_state = true;
    add("beta 0", &spec, l2_options(false), 42);
    spec.beta = BetaFill::Constant(1.0);
    add("beta 1", &spec, l2_options(false), 43);
    let mut spec = GdnSpec::new(65, 2, 2, 64, 64);
    let scaled = GdnOptions {
        scale: Some(0.3),
        use_qk_l2norm: false,
    };
    spec.dtype = DType::F32;
    add("f32 scale 0.3", &spec, scaled.clone(), 60);
    spec.dtype = DType::F16;
    add("f16 scale 0.3", &spec, scaled, 61);
    // f32 o at K = V = 128 (CUDA's register walks store it from their accumulators, where
    // 2-byte outputs go through shared memory), with initial states and the l2 norm.
    let mut spec = GdnSpec::new(130, 1, 2, 128, 128);
    spec.dtype = DType::F32;
    spec.with_initial_state = true;
    spec.raw_qk = true;
    add("f32 K=V=128 l2 init", &spec, l2_options(true), 62);
    cases
}

/// A case whose gates are so negative at two tokens (-1e4 and -3e38) that the state resets
/// there: exp underflows to 0, never NaN.
pub fn reset_gates_case() -> Result<GdnCase> {
    let spec = GdnSpec::new(130, 1, 1, 32, 32);
    let mut case = GdnCase::random(&spec, 50)?;
    let mut g = case.g.to_f32_vec("g")?;
    g[3] = -1.0e4;
    g[100] = -3.0e38;
    case.g = HostTensor::from_f32(case.g.shape().to_vec(), g)?;
    Ok(case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_has_its_own_name_and_draws() {
        let cases = prefill_suite();
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "names are unique");
        for c in &cases {
            let case = GdnCase::random(&c.spec, c.seed).unwrap();
            assert_eq!(case.q.shape()[1], c.spec.tokens, "{}", c.name);
        }
        let reset = reset_gates_case().unwrap();
        let g = reset.g.to_f32_vec("g").unwrap();
        assert!(g[100] < -1e38 && g.iter().all(|x| x.is_finite()));
    }
}
