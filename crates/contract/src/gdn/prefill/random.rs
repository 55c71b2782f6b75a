//! Seeded random GDN problems, for tests, the demo and benchmarks. Inputs are drawn so that
//! the recurrence stays well conditioned, as in real models: unit-norm keys (when the kernel
//! does not normalise them itself), gates `g = -softplus(.)`-like in [-0.7, -0.01], beta in
//! (0, 1).

use super::GdnInputs;
use crate::error::{Error, Result};
use crate::gdn::gating::fused_gates;
use crate::rng::Rng;
use crate::tensor::{DType, HostTensor};

/// `rows` standard-normal rows of `dim`, scaled to unit norm unless `raw` (when the kernel is
/// asked to normalise them itself).
pub(crate) fn draw_query_key_rows(rng: &mut Rng, rows: usize, dim: usize, raw: bool) -> Vec<f32> {
    let mut x = rng.normal_vec(rows * dim, 1.0);
    if !raw {
        for row in x.chunks_exact_mut(dim) {
            let inv = 1.0 / row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v *= inv);
        }
    }
    x
}

/// How to draw beta.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BetaFill {
    Random,
    Constant(f32),
}

/// The recipe of a random problem.
#[derive(Clone, Debug)]
pub struct GdnSpec {
    pub batch: usize,
    pub tokens: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub dtype: DType,
    /// Varlen sequence lengths (sum = tokens, batch must be 1).
    pub seq_lens: Option<Vec<usize>>,
    /// Multiplies the gates (10 = strong decay, 0 = no decay).
    pub gate_scale: f32,
    pub beta: BetaFill,
    /// Draw q and k raw (the kernel normalises) instead of unit-norm.
    pub raw_qk: bool,
    pub with_initial_state: bool,
}

impl GdnSpec {
    /// A small default problem.
    pub fn new(
        tokens: usize,
        key_heads: usize,
        value_heads: usize,
        key_dim: usize,
        value_dim: usize,
    ) -> Self {
        Self {
            batch: 1,
            tokens,
            key_heads,
            value_heads,
            key_dim,
            value_dim,
            dtype: DType::BF16,
            seq_lens: None,
            gate_scale: 1.0,
            beta: BetaFill::Random,
            raw_qk: false,
            with_initial_state: false,
        }
    }
}

impl GdnSpec {
    /// The f32 elements a case of this spec holds (q, k, v, g, beta and the initial states),
    /// or an error when the count overflows.
    fn elements(&self) -> Result<usize> {
        let product = |factors: &[usize]| factors.iter().try_fold(1usize, |n, &f| n.checked_mul(f));
        let sequences = self.seq_lens.as_ref().map_or(self.batch, Vec::len);
        let parts = [
            product(&[2, self.batch, self.tokens, self.key_heads, self.key_dim]),
            product(&[self.batch, self.tokens, self.value_heads, self.value_dim]),
            product(&[2, self.batch, self.tokens, self.value_heads]),
            if self.with_initial_state {
                product(&[sequences, self.value_heads, self.key_dim, self.value_dim])
            } else {
                Some(0)
            },
        ];
        parts
            .iter()
            .try_fold(0usize, |sum, part| part.and_then(|p| sum.checked_add(p)))
            .ok_or_else(|| {
                Error::InvalidValue(format!(
                    "a case of {} x {} tokens with these heads has more elements than memory can address",
                    self.batch, self.tokens
                ))
            })
    }

    /// Refuses a spec whose inputs this machine cannot allocate, so that a size too large is
    /// an error before anything is drawn, not an abort in the middle of drawing.
    fn check_memory(&self) -> Result<()> {
        let elements = self.elements()?;
        let mut probe: Vec<f32> = Vec::new();
        probe.try_reserve_exact(elements).map_err(|_| {
            Error::InvalidValue(format!(
                "a case of {} x {} tokens needs {:.1} GiB for its inputs, more than this machine can allocate",
                self.batch,
                self.tokens,
                elements as f64 * 4.0 / (1u64 << 30) as f64
            ))
        })
    }
}

