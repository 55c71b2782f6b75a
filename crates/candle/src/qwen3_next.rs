//! One Qwen3-Next Gated DeltaNet layer (the linear-attention layer of Qwen3-Next), written in
//! candle, with its recurrence on deltakv's ops: [`gdn_prefill`] for a prompt and
//! [`gdn_decode`] (fused gating, the state pool updated in place) for each new token.
//!
//! Per token, with `Hk` key heads, `Hv` value heads (GVA), head dims `dk`, `dv`:
//!
//! ```text
//! q, k, v, z = split(x W_qkvz)         per key head: q, k [dk]; v, z [Hv/Hk * dv]
//! b, a       = split(x W_ba)           per key head: [Hv/Hk] each
//! q, k, v    = silu(causal depthwise conv1d over time of [q | k | v], kernel 4)
//! g    = -exp(A_log) softplus(a + dt_bias),  beta = sigmoid(b)
//! o    = GDN(q, k, v, g, beta) with q, k l2-normalised   (deltakv)
//! y    = (rms_norm(o) * w_norm * silu(z)) W_out
//! ```
//!
//! [`GdnCore::Reference`] runs the recurrence in plain candle ops instead (f32, token by
//! token): the test holds deltakv's layer to it. The layer runs where its weights and cache
//! are: on the CPU, or on a CUDA device ([`GatedDeltaNetLayer::to_device`],
//! [`LayerCache::new_on`]) with the `candle-cuda` feature.

use crate::ops::{Gates, gdn_decode, gdn_prefill};
use candle_core::{D, DType, Device, Result, Tensor};
use deltakv::gdn::{DecodeOptions, GdnOptions, PrefillMode};
use deltakv::rng::Rng;

/// Sizes of the layer.
#[derive(Clone, Copy, Debug)]
pub struct GdnLayerConfig {
    pub hidden: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    pub rms_eps: f64,
}

impl GdnLayerConfig {
    /// Qwen3-Next-80B-A3B's layer (hidden 2048, 16 key heads, 32 value heads, 128 x 128).
    pub fn qwen3_next_80b() -> Self {
        Self {
            hidden: 2048,
            key_heads: 16,
            value_heads: 32,
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
            rms_eps: 1e-6,
        }
    }

    fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// Which implementation of the recurrence the layer calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnCore {
    /// deltakv's kernels (CPU or CUDA, where the tensors are) through [`gdn_prefill`] and
    /// [`gdn_decode`].
    Deltakv,
    /// The recurrence in plain candle ops (f32), the test's reference.
    Reference,
}

/// The layer's weights (random, seeded).
pub struct GatedDeltaNetLayer {
    pub config: GdnLayerConfig,
    /// `[2 Hk dk + 2 Hv dv, hidden]`
    in_proj_qkvz: Tensor,
    /// `[2 Hv, hidden]`
    in_proj_ba: Tensor,
    /// `[conv_dim, kernel]`
    conv_weight: Tensor,
    /// `[Hv]`
    a_log: Tensor,
    /// `[Hv]`
    dt_bias: Tensor,
    /// `[dv]`
    norm_weight: Tensor,
    /// `[hidden, Hv dv]`
    out_proj: Tensor,
}

/// What the layer keeps between calls for a batch of sequences: the last `kernel - 1` conv
/// inputs per sequence, and the recurrent states in a pool addressed by slot.
pub struct LayerCache {
    /// `[B, kernel - 1, conv_dim]`
    pub conv_state: Tensor,
    /// `[S, Hv, dk, dv]` f32
    pub state_pool: Tensor,
    /// `[B]` i64: the slot of each sequence.
    pub slots: Tensor,
}

impl LayerCache {
    /// An empty cache on the CPU for `batch` sequences in slots `slots` of a pool of
    /// `pool_slots`.
    pub fn new(config: &GdnLayerConfig, slots: &[i64], pool_slots: usize) -> Result<Self> {
        Self::new_on(config, slots, pool_slots, &Device::Cpu)
    }

    /// [`LayerCache::new`] on `dev`.
    pub fn new_on(
        config: &GdnLayerConfig,
        slots: &[i64],
        pool_slots: usize,
        dev: &Device,
    ) -> Result<Self> {
        let batch = slots.len();
        Ok(Self {
            conv_state: Tensor::zeros(
                (batch, config.conv_kernel - 1, config.conv_dim()),
                DType::F32,
                dev,
            )?,
            state_pool: Tensor::zeros(
                (
                    pool_slots,
                    config.value_heads,
                    config.key_dim,
                    config.value_dim,
                ),
                DType::F32,
                dev,
            )?,
            slots: Tensor::new(slots, dev)?,
        })
    }
}

fn random(rng: &mut Rng, shape: &[usize], std: f64) -> Result<Tensor> {
    let n = shape.iter().product();
    Tensor::from_vec(rng.normal_vec(n, std), shape, &Device::Cpu)
}

