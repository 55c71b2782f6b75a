"""The compressed KV cache class against exact f64 attention, and every docstring example of
the package run as a doctest (so the documented examples stay runnable)."""

import doctest

import numpy as np
import pytest

import deltakv
from deltakv import _deltakv
from test_gdn_prefill import rel_rms


def exact_attention(q, ks, vs, scale):
    """f64 causal attention: q [B, Tq, Hq, d]; ks, vs per sequence [T_b, Hkv, d]."""
    B, Tq, Hq, d = q.shape
    o = np.zeros((B, Tq, Hq, d))
    for b in range(B):
        k, v = ks[b].astype(np.float64), vs[b].astype(np.float64)
        T, Hkv = k.shape[:2]
        for i in range(Tq):
            pos = T - Tq + i
            for h in range(Hq):
                kh = h // (Hq // Hkv)
                s = scale * (k[: pos + 1, kh] @ q[b, i, h])
                p = np.exp(s - s.max())
                o[b, i, h] = (p / p.sum()) @ v[: pos + 1, kh]
    return o


@pytest.mark.parametrize("dim, kv_heads, hq, tq", [(64, 2, 4, 1), (128, 1, 3, 3), (80, 2, 2, 2)])
def test_append_attend_bytes(dim, kv_heads, hq, tq):
    rng = np.random.default_rng(dim + tq)
    lens = [37, 200]
    cache = deltakv.KvCache(dim, kv_heads, batch=2, bits_k=8, bits_v=8, seed=3)
    ks = [rng.standard_normal((n, kv_heads, dim)).astype(np.float32) for n in lens]
    vs = [rng.standard_normal((n, kv_heads, dim)).astype(np.float32) for n in lens]
    for b in range(2):
        cache.append(b, ks[b][:10], vs[b][:10])  # two appends per sequence
        cache.append(b, ks[b][10:], vs[b][10:])
        assert cache.seq_len(b) == lens[b]
    assert dict(_deltakv.last_call_buffers())["k"] == ks[1][10:].__array_interface__["data"][0]
    q = rng.standard_normal((2, tq, hq, dim)).astype(np.float32)
    o = cache.attend(q, scale=0.1)
    assert o.shape == q.shape and o.dtype == np.float32
    # The Rust tests' bound for 8-bit keys and values against exact attention.
    assert rel_rms(o, exact_attention(q, ks, vs, 0.1)) < 0.01
    per_token_head = 2 * (dim * 8 // 8 + 4)  # codes + f32 norm, keys and values
    assert cache.bytes() == sum(lens) * kv_heads * per_token_head
    assert (cache.dim, cache.kv_heads, cache.batch, cache.bits_k, cache.bits_v) == (
        dim, kv_heads, 2, 8, 8)


def test_cache_errors_are_value_errors_with_the_rust_message():
    cache = deltakv.KvCache(64, 2, batch=1)
    k = np.zeros((3, 2, 64), np.float32)
    with pytest.raises(ValueError, match=r"expected \[n, kv_heads=2, dim=64\]"):
        cache.append(0, k[:, :1].copy(), k[:, :1].copy())
    with pytest.raises(ValueError, match="expected float32"):
        cache.append(0, k.astype(np.float16), k)
    with pytest.raises(ValueError, match="sequence 1"):
        cache.append(1, k, k)
    cache.append(0, k + 1, k + 1)
    with pytest.raises(ValueError, match="has only 3 cached tokens"):
        cache.attend(np.ones((1, 4, 2, 64), np.float32))
    with pytest.raises(NotImplementedError, match="^unsupported: bits-k = 5"):
        deltakv.KvCache(64, 2, batch=1, bits_k=5)


def test_torch_queries_get_torch_results():
    torch = pytest.importorskip("torch")
    cache = deltakv.KvCache(64, 1, batch=1)
    kv = torch.randn(5, 1, 64)
    cache.append(0, kv, kv)
    o = cache.attend(torch.randn(1, 1, 2, 64))
    assert isinstance(o, torch.Tensor) and o.shape == (1, 1, 2, 64)


def test_docstring_examples_run():
    failures, tried = doctest.testmod(deltakv, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried >= 5 and failures == 0


def test_typing_stub_matches_the_package():
    """Every public name has a stub with the same parameters (names, order, defaults)."""
    import ast
    import inspect
    import pathlib

    stub = ast.parse(pathlib.Path(deltakv.__file__).with_suffix(".pyi").read_text())
    stubbed = {n.name: n for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(deltakv.__all__) <= set(stubbed)

    def params(fn):
        args = fn.args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        return names + ([args.kwarg.arg] if args.kwarg else [])

    for name in deltakv.__all__:
        real = getattr(deltakv, name)
        node = stubbed[name]
        if isinstance(node, ast.ClassDef):
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            for method, fn in methods.items():
                attr = inspect.getattr_static(real, method)
                if isinstance(attr, property):
                    continue
                assert params(fn) == list(inspect.signature(attr).parameters), (name, method)
        else:
            assert params(node) == list(inspect.signature(real).parameters), name


def test_cuda_kv_cache_without_a_gpu_says_so_in_one_line():
    try:
        cache = deltakv.CudaKvCache(dim=64, kv_heads=1, batch=1, max_tokens=64)
    except RuntimeError as e:
        message = str(e)
        print(f"CudaKvCache here: {message}")
        assert "\n" not in message and message.startswith("device `cuda` is not available: ")
    else:  # a machine with a GPU: tests/test_cuda.py checks it
        assert cache.batch == 1 and cache.seq_len(0) == 0 and cache.bytes() == 0
