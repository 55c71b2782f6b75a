"""deltakv's Python functions on CUDA torch tensors (a build with the cargo feature `cuda`, on
a machine with a GPU): FLA-signature prefill and the in-place pool decode against the f64
references with the Rust CUDA tests' tolerances, zero copies (the kernels read and write the
callers' device memory; results are deltakv's buffers, wrapped by torch), the checkpoints
against the f64 recurrence, the stream handshake (work on a non-default torch stream, an
initial state written there, no synchronisation) and device checks.

Skipped, with one line on pytest's summary (-rs), without a CUDA torch or a `cuda` build;
`tools/gpu-check.sh py-cuda` runs them on the GPU machine."""

import numpy as np
import pytest

import deltakv
from deltakv import _deltakv
from test_gdn_prefill import reference, rel_rms
from test_zero_copy_and_decode import decode_reference, fused_gates

torch = pytest.importorskip("torch", reason="skipped: torch is not installed (CUDA tests)")
if not torch.cuda.is_available():
    pytest.skip("skipped: no CUDA GPU for torch here (the CUDA tests run on the GPU machine: "
                "tools/gpu-check.sh py-cuda)", allow_module_level=True)
if not deltakv.CUDA_BUILT:
    pytest.skip("skipped: this deltakv was built without the cargo feature `cuda`",
                allow_module_level=True)

DEVICE = torch.device("cuda", torch.cuda.current_device())
# The Rust CUDA tests' bounds: prefill (bf16 products, f32 state) o and final state 4e-3
# (crates/cuda/tests/gdn_prefill.rs); decode as every backend's (contract decode check): o
# 2e-3, intermediate states and an f32 pool 1e-5, a bf16 pool 4e-3.
PREFILL_TOLERANCE = 4e-3
DECODE_O_TOLERANCE = 2e-3
DECODE_STATE_TOLERANCE_F32 = 1e-5
DECODE_STATE_TOLERANCE_BF16 = 4e-3


def buffers():
    return dict(_deltakv.last_call_buffers())


def make_case(rng, B, T, Hg, H, K, V, l2, n_seqs=None, init=False):
    """As the contract's random problems: q, k standard normal (unit-norm rows unless the
    kernel normalises them), g in [-0.7, -0.01], beta in (0, 1); float32 NumPy arrays."""
    q = rng.standard_normal((B, T, Hg, K))
    k = rng.standard_normal((B, T, Hg, K))
    if not l2:
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V))
    g = -rng.uniform(0.01, 0.7, (B, T, H))
    beta = 1 / (1 + np.exp(-rng.standard_normal((B, T, H))))
    N = B if n_seqs is None else n_seqs
    s0 = 0.1 * rng.standard_normal((N, H, K, V)) if init else None
    f32 = lambda x: None if x is None else x.astype(np.float32)  # noqa: E731
    return tuple(f32(x) for x in (q, k, v, g, beta, s0))


def on_gpu(x, dtype=None):
    t = torch.from_numpy(x).to(DEVICE)
    return t if dtype is None else t.to(dtype)


def host(t):
    return t.detach().double().cpu().numpy()


PREFILL_CASES = [
    # (B, T, Hg, H, K, V, cu_seqlens, initial state, l2)
    (1, 1, 2, 4, 64, 32, None, True, True),
    (2, 63, 1, 3, 32, 48, None, True, True),
    (2, 65, 2, 4, 128, 128, None, False, False),
    (1, 1000, 2, 4, 128, 64, None, True, True),
    (1, 300, 1, 2, 64, 128, [0, 1, 64, 65, 130, 300], True, True),
    (3, 16, 2, 6, 256, 96, None, True, False),
]


