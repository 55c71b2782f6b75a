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
    let arrays = PrefillObjects {
        q,
        k,
        v,
        g,
        beta,
        initial_state,
        cu_seqlens,
    };
    let options = GdnOptions {
        scale,
        use_qk_l2norm,
    };
    let out = prefill(
        py,
        mode,
        &arrays,
        &options,
        output_final_state,
        None,
        stream,
    )?;
    Ok((out.o, out.final_state))
}

/// [`gdn_prefill`] in the chunked form that also returns the state every `checkpoint_every`
/// tokens of each sequence (a positive multiple of 64; the contract's layout,
/// `deltakv::gdn::prefill::checkpoint`): `(o, final_state or None, checkpoints
/// [C, H, K, V] f32, offsets)`, where sequence `n`'s checkpoints are rows
/// `offsets[n]..offsets[n + 1]` (a list of `N + 1` ints).
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm, output_final_state, checkpoint_every, stream = None))]
#[allow(clippy::too_many_arguments)]
pub fn gdn_prefill_checkpointed(
    py: Python<'_>,
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
    checkpoint_every: usize,
    stream: Option<i64>,
) -> PyResult<(Exported, Option<Exported>, Exported, Vec<usize>)> {
    let arrays = PrefillObjects {
        q,
        k,
        v,
        g,
        beta,
        initial_state,
        cu_seqlens,
    };
    let options = GdnOptions {
        scale,
        use_qk_l2norm,
    };
    let every = Some(checkpoint_every);
    let out = prefill(
        py,
        "chunk",
        &arrays,
        &options,
        output_final_state,
        every,
        stream,
    )?;
    let (states, offsets) = out
        .checkpoints
        .ok_or_else(|| PyValueError::new_err("the prefill returned no checkpoints"))?;
    Ok((out.o, out.final_state, states, offsets))
}

/// The Python arrays of a prefill call, before import.
struct PrefillObjects<'a, 'py> {
    q: &'a Bound<'py, PyAny>,
    k: &'a Bound<'py, PyAny>,
    v: &'a Bound<'py, PyAny>,
    g: &'a Bound<'py, PyAny>,
    beta: &'a Bound<'py, PyAny>,
    initial_state: Option<&'a Bound<'py, PyAny>>,
    cu_seqlens: Option<&'a Bound<'py, PyAny>>,
}

/// What a prefill call returns to Python: `o`, the final state when asked, and the
/// checkpoints with their per-sequence offsets when asked.
pub struct PrefillResults {
    pub o: Exported,
    pub final_state: Option<Exported>,
    pub checkpoints: Option<(Exported, Vec<usize>)>,
}

fn prefill(
    py: Python<'_>,
    mode: &str,
    arrays: &PrefillObjects<'_, '_>,
    options: &GdnOptions,
    output_final_state: bool,
    checkpoint_every: Option<usize>,
    stream: Option<i64>,
) -> PyResult<PrefillResults> {
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
        ("q", Some(arrays.q)),
        ("k", Some(arrays.k)),
        ("v", Some(arrays.v)),
        ("g", Some(arrays.g)),
        ("beta", Some(arrays.beta)),
        ("initial_state", arrays.initial_state),
        ("cu_seqlens", arrays.cu_seqlens),
    ])?;
    let launcher = launcher(device, stream)?;
    #[cfg(feature = "cuda")]
    let stream = launcher.as_ref().map(|l| l.stream());
    let import = |name, obj| Borrowed::import(name, obj, device, stream);
    let (q, k, v) = (
        import("q", arrays.q)?,
        import("k", arrays.k)?,
        import("v", arrays.v)?,
    );
    let (g, beta) = (import("g", arrays.g)?, import("beta", arrays.beta)?);
    let initial_state = import_opt("initial_state", arrays.initial_state, device, stream)?;
    let cu_seqlens = import_opt("cu_seqlens", arrays.cu_seqlens, device, stream)?;
    let mut buffers = addresses([&q, &k, &v, &g, &beta]);
    buffers.extend(addresses(initial_state.iter().chain(&cu_seqlens)));
    let mut out = match launcher {
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
                .detach(|| {
                    deltakv::gdn::gdn_prefill_checkpointed(&inputs, options, mode, checkpoint_every)
                })
                .map_err(to_py_err)?;
            let checkpoints = match out.checkpoints {
                Some(c) => {
                    let offsets = c.offsets.to_i64_vec("offsets").map_err(to_py_err)?;
                    let offsets = offsets.into_iter().map(|x| x as usize).collect();
                    Some((Exported::from_tensor(c.states), offsets))
                }
                None => None,
            };
            PrefillResults {
                o: Exported::from_tensor(out.o),
                final_state: Some(Exported::from_tensor(out.final_state))
                    .filter(|_| output_final_state),
                checkpoints,
            }
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
            crate::cuda::prefill(
                py,
                &launcher,
                mode,
                &arrays,
                options,
                output_final_state,
                checkpoint_every,
            )?
        }
        #[cfg(not(feature = "cuda"))]
        Some(never) => match never {},
    };
    buffers.push(("o".to_string(), out.o.address()));
    if let Some(s) = out.final_state.as_mut() {
        buffers.push(("final_state".to_string(), s.address()));
    }
    if let Some((s, _)) = out.checkpoints.as_mut() {
        buffers.push(("checkpoints".to_string(), s.address()));
    }
    record_buffers(buffers);
    Ok(out)
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
