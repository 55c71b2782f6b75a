"""deltakv's Python GDN prefill against an f64 NumPy reference of the recurrence."""

import numpy as np
import pytest

import deltakv

FUNCS = [deltakv.chunk_gated_delta_rule, deltakv.fused_recurrent_gated_delta_rule]
# rel_rms bounds: f32 inputs as the Rust tests (o 1.5e-6, state 1e-6) with headroom; f16 o is
# rounded to f16 (2^-11 relative), the state stays f32.
BOUNDS = {np.float32: (1e-5, 1e-5), np.float16: (2e-3, 1e-4)}


def rel_rms(x, ref):
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.sum((x - ref) ** 2) / np.sum(ref**2)))


def reference(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, l2=False,
              checkpoint_every=None):
    """f64 GDN recurrence per token and value head h (key head h // (H // Hg), as FLA); returns
    (o, state), and with ``checkpoint_every`` also (checkpoints, offsets) in the contract's
    layout (gdn::prefill::checkpoint): sequence n's state after each token c * every of its
    own, rows offsets[n]:offsets[n + 1] of a [C, H, K, V] array."""
    q, k, v, g, beta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta))
    B, T, Hg, K = q.shape
    H, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        spans = [(0, int(s), int(e)) for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    o = np.zeros((B, T, H, V))
    states = np.zeros((len(spans), H, K, V))
    every = checkpoint_every
    offsets = [0]
    for _, start, end in spans:
        offsets.append(offsets[-1] + (0 if every is None else (end - start) // every))
    checkpoints = np.zeros((offsets[-1], H, K, V))
    for n, (b, start, end) in enumerate(spans):
        for h in range(H):
            hk = h // (H // Hg)
            S = np.zeros((K, V)) if initial_state is None else initial_state[n, h].astype(np.float64)
            for t in range(start, end):
                qt, kt = q[b, t, hk], k[b, t, hk]
                if l2:
                    qt = qt / np.sqrt(np.sum(qt * qt) + 1e-6)
                    kt = kt / np.sqrt(np.sum(kt * kt) + 1e-6)
                S = np.exp(g[b, t, h]) * S
                vt = beta[b, t, h] * (v[b, t, h] - S.T @ kt)
                S = S + np.outer(kt, vt)
                o[b, t, h] = scale * (S.T @ qt)
                position = t + 1 - start
                if every is not None and position % every == 0:
                    checkpoints[offsets[n] + position // every - 1, h] = S
            states[n, h] = S
    if every is not None:
        return o, states, (checkpoints, offsets)
    return o, states


def make_case(rng, B, T, Hg, H, K, V, dtype=np.float32, n_seqs=None, init=False):
    q = rng.standard_normal((B, T, Hg, K)).astype(dtype)
    k = rng.standard_normal((B, T, Hg, K)).astype(dtype)
    v = rng.standard_normal((B, T, H, V)).astype(dtype)
    # g = -softplus(x) clipped to about [-5, -0.01]; beta = sigmoid(x) in (0, 1).
    x = rng.uniform(-4.6, 5.0, (B, T, H))
    g = np.clip(-np.log1p(np.exp(x)), -5.0, -0.01).astype(np.float32)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H)) * 2))).astype(np.float32)
    N = B if n_seqs is None else n_seqs
    s0 = (0.1 * rng.standard_normal((N, H, K, V))).astype(np.float32) if init else None
    return q, k, v, g, beta, s0


