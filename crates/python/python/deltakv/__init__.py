"""deltakv from Python (CPU, and CUDA GPUs in a build with the cargo feature ``cuda``): Gated
DeltaNet prefill with flash-linear-attention's signatures, decode over a state pool in place,
and the compressed KV cache (:class:`KvCache` on the CPU, :class:`CudaKvCache` on a GPU).

Layouts (time-major, as FLA): q, k ``[B, T, Hg, K]``; v ``[B, T, H, V]``; g (log decay) and
beta ``[B, T, H]``; ``initial_state`` and the final state ``[N, H, K, V]`` float32, where N is
B, or the number of sequences with ``cu_seqlens`` (``[N + 1]`` int32/int64 offsets, then
B == 1). Value head h reads key head ``h // (H // Hg)`` (GQA/GVA, as FLA), so H must be a
multiple of Hg. q, k and v share one dtype (float32, float16 or bfloat16); o has v's dtype.

Tensors travel through DLPack, without copies. Inputs: any array with ``__dlpack__`` (NumPy,
torch, CuPy, JAX, ...), C-contiguous, read where it is (a non-contiguous NumPy array or torch
tensor given to the prefill functions is first made contiguous: that one copy is the only
one). A state pool is written in place. Outputs: the kernel's own result buffers, handed to
the caller's ``from_dlpack``, so they come back as the caller's kind (a torch tensor for torch
inputs, a NumPy array for NumPy inputs) on the caller's device. The GIL is released while a
kernel runs: do not write the arrays of a call from another thread meanwhile.

Devices: a call runs where its tensors are, all on one device (else ``ValueError``): the CPU
backend for host arrays, deltakv's CUDA backend for CUDA arrays (torch CUDA tensors, CuPy) in
a build with the ``cuda`` feature (``deltakv.CUDA_BUILT``). Without a GPU or driver a CUDA
tensor raises one-line ``RuntimeError`` (``device `cuda` is not available: ...``).

The stream rule (CUDA): the work is queued on the caller's current stream, so an engine can
call deltakv inside its own step with no synchronisation. The stream is ``stream=`` when
given (a ``torch.cuda.Stream``, a CuPy stream or a ``cudaStream_t`` integer), else
``torch.cuda.current_stream(device)`` for torch tensors, CuPy's current stream for CuPy
arrays, else the legacy default stream. It is passed to each input's
``__dlpack__(stream=...)`` (the DLPack handshake) and deltakv's kernels run on that very
stream; results are allocated on it and freed on it when the caller drops them. The only host
wait is the index check of decode (``slot_indices``) and of a varlen prefill
(``cu_seqlens``), read back before launching: it waits for the caller's stream up to the call,
never for the whole device. With an explicit ``stream=`` other than torch's current stream,
keep the inputs alive until that stream has run the call (torch's ``record_stream`` rule: a
tensor freed on its own stream may be reused there while the other stream still reads it);
the contiguous copies deltakv makes of non-contiguous torch inputs are recorded on that
stream for you.

Values are scanned on the CPU only: there a NaN, an infinity or a positive ``g`` is refused
before anything is written; on CUDA the shapes, dtypes and indices are checked, the values
are not (no device-wide scan on the caller's stream).

Errors from deltakv carry its one-line message: ``ValueError`` for bad shapes, dtypes or
values, ``NotImplementedError`` for what deltakv does not support, ``RuntimeError`` for a
backend failure.
"""

from typing import Any, Dict, List, Optional, Tuple

from . import _deltakv
from ._interop import (_as_kind_of, _contiguous_input, _cuda_stream, _input, _keep_for_stream,
                       _ones_like_kind, _root_module)
from ._kv import CudaKvCache, KvCache

CUDA_BUILT: bool = _deltakv.CUDA_BUILT
"""True when this build runs CUDA arrays (the cargo feature ``cuda``)."""

# The classes are the package's (their repr, help and doctests), wherever they are defined.
KvCache.__module__ = __name__
CudaKvCache.__module__ = __name__

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_checkpointed",
    "fused_recurrent_gated_delta_rule",
    "gated_delta_rule_decode",
    "KvCache",
    "CudaKvCache",
]

