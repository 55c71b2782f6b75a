//! GDN prefill and decode from Python: inputs borrowed through DLPack, the pool written in
//! place, results exported through DLPack. Every call runs where its arrays are: the CPU
//! backend for host arrays, the CUDA backend (module `cuda`, cargo feature `cuda`) for arrays on
//! a GPU; arrays on different devices are a `ValueError`.

use crate::dlpack::{Borrowed, Device, call_device};
use crate::export::Exported;
use crate::{record_buffers, to_py_err};
use deltakv::HostView;
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions, PrefillMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn import_opt(
    name: &str,
    obj: Option<&Bound<'_, PyAny>>,
    device: Device,
    stream: Option<i64>,
) -> PyResult<Option<Borrowed>> {
    obj.map(|o| Borrowed::import(name, o, device, stream))
        .transpose()
}

/// The stream to order a call's CUDA arrays on (None on the CPU), after opening deltakv's GPU;
/// a build without the feature `cuda` refuses GPU arrays with one line.
#[cfg(feature = "cuda")]
fn launcher(device: Device, stream: Option<i64>) -> PyResult<Option<crate::cuda::Launcher>> {
    if device.is_cpu() {
        return Ok(None);
    }
    crate::cuda::Launcher::new(device, stream).map(Some)
}

#[cfg(not(feature = "cuda"))]
fn launcher(device: Device, _stream: Option<i64>) -> PyResult<Option<std::convert::Infallible>> {
    if device.is_cpu() {
        return Ok(None);
    }
    Err(to_py_err(deltakv::Error::DeviceUnavailable {
        device: "cuda".to_string(),
        reason: format!(
            "the tensors are on {device}, but this deltakv was built without CUDA (build it with the cargo feature `cuda`)"
        ),
    }))
}

/// (name, address) of each present array of a call, as [`record_buffers`] takes them.
fn addresses<'a>(arrays: impl IntoIterator<Item = &'a Borrowed>) -> Vec<(String, usize)> {
    arrays
        .into_iter()
        .map(|b| (b.name().to_string(), b.address()))
        .collect()
}

fn view_opt(b: &Option<Borrowed>) -> PyResult<Option<HostView<'_>>> {
    b.as_ref().map(Borrowed::view).transpose()
}

/// GDN prefill over arrays read in place, on the device they are on (see
/// `deltakv.chunk_gated_delta_rule`). `mode` is `"chunk"` or `"recurrent"`; `stream` is the
/// DLPack stream integer of the caller's CUDA stream (ignored on the CPU). Returns
/// `(o, final_state or None)` as [`Exported`] results on that device.
#[pyfunction]
#[pyo3(signature = (mode, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm, output_final_state = true, stream = None))]
#[allow(clippy::too_many_arguments)]
pub fn gdn_prefill(
    py: Python<'_>,
    mode: &str,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    g: &Bound<'_, PyAny>,
    beta: &Bound<'_, PyAny>,
    scale: Option<f32>,
    initial_state: Option<&Bound<'_, PyAny>>,
    cu_seqlens: Option<&Bound<'_, PyAny>>,
    use_qk_l2norm: bool,
    output_final_state: bool,
    stream: Option<i64>,
) -> PyResult<(Exported, Option<Exported>)> {
    let mode = match mode {
        "chunk" => PrefillMode::Chunk,
        "recurrent" => PrefillMode::Recurrent,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown prefill mode `{other}` (expected chunk or recurrent)"
            )));
        }
    };
    let device = call_device(&[
        ("q", Some(q)),
        ("k", Some(k)),
        ("v", Some(v)),
        ("g", Some(g)),
        ("beta", Some(beta)),
        ("initial_state", initial_state),
        ("cu_seqlens", cu_seqlens),
    ])?;
    let launcher = launcher(device, stream)?;
    #[cfg(feature = "cuda")]
    let stream = launcher.as_ref().map(|l| l.stream());
    let import = |name, obj| Borrowed::import(name, obj, device, stream);
    let (q, k, v) = (import("q", q)?, import("k", k)?, import("v", v)?);
    let (g, beta) = (import("g", g)?, import("beta", beta)?);
    let initial_state = import_opt("initial_state", initial_state, device, stream)?;
    let cu_seqlens = import_opt("cu_seqlens", cu_seqlens, device, stream)?;
    let mut buffers = addresses([&q, &k, &v, &g, &beta]);
    buffers.extend(addresses(initial_state.iter().chain(&cu_seqlens)));
    let options = GdnOptions {
        scale,
        use_qk_l2norm,
    };
    let (mut o, mut final_state) = match launcher {
        None => {
            let views = [q.view()?, k.view()?, v.view()?, g.view()?, beta.view()?];
            let initial_state = view_opt(&initial_state)?;
            let cu_seqlens = view_opt(&cu_seqlens)?;
            let inputs = GdnInputs {
                q: &views[0],
                k: &views[1],
                v: &views[2],
                g: &views[3],
                beta: &views[4],
                initial_state: initial_state.as_ref(),
                cu_seqlens: cu_seqlens.as_ref(),
            };
            let out = py
                .detach(|| deltakv::gdn::gdn_prefill(&inputs, &options, mode))
                .map_err(to_py_err)?;
            (
                Exported::from_tensor(out.o),
                Some(Exported::from_tensor(out.final_state)).filter(|_| output_final_state),
            )
        }
        #[cfg(feature = "cuda")]
        Some(launcher) => {
            let arrays = crate::cuda::PrefillArrays {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                initial_state: initial_state.as_ref(),
                cu_seqlens: cu_seqlens.as_ref(),
            };
            crate::cuda::prefill(py, &launcher, mode, &arrays, &options, output_final_state)?
        }
        #[cfg(not(feature = "cuda"))]
        Some(never) => match never {},
    };
    buffers.push(("o".to_string(), o.address()));
    if let Some(s) = final_state.as_mut() {
        buffers.push(("final_state".to_string(), s.address()));
    }
    record_buffers(buffers);
    Ok((o, final_state))
}

