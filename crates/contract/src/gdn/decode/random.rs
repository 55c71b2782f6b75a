//! Seeded random decode problems, for tests, the demo and benchmarks: a pool of random states,
//! rows addressing a random choice of distinct slots (some rows optionally skipped), and either
//! g/beta drawn as in [`crate::gdn::prefill::random`] or raw fused-gating inputs at
//! Qwen3-Next-like scales.

use super::{DecodeInputs, Gating};
use crate::error::Result;
use crate::gdn::prefill::random::draw_query_key_rows;
use crate::rng::Rng;
use crate::tensor::{DType, HostTensor};

/// The recipe of a random decode problem.
#[derive(Clone, Debug)]
pub struct DecodeSpec {
    pub batch: usize,
    pub tokens: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// S: slots in the pool (at least `batch`).
    pub slots: usize,
    /// dtype of q, k, v.
    pub dtype: DType,
    /// dtype of the pool (f32 or bf16).
    pub pool_dtype: DType,
    /// Raw a, b, A_log, dt_bias instead of g, beta.
    pub fused_gating: bool,
    /// Draw q and k raw (the kernel normalises) instead of unit-norm.
    pub raw_qk: bool,
    /// Batch rows given a negative slot index.
    pub skipped_rows: Vec<usize>,
}

impl DecodeSpec {
    /// A problem with `slots = batch + 2`, bf16 inputs, an f32 pool, g/beta gating.
    pub fn new(
        batch: usize,
        tokens: usize,
        key_heads: usize,
        value_heads: usize,
        key_dim: usize,
        value_dim: usize,
    ) -> Self {
        Self {
            batch,
            tokens,
            key_heads,
            value_heads,
            key_dim,
            value_dim,
            slots: batch + 2,
            dtype: DType::BF16,
            pool_dtype: DType::F32,
            fused_gating: false,
            raw_qk: false,
            skipped_rows: Vec::new(),
        }
    }
}

/// Owned tensors of a random decode problem.
#[derive(Clone, Debug)]
pub struct DecodeCase {
    pub q: HostTensor,
    pub k: HostTensor,
    pub v: HostTensor,
    /// `g`, `beta` or `a`, `b`, `A_log`, `dt_bias`, by name.
    pub gates: Vec<(String, HostTensor)>,
    pub slot_indices: HostTensor,
    pub state_pool: HostTensor,
}

impl DecodeCase {
    /// Draws a problem from `spec` with `seed`.
    pub fn random(spec: &DecodeSpec, seed: u64) -> Result<Self> {
        let mut rng = Rng::new(seed);
        let rows = spec.batch * spec.tokens;
        let qk_shape = vec![spec.batch, spec.tokens, spec.key_heads, spec.key_dim];
        let q = draw_query_key_rows(&mut rng, rows * spec.key_heads, spec.key_dim, spec.raw_qk);
        let k = draw_query_key_rows(&mut rng, rows * spec.key_heads, spec.key_dim, spec.raw_qk);
        let v = rng.normal_vec(rows * spec.value_heads * spec.value_dim, 1.0);
        let gates_len = rows * spec.value_heads;
        let gate_shape = vec![spec.batch, spec.tokens, spec.value_heads];
        let heads = vec![spec.value_heads];
        let gates = if spec.fused_gating {
            vec![
                (
                    "a".to_string(),
                    HostTensor::from_f32(gate_shape.clone(), rng.normal_vec(gates_len, 1.0))?,
                ),
                (
                    "b".to_string(),
                    HostTensor::from_f32(gate_shape, rng.normal_vec(gates_len, 1.5))?,
                ),
                (
                    "A_log".to_string(),
                    HostTensor::from_f32(
                        heads.clone(),
                        rng.uniform_vec(spec.value_heads, 0.0, 2.5),
                    )?,
                ),
                (
                    "dt_bias".to_string(),
                    HostTensor::from_f32(heads, rng.uniform_vec(spec.value_heads, -5.0, -1.0))?,
                ),
            ]
        } else {
            vec![
                (
                    "g".to_string(),
                    HostTensor::from_f32(
                        gate_shape.clone(),
                        rng.uniform_vec(gates_len, -0.7, -0.01),
                    )?,
                ),
                (
                    "beta".to_string(),
                    HostTensor::from_f32(gate_shape, rng.uniform_vec(gates_len, 0.05, 0.95))?,
                ),
            ]
        };
        // A random choice of distinct slots (partial Fisher-Yates).
        let mut order: Vec<i32> = (0..spec.slots as i32).collect();
        for i in 0..spec.batch.min(spec.slots) {
            let j = i + rng.below(spec.slots - i);
            order.swap(i, j);
        }
        let slots: Vec<i32> = (0..spec.batch)
            .map(|row| {
                if spec.skipped_rows.contains(&row) {
                    -1
                } else {
                    order[row]
                }
            })
            .collect();
        let pool_shape = vec![spec.slots, spec.value_heads, spec.key_dim, spec.value_dim];
        let pool_len = pool_shape.iter().product();
        let pool = rng.normal_vec(pool_len, 0.3);
        Ok(Self {
            q: HostTensor::from_f32_as(qk_shape.clone(), &q, spec.dtype)?,
            k: HostTensor::from_f32_as(qk_shape, &k, spec.dtype)?,
            v: HostTensor::from_f32_as(
                vec![spec.batch, spec.tokens, spec.value_heads, spec.value_dim],
                &v,
                spec.dtype,
            )?,
            gates,
            slot_indices: HostTensor::from_i32(vec![spec.batch], slots)?,
            state_pool: HostTensor::from_f32_as(pool_shape, &pool, spec.pool_dtype)?,
        })
    }

    /// The case as a `gdn-decode` input file: every tensor under its interchange name, no
    /// metadata.
    pub fn tensor_file(&self) -> crate::io::TensorFile {
        let mut file = crate::io::TensorFile::new();
        for (name, t) in [
            ("q", &self.q),
            ("k", &self.k),
            ("v", &self.v),
            ("slot_indices", &self.slot_indices),
            ("state_pool", &self.state_pool),
        ] {
            file.insert(name, t.clone());
        }
        for (name, t) in &self.gates {
            file.insert(name, t.clone());
        }
        file
    }

    /// The gating tensor called `name`, if this case has it.
    pub fn gate(&self, name: &str) -> Option<&HostTensor> {
        self.gates.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Borrowed inputs for a decode call (the pool is passed separately).
    pub fn inputs(&self) -> Result<DecodeInputs<'_>> {
        Ok(DecodeInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gating: Gating::from_lookup(|name| self.gate(name))?,
            slot_indices: &self.slot_indices,
        })
    }
}