/// Owned tensors of a random problem.
#[derive(Clone, Debug)]
pub struct GdnCase {
    pub q: HostTensor,
    pub k: HostTensor,
    pub v: HostTensor,
    pub g: HostTensor,
    pub beta: HostTensor,
    pub initial_state: Option<HostTensor>,
    pub cu_seqlens: Option<HostTensor>,
}

impl GdnCase {
    /// Draws a problem from `spec` with `seed`.
    pub fn random(spec: &GdnSpec, seed: u64) -> Result<Self> {
        spec.check_memory()?;
        let mut rng = Rng::new(seed);
        let rows = spec.batch * spec.tokens;
        let qk_shape = vec![spec.batch, spec.tokens, spec.key_heads, spec.key_dim];
        let q = draw_query_key_rows(&mut rng, rows * spec.key_heads, spec.key_dim, spec.raw_qk);
        let k = draw_query_key_rows(&mut rng, rows * spec.key_heads, spec.key_dim, spec.raw_qk);
        let v = rng.normal_vec(rows * spec.value_heads * spec.value_dim, 1.0);
        let gates = rows * spec.value_heads;
        let g: Vec<f32> = rng
            .uniform_vec(gates, -0.7, -0.01)
            .into_iter()
            .map(|x| x * spec.gate_scale)
            .collect();
        let beta = match spec.beta {
            BetaFill::Random => rng.uniform_vec(gates, 0.05, 0.95),
            BetaFill::Constant(b) => vec![b; gates],
        };
        let gate_shape = vec![spec.batch, spec.tokens, spec.value_heads];
        let sequences = spec.seq_lens.as_ref().map_or(spec.batch, Vec::len);
        let initial_state = if spec.with_initial_state {
            let n = sequences * spec.value_heads * spec.key_dim * spec.value_dim;
            Some(HostTensor::from_f32(
                vec![sequences, spec.value_heads, spec.key_dim, spec.value_dim],
                rng.normal_vec(n, 0.3),
            )?)
        } else {
            None
        };
        let cu_seqlens = match &spec.seq_lens {
            None => None,
            Some(lens) => {
                let mut offsets = vec![0i32];
                for &len in lens {
                    offsets.push(offsets.last().unwrap() + len as i32);
                }
                Some(HostTensor::from_i32(vec![offsets.len()], offsets)?)
            }
        };
        Ok(Self {
            q: HostTensor::from_f32_as(qk_shape.clone(), &q, spec.dtype)?,
            k: HostTensor::from_f32_as(qk_shape, &k, spec.dtype)?,
            v: HostTensor::from_f32_as(
                vec![spec.batch, spec.tokens, spec.value_heads, spec.value_dim],
                &v,
                spec.dtype,
            )?,
            g: HostTensor::from_f32(gate_shape.clone(), g)?,
            beta: HostTensor::from_f32(gate_shape, beta)?,
            initial_state,
            cu_seqlens,
        })
    }

    /// Borrowed inputs for a prefill call.
    pub fn inputs(&self) -> GdnInputs<'_> {
        GdnInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.initial_state.as_ref(),
            cu_seqlens: self.cu_seqlens.as_ref(),
        }
    }

    /// Replaces g and beta with gates as Qwen3-Next computes them from seed `seed`
    /// (`g = -exp(A_log) softplus(a)`, `A_log = ln U(1, 16)` per head, `beta = sigmoid(b)`, a
    /// and b standard normal): g averages about -6 and reaches below -10.
    pub fn with_model_gates(&mut self, seed: u64) -> Result<()> {
        let shape = self.g.shape().to_vec();
        let heads = shape.last().copied().unwrap_or(1).max(1);
        let rows = self.g.len() / heads;
        let mut rng = Rng::new(seed);
        let a_log: Vec<f32> = (0..heads)
            .map(|_| rng.uniform_in(1.0, 16.0).ln() as f32)
            .collect();
        let a = rng.normal_vec(rows * heads, 1.0);
        let b = rng.normal_vec(rows * heads, 1.0);
        let (g, beta) = fused_gates(&a, &b, &a_log, &vec![0.0; heads]);
        self.g = HostTensor::from_f32(shape.clone(), g)?;
        self.beta = HostTensor::from_f32(shape, beta)?;
        Ok(())
    }
}