/// GDN decode: advances the slots of the caller's `state_pool` (`[S, H, K, V]` f32 or bf16,
/// written in place, on the CPU or a GPU) by the `T <= 16` tokens of each row (see
/// `deltakv.gated_delta_rule_decode`). Returns `(o, intermediate_states or None)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, state_pool, slot_indices, g, beta, a, b, a_log, dt_bias, scale, use_qk_l2norm, intermediate_states, stream = None))]
#[allow(clippy::too_many_arguments)]
pub fn gdn_decode(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    state_pool: &Bound<'_, PyAny>,
    slot_indices: &Bound<'_, PyAny>,
    g: Option<&Bound<'_, PyAny>>,
    beta: Option<&Bound<'_, PyAny>>,
    a: Option<&Bound<'_, PyAny>>,
    b: Option<&Bound<'_, PyAny>>,
    a_log: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    scale: Option<f32>,
    use_qk_l2norm: bool,
    intermediate_states: bool,
    stream: Option<i64>,
) -> PyResult<(Exported, Option<Exported>)> {
    let gate_args = [
        ("g", g),
        ("beta", beta),
        ("a", a),
        ("b", b),
        ("A_log", a_log),
        ("dt_bias", dt_bias),
    ];
    let mut named = vec![
        ("q", Some(q)),
        ("k", Some(k)),
        ("v", Some(v)),
        ("state_pool", Some(state_pool)),
        ("slot_indices", Some(slot_indices)),
    ];
    named.extend(gate_args);
    let device = call_device(&named)?;
    let launcher = launcher(device, stream)?;
    #[cfg(feature = "cuda")]
    let stream = launcher.as_ref().map(|l| l.stream());
    let import = |name, obj| Borrowed::import(name, obj, device, stream);
    let (q, k, v) = (import("q", q)?, import("k", k)?, import("v", v)?);
    let mut pool = import("state_pool", state_pool)?;
    let slots = import("slot_indices", slot_indices)?;
    let gates = gate_args
        .iter()
        .map(|(name, obj)| import_opt(name, *obj, device, stream))
        .collect::<PyResult<Vec<_>>>()?;
    // The pool is written while the inputs are read: they must not share memory.
    for input in [&q, &k, &v, &slots]
        .into_iter()
        .chain(gates.iter().flatten())
    {
        input.check_disjoint(&pool)?;
    }
    let mut buffers = addresses([&q, &k, &v, &slots, &pool]);
    buffers.extend(addresses(gates.iter().flatten()));
    let options = DecodeOptions {
        gdn: GdnOptions {
            scale,
            use_qk_l2norm,
        },
        intermediate_states,
    };
    let (mut o, mut states) = match launcher {
        None => {
            let (qv, kv, vv, sv) = (q.view()?, k.view()?, v.view()?, slots.view()?);
            let gate_views = gates.iter().map(view_opt).collect::<PyResult<Vec<_>>>()?;
            let gating = Gating::from_parts(
                gate_views[0].as_ref(),
                gate_views[1].as_ref(),
                gate_views[2].as_ref(),
                gate_views[3].as_ref(),
                gate_views[4].as_ref(),
                gate_views[5].as_ref(),
            )
            .map_err(to_py_err)?;
            let inputs = DecodeInputs {
                q: &qv,
                k: &kv,
                v: &vv,
                gating,
                slot_indices: &sv,
            };
            let mut pool_view = pool.view_mut()?;
            let out = py
                .detach(|| deltakv::gdn::gdn_decode(&inputs, &mut pool_view, &options))
                .map_err(to_py_err)?;
            (
                Exported::from_tensor(out.o),
                out.intermediate_states.map(Exported::from_tensor),
            )
        }
        #[cfg(feature = "cuda")]
        Some(launcher) => {
            let [g0, g1, g2, g3, g4, g5] = [0, 1, 2, 3, 4, 5].map(|i| gates[i].as_ref());
            let arrays = crate::cuda::DecodeArrays {
                q: &q,
                k: &k,
                v: &v,
                state_pool: &pool,
                slot_indices: &slots,
                gates: [g0, g1, g2, g3, g4, g5],
            };
            crate::cuda::decode(py, &launcher, &arrays, &options)?
        }
        #[cfg(not(feature = "cuda"))]
        Some(never) => match never {},
    };
    buffers.push(("o".to_string(), o.address()));
    if let Some(s) = states.as_mut() {
        buffers.push(("intermediate_states".to_string(), s.address()));
    }
    record_buffers(buffers);
    Ok((o, states))
}
