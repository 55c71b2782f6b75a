//! The two ops: candle's CPU storage viewed as deltakv host views (and, with the `candle-cuda`
//! feature, candle's CUDA storage as deltakv device tensors), the kernels run in place.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp3, Error, InplaceOp3, Layout, Result, Shape, Storage, StorageRef, Tensor,
};
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions, PrefillMode};
use deltakv::{HostTensor, HostView, HostViewMut, TensorData, TensorSlice, TensorSliceMut};
use std::sync::Mutex;

fn err(e: deltakv::Error) -> Error {
    Error::Msg(e.to_string())
}

/// Elements `start..end` of a contiguous layout, or an error naming the tensor.
pub(crate) fn range(name: &str, layout: &Layout) -> Result<(usize, usize)> {
    layout.contiguous_offsets().ok_or_else(|| {
        Error::Msg(format!(
            "tensor `{name}` is not contiguous (deltakv reads tensors in place)"
        ))
    })
}

/// A contiguous CPU storage, viewed in place.
fn view<'a>(name: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<HostView<'a>> {
    let (start, end) = range(name, layout)?;
    let data = match storage {
        CpuStorage::F32(v) => TensorSlice::F32(&v[start..end]),
        CpuStorage::F16(v) => TensorSlice::F16(&v[start..end]),
        CpuStorage::BF16(v) => TensorSlice::BF16(&v[start..end]),
        CpuStorage::I32(v) => TensorSlice::I32(&v[start..end]),
        CpuStorage::I64(v) => TensorSlice::I64(&v[start..end]),
        other => {
            return Err(Error::Msg(format!(
                "tensor `{name}` has dtype {:?}; deltakv reads f32, f16, bf16, i32 and i64",
                other.dtype()
            )));
        }
    };
    HostView::new(layout.dims().to_vec(), data).map_err(err)
}

/// A contiguous CPU storage, viewed mutably in place (the pool).
fn view_mut<'a>(
    name: &str,
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> Result<HostViewMut<'a>> {
    let (start, end) = range(name, layout)?;
    let data = match storage {
        CpuStorage::F32(v) => TensorSliceMut::F32(&mut v[start..end]),
        CpuStorage::BF16(v) => TensorSliceMut::BF16(&mut v[start..end]),
        other => {
            return Err(Error::Msg(format!(
                "tensor `{name}` has dtype {:?}; a state pool is f32 or bf16",
                other.dtype()
            )));
        }
    };
    HostViewMut::new(layout.dims().to_vec(), data).map_err(err)
}

/// A tensor the op reads besides its candle operands, read-locked for the call.
struct Locked<'a> {
    name: &'static str,
    storage: StorageRef<'a>,
    layout: &'a Layout,
}

impl<'a> Locked<'a> {
    fn new(name: &'static str, t: &'a Tensor) -> Self {
        let (storage, layout) = t.storage_and_layout();
        Self {
            name,
            storage,
            layout,
        }
    }

    fn view(&self) -> Result<HostView<'_>> {
        match &*self.storage {
            Storage::Cpu(s) => view(self.name, s, self.layout),
            _ => Err(Error::Msg(format!(
                "tensor `{}` is not on the CPU, where q, k and v are",
                self.name
            ))),
        }
    }

    /// The locked storage and its layout (the CUDA path borrows them as device tensors).
    #[cfg(feature = "candle-cuda")]
    fn parts(&self) -> (&Storage, &Layout) {
        (&self.storage, self.layout)
    }
}

fn lock_opt<'a>(name: &'static str, t: &'a Option<Tensor>) -> Option<Locked<'a>> {
    t.as_ref().map(|t| Locked::new(name, t))
}

fn view_opt<'a>(l: &'a Option<Locked<'_>>) -> Result<Option<HostView<'a>>> {
    l.as_ref().map(Locked::view).transpose()
}

/// A kernel's float result as candle CPU storage (the `Vec` moves; no copy).
fn into_storage(t: HostTensor) -> (CpuStorage, Shape) {
    let shape = Shape::from(t.shape().to_vec());
    let storage = match t.into_data() {
        TensorData::F32(v) => CpuStorage::F32(v),
        TensorData::F16(v) => CpuStorage::F16(v),
        TensorData::BF16(v) => CpuStorage::BF16(v),
        TensorData::I32(v) => CpuStorage::I32(v),
        TensorData::I64(v) => CpuStorage::I64(v),
    };
    (storage, shape)
}