# FLA arguments deltakv accepts at the value that asks for what deltakv computes (FLA's
# defaults); any other value, or any other argument, raises NotImplementedError.
_FLA_DEFAULTS = {
    "use_beta_sigmoid_in_kernel": False,
    "allow_neg_eigval": False,
    "state_v_first": False,
    "use_gate_in_kernel": False,
    "chunk_size": 64,
    "gk": None,
    "gv": None,
    "A_log": None,
    "dt_bias": None,
    "cp_context": None,
    "cu_seqlens_cpu": None,
    "chunk_indices": None,
}


def _check_fla_kwargs(fla_name: str, kwargs: Dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if name == "checkpoint_every":
            raise NotImplementedError(
                f"{fla_name} takes no checkpoint_every (FLA's signature): call "
                "deltakv.chunk_gated_delta_rule_checkpointed for the states every N tokens"
            )
        if name in _FLA_DEFAULTS:
            default = _FLA_DEFAULTS[name]
            accepted = value is None if default is None else (
                type(value) is type(default) and value == default)
            if accepted:
                continue
            raise NotImplementedError(
                f"deltakv supports the argument `{name}` of FLA's {fla_name} only at "
                f"{default!r}, got {value!r}"
            )
        raise NotImplementedError(
            f"deltakv does not support the argument `{name}` of FLA's {fla_name}"
        )

def _prefill(mode: str, fla_name: str, q, k, v, g, beta, scale, initial_state,
             output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, stream, kwargs,
             checkpoint_every=None):
    _check_fla_kwargs(fla_name, kwargs)
    if isinstance(cu_seqlens, bool):
        # FLA 0.6 takes use_qk_l2norm_in_kernel ninth, where the contract has cu_seqlens.
        raise ValueError(
            f"cu_seqlens is the bool {cu_seqlens}: {fla_name}'s ninth positional argument is "
            "cu_seqlens here (q, k, v, g, beta, scale, initial_state, output_final_state, "
            "cu_seqlens, use_qk_l2norm_in_kernel), not FLA 0.6's use_qk_l2norm_in_kernel; "
            "pass flags by keyword"
        )
    # Arrays made here (beta's ones, contiguous copies of non-contiguous torch tensors) must
    # outlive deltakv's reads of them.
    made = []
    if beta is None:
        beta = _ones_like_kind(v, tuple(v.shape[:3]))
        made.append(beta)
    given = (q, k, v, g, beta, initial_state, cu_seqlens)
    arrays = [None if x is None else _contiguous_input(x) for x in given]
    inputs = (
        *arrays[:5],
        None if scale is None else float(scale),
        *arrays[5:],
        bool(use_qk_l2norm_in_kernel),
        bool(output_final_state),
    )
    cuda_stream = _cuda_stream(q, stream)
    if stream is not None:
        # The copies made here, which torch's allocator must keep for deltakv's stream.
        made += [x for x, original in zip(arrays, given)
                 if x is not None and _root_module(x) == "torch"
                 and x.data_ptr() != original.data_ptr()]
        _keep_for_stream(made, cuda_stream)
    if checkpoint_every is None:
        o, final_state = _deltakv.gdn_prefill(mode, *inputs, cuda_stream)
        return _as_kind_of(o, q), None if final_state is None else _as_kind_of(final_state, q)
    if isinstance(checkpoint_every, bool) or int(checkpoint_every) != checkpoint_every:
        raise ValueError(f"checkpoint_every must be an int, got {checkpoint_every!r}")
    if checkpoint_every <= 0:
        raise ValueError(
            "checkpoint_every must be a positive multiple of 64 tokens (checkpoints fall on "
            f"chunk boundaries), got {checkpoint_every}"
        )
    o, final_state, checkpoints, offsets = _deltakv.gdn_prefill_checkpointed(
        *inputs, int(checkpoint_every), cuda_stream
    )
    return (
        _as_kind_of(o, q),
        None if final_state is None else _as_kind_of(final_state, q),
        _as_kind_of(checkpoints, q),
        list(offsets),
    )


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
    *,
    stream: Any = None,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """Gated DeltaNet prefill, chunked (64-token WY chunks), on the tensors' device (the CPU,
    or a CUDA GPU: tensor cores, bf16 products with f32 accumulation and state); FLA's
    signature.

    Per token and value head h (key head ``h // (H // Hg)``): optionally l2-normalise q and k,
    then ``S <- exp(g) S``, ``v' = beta (v - S^T k)``, ``S <- S + k v'^T``,
    ``o = scale S^T q``, with S ``[K, V]`` float32.

    Args:
        q: ``[B, T, Hg, K]`` float32, float16 or bfloat16.
        k: ``[B, T, Hg, K]``, q's dtype.
        v: ``[B, T, H, V]``, q's dtype; H a multiple of Hg.
        g: ``[B, T, H]`` float, the log decay (<= 0).
        beta: ``[B, T, H]`` float, the write strength.
        scale: output scale; None means ``K ** -0.5``.
        initial_state: ``[N, H, K, V]`` float32, or None for zeros.
        output_final_state: return the final state (else None).
        cu_seqlens: ``[N + 1]`` int32/int64 sequence offsets into T (then B == 1), or None.
        use_qk_l2norm_in_kernel: l2-normalise q and k per head (eps 1e-6 inside the sqrt).
        stream: CUDA only: the stream to queue the work on (a ``torch.cuda.Stream``, a CuPy
            stream or a ``cudaStream_t`` integer); None means the current stream of torch /
            CuPy on the tensors' device (see the module's stream rule).
        **kwargs: FLA's other arguments are accepted at their defaults
            (``use_beta_sigmoid_in_kernel=False``, ``allow_neg_eigval=False``,
            ``state_v_first=False``, ``chunk_size=64``, ``cp_context=None``,
            ``cu_seqlens_cpu=None``, ``chunk_indices=None``, and for the recurrent form ``gk``,
            ``gv``, ``A_log``, ``dt_bias`` None and ``use_gate_in_kernel=False``); any other
            value, or any other argument, raises NotImplementedError naming it.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in v's dtype; final_state ``[N, H, K, V]``
        float32, or None when not asked for; of q's kind on q's device (torch tensors for
        torch inputs), deltakv's own buffers (no copy).

    Raises:
        ValueError: bad shapes, dtypes or values (deltakv's message), or tensors on
            different devices.
        NotImplementedError: an FLA argument deltakv does not support.
        RuntimeError: CUDA tensors without a usable GPU or driver, or a build without CUDA.

    Example:
        >>> import numpy as np, deltakv
        >>> rng = np.random.default_rng(0)
        >>> B, T, Hg, H, K, V = 1, 100, 2, 4, 64, 64
        >>> q = rng.standard_normal((B, T, Hg, K), dtype=np.float32)
        >>> k = rng.standard_normal((B, T, Hg, K), dtype=np.float32)
        >>> v = rng.standard_normal((B, T, H, V), dtype=np.float32)
        >>> g = -rng.random((B, T, H), dtype=np.float32)
        >>> beta = rng.random((B, T, H), dtype=np.float32)
        >>> o, state = deltakv.chunk_gated_delta_rule(
        ...     q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
        >>> o.shape, state.shape, o.dtype
        ((1, 100, 4, 64), (1, 4, 64, 64), dtype('float32'))
    """
    return _prefill("chunk", "chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                    output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, stream, kwargs)


def chunk_gated_delta_rule_checkpointed(
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
    *,
    checkpoint_every: int,
    stream: Any = None,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any], Any, List[int]]:
    """:func:`chunk_gated_delta_rule` that also returns the recurrent state every
    ``checkpoint_every`` tokens of each sequence, for prefix caching and rollback (the same
    arguments as FLA's function, plus ``checkpoint_every``; FLA has no such output, so it is a
    separate function and :func:`chunk_gated_delta_rule` keeps FLA's ``(o, final_state)``).

    Sequence n (a batch row, or a ``cu_seqlens`` span) of length L_n has
    ``L_n // checkpoint_every`` checkpoints: its state after tokens ``c * checkpoint_every``,
    c = 1, 2, ..., counted from its own start (the initial state included; one that falls on
    the sequence end equals its final state). Chunks are 64 tokens from each sequence's start,
    so every checkpoint is a state the chunked kernels already hold: no extra work.

    Args:
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
        use_qk_l2norm_in_kernel, stream: as :func:`chunk_gated_delta_rule`.
        checkpoint_every: tokens between checkpoints, a positive multiple of 64.

    Returns:
        ``(o, final_state, checkpoints, offsets)``: o and final_state as
        :func:`chunk_gated_delta_rule`; checkpoints ``[C, H, K, V]`` float32 (of q's kind on
        q's device), every checkpoint of the call, sequence by sequence, each sequence's in
        position order; offsets, a list of ``N + 1`` ints: sequence n's checkpoints are rows
        ``offsets[n]:offsets[n + 1]``, so its checkpoint at token ``c * checkpoint_every`` is
        row ``offsets[n] + c - 1``.

    Raises:
        ValueError: as :func:`chunk_gated_delta_rule`, and ``checkpoint_every`` not a positive
            multiple of 64.

    Example:
        >>> import numpy as np, deltakv
        >>> rng = np.random.default_rng(0)
        >>> q, k = (rng.standard_normal((1, 300, 1, 32), dtype=np.float32) for _ in range(2))
        >>> v = rng.standard_normal((1, 300, 2, 32), dtype=np.float32)
        >>> g = -rng.random((1, 300, 2), dtype=np.float32)
        >>> beta = rng.random((1, 300, 2), dtype=np.float32)
        >>> o, final, checkpoints, offsets = deltakv.chunk_gated_delta_rule_checkpointed(
        ...     q, k, v, g, beta, use_qk_l2norm_in_kernel=True, checkpoint_every=128)
        >>> checkpoints.shape, offsets  # the states after tokens 128 and 256
        ((2, 2, 32, 32), [0, 2])
    """
    return _prefill("chunk", "chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                    output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, stream, kwargs,
                    checkpoint_every=checkpoint_every)


def fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Optional[Any] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Any] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Any] = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    stream: Any = None,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """Gated DeltaNet prefill, token by token (the recurrence), on the tensors' device; FLA's
    signature.

    Same arguments, shapes and results as :func:`chunk_gated_delta_rule`:
    q, k ``[B, T, Hg, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; initial_state and
    final_state ``[N, H, K, V]`` float32; cu_seqlens ``[N + 1]``; o ``[B, T, H, V]``. As in
    FLA, beta may be left out (None): ones, float32, of v's kind on v's device.
    On a CUDA GPU, T <= 16 without cu_seqlens (decode steps) runs deltakv's decode kernels
    (the recurrence in float32, from a copy of initial_state); longer or varlen calls run
    the chunked kernels (the same function, bf16 products).

    Example:
        >>> import numpy as np, deltakv
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.standard_normal((2, 1, 32, 1, 64), dtype=np.float32)
        >>> v = rng.standard_normal((1, 32, 2, 64), dtype=np.float32)
        >>> g = -rng.random((1, 32, 2), dtype=np.float32)
        >>> beta = rng.random((1, 32, 2), dtype=np.float32)
        >>> o, _ = deltakv.fused_recurrent_gated_delta_rule(q, k, v, g, beta)
        >>> o.shape
        (1, 32, 2, 64)
    """
    return _prefill("recurrent", "fused_recurrent_gated_delta_rule", q, k, v, g, beta, scale,
                    initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                    stream, kwargs)