@pytest.mark.parametrize("func", [deltakv.chunk_gated_delta_rule,
                                  deltakv.fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", PREFILL_CASES)
def test_prefill_on_cuda_tensors_against_f64_reference(func, dtype, case):
    B, T, Hg, H, K, V, cu, init, l2 = case
    rng = np.random.default_rng(T * 1000 + K + V)
    n_seqs = None if cu is None else len(cu) - 1
    q, k, v, g, beta, s0 = make_case(rng, B, T, Hg, H, K, V, l2, n_seqs, init)
    acts = [on_gpu(x, dtype) for x in (q, k, v)]
    gates = [on_gpu(g), on_gpu(beta)]
    state = None if s0 is None else on_gpu(s0)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    before = [t.clone() for t in acts + gates + ([state] if init else [])]
    o, final = func(*acts, *gates, initial_state=state, output_final_state=True,
                    cu_seqlens=cu_t, use_qk_l2norm_in_kernel=l2)
    seen = buffers()
    assert isinstance(o, torch.Tensor) and o.device == DEVICE and o.dtype == dtype
    assert final.device == DEVICE and final.dtype == torch.float32
    assert o.shape == (B, T, H, V) and final.shape == (n_seqs or B, H, K, V)
    # Zero copies: the kernels read the callers' device memory; o and the final state are
    # deltakv's buffers, wrapped by torch where they are.
    for name, t in dict(q=acts[0], k=acts[1], v=acts[2], g=gates[0], beta=gates[1]).items():
        assert seen[name] == t.data_ptr(), name
    if init:
        assert seen["initial_state"] == state.data_ptr()
    assert seen["o"] == o.data_ptr() and seen["final_state"] == final.data_ptr()
    # The reference runs on the inputs as the kernel saw them (rounded to bf16 when bf16).
    ref_o, ref_s = reference(*(host(t) for t in acts), g, beta, initial_state=s0,
                             cu_seqlens=cu, l2=l2)
    o_err, s_err = rel_rms(host(o), ref_o), rel_rms(host(final), ref_s)
    print(f"cuda {func.__name__} {dtype} {case}: o rel_rms {o_err:.3e}, "
          f"final state {s_err:.3e}")
    assert o_err < PREFILL_TOLERANCE and s_err < PREFILL_TOLERANCE
    for b, a in zip(before, acts + gates + ([state] if init else [])):
        assert torch.equal(b, a)  # inputs untouched


def test_prefill_without_final_state_and_with_scale():
    rng = np.random.default_rng(1)
    q, k, v, g, beta, _ = make_case(rng, 1, 70, 1, 2, 64, 64, l2=False)
    for func in (deltakv.chunk_gated_delta_rule, deltakv.fused_recurrent_gated_delta_rule):
        o, final = func(*(on_gpu(x) for x in (q, k, v, g, beta)), scale=0.3)
        assert final is None and o.is_cuda
        assert rel_rms(host(o), reference(q, k, v, g, beta, scale=0.3)[0]) < PREFILL_TOLERANCE


CHECKPOINT_CASES = [
    # (B, T, Hg, H, K, V, cu_seqlens, checkpoint_every)
    (2, 300, 2, 4, 128, 128, None, 64),
    (1, 700, 1, 2, 64, 96, [0, 1, 130, 256, 700], 128),
    (1, 100, 1, 2, 64, 64, None, 128),  # shorter than the spacing: no checkpoint
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_checkpoints_on_cuda_tensors_against_f64_reference(dtype, case):
    B, T, Hg, H, K, V, cu, every = case
    rng = np.random.default_rng(T + every)
    n_seqs = None if cu is None else len(cu) - 1
    q, k, v, g, beta, s0 = make_case(rng, B, T, Hg, H, K, V, True, n_seqs, init=True)
    acts = [on_gpu(x, dtype) for x in (q, k, v)]
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int64, device=DEVICE)
    o, final, checkpoints, offsets = deltakv.chunk_gated_delta_rule_checkpointed(
        *acts, on_gpu(g), on_gpu(beta), initial_state=on_gpu(s0), output_final_state=True,
        cu_seqlens=cu_t, use_qk_l2norm_in_kernel=True, checkpoint_every=every)
    if checkpoints.numel():
        assert buffers()["checkpoints"] == checkpoints.data_ptr()
    assert checkpoints.device == DEVICE and checkpoints.dtype == torch.float32
    ref_o, ref_s, (ref_c, ref_offsets) = reference(
        *(host(t) for t in acts), g, beta, initial_state=s0, cu_seqlens=cu, l2=True,
        checkpoint_every=every)
    assert offsets == ref_offsets and tuple(checkpoints.shape) == ref_c.shape
    worst = max((rel_rms(c, r) for c, r in zip(host(checkpoints), ref_c)), default=0.0)
    o_err, s_err = rel_rms(host(o), ref_o), rel_rms(host(final), ref_s)
    print(f"cuda checkpoints {dtype} {case}: {len(ref_c)} rows, worst {worst:.3e}, "
          f"o {o_err:.3e}, final state {s_err:.3e}")
    assert worst < PREFILL_TOLERANCE and o_err < PREFILL_TOLERANCE and s_err < PREFILL_TOLERANCE


DECODE_CASES = [
    # (B, T, Hg, H, K, V, S, slots, fused gating, l2, pool dtype)
    (1, 1, 2, 4, 128, 128, 3, [2], True, True, torch.float32),
    (3, 1, 1, 3, 64, 32, 5, [4, -1, 0], False, True, torch.float32),
    (9, 1, 16, 32, 128, 128, 12, [0, 3, 5, 7, 9, 11, 1, -1, 2], True, True, torch.float32),
    (2, 4, 2, 6, 32, 48, 4, [1, 3], True, False, torch.bfloat16),
    (4, 16, 2, 2, 64, 64, 6, [5, 2, -7, 0], False, True, torch.bfloat16),
]


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_in_place_on_the_callers_pool(case):
    B, T, Hg, H, K, V, S, slots, fused, l2, pool_dtype = case
    rng = np.random.default_rng(B * 100 + T)
    q, k, v, g, beta, _ = make_case(rng, B, T, Hg, H, K, V, l2)
    pool = on_gpu((0.3 * rng.standard_normal((S, H, K, V))).astype(np.float32), pool_dtype)
    before = pool.clone()
    slot_t = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    if fused:
        a, b = (rng.standard_normal((B, T, H)).astype(np.float32) for _ in range(2))
        A_log, dt_bias = (rng.uniform(-1, 1, H).astype(np.float32) for _ in range(2))
        gating = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
        g, beta = fused_gates(a, b, A_log, dt_bias)
    else:
        gating = dict(g=g, beta=beta)
    gating_t = {name: on_gpu(x) for name, x in gating.items()}
    acts = [on_gpu(x) for x in (q, k, v)]
    pointer = pool.data_ptr()
    o, inter = deltakv.gated_delta_rule_decode(*acts, pool, slot_t, **gating_t,
                                               use_qk_l2norm_in_kernel=l2,
                                               output_intermediate_states=True)
    seen = buffers()
    # The kernel wrote the caller's pool where it is; every input was read in place.
    assert pool.data_ptr() == pointer and seen["state_pool"] == pointer
    for name, t in dict(q=acts[0], k=acts[1], v=acts[2], slot_indices=slot_t,
                        **gating_t).items():
        assert seen[name] == t.data_ptr(), name
    assert seen["o"] == o.data_ptr() and seen["intermediate_states"] == inter.data_ptr()
    assert o.is_cuda and o.dtype == torch.float32 and inter.shape == (B, T, H, K, V)
    ref_o, ref_pool, ref_inter = decode_reference(q, k, v, g, beta, host(before), slots, l2)
    o_err, pool_err = rel_rms(host(o), ref_o), rel_rms(host(pool), ref_pool)
    inter_err = rel_rms(host(inter), ref_inter)
    print(f"cuda decode {case}: o {o_err:.3e}, pool {pool_err:.3e}, intermediate "
          f"{inter_err:.3e}")
    pool_tolerance = (DECODE_STATE_TOLERANCE_BF16 if pool_dtype == torch.bfloat16
                      else DECODE_STATE_TOLERANCE_F32)
    # Intermediate states are f32 (a bf16 pool is widened once, exactly), as the contract's
    # check bounds them on every device.
    assert o_err < DECODE_O_TOLERANCE and pool_err < pool_tolerance
    assert inter_err < DECODE_STATE_TOLERANCE_F32
    untouched = [s for s in range(S) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])
    for row, s in enumerate(slots):
        if s < 0:
            assert not o[row].any()


def test_stream_handshake_on_a_side_stream_without_synchronising():
    """Work queued on a non-default torch stream behind a long GPU sleep: deltakv's prefill
    with an initial state is queued on that stream and reads the state as the stream's earlier
    work left it (doubled there, after the sleep); decode updates the pool after the stream's
    earlier writes; results are right once the stream finishes. The same call on the default
    stream, and the checkpointed call (the lockstep state pass) on the side stream, are checked
    beside it, every figure printed before the assertions, so a failure says whether the
    stream, the shape or the state pass is at fault. Whether the prefill call returned before
    the stream drained is printed, not asserted: its small host-to-device uploads (chunk
    tables) come from pageable memory, which the H100's driver (580, CUDA 13) copies only once
    the stream reaches them."""
    rng = np.random.default_rng(2)
    q, k, v, g, beta, s0 = make_case(rng, 2, 200, 2, 4, 128, 128, l2=True, init=True)
    acts = [on_gpu(x) for x in (q, k, v, g, beta)]
    state = on_gpu(s0).clone()  # written in place below; s0 stays the reference's
    figures, errors = [], []

    def check(what, o, final, initial, checkpoints=None):
        ref_o, ref_s, (ref_c, _) = reference(q, k, v, g, beta, initial_state=initial, l2=True,
                                             checkpoint_every=64)
        errs = [rel_rms(host(o), ref_o), rel_rms(host(final), ref_s)]
        if checkpoints is not None:
            errs.append(max(rel_rms(c, r) for c, r in zip(host(checkpoints), ref_c)))
        figures.append(f"{what}: " + ", ".join(f"{e:.3e}" for e in errs))
        errors.extend(errs)

    # q and k are raw normal rows (|k|^2 ~ 128): the kernel must normalise them, or the state
    # grows ~|1 - beta |k|^2| ~ 60x a token and overflows f32 (NaN on every stream).
    o, final = deltakv.chunk_gated_delta_rule(*acts, initial_state=state,
                                              output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    check("default stream prefill (o, final state)", o, final, s0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # The inputs the call must see are written on the side stream after ~0.1 s of sleep.
        ones = torch.ones_like(state)
        torch.cuda._sleep(200_000_000)
        state.mul_(ones * 2)  # the initial state doubles, on the side stream
        o, final = deltakv.chunk_gated_delta_rule(*acts, initial_state=state,
                                                  output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
        busy = not side.query()
        o_after = o * 1  # a consumer on the same stream
        torch.cuda._sleep(100_000_000)
        state.mul_(ones * 2)  # quadrupled, for the checkpointed call
        oc, fc, checkpoints, offsets = deltakv.chunk_gated_delta_rule_checkpointed(
            *acts, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
            checkpoint_every=64)
        oc_after = oc * 1
    side.synchronize()
    returned = "returned while the stream was busy" if busy else "waited for the stream"
    check(f"side stream prefill (o, final state; the call {returned})", o_after, final, 2 * s0)
    check("side stream checkpointed prefill (o, final state, worst checkpoint)", oc_after, fc,
          4 * s0, checkpoints)
    print("; ".join(figures))
    assert offsets == [0, 3, 6] and checkpoints.shape == (6, 4, 128, 128)
    assert all(e < PREFILL_TOLERANCE for e in errors), figures

    # Decode on the side stream: the pool is rewritten there behind a sleep first.
    B, H, K, V = 4, 4, 128, 128
    qd, kd, vd, gd, bd, _ = make_case(rng, B, 1, 2, H, K, V, l2=True)
    pool0 = (0.3 * rng.standard_normal((B, H, K, V))).astype(np.float32)
    pool = torch.zeros(B, H, K, V, device=DEVICE)
    slots = torch.arange(B, device=DEVICE)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        pool.copy_(on_gpu(pool0))
        od, _ = deltakv.gated_delta_rule_decode(*(on_gpu(x) for x in (qd, kd, vd)), pool, slots,
                                                g=on_gpu(gd), beta=on_gpu(bd),
                                                use_qk_l2norm_in_kernel=True)
        od_after = od * 1
    side.synchronize()
    ref_o, ref_pool, _ = decode_reference(qd, kd, vd, gd, bd, pool0, list(range(B)), True)
    assert rel_rms(host(od_after), ref_o) < DECODE_O_TOLERANCE
    assert rel_rms(host(pool), ref_pool) < DECODE_STATE_TOLERANCE_F32


def test_a_result_imported_on_another_stream_waits_for_the_work():
    """The DLPack handshake on the way out: a result made on stream A and imported by torch
    while stream B is current is ordered before B's use of it (an event, no host wait)."""
    rng = np.random.default_rng(3)
    q, k, v, g, beta, _ = make_case(rng, 1, 500, 1, 2, 128, 128, l2=True)
    acts = [on_gpu(x) for x in (q, k, v, g, beta)]
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream_a):
        torch.cuda._sleep(200_000_000)
    o, _ = _deltakv.gdn_prefill("chunk", *acts, None, None, None, True, False,
                                stream_a.cuda_stream)
    with torch.cuda.stream(stream_b):
        o_b = torch.from_dlpack(o) * 1
    torch.cuda.synchronize()
    assert rel_rms(host(o_b), reference(q, k, v, g, beta, l2=True)[0]) < PREFILL_TOLERANCE


def test_explicit_stream_argument():
    rng = np.random.default_rng(4)
    q, k, v, g, beta, _ = make_case(rng, 1, 40, 1, 1, 64, 64, l2=True)
    side = torch.cuda.Stream()
    for stream in (side, side.cuda_stream, torch.cuda.default_stream()):
        o, _ = deltakv.chunk_gated_delta_rule(*(on_gpu(x) for x in (q, k, v, g, beta)),
                                              use_qk_l2norm_in_kernel=True, stream=stream)
        torch.cuda.synchronize()
        assert rel_rms(host(o), reference(q, k, v, g, beta, l2=True)[0]) < PREFILL_TOLERANCE


def test_device_mismatch_and_errors_carry_the_rust_message():
    rng = np.random.default_rng(5)
    q, k, v, g, beta, _ = make_case(rng, 1, 4, 2, 4, 64, 64, l2=True)
    gpu = [on_gpu(x) for x in (q, k, v, g, beta)]
    with pytest.raises(ValueError, match=r"^tensor `k` is on the CPU but `q` is on cuda:\d; "
                                         r"every tensor of a call must be on one device$"):
        deltakv.chunk_gated_delta_rule(gpu[0], torch.from_numpy(k), *gpu[2:])
    with pytest.raises(ValueError, match=r"^value heads H=3 is not a multiple of key heads "
                                         r"Hg=2$"):
        deltakv.chunk_gated_delta_rule(gpu[0], gpu[1], gpu[2][:, :, :3].contiguous(),
                                       gpu[3][:, :, :3].contiguous(),
                                       gpu[4][:, :, :3].contiguous())
    pool = torch.zeros(3, 4, 64, 64, device=DEVICE)
    before = pool.clone()
    with pytest.raises(ValueError, match="every tensor of a call must be on one device"):
        deltakv.gated_delta_rule_decode(*gpu[:3], pool, torch.tensor([0]), g=gpu[3], beta=gpu[4])
    with pytest.raises(ValueError, match=r"slot_indices\[0\] = 3 is out of range"):
        deltakv.gated_delta_rule_decode(*gpu[:3], pool, torch.tensor([3], device=DEVICE),
                                        g=gpu[3], beta=gpu[4])
    assert torch.equal(pool, before)
    with pytest.raises(ValueError, match="KvCache runs on the CPU"):
        deltakv.KvCache(dim=64, kv_heads=1, batch=1).append(0, torch.zeros(1, 1, 64,
                                                                          device=DEVICE),
                                                            torch.zeros(1, 1, 64))


def test_cuda_kv_cache_against_the_cpu_cache():
    """The paged cache on the GPU, fed the caller's device arrays in place, against the CPU's
    cache of the same scheme (the same codes): attention within f32 rounding, same bytes."""
    rng = np.random.default_rng(6)
    B, Hkv, Hq, d, lens = 2, 2, 8, 128, [100, 37]
    k = rng.standard_normal((B, 100, Hkv, d)).astype(np.float32)
    v = rng.standard_normal((B, 100, Hkv, d)).astype(np.float32)
    q = rng.standard_normal((B, 1, Hq, d)).astype(np.float32)
    cpu = deltakv.KvCache(dim=d, kv_heads=Hkv, batch=B, bits_k=4, bits_v=2, seed=3)
    for b, n in enumerate(lens):
        cpu.append(b, k[b, :n], v[b, :n])
    gpu = deltakv.CudaKvCache(dim=d, kv_heads=Hkv, batch=B, max_tokens=256, bits_k=4,
                              bits_v=2, seed=3)
    kt, vt, qt = on_gpu(k), on_gpu(v), on_gpu(q)
    gpu.append(kt, vt, new_lens=lens)
    assert buffers()["k"] == kt.data_ptr() and buffers()["v"] == vt.data_ptr()
    o = gpu.attend(qt)
    assert buffers()["q"] == qt.data_ptr() and buffers()["o"] == o.data_ptr()
    assert o.is_cuda and o.dtype == torch.float32 and o.shape == (B, 1, Hq, d)
    err = rel_rms(host(o), np.asarray(cpu.attend(q), dtype=np.float64))
    print(f"CudaKvCache attend against the CPU cache: rel_rms {err:.3e}")
    assert err < 1e-5
    assert [gpu.seq_len(b) for b in range(B)] == lens and gpu.bytes() == cpu.bytes()
    with pytest.raises(ValueError, match="non-finite"):
        gpu.append(kt * float("nan"), vt, new_lens=[1, 0])
    assert [gpu.seq_len(b) for b in range(B)] == lens
    with pytest.raises(ValueError, match="every tensor of a call must be on one device"):
        gpu.append(kt, torch.from_numpy(v))