fn softplus(x: &Tensor) -> Result<Tensor> {
    (x.exp()? + 1.0)?.log()
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?)
}

impl GatedDeltaNetLayer {
    /// Random weights from `seed` (scaled so activations stay O(1)); `A_log` and `dt_bias` as
    /// Qwen3-Next initialises them (A uniform in [0.01, 16], dt_bias 1) with some spread.
    pub fn random(config: GdnLayerConfig, seed: u64) -> Result<Self> {
        let mut rng = Rng::new(seed);
        let c = config;
        let std = (c.hidden as f64).powf(-0.5);
        let (hk, hv) = (c.key_heads * c.key_dim, c.value_heads * c.value_dim);
        let a: Vec<f32> = rng.uniform_vec(c.value_heads, 0.01, 16.0);
        Ok(Self {
            in_proj_qkvz: random(&mut rng, &[2 * hk + 2 * hv, c.hidden], std)?,
            in_proj_ba: random(&mut rng, &[2 * c.value_heads, c.hidden], std)?,
            conv_weight: random(&mut rng, &[c.conv_dim(), c.conv_kernel], 0.5)?,
            a_log: Tensor::from_vec(
                a.iter().map(|x| x.ln()).collect::<Vec<f32>>(),
                c.value_heads,
                &Device::Cpu,
            )?,
            dt_bias: (random(&mut rng, &[c.value_heads], 0.3)? + 1.0)?,
            norm_weight: (random(&mut rng, &[c.value_dim], 0.1)? + 1.0)?,
            out_proj: random(&mut rng, &[c.hidden, hv], (hv as f64).powf(-0.5))?,
            config,
        })
    }