def gated_delta_rule_decode(
    q: Any,
    k: Any,
    v: Any,
    state_pool: Any,
    slot_indices: Any,
    g: Optional[Any] = None,
    beta: Optional[Any] = None,
    *,
    A_log: Optional[Any] = None,
    dt_bias: Optional[Any] = None,
    a: Optional[Any] = None,
    b: Optional[Any] = None,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
    output_intermediate_states: bool = False,
    stream: Any = None,
) -> Tuple[Any, Optional[Any]]:
    """Gated DeltaNet decode over a state pool, in place, on the tensors' device (the CPU or a
    CUDA GPU, where the pool is the caller's device memory, written by the kernel).

    Row b advances the state in slot ``slot_indices[b]`` of ``state_pool`` by its T new
    tokens (the recurrence of :func:`chunk_gated_delta_rule`), reading and writing the
    caller's pool memory directly; a negative index skips the row (its o is zeros, no slot is
    touched). Nothing is written when the inputs are invalid (an index out of range, two rows
    on one slot, T > 16, and on the CPU NaN or g > 0: CUDA checks shapes and indices, not
    values; see the module's note). A bfloat16 pool is widened once, runs all T tokens
    in float32 and is rounded once.

    Gating: either ``g`` and ``beta``, or fused from the layer's raw projections (Qwen3-Next's
    ``fused_gdn_gating``): ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``.

    Args:
        q: ``[B, T, Hg, K]`` float32, float16 or bfloat16, T in 1..=16.
        k: ``[B, T, Hg, K]``, q's dtype.
        v: ``[B, T, H, V]``, q's dtype.
        state_pool: ``[S, H, K, V]`` float32 or bfloat16, C-contiguous and writable; updated
            in place (never copied).
        slot_indices: ``[B]`` int32/int64; negative skips the row.
        g: ``[B, T, H]`` float, the log decay (<= 0); with ``beta``.
        beta: ``[B, T, H]`` float.
        A_log: ``[H]`` float (fused gating, with ``dt_bias``, ``a``, ``b``).
        dt_bias: ``[H]`` float.
        a: ``[B, T, H]`` float, the raw decay projection.
        b: ``[B, T, H]`` float, the raw write-strength projection.
        scale: output scale; None means ``K ** -0.5``.
        use_qk_l2norm_in_kernel: l2-normalise q and k per head.
        output_intermediate_states: also return the state after every token.
        stream: CUDA only: the stream to queue the work on (see
            :func:`chunk_gated_delta_rule`). The index check reads slot_indices on the host,
            which waits for that stream up to the call.

    Returns:
        ``(o, intermediate_states)``: o ``[B, T, H, V]`` in v's dtype; intermediate_states
        ``[B, T, H, K, V]`` float32 (for speculative decoding's rollback) or None; of q's kind.

    Example:
        >>> import numpy as np, deltakv
        >>> rng = np.random.default_rng(0)
        >>> B, T, Hg, H, K, V, S = 3, 1, 2, 4, 64, 64, 8
        >>> pool = np.zeros((S, H, K, V), dtype=np.float32)   # the engine's state pool
        >>> q, k = rng.standard_normal((2, B, T, Hg, K), dtype=np.float32)
        >>> v = rng.standard_normal((B, T, H, V), dtype=np.float32)
        >>> a, b = rng.standard_normal((2, B, T, H), dtype=np.float32)
        >>> A_log, dt_bias = np.zeros(H, np.float32), np.zeros(H, np.float32)
        >>> slots = np.array([5, -1, 2], dtype=np.int32)        # row 1 is padding
        >>> o, _ = deltakv.gated_delta_rule_decode(q, k, v, pool, slots, A_log=A_log,
        ...     dt_bias=dt_bias, a=a, b=b, use_qk_l2norm_in_kernel=True)
        >>> o.shape, bool(pool[5].any()), bool(pool[0].any()), bool(o[1].any())
        ((3, 1, 4, 64), True, False, False)
    """
    o, states = _deltakv.gdn_decode(
        _input(q),
        _input(k),
        _input(v),
        _input(state_pool),
        _input(slot_indices),
        None if g is None else _input(g),
        None if beta is None else _input(beta),
        None if a is None else _input(a),
        None if b is None else _input(b),
        None if A_log is None else _input(A_log),
        None if dt_bias is None else _input(dt_bias),
        None if scale is None else float(scale),
        bool(use_qk_l2norm_in_kernel),
        bool(output_intermediate_states),
        _cuda_stream(q, stream),
    )
    return _as_kind_of(o, q), None if states is None else _as_kind_of(states, q)
