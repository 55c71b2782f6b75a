"""The compressed KV cache of one attention layer: :class:`KvCache` on the CPU,
:class:`CudaKvCache` (paged) on a CUDA GPU."""

from typing import Any, Optional

from . import _deltakv
from ._interop import _as_kind_of, _cuda_stream, _device_stream, _input


def _native(name: str, doc: str) -> Any:
    """A read-only property answered by the native cache's attribute ``name``."""
    return property(lambda self: getattr(self._cache, name), doc=doc)


class _CacheQueries:
    """What both caches answer from the native cache they hold (``self._cache``)."""

    _cache: Any

    def bytes(self) -> int:
        """Bytes of codes and norms of the tokens held (keys and values, every sequence and
        head)."""
        return self._cache.bytes()

    def seq_len(self, seq: int) -> int:
        """Tokens cached for sequence ``seq``."""
        return self._cache.seq_len(seq)

    dim = _native("dim", "d, the head dimension.")
    kv_heads = _native("kv_heads", "Hkv, KV heads.")
    batch = _native("batch", "Sequences in the cache.")


class KvCache(_CacheQueries):
    """The compressed KV cache of one attention layer, on the CPU (CPU arrays only; a CUDA
    tensor raises ValueError).

    Each key and value vector (head dim d, 64..=256) is stored as its norm and ``bits_k`` /
    ``bits_v``-bit codebook indices of its rotated direction (a seeded randomised Hadamard
    rotation, Lloyd-Max levels); attention reads the packed codes directly. Sequences of the
    batch grow independently.

    Args:
        dim: d, the head dimension (64..=256).
        kv_heads: Hkv, KV heads.
        batch: sequences in the cache.
        bits_k: bits per key coordinate (2, 3, 4 or 8).
        bits_v: bits per value coordinate (2, 3, 4 or 8).
        seed: seed of the layer's rotation.
        norms: ``"f32"`` or ``"f16"`` stored norms.
        codebook: ``"lloyd-max"`` or ``"aura"``.

    Example:
        >>> import numpy as np, deltakv
        >>> rng = np.random.default_rng(0)
        >>> cache = deltakv.KvCache(dim=128, kv_heads=2, batch=1, bits_k=4, bits_v=2)
        >>> k, v = rng.standard_normal((2, 100, 2, 128), dtype=np.float32)
        >>> cache.append(0, k, v)                    # [n, Hkv, d] each
        >>> q = rng.standard_normal((1, 1, 8, 128), dtype=np.float32)   # [B, Tq, Hq, d]
        >>> o = cache.attend(q)
        >>> o.shape, cache.seq_len(0), cache.bytes()  # 104 bytes per token and KV head
        ((1, 1, 8, 128), 100, 20800)
    """

    def __init__(self, dim: int, kv_heads: int, batch: int, bits_k: int = 4, bits_v: int = 2,
                 seed: int = 0, norms: str = "f32", codebook: str = "lloyd-max") -> None:
        self._cache = _deltakv.KvCache(dim, kv_heads, batch, bits_k, bits_v, seed, norms,
                                       codebook)

    def append(self, seq: int, k: Any, v: Any) -> None:
        """Encodes and appends ``n`` tokens to sequence ``seq``: ``k``, ``v``
        ``[n, kv_heads, dim]`` float32, read in place."""
        self._cache.append(seq, _input(k), _input(v))

    def attend(self, q: Any, scale: Optional[float] = None) -> Any:
        """Attention of ``q`` ``[B, Tq, Hq, dim]`` float32 over the cache (Hq a multiple of
        kv_heads; query head h reads KV head ``h // (Hq // kv_heads)``). Query i of sequence
        b sits at position ``len_b - Tq + i`` and sees keys ``0..=len_b - Tq + i`` (Tq = 1 is
        decode). ``scale`` defaults to ``dim ** -0.5``. Returns o ``[B, Tq, Hq, dim]``
        float32, of q's kind."""
        return _as_kind_of(self._cache.attend(_input(q), None if scale is None else float(scale)),
                           q)

    bits_k = _native("bits_k", "Bits per key coordinate.")
    bits_v = _native("bits_v", "Bits per value coordinate.")


