//! GDN prefill and decode from Python: inputs borrowed through DLPack, the pool written in
//! place, results exported through DLPack.

use crate::dlpack::{Borrowed, Exported};
use crate::{record_buffers, to_py_err};
use deltakv::gdn::{DecodeInputs, DecodeOptions, Gating, GdnInputs, GdnOptions, PrefillMode};
use deltakv::{HostData, HostView};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn import_opt(name: &str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Borrowed>> {
    obj.map(|o| Borrowed::import(name, o)).transpose()
}

fn view_opt(b: &Option<Borrowed>) -> PyResult<Option<HostView<'_>>> {
    b.as_ref().map(Borrowed::view).transpose()
}

fn address(name: &str, t: &impl HostData) -> (String, usize) {
    (name.to_string(), t.values().as_ptr() as usize)
}

/// GDN prefill on the CPU over arrays read in place (see `deltakv.chunk_gated_delta_rule`).
/// `mode` is `"chunk"` or `"recurrent"`. Returns `(o, final_state)` as [`Exported`] results.
#[pyfunction]
#[pyo3(signature = (mode, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm))]
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
) -> PyResult<(Exported, Exported)> {
    let mode = match mode {
        "chunk" => PrefillMode::Chunk,
        "recurrent" => PrefillMode::Recurrent,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown prefill mode `{other}` (expected chunk or recurrent)"
            )));
        }
    };
    let (q, k, v) = (
        Borrowed::import("q", q)?,
        Borrowed::import("k", k)?,
        Borrowed::import("v", v)?,
    );
    let (g, beta) = (Borrowed::import("g", g)?, Borrowed::import("beta", beta)?);
    let initial_state = import_opt("initial_state", initial_state)?;
    let cu_seqlens = import_opt("cu_seqlens", cu_seqlens)?;
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
    let mut buffers: Vec<_> = ["q", "k", "v", "g", "beta"]
        .iter()
        .zip(&views)
        .map(|(name, t)| address(name, t))
        .collect();
    buffers.extend(initial_state.as_ref().map(|t| address("initial_state", t)));
    buffers.extend(cu_seqlens.as_ref().map(|t| address("cu_seqlens", t)));
    record_buffers(buffers);
    let options = GdnOptions {
        scale,
        use_qk_l2norm,
    };
    let out = py
        .detach(|| deltakv::gdn::gdn_prefill(&inputs, &options, mode))
        .map_err(to_py_err)?;
    Ok((
        Exported::from_tensor(out.o),
        Exported::from_tensor(out.final_state),
    ))
}

/// GDN decode on the CPU: advances the slots of the caller's `state_pool` (`[S, H, K, V]`
/// f32 or bf16, written in place) by the `T <= 16` tokens of each row (see
/// `deltakv.gated_delta_rule_decode`). Returns `(o, intermediate_states or None)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, state_pool, slot_indices, g, beta, a, b, a_log, dt_bias, scale, use_qk_l2norm, intermediate_states))]
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
) -> PyResult<(Exported, Option<Exported>)> {
    let (q, k, v) = (
        Borrowed::import("q", q)?,
        Borrowed::import("k", k)?,
        Borrowed::import("v", v)?,
    );
    let mut pool = Borrowed::import("state_pool", state_pool)?;
    let slots = Borrowed::import("slot_indices", slot_indices)?;
    let gates = [
        import_opt("g", g)?,
        import_opt("beta", beta)?,
        import_opt("a", a)?,
        import_opt("b", b)?,
        import_opt("A_log", a_log)?,
        import_opt("dt_bias", dt_bias)?,
    ];
    // The pool is written while the inputs are read: they must not share memory.
    for input in [&q, &k, &v, &slots]
        .into_iter()
        .chain(gates.iter().flatten())
    {
        input.check_disjoint(&pool)?;
    }
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
    let mut buffers = vec![
        address("q", &qv),
        address("k", &kv),
        address("v", &vv),
        address("slot_indices", &sv),
        address("state_pool", &pool_view),
    ];
    for (name, t) in ["g", "beta", "a", "b", "A_log", "dt_bias"]
        .iter()
        .zip(&gate_views)
    {
        buffers.extend(t.as_ref().map(|t| address(name, t)));
    }
    record_buffers(buffers);
    let options = DecodeOptions {
        gdn: GdnOptions {
            scale,
            use_qk_l2norm,
        },
        intermediate_states,
    };
    let out = py
        .detach(|| deltakv::gdn::gdn_decode(&inputs, &mut pool_view, &options))
        .map_err(to_py_err)?;
    Ok((
        Exported::from_tensor(out.o),
        out.intermediate_states.map(Exported::from_tensor),
    ))
}