/// Tokens `range` of every row of a `[B, T, ...]` tensor, as a `[B, range.len(), ...]` tensor
/// of the same dtype (a prompt and the tokens decoded after it, from one longer case).
pub fn token_range(t: &HostTensor, range: std::ops::Range<usize>) -> Result<HostTensor> {
    let shape = t.shape();
    let tokens = shape.get(1).copied().unwrap_or(0);
    if shape.len() < 2 || range.start > range.end || range.end > tokens {
        return Err(Error::shape(
            "t",
            format!("tokens {range:?} of a tensor {shape:?} (expected [B, T, ...] with T >= end)"),
        ));
    }
    let per_token: usize = shape[2..].iter().product();
    let values = t.to_f32_vec("t")?;
    let mut out = Vec::with_capacity(shape[0] * range.len() * per_token);
    for row in values
        .chunks_exact((tokens * per_token).max(1))
        .take(shape[0])
    {
        out.extend_from_slice(&row[range.start * per_token..range.end * per_token]);
    }
    let mut new_shape = shape.to_vec();
    new_shape[1] = range.len();
    HostTensor::from_f32_as(new_shape, &out, t.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_range_keeps_each_rows_tokens() {
        // [B 2, T 3, 2]: row b, token t holds 10 b + t twice.
        let values: Vec<f32> = (0..2)
            .flat_map(|b| (0..3).flat_map(move |t| [10.0 * b as f32 + t as f32; 2]))
            .collect();
        let t = HostTensor::from_f32(vec![2, 3, 2], values).unwrap();
        let head = token_range(&t, 0..2).unwrap();
        assert_eq!(head.shape(), &[2, 2, 2]);
        assert_eq!(
            head.as_f32().unwrap(),
            &[0.0, 0.0, 1.0, 1.0, 10.0, 10.0, 11.0, 11.0]
        );
        let last = token_range(&t, 2..3).unwrap();
        assert_eq!(last.as_f32().unwrap(), &[2.0, 2.0, 12.0, 12.0]);
        assert!(token_range(&t, 2..4).is_err());
    }

    #[test]
    fn model_gates_are_decays_and_sigmoids() {
        let mut case = GdnCase::random(&GdnSpec::new(50, 1, 3, 8, 8), 1).unwrap();
        case.with_model_gates(2).unwrap();
        let g = case.g.as_f32().unwrap();
        let beta = case.beta.as_f32().unwrap();
        assert_eq!(g.len(), 150);
        assert!(g.iter().all(|&x| x < 0.0 && x.is_finite()));
        assert!(beta.iter().all(|&x| x > 0.0 && x < 1.0));
        let mean = g.iter().sum::<f32>() / g.len() as f32;
        assert!(mean < -1.0, "mean g {mean}");
    }

    #[test]
    fn a_case_too_large_to_hold_is_an_error_not_an_abort() {
        // 2^50 tokens: the element count overflows nothing, the allocation cannot succeed.
        let err = GdnCase::random(&GdnSpec::new(1 << 50, 16, 32, 128, 128), 1).unwrap_err();
        assert!(
            err.to_string()
                .contains("more than this machine can allocate"),
            "{err}"
        );
        let err = GdnCase::random(&GdnSpec::new(usize::MAX / 2, 16, 32, 128, 128), 1).unwrap_err();
        assert!(
            err.to_string().contains("more elements than memory"),
            "{err}"
        );
    }
}