CASES = [
    # (B, T, Hg, H, K, V, cu_seqlens, initial state, l2)
    (1, 1, 2, 4, 16, 8, None, False, True),
    (2, 63, 1, 3, 12, 20, None, True, True),
    (1, 65, 2, 6, 32, 16, None, True, False),
    (2, 65, 2, 2, 8, 24, None, False, True),
    (1, 130, 2, 4, 16, 12, [0, 1, 64, 65, 130], True, True),
]


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
def test_against_f64_reference(func, dtype, case):
    B, T, Hg, H, K, V, cu, init, l2 = case
    rng = np.random.default_rng(hash((T, H, K, V)) % 2**32)
    n_seqs = None if cu is None else len(cu) - 1
    q, k, v, g, beta, s0 = make_case(rng, B, T, Hg, H, K, V, dtype, n_seqs, init)
    cu_arr = None if cu is None else np.array(cu, dtype=np.int32)
    copies = [x.copy() for x in (q, k, v, g, beta)] + ([s0.copy()] if init else [])
    o, state = func(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                    cu_seqlens=cu_arr, use_qk_l2norm_in_kernel=l2)
    ref_o, ref_s = reference(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, l2=l2)
    assert o.shape == (B, T, H, V) and o.dtype == dtype
    assert state.shape == ref_s.shape and state.dtype == np.float32
    o_err, s_err = rel_rms(o, ref_o), rel_rms(state, ref_s)
    print(f"{func.__name__} {np.dtype(dtype)} {case}: o {o_err:.3e}, state {s_err:.3e}")
    o_bound, s_bound = BOUNDS[dtype]
    if not l2 and dtype == np.float32:
        # Unnormalised k (|k|^2 ~ K) makes the update far from contractive: the chunked form
        # measures ~8e-6 at K = 32; allow twice the f32 bound there.
        o_bound, s_bound = 2 * o_bound, 2 * s_bound
    assert o_err < o_bound, o_err
    assert s_err < s_bound, s_err
    # Inputs untouched.
    for before, after in zip(copies, [q, k, v, g, beta] + ([s0] if init else [])):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("func", FUNCS)
def test_scale_and_no_final_state(func):
    rng = np.random.default_rng(7)
    q, k, v, g, beta, _ = make_case(rng, 1, 9, 1, 2, 8, 8)
    o, state = func(q, k, v, g, beta, scale=0.3)
    assert state is None
    ref_o, _ = reference(q, k, v, g, beta, scale=0.3)
    assert rel_rms(o, ref_o) < 1e-5
    assert isinstance(o, np.ndarray) and o.flags.c_contiguous and o.flags.writeable


@pytest.mark.parametrize("func", FUNCS)
def test_non_contiguous_input(func):
    rng = np.random.default_rng(3)
    q, k, v, g, beta, _ = make_case(rng, 1, 10, 2, 2, 8, 8)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not qt.flags.c_contiguous
    o, _ = func(qt, k, v, g, beta)
    assert rel_rms(o, reference(q, k, v, g, beta)[0]) < 1e-5