fn into_tensor(t: HostTensor) -> Result<Tensor> {
    let (storage, shape) = into_storage(t);
    match storage {
        CpuStorage::F32(v) => Tensor::from_vec(v, shape, &candle_core::Device::Cpu),
        CpuStorage::BF16(v) => Tensor::from_vec(v, shape, &candle_core::Device::Cpu),
        CpuStorage::F16(v) => Tensor::from_vec(v, shape, &candle_core::Device::Cpu),
        _ => Err(Error::Msg("deltakv returned a non-float tensor".into())),
    }
}

/// Takes what a kernel left in `slot`.
fn take<T>(slot: &Mutex<Option<T>>, what: &str) -> Result<T> {
    let value = match slot.lock() {
        Ok(mut guard) => guard.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    value.ok_or_else(|| Error::Msg(format!("deltakv's {what} did not run")))
}

fn put<T>(slot: &Mutex<Option<T>>, value: T) {
    match slot.lock() {
        Ok(mut guard) => *guard = Some(value),
        Err(poisoned) => *poisoned.into_inner() = Some(value),
    }
}

/// GDN prefill as a `CustomOp3` over `(q, k, v)`.
struct Prefill {
    g: Tensor,
    beta: Tensor,
    initial_state: Option<Tensor>,
    cu_seqlens: Option<Tensor>,
    options: GdnOptions,
    mode: PrefillMode,
    final_state: Mutex<Option<HostTensor>>,
    /// On CUDA: the final state's buffer `[N, H, K, V]` f32, allocated before the call.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    final_state_buffer: Option<Tensor>,
}

impl CustomOp3 for Prefill {
    fn name(&self) -> &'static str {
        "deltakv-gdn-prefill"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (view("q", s1, l1)?, view("k", s2, l2)?, view("v", s3, l3)?);
        let (g, beta) = (Locked::new("g", &self.g), Locked::new("beta", &self.beta));
        let initial_state = lock_opt("initial_state", &self.initial_state);
        let cu_seqlens = lock_opt("cu_seqlens", &self.cu_seqlens);
        let (g, beta) = (g.view()?, beta.view()?);
        let (initial_state, cu_seqlens) = (view_opt(&initial_state)?, view_opt(&cu_seqlens)?);
        let inputs = GdnInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            initial_state: initial_state.as_ref(),
            cu_seqlens: cu_seqlens.as_ref(),
        };
        let out = deltakv::gdn::gdn_prefill(&inputs, &self.options, self.mode).map_err(err)?;
        put(&self.final_state, out.final_state);
        Ok(into_storage(out.o))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let buffer = self
            .final_state_buffer
            .as_ref()
            .ok_or_else(|| Error::Msg("deltakv's CUDA prefill has no final-state buffer".into()))?;
        let (g, beta) = (Locked::new("g", &self.g), Locked::new("beta", &self.beta));
        let initial_state = lock_opt("initial_state", &self.initial_state);
        let cu_seqlens = lock_opt("cu_seqlens", &self.cu_seqlens);
        let state = Locked::new("final_state", buffer);
        crate::cuda::prefill(
            (s1, l1),
            (s2, l2),
            (s3, l3),
            g.parts(),
            beta.parts(),
            initial_state.as_ref().map(Locked::parts),
            cu_seqlens.as_ref().map(Locked::parts),
            state.parts(),
            &self.options,
        )
    }
}

/// `[N, H, K, V]` f32 for a prefill of `q` `[B, T, Hg, K]` and `v` `[B, T, H, V]` (N: B, or the
/// number of `cu_seqlens` sequences); a placeholder when the ranks are wrong (the contract's
/// check then names the bad tensor).
fn final_state_shape(q: &Tensor, v: &Tensor, cu_seqlens: Option<&Tensor>) -> Vec<usize> {
    match (q.dims(), v.dims()) {
        (&[batch, _, _, key_dim], &[_, _, value_heads, value_dim]) => {
            let sequences = match cu_seqlens.map(Tensor::dims) {
                Some(&[len]) => len.saturating_sub(1),
                Some(_) => 0,
                None => batch,
            };
            vec![sequences, value_heads, key_dim, value_dim]
        }
        _ => vec![0],
    }
}

