"""deltakv from Python: Gated DeltaNet prefill on the CPU with flash-linear-attention's
signatures and layouts.

Layouts (time-major, as FLA): q, k ``[B, T, Hg, K]``; v ``[B, T, H, V]``; g (log decay) and
beta ``[B, T, H]``; ``initial_state`` and the final state ``[N, H, K, V]`` float32, where N is
B, or the number of sequences with ``cu_seqlens`` (``[N + 1]`` int32/int64 offsets, then
B == 1). Value head h reads key head ``h // (H // Hg)`` (GQA/GVA, as FLA), so H must be a
multiple of Hg.
q, k and v share one dtype (float32, float16, or bfloat16 from torch); o has v's dtype.

Inputs: NumPy arrays, or any object with ``__dlpack__`` on the CPU (torch tensors, ...), read
in place and decoded once into deltakv's Rust tensors (one copy of each input; a
non-contiguous input is first made contiguous, a second copy). Outputs: NumPy arrays over
buffers that the Rust results are written into once; torch tensors (sharing that memory) when
q is a torch tensor. CPU only in this build.
"""

from typing import Any, Optional, Tuple

import numpy as np

from . import _deltakv

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]

_KDL_CPU = 1
_NP_TAGS = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
}
_TAG_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i32": np.int32,
           "i64": np.int64}


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _to_array(name: str, x: Any) -> Tuple[np.ndarray, str]:
    """``(C-contiguous little-endian array, dtype tag)`` of input ``x``, without a copy where
    ``x`` is already a contiguous CPU array."""
    if isinstance(x, np.ndarray):
        arr = x
    elif hasattr(x, "__dlpack__"):
        if hasattr(x, "__dlpack_device__"):
            device_type = int(x.__dlpack_device__()[0])
            if device_type != _KDL_CPU:
                raise ValueError(
                    f"tensor `{name}` is not on the CPU (DLPack device type {device_type}); "
                    "deltakv's Python functions run on the CPU in this build"
                )
        if _is_torch(x) and str(x.dtype) == "torch.bfloat16":
            import torch

            bits = np.from_dlpack(x.detach().contiguous().view(torch.int16)).view(np.uint16)
            return np.ascontiguousarray(bits), "bf16"
        arr = np.from_dlpack(x.detach() if _is_torch(x) else x)
    else:
        raise ValueError(
            f"tensor `{name}` is a {type(x).__name__}, expected a NumPy array or an object "
            "with __dlpack__ on the CPU"
        )
    tag = _NP_TAGS.get(arr.dtype.newbyteorder("="))
    if tag is None:
        raise ValueError(
            f"tensor `{name}` has dtype {arr.dtype}, expected float32, float16 or bfloat16 "
            "(cu_seqlens: int32 or int64)"
        )
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr), tag


def _from_result(result: Tuple[Any, str, bytearray], as_torch: bool) -> Any:
    shape, tag, buffer = result
    arr = np.frombuffer(buffer, dtype=_TAG_NP[tag]).reshape(shape)
    if as_torch:
        import torch

        t = torch.from_numpy(arr)
        return t.view(torch.bfloat16) if tag == "bf16" else t
    return arr


def _prefill(mode: str, fla_name: str, q, k, v, g, beta, scale, initial_state,
             output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, kwargs):
    for name in kwargs:
        raise NotImplementedError(
            f"deltakv does not support the argument `{name}` of FLA's {fla_name}"
        )
    if scale is not None:
        scale = float(scale)
    o, state = _deltakv.gdn_prefill(
        mode,
        _to_array("q", q),
        _to_array("k", k),
        _to_array("v", v),
        _to_array("g", g),
        _to_array("beta", beta),
        scale,
        None if initial_state is None else _to_array("initial_state", initial_state),
        None if cu_seqlens is None else _to_array("cu_seqlens", cu_seqlens),
        bool(use_qk_l2norm_in_kernel),
    )
    as_torch = _is_torch(q)
    o = _from_result(o, as_torch)
    final_state = _from_result(state, as_torch) if output_final_state else None
    return o, final_state


def chunk_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Optional[float] = None,
    initial_state: Optional[Any] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Any] = None,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """Gated DeltaNet prefill, chunked (64-token WY chunks), on the CPU; FLA's signature.

    Per token and value head h (key head ``h // (H // Hg)``): optionally l2-normalise q and k, then
    ``S <- exp(g) S``, ``v' = beta (v - S^T k)``, ``S <- S + k v'^T``, ``o = scale S^T q``.

    Args:
        q: ``[B, T, Hg, K]`` float32 / float16 (/ bfloat16 from torch).
        k: ``[B, T, Hg, K]``, q's dtype.
        v: ``[B, T, H, V]``, q's dtype; H a multiple of Hg.
        g: ``[B, T, H]`` float, the log decay (<= 0).
        beta: ``[B, T, H]`` float, the write strength.
        scale: output scale; None means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` float32, or None for zeros.
        output_final_state: return the final state (else None).
        cu_seqlens: ``[N + 1]`` int32/int64 sequence offsets into T (then B == 1), or None.
        use_qk_l2norm_in_kernel: l2-normalise q and k per head (eps 1e-6 inside the sqrt).
        **kwargs: any other FLA argument raises NotImplementedError naming it.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in v's dtype; final_state ``[N, H, K, V]``
        float32, or None when not asked for. NumPy arrays, or torch tensors when q is one.

    Raises:
        ValueError: bad shapes, dtypes or values (deltakv's message), or a non-CPU tensor.
        NotImplementedError: an FLA argument deltakv does not support.
    """
    return _prefill("chunk", "chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                    output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, kwargs)


def fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Optional[float] = None,
    initial_state: Optional[Any] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Any] = None,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """Gated DeltaNet prefill, token by token (the recurrence), on the CPU; FLA's signature.

    Same arguments, shapes and results as :func:`chunk_gated_delta_rule`:
    q, k ``[B, T, Hg, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; initial_state and
    final_state ``[N, H, K, V]`` float32; cu_seqlens ``[N + 1]``; o ``[B, T, H, V]``.
    """
    return _prefill("recurrent", "fused_recurrent_gated_delta_rule", q, k, v, g, beta, scale,
                    initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                    kwargs)