@pytest.mark.parametrize("func", FUNCS)
def test_bad_shapes_raise_value_error_with_rust_message(func):
    rng = np.random.default_rng(1)
    q, k, v, g, beta, _ = make_case(rng, 1, 4, 2, 4, 8, 8)
    with pytest.raises(ValueError, match=r"^value heads H=3 is not a multiple of key heads Hg=2$"):
        func(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="^tensor `k`"):
        func(q, k[:, :3], v, g, beta)
    with pytest.raises(ValueError, match="cu_seqlens"):
        func(q, k, v, g, beta, cu_seqlens=np.array([0, 3, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="initial_state"):
        func(q, k, v, g, beta, initial_state=np.zeros((1, 4, 8, 7), np.float32))
    with pytest.raises(ValueError, match="dtype float64"):
        func(q.astype(np.float64), k, v, g, beta)
    with pytest.raises(ValueError):
        func(q, k.astype(np.float16), v, g, beta)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("kwarg, value", [
    ("gk", np.zeros((1, 4, 1), np.float32)),
    ("gv", np.zeros((1, 4, 1), np.float32)),
    ("use_gate_in_kernel", True),
    ("use_beta_sigmoid_in_kernel", True),
    ("state_v_first", True),
    ("chunk_size", 32),
    ("chunk_indices", np.zeros(2, np.int64)),
    ("head_first", False),
    ("output_attentions", None),
])
def test_unsupported_kwargs_raise_not_implemented(func, kwarg, value):
    rng = np.random.default_rng(2)
    q, k, v, g, beta, _ = make_case(rng, 1, 4, 1, 1, 8, 8)
    with pytest.raises(NotImplementedError, match=f"`{kwarg}`"):
        func(q, k, v, g, beta, **{kwarg: value})


@pytest.mark.parametrize("func", FUNCS)
def test_fla_arguments_at_their_defaults_change_nothing(func):
    rng = np.random.default_rng(3)
    q, k, v, g, beta, _ = make_case(rng, 1, 70, 1, 2, 8, 8)
    plain, _ = func(q, k, v, g, beta)
    defaults = dict(use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                    state_v_first=False, chunk_size=64, cp_context=None, cu_seqlens_cpu=None,
                    chunk_indices=None, gk=None, gv=None, A_log=None, dt_bias=None,
                    use_gate_in_kernel=False)
    with_defaults, _ = func(q, k, v, g, beta, **defaults)
    np.testing.assert_array_equal(with_defaults, plain)


@pytest.mark.parametrize("func", FUNCS)
def test_a_flag_where_cu_seqlens_stands_names_the_positional_order(func):
    # FLA 0.6's ninth positional argument is use_qk_l2norm_in_kernel; the contract's is
    # cu_seqlens, so a positional FLA 0.6 call must fail loudly, not run without the norm.
    rng = np.random.default_rng(6)
    q, k, v, g, beta, _ = make_case(rng, 1, 9, 1, 2, 8, 8)
    for flag in (True, False):
        with pytest.raises(ValueError, match="pass flags by keyword"):
            func(q, k, v, g, beta, None, None, False, flag)


def test_recurrent_beta_left_out_is_ones_as_in_fla():
    rng = np.random.default_rng(5)
    q, k, v, g, _, _ = make_case(rng, 1, 9, 1, 2, 8, 8)
    ones = np.ones(v.shape[:3], np.float32)
    expected, _ = deltakv.fused_recurrent_gated_delta_rule(q, k, v, g, ones)
    left_out, _ = deltakv.fused_recurrent_gated_delta_rule(q, k, v, g)
    np.testing.assert_array_equal(left_out, expected)
    assert np.abs(expected).max() > 0


class _FakeGpuTensor:
    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_mixed_devices_raise_value_error():
    rng = np.random.default_rng(4)
    q, k, v, g, beta, _ = make_case(rng, 1, 4, 1, 1, 8, 8)
    with pytest.raises(ValueError, match=r"^tensor `k` is on the CPU but `q` is on cuda:0; "
                                         r"every tensor of a call must be on one device$"):
        deltakv.chunk_gated_delta_rule(_FakeGpuTensor(q), k, v, g, beta)


def test_cuda_tensors_without_a_gpu_say_so_in_one_line():
    """Arrays that claim to be on a GPU: a build without the feature `cuda`, or a machine
    without the driver, says so in one line; on a GPU machine deltakv finds the fake's capsule
    is host memory."""
    rng = np.random.default_rng(4)
    arrays = [_FakeGpuTensor(x) for x in make_case(rng, 1, 4, 1, 1, 8, 8)[:5]]
    try:
        deltakv.chunk_gated_delta_rule(*arrays)
    except RuntimeError as e:
        message = str(e)
        print(f"CUDA tensor here: {message}")
        assert "\n" not in message and message.startswith("device `cuda` is not available: ")
        if deltakv.CUDA_BUILT:
            assert "no CUDA device" in message or "NVRTC" in message
        else:
            assert "built without CUDA" in message
    except ValueError as e:
        assert deltakv.CUDA_BUILT
        assert str(e) == "tensor `q`: its DLPack capsule is on the CPU, expected cuda:0"
    else:
        raise AssertionError("a CUDA tensor ran on the CPU")


class _CpuDlpack:
    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None, **kwargs):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_cpu_objects_accepted():
    rng = np.random.default_rng(5)
    q, k, v, g, beta, _ = make_case(rng, 1, 6, 1, 2, 8, 4)
    o, _ = deltakv.chunk_gated_delta_rule(*(_CpuDlpack(x) for x in (q, k, v, g, beta)))
    assert rel_rms(o, reference(q, k, v, g, beta)[0]) < 1e-5


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    q, k, v, g, beta, s0 = make_case(rng, 1, 20, 2, 4, 8, 8, init=True)
    args = [torch.from_numpy(x) for x in (q, k, v, g, beta)]
    o, s = deltakv.chunk_gated_delta_rule(*args, initial_state=torch.from_numpy(s0),
                                          output_final_state=True)
    assert isinstance(o, torch.Tensor) and isinstance(s, torch.Tensor)
    ref_o, ref_s = reference(q, k, v, g, beta, initial_state=s0)
    assert rel_rms(o.numpy(), ref_o) < 1e-5 and rel_rms(s.numpy(), ref_s) < 1e-5
    ob, _ = deltakv.chunk_gated_delta_rule(*(a.to(torch.bfloat16) for a in args[:3]), *args[3:])
    assert ob.dtype == torch.bfloat16 and ob.shape == (1, 20, 4, 8)


def test_native_layer_checks_what_it_is_given():
    """The Rust side reads what DLPack says of each array: a non-contiguous array or an
    unknown mode is a ValueError, not a misread."""
    from deltakv import _deltakv

    rng = np.random.default_rng(8)
    q, k, v, g, beta, _ = make_case(rng, 1, 4, 1, 1, 8, 8)
    args = [q, k, v, g, beta]
    _deltakv.gdn_prefill("chunk", *args, None, None, None, False)
    with pytest.raises(ValueError, match=r"expected f16 \(the dtype of q\)"):
        _deltakv.gdn_prefill("chunk", q.astype(np.float16), *args[1:], None, None, None, False)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _deltakv.gdn_prefill("chunk", q[:, ::2], *args[1:], None, None, None, False)
    with pytest.raises(ValueError, match="unknown prefill mode"):
        _deltakv.gdn_prefill("fast", *args, None, None, None, False)


CHECKPOINT_CASES = [
    # (B, T, Hg, H, K, V, cu_seqlens, initial state, l2, checkpoint_every)
    (1, 300, 1, 2, 16, 12, None, True, True, 64),
    (2, 256, 2, 4, 8, 8, None, False, True, 128),
    (1, 400, 1, 2, 16, 16, [0, 1, 64, 65, 193, 400], True, False, 64),
    (1, 100, 1, 1, 8, 8, None, True, True, 128),  # shorter than the spacing: no checkpoint
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_checkpoints_against_the_f64_reference(dtype, case):
    """chunk_gated_delta_rule_checkpointed: the states every N tokens of each sequence in the
    contract's layout, against the f64 recurrence; o and the final state as the plain call's."""
    B, T, Hg, H, K, V, cu, init, l2, every = case
    rng = np.random.default_rng(T * 7 + every)
    n_seqs = None if cu is None else len(cu) - 1
    q, k, v, g, beta, s0 = make_case(rng, B, T, Hg, H, K, V, dtype, n_seqs, init)
    cu_arr = None if cu is None else np.array(cu, dtype=np.int64)
    o, final, checkpoints, offsets = deltakv.chunk_gated_delta_rule_checkpointed(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu_arr,
        use_qk_l2norm_in_kernel=l2, checkpoint_every=every)
    ref_o, ref_s, (ref_c, ref_offsets) = reference(q, k, v, g, beta, initial_state=s0,
                                                   cu_seqlens=cu, l2=l2, checkpoint_every=every)
    assert offsets == ref_offsets
    assert checkpoints.shape == ref_c.shape and checkpoints.dtype == np.float32
    o_bound, s_bound = BOUNDS[dtype]
    if not l2 and dtype == np.float32:
        o_bound, s_bound = 2 * o_bound, 2 * s_bound  # as in test_against_f64_reference
    # Every checkpoint on its own, so that one wrong row among many fails.
    worst = max((rel_rms(c, r) for c, r in zip(checkpoints, ref_c)), default=0.0)
    o_err, s_err = rel_rms(o, ref_o), rel_rms(final, ref_s)
    print(f"checkpoints {np.dtype(dtype)} {case}: {len(checkpoints)} rows, worst {worst:.3e}, "
          f"o {o_err:.3e}, final state {s_err:.3e}")
    assert worst < s_bound and o_err < o_bound and s_err < s_bound
    plain_o, plain_final = deltakv.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu_arr,
        use_qk_l2norm_in_kernel=l2)
    np.testing.assert_array_equal(o, plain_o)
    np.testing.assert_array_equal(final, plain_final)


def test_checkpoint_every_is_checked_and_kept_out_of_fla_signatures():
    rng = np.random.default_rng(9)
    q, k, v, g, beta, _ = make_case(rng, 1, 70, 1, 1, 8, 8)
    for bad in (0, 32, 100, -64):
        with pytest.raises(ValueError, match="multiple of 64"):
            deltakv.chunk_gated_delta_rule_checkpointed(q, k, v, g, beta, checkpoint_every=bad)
    with pytest.raises(ValueError, match="must be an int"):
        deltakv.chunk_gated_delta_rule_checkpointed(q, k, v, g, beta, checkpoint_every=64.5)
    with pytest.raises(TypeError):
        deltakv.chunk_gated_delta_rule_checkpointed(q, k, v, g, beta)  # checkpoint_every needed
    for func in FUNCS:
        with pytest.raises(NotImplementedError, match="chunk_gated_delta_rule_checkpointed"):
            func(q, k, v, g, beta, checkpoint_every=64)
    o, final, checkpoints, offsets = deltakv.chunk_gated_delta_rule_checkpointed(
        q, k, v, g, beta, checkpoint_every=64)
    assert final is None and checkpoints.shape == (1, 1, 8, 8) and offsets == [0, 1]