/// GDN prefill on candle tensors: q, k `[B, T, Hg, K]`, v `[B, T, H, V]` (one float dtype), g,
/// beta `[B, T, H]` float, optional `initial_state` `[N, H, K, V]` f32 and `cu_seqlens`
/// `[N + 1]` i32/i64 (then B == 1). Returns `(o [B, T, H, V] in v's dtype, final_state
/// [N, H, K, V] f32)`. Non-contiguous inputs are made contiguous first (candle's `contiguous`,
/// a no-op for contiguous ones).
///
/// CPU tensors run deltakv's CPU kernels (`mode` picks the chunked or the token-by-token
/// form). CUDA tensors (feature `candle-cuda`; every tensor on one GPU) run deltakv's chunked CUDA
/// kernels in either mode (bf16 products, f32 accumulation and states: o within ~4e-3 of the
/// f64 oracle), on candle's stream; their values are not checked on the host.
#[allow(clippy::too_many_arguments)]
pub fn gdn_prefill(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    cu_seqlens: Option<&Tensor>,
    options: &GdnOptions,
    mode: PrefillMode,
) -> Result<(Tensor, Tensor)> {
    let final_state_buffer = match q.device() {
        candle_core::Device::Cpu => None,
        device => Some(Tensor::zeros(
            final_state_shape(q, v, cu_seqlens),
            candle_core::DType::F32,
            device,
        )?),
    };
    let op = Prefill {
        g: g.contiguous()?,
        beta: beta.contiguous()?,
        initial_state: initial_state.map(Tensor::contiguous).transpose()?,
        cu_seqlens: cu_seqlens.map(Tensor::contiguous).transpose()?,
        options: options.clone(),
        mode,
        final_state: Mutex::new(None),
        final_state_buffer,
    };
    let o = q
        .contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &op)?;
    let final_state = match op.final_state_buffer {
        Some(buffer) => buffer,
        None => into_tensor(take(&op.final_state, "prefill")?)?,
    };
    Ok((o, final_state))
}

/// The gating of a decode call: g and beta `[B, T, H]`, or Qwen3-Next's fused gating from the
/// raw projections `a`, `b` `[B, T, H]` and per-head `A_log`, `dt_bias` `[H]`:
/// `g = -exp(A_log) softplus(a + dt_bias)`, `beta = sigmoid(b)`.
#[derive(Clone, Copy, Debug)]
pub enum Gates<'a> {
    Direct {
        g: &'a Tensor,
        beta: &'a Tensor,
    },
    Fused {
        a: &'a Tensor,
        b: &'a Tensor,
        a_log: &'a Tensor,
        dt_bias: &'a Tensor,
    },
}

/// GDN decode as an `InplaceOp3` on the pool, with `(q, k)` as candle operands.
struct Decode {
    v: Tensor,
    slot_indices: Tensor,
    /// `[g, beta]` or `[a, b, A_log, dt_bias]`.
    gates: Vec<Tensor>,
    fused: bool,
    options: DecodeOptions,
    out: Mutex<Option<deltakv::gdn::DecodeOutput>>,
    /// On CUDA: `o` and the intermediate states' buffers, allocated before the call.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    device_outputs: Option<(Tensor, Option<Tensor>)>,
}

const DIRECT_NAMES: [&str; 2] = ["g", "beta"];
const FUSED_NAMES: [&str; 4] = ["a", "b", "A_log", "dt_bias"];

impl Decode {
    /// The gates' names (`[g, beta]` or `[a, b, A_log, dt_bias]`), each gate read-locked.
    fn locked_gates(&self) -> (&'static [&'static str], Vec<Locked<'_>>) {
        let names: &'static [&'static str] = if self.fused {
            &FUSED_NAMES
        } else {
            &DIRECT_NAMES
        };
        let gates = names
            .iter()
            .zip(&self.gates)
            .map(|(name, t)| Locked::new(name, t))
            .collect();
        (names, gates)
    }
}

impl InplaceOp3 for Decode {
    fn name(&self) -> &'static str {
        "deltakv-gdn-decode"
    }

    fn cpu_fwd(
        &self,
        pool: &mut CpuStorage,
        pool_layout: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (q, k) = (view("q", s2, l2)?, view("k", s3, l3)?);
        let v = Locked::new("v", &self.v);
        let slots = Locked::new("slot_indices", &self.slot_indices);
        let (names, gates) = self.locked_gates();
        let (v, slots) = (v.view()?, slots.view()?);
        let gate_views = gates.iter().map(Locked::view).collect::<Result<Vec<_>>>()?;
        let gating = Gating::from_lookup(|name| {
            names
                .iter()
                .position(|n| *n == name)
                .map(|i| &gate_views[i])
        })
        .map_err(err)?;
        let inputs = DecodeInputs {
            q: &q,
            k: &k,
            v: &v,
            gating,
            slot_indices: &slots,
        };
        let mut pool = view_mut("state_pool", pool, pool_layout)?;
        let out = deltakv::gdn::gdn_decode(&inputs, &mut pool, &self.options).map_err(err)?;
        put(&self.out, out);
        Ok(())
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        pool: &mut candle_core::CudaStorage,
        pool_layout: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (o, states) = self
            .device_outputs
            .as_ref()
            .ok_or_else(|| Error::Msg("deltakv's CUDA decode has no output buffers".into()))?;
        let v = Locked::new("v", &self.v);
        let slots = Locked::new("slot_indices", &self.slot_indices);
        let (_, gates) = self.locked_gates();
        let gate_parts: Vec<(&'static str, &Storage, &Layout)> = gates
            .iter()
            .map(|l| {
                let (s, layout) = l.parts();
                (l.name, s, layout)
            })
            .collect();
        let o = Locked::new("o", o);
        let states = states
            .as_ref()
            .map(|t| Locked::new("intermediate_states", t));
        crate::cuda::decode(
            (pool, pool_layout),
            (s2, l2),
            (s3, l3),
            v.parts(),
            slots.parts(),
            &gate_parts,
            crate::cuda::DecodeBuffers {
                o: o.parts(),
                intermediate_states: states.as_ref().map(Locked::parts),
            },
            &self.options,
        )
    }
}

