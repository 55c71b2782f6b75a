"""Zero copies through DLPack (the kernels read the callers' own buffers, a pool is written in
place, results come back as the caller's kind), and decode over a state pool against an f64
NumPy reference with the Rust tests' tolerances."""

import numpy as np
import pytest

import deltakv
from deltakv import _deltakv
from test_gdn_prefill import make_case, reference, rel_rms

# The Rust decode suite's tolerances (deltakv_contract::gdn::decode::check).
O_TOLERANCE_F32 = 1e-5
STATE_TOLERANCE_F32 = 1e-5
O_TOLERANCE = 2e-3
STATE_TOLERANCE_BF16 = 4e-3


def address(x):
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.data_ptr()  # torch


def buffers():
    return dict(_deltakv.last_call_buffers())


def test_prefill_reads_the_callers_arrays_in_place():
    rng = np.random.default_rng(10)
    q, k, v, g, beta, s0 = make_case(rng, 1, 70, 2, 4, 16, 8, init=True)
    cu = np.array([0, 30, 70], dtype=np.int32)
    s0 = np.concatenate([s0, s0])
    o, s = deltakv.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                          output_final_state=True, cu_seqlens=cu)
    seen = buffers()
    for name, x in dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=s0, cu_seqlens=cu).items():
        assert seen[name] == address(x), name
    ref_o, ref_s = reference(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu)
    assert rel_rms(o, ref_o) < 1e-5 and rel_rms(s, ref_s) < 1e-5
    # Results are the kernel's buffers, owned by NumPy now, writable.
    assert o.flags.writeable and o.flags.c_contiguous and s.shape == (2, 4, 16, 8)


def fused_gates(a, b, A_log, dt_bias):
    x = a.astype(np.float64) + dt_bias
    softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    return -np.exp(A_log.astype(np.float64)) * softplus, 1 / (1 + np.exp(-b.astype(np.float64)))


def decode_reference(q, k, v, g, beta, pool, slots, l2, scale=None):
    """(o, new pool, intermediate states) in f64: each row runs its T tokens from its slot."""
    B, T = q.shape[:2]
    H, K, V = pool.shape[1:]
    o = np.zeros((B, T, H, V))
    inter = np.zeros((B, T, H, K, V))
    new_pool = pool.astype(np.float64)
    for b, s in enumerate(slots):
        if s < 0:
            continue
        state = new_pool[s][None]
        for t in range(T):
            sl = slice(b, b + 1), slice(t, t + 1)
            ob, state = reference(q[sl], k[sl], v[sl], g[sl], beta[sl], scale=scale,
                                  initial_state=state, l2=l2)
            o[b, t] = ob[0, 0]
            inter[b, t] = state[0]
        new_pool[s] = state[0]
    return o, new_pool, inter


DECODE_CASES = [
    # (B, T, Hg, H, K, V, S, slots, fused, l2)
    (1, 1, 2, 4, 16, 8, 3, [2], False, True),
    (3, 1, 1, 3, 12, 20, 5, [4, -1, 0], True, True),
    (2, 4, 2, 6, 32, 16, 4, [1, 3], True, False),
    (4, 16, 2, 2, 8, 24, 6, [5, 2, -7, 0], False, True),
]


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_in_place_against_f64_reference(case):
    B, T, Hg, H, K, V, S, slots, fused, l2 = case
    rng = np.random.default_rng(B * 100 + T)
    q, k, v, g, beta, _ = make_case(rng, B, T, Hg, H, K, V)
    pool = (0.3 * rng.standard_normal((S, H, K, V))).astype(np.float32)
    before = pool.copy()
    slot_indices = np.array(slots, dtype=np.int64)
    gating = dict(g=g, beta=beta)
    if fused:
        a = rng.standard_normal((B, T, H)).astype(np.float32)
        b = rng.standard_normal((B, T, H)).astype(np.float32)
        A_log = rng.uniform(-1, 1, H).astype(np.float32)
        dt_bias = rng.uniform(-1, 1, H).astype(np.float32)
        gating = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
        g, beta = fused_gates(a, b, A_log, dt_bias)
    o, inter = deltakv.gated_delta_rule_decode(q, k, v, pool, slot_indices, **gating,
                                               use_qk_l2norm_in_kernel=l2,
                                               output_intermediate_states=True)
    seen = buffers()
    assert seen["state_pool"] == address(pool)  # the kernel wrote the caller's pool
    for name, x in dict(q=q, k=k, v=v, slot_indices=slot_indices, **gating).items():
        assert seen[name] == address(x), name
    ref_o, ref_pool, ref_inter = decode_reference(q, k, v, g, beta, before, slots, l2)
    assert o.shape == (B, T, H, V) and inter.shape == (B, T, H, K, V)
    assert rel_rms(o, ref_o) < O_TOLERANCE_F32
    assert rel_rms(inter, ref_inter) < STATE_TOLERANCE_F32
    assert rel_rms(pool, ref_pool) < STATE_TOLERANCE_F32
    for b, s in enumerate(slots):
        if s < 0:
            assert not o[b].any() and not inter[b].any()
    untouched = [s for s in range(S) if s not in slots]
    assert np.array_equal(pool[untouched], before[untouched])