    /// The same weights on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            config: self.config,
            in_proj_qkvz: self.in_proj_qkvz.to_device(device)?,
            in_proj_ba: self.in_proj_ba.to_device(device)?,
            conv_weight: self.conv_weight.to_device(device)?,
            a_log: self.a_log.to_device(device)?,
            dt_bias: self.dt_bias.to_device(device)?,
            norm_weight: self.norm_weight.to_device(device)?,
            out_proj: self.out_proj.to_device(device)?,
        })
    }

    /// `x [B, T, hidden]` f32 -> `[B, T, hidden]`, advancing `cache` by T tokens: a prefill
    /// for T > 1, a decode step for T == 1 (deltakv's in-place decode over the pool).
    pub fn forward(&self, x: &Tensor, cache: &mut LayerCache, core: GdnCore) -> Result<Tensor> {
        let c = self.config;
        let (batch, tokens, _) = x.dims3()?;
        let group = c.value_heads / c.key_heads;
        // Projections, split per key head as Qwen3-Next lays them out.
        let qkvz = x.broadcast_matmul(&self.in_proj_qkvz.t()?)?.reshape((
            batch,
            tokens,
            c.key_heads,
            2 * c.key_dim + 2 * group * c.value_dim,
        ))?;
        let ba = x.broadcast_matmul(&self.in_proj_ba.t()?)?.reshape((
            batch,
            tokens,
            c.key_heads,
            2 * group,
        ))?;
        let q = qkvz.narrow(3, 0, c.key_dim)?;
        let k = qkvz.narrow(3, c.key_dim, c.key_dim)?;
        let v = qkvz.narrow(3, 2 * c.key_dim, group * c.value_dim)?;
        let z = qkvz
            .narrow(3, 2 * c.key_dim + group * c.value_dim, group * c.value_dim)?
            .reshape((batch, tokens, c.value_heads, c.value_dim))?;
        let b = ba
            .narrow(3, 0, group)?
            .reshape((batch, tokens, c.value_heads))?;
        let a = ba
            .narrow(3, group, group)?
            .reshape((batch, tokens, c.value_heads))?;
        let flat = |t: &Tensor| t.reshape((batch, tokens, ())); // [B, T, heads * dim]
        let mixed = Tensor::cat(&[flat(&q)?, flat(&k)?, flat(&v)?], 2)?;
        let mixed = self.causal_conv(&mixed, cache)?.silu()?;
        let hk = c.key_heads * c.key_dim;
        let q = mixed
            .narrow(2, 0, hk)?
            .reshape((batch, tokens, c.key_heads, c.key_dim))?;
        let k = mixed
            .narrow(2, hk, hk)?
            .reshape((batch, tokens, c.key_heads, c.key_dim))?;
        let v = mixed
            .narrow(2, 2 * hk, c.value_heads * c.value_dim)?
            .reshape((batch, tokens, c.value_heads, c.value_dim))?;
        let o = match core {
            GdnCore::Deltakv => self.deltakv_core(&q, &k, &v, &a, &b, cache)?,
            GdnCore::Reference => self.reference_core(&q, &k, &v, &a, &b, cache)?,
        };
        // Gated RMS norm per value head, then the output projection.
        let normed = o.broadcast_div(&(o.sqr()?.mean_keepdim(D::Minus1)? + c.rms_eps)?.sqrt()?)?;
        let gated = normed.broadcast_mul(&self.norm_weight)?.mul(&z.silu()?)?;
        gated
            .reshape((batch, tokens, c.value_heads * c.value_dim))?
            .broadcast_matmul(&self.out_proj.t()?)
    }

    /// Depthwise causal conv over time: `mixed [B, T, C]` with the cached last `kernel - 1`
    /// inputs in front; updates the cache.
    fn causal_conv(&self, mixed: &Tensor, cache: &mut LayerCache) -> Result<Tensor> {
        let kernel = self.config.conv_kernel;
        let tokens = mixed.dim(1)?;
        let padded = Tensor::cat(&[&cache.conv_state, mixed], 1)?;
        let mut out = padded
            .narrow(1, 0, tokens)?
            .broadcast_mul(&self.conv_weight.narrow(1, 0, 1)?.squeeze(1)?)?;
        for j in 1..kernel {
            let w = self.conv_weight.narrow(1, j, 1)?.squeeze(1)?;
            out = (out + padded.narrow(1, j, tokens)?.broadcast_mul(&w)?)?;
        }
        cache.conv_state = padded.narrow(1, tokens, kernel - 1)?.contiguous()?;
        Ok(out)
    }

    /// The recurrence on deltakv: a prefill from the sequences' slots (its final states
    /// written back to them), or for one token the in-place decode with fused gating.
    fn deltakv_core(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: &Tensor,
        b: &Tensor,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let options = GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        };
        if q.dim(1)? == 1 {
            let gates = Gates::Fused {
                a,
                b,
                a_log: &self.a_log,
                dt_bias: &self.dt_bias,
            };
            let options = DecodeOptions {
                gdn: options,
                intermediate_states: false,
            };
            let (o, _) = gdn_decode(q, k, v, gates, &cache.slots, &cache.state_pool, &options)?;
            return Ok(o);
        }
        let (g, beta) = self.gates(a, b)?;
        let initial = cache.state_pool.index_select(&cache.slots, 0)?;
        let (o, final_state) = gdn_prefill(
            q,
            k,
            v,
            &g,
            &beta,
            Some(&initial),
            None,
            &options,
            PrefillMode::Chunk,
        )?;
        self.store_states(&final_state, cache)?;
        Ok(o)
    }

    /// `g = -exp(A_log) softplus(a + dt_bias)`, `beta = sigmoid(b)`.
    fn gates(&self, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
        let decay = self.a_log.exp()?.neg()?;
        let g = softplus(&a.broadcast_add(&self.dt_bias)?)?.broadcast_mul(&decay)?;
        Ok((g, sigmoid(b)?))
    }

    /// Writes each sequence's state `[B, Hv, dk, dv]` into its slot of the pool.
    fn store_states(&self, states: &Tensor, cache: &mut LayerCache) -> Result<()> {
        for (row, slot) in cache.slots.to_vec1::<i64>()?.into_iter().enumerate() {
            cache
                .state_pool
                .slice_set(&states.narrow(0, row, 1)?, 0, slot as usize)?;
        }
        Ok(())
    }

    /// The recurrence in candle ops, token by token, f32 (the reference).
    fn reference_core(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: &Tensor,
        b: &Tensor,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let c = self.config;
        let group = c.value_heads / c.key_heads;
        let (g, beta) = self.gates(a, b)?;
        // Value head h reads key head h / group.
        let expand = |t: &Tensor| -> Result<Tensor> {
            let (bsz, tokens, heads, dim) = t.dims4()?;
            l2_normalize(
                &t.unsqueeze(3)?
                    .broadcast_as((bsz, tokens, heads, group, dim))?
                    .reshape((bsz, tokens, heads * group, dim))?,
            )
        };
        let (q, k) = (expand(q)?, expand(k)?);
        let scale = (c.key_dim as f64).powf(-0.5);
        let mut state = cache.state_pool.index_select(&cache.slots, 0)?; // [B, Hv, dk, dv]
        let mut outputs = Vec::new();
        for t in 0..q.dim(1)? {
            let at = |x: &Tensor| x.narrow(1, t, 1)?.squeeze(1)?.contiguous();
            let (qt, kt, vt) = (at(&q)?, at(&k)?, at(v)?); // [B, Hv, d]
            let (gt, bt) = (at(&g)?.unsqueeze(2)?, at(&beta)?.unsqueeze(2)?); // [B, Hv, 1]
            state = state.broadcast_mul(&gt.exp()?.unsqueeze(3)?)?;
            let predicted = kt.unsqueeze(2)?.matmul(&state)?.squeeze(2)?; // S^T k
            let delta = (vt - predicted)?.broadcast_mul(&bt)?;
            state = (state + kt.unsqueeze(3)?.matmul(&delta.unsqueeze(2)?)?)?;
            outputs.push((qt.unsqueeze(2)?.matmul(&state)?.squeeze(2)? * scale)?);
        }
        self.store_states(&state, cache)?;
        Tensor::stack(&outputs, 1)
    }
}