/// The address of a tensor's storage (equal for tensors sharing one allocation).
fn storage_address(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    &*storage as *const Storage as usize
}

/// GDN decode on candle tensors, updating `state_pool` `[S, H, K, V]` (f32 or bf16, contiguous)
/// in place: row `b` advances slot `slot_indices[b]` (`[B]` i32/i64; negative skips the row) by
/// its T <= 16 tokens. q, k `[B, T, Hg, K]`, v `[B, T, H, V]`. Returns `(o [B, T, H, V] in v's
/// dtype, intermediate states [B, T, H, K, V] f32 when `options.intermediate_states`)`. No
/// input may share storage with the pool. CPU tensors run deltakv's CPU kernels; CUDA tensors
/// (feature `candle-cuda`, every tensor on one GPU) its CUDA kernels on candle's stream, in f32 like
/// the CPU (the slot indices are read to the host to check them; other values are not).
pub fn gdn_decode(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gates: Gates<'_>,
    slot_indices: &Tensor,
    state_pool: &Tensor,
    options: &DecodeOptions,
) -> Result<(Tensor, Option<Tensor>)> {
    let (gates, fused) = match gates {
        Gates::Direct { g, beta } => (vec![g, beta], false),
        Gates::Fused {
            a,
            b,
            a_log,
            dt_bias,
        } => (vec![a, b, a_log, dt_bias], true),
    };
    // The op read-locks these while the pool is write-locked: one sharing the pool's storage
    // would deadlock, so it is refused here (candle itself checks q and k).
    let pool_storage = storage_address(state_pool);
    for (name, t) in [("v", v), ("slot_indices", slot_indices)]
        .into_iter()
        .chain(gates.iter().map(|t| ("a gate", *t)))
    {
        if storage_address(t) == pool_storage {
            return Err(Error::Msg(format!(
                "tensor `{name}` shares storage with `state_pool`, which the call writes in place"
            )));
        }
    }
    let device_outputs = match q.device() {
        candle_core::Device::Cpu => None,
        device => {
            let (o_shape, states_shape) = decode_output_shapes(q, v);
            let o = Tensor::zeros(o_shape, v.dtype(), device)?;
            let states = options
                .intermediate_states
                .then(|| Tensor::zeros(states_shape, candle_core::DType::F32, device))
                .transpose()?;
            Some((o, states))
        }
    };
    let op = Decode {
        device_outputs,
        v: v.contiguous()?,
        slot_indices: slot_indices.contiguous()?,
        gates: gates
            .into_iter()
            .map(Tensor::contiguous)
            .collect::<Result<_>>()?,
        fused,
        options: options.clone(),
        out: Mutex::new(None),
    };
    state_pool.inplace_op3(&q.contiguous()?, &k.contiguous()?, &op)?;
    if let Some(outputs) = op.device_outputs {
        return Ok(outputs);
    }
    let out = take(&op.out, "decode")?;
    Ok((
        into_tensor(out.o)?,
        out.intermediate_states.map(into_tensor).transpose()?,
    ))
}

/// `(o [B, T, H, V], intermediate states [B, T, H, K, V])` of a decode of `q` `[B, T, Hg, K]`
/// and `v` `[B, T, H, V]`; placeholders when the ranks are wrong (the contract's check then
/// names the bad tensor).
fn decode_output_shapes(q: &Tensor, v: &Tensor) -> (Vec<usize>, Vec<usize>) {
    match (q.dims(), v.dims()) {
        (&[.., key_dim], &[batch, tokens, value_heads, value_dim]) => (
            vec![batch, tokens, value_heads, value_dim],
            vec![batch, tokens, value_heads, key_dim, value_dim],
        ),
        _ => (vec![0], vec![0]),
    }
}