def test_decode_errors_leave_the_pool_untouched():
    rng = np.random.default_rng(12)
    q, k, v, g, beta, _ = make_case(rng, 2, 1, 1, 2, 8, 8)
    pool = rng.standard_normal((3, 2, 8, 8)).astype(np.float32)
    before = pool.copy()
    call = lambda slots, p=pool, **kw: deltakv.gated_delta_rule_decode(  # noqa: E731
        q, k, v, p, np.array(slots, dtype=np.int32), **{"g": g, "beta": beta, **kw})
    with pytest.raises(ValueError, match=r"^slot_indices: rows 0 and 1 both address slot 1"):
        call([1, 1])
    with pytest.raises(ValueError, match=r"slot_indices\[1\] = 3 is out of range"):
        call([0, 3])
    with pytest.raises(ValueError, match="positive log decay"):
        call([0, 1], g=-g)
    with pytest.raises(ValueError, match="either g and beta or fused gating"):
        call([0, 1], a=g)
    assert np.array_equal(pool, before)
    with pytest.raises(ValueError, match="not C-contiguous"):
        call([0, 1], p=np.asfortranarray(pool))
    readonly = pool.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call([0, 1], p=readonly)
    # An input that is a view into the pool would be read while the pool is written.
    flat = pool.reshape(-1)
    with pytest.raises(ValueError, match="overlaps `state_pool`"):
        deltakv.gated_delta_rule_decode(flat[: q.size].reshape(q.shape), k, v, pool,
                                        np.array([0, 1], dtype=np.int32), g=g, beta=beta)
    assert np.array_equal(pool, before)


def test_results_and_inputs_of_other_dtypes():
    rng = np.random.default_rng(13)
    q, k, v, g, beta, _ = make_case(rng, 1, 5, 1, 2, 8, 8, dtype=np.float16)
    o, _ = deltakv.chunk_gated_delta_rule(q, k, v, g, beta)
    assert o.dtype == np.float16
    with pytest.raises(ValueError, match="has dtype float64"):
        deltakv.chunk_gated_delta_rule(q, k, v, g.astype(np.float64), beta)
    with pytest.raises(ValueError, match="expected an array with __dlpack__"):
        deltakv.chunk_gated_delta_rule(q.tolist(), k, v, g, beta)


def test_an_exported_result_is_handed_out_once():
    rng = np.random.default_rng(14)
    q, k, v, g, beta, _ = make_case(rng, 1, 3, 1, 1, 8, 8)
    o, _ = _deltakv.gdn_prefill("chunk", q, k, v, g, beta, None, None, None, False)
    assert o.__dlpack_device__() == (1, 0)
    np.from_dlpack(o)
    with pytest.raises(BufferError, match="already exported"):
        np.from_dlpack(o)


def test_torch_pool_in_place_f32_and_bf16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    B, T, Hg, H, K, V, S = 3, 2, 2, 4, 16, 16, 5
    q, k, v, g, beta, _ = make_case(rng, B, T, Hg, H, K, V)
    slots = [3, 0, -1]
    pool0 = (0.3 * rng.standard_normal((S, H, K, V))).astype(np.float32)
    idx = torch.tensor(slots, dtype=torch.int32)
    gates = torch.from_numpy(g), torch.from_numpy(beta)
    for dtype, o_tol, pool_tol in [(torch.float32, O_TOLERANCE_F32, STATE_TOLERANCE_F32),
                                   (torch.bfloat16, O_TOLERANCE, STATE_TOLERANCE_BF16)]:
        pool = torch.from_numpy(pool0).to(dtype)
        acts = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
        # The reference runs in f64 on the same (rounded) inputs and pool.
        ref_o, ref_pool, _ = decode_reference(*(a.double().numpy() for a in acts), g, beta,
                                              pool.double().numpy(), slots, True)
        pointer = pool.data_ptr()
        o, _ = deltakv.gated_delta_rule_decode(*acts, pool, idx, *gates,
                                               use_qk_l2norm_in_kernel=True)
        assert isinstance(o, torch.Tensor) and o.dtype == dtype and pool.data_ptr() == pointer
        assert buffers()["state_pool"] == pointer
        assert buffers()["q"] == acts[0].data_ptr()
        assert rel_rms(o.double().numpy(), ref_o) < o_tol
        assert rel_rms(pool.double().numpy(), ref_pool) < pool_tol