class CudaKvCache(_CacheQueries):
    """The paged compressed KV cache of one attention layer on a CUDA GPU (a build with the
    cargo feature ``cuda``), byte for byte what the CPU's paged cache holds.

    ``batch`` sequences of up to ``max_tokens`` tokens each, in pages of ``page_tokens``
    (allocated up front); each key and value vector is stored as its norm and ``bits_k`` /
    ``bits_v``-bit codes, as :class:`KvCache`. Appends and attention read the caller's device
    arrays in place and run on the caller's stream (the module's stream rule); the cache's own
    memory is allocated on the stream current at construction: use it there, or order other
    streams after it.

    Args:
        dim: d, the head dimension (64..=256).
        kv_heads: Hkv, KV heads.
        batch: sequences in the cache.
        max_tokens: tokens each sequence may hold.
        bits_k: bits per key coordinate (2, 3, 4 or 8).
        bits_v: bits per value coordinate (2, 3, 4 or 8).
        seed: seed of the layer's rotation.
        norms: ``"f32"`` or ``"f16"`` stored norms.
        codebook: ``"lloyd-max"`` or ``"aura"``.
        page_tokens: tokens per page.
        device: CUDA device index (None: deltakv's, ``DELTAKV_CUDA_DEVICE`` or 0).
        stream: the stream of the construction (see the module's stream rule).

    Example (on a GPU, with torch)::

        cache = deltakv.CudaKvCache(dim=128, kv_heads=2, batch=2, max_tokens=4096)
        k, v = torch.randn(2, 2, 100, 2, 128, device="cuda")   # [B, Tn, Hkv, d] each
        cache.append(k, v, new_lens=[100, 37])     # 100 tokens to sequence 0, 37 to 1
        o = cache.attend(torch.randn(2, 1, 8, 128, device="cuda"))   # [B, Tq, Hq, d] f32
    """

    def __init__(self, dim: int, kv_heads: int, batch: int, max_tokens: int, bits_k: int = 4,
                 bits_v: int = 2, seed: int = 0, norms: str = "f32",
                 codebook: str = "lloyd-max", page_tokens: int = 64,
                 device: Optional[int] = None, stream: Any = None) -> None:
        if not _deltakv.CUDA_BUILT:
            raise RuntimeError("device `cuda` is not available: this deltakv was built without "
                               "CUDA (build it with the cargo feature `cuda`)")
        self._cache = _deltakv.CudaKvCache(dim, kv_heads, batch, max_tokens, bits_k, bits_v,
                                           seed, norms, codebook, page_tokens, device,
                                           _device_stream(device, stream))

    def append(self, k: Any, v: Any, new_lens: Optional[Any] = None, *,
               stream: Any = None) -> None:
        """Encodes and appends ``new_lens[b]`` tokens (every ``Tn`` when None) of ``k``, ``v``
        ``[B, Tn, kv_heads, dim]`` (float32, float16 or bfloat16 on the GPU, read in place) to
        sequence b. Refuses, changing nothing, a non-finite input (this waits for the stream
        to know)."""
        lens = None if new_lens is None else [int(n) for n in new_lens]
        self._cache.append(_input(k), _input(v), lens, _cuda_stream(k, stream))

    def attend(self, q: Any, scale: Optional[float] = None, *, stream: Any = None) -> Any:
        """Attention of ``q`` ``[B, Tq, Hq, dim]`` (on the GPU, read in place) over the cache,
        query i of sequence b at position ``len_b - Tq + i`` (Tq = 1 is decode). Returns o
        ``[B, Tq, Hq, dim]`` float32 on the GPU, of q's kind."""
        o = self._cache.attend(_input(q), None if scale is None else float(scale),
                               _cuda_stream(q, stream))
        return _as_kind_of(o, q)
