"""Typing stub of deltakv: FLA-compatible Gated DeltaNet prefill, decode over a state pool in
place (CPU, and CUDA in a build with the cargo feature ``cuda``), and the compressed KV cache
(CPU). Arrays are anything with ``__dlpack__`` (NumPy, torch, CuPy, JAX, ...), all of a call on
one device; results are of the caller's kind on the caller's device. CUDA work is queued on
``stream`` when given (a torch.cuda.Stream, a CuPy stream or a cudaStream_t integer), else on
torch's / CuPy's current stream of the tensors' device: no synchronisation, the caller's
stream orders it (decode, and prefill with cu_seqlens, wait for that stream up to the call to
read the indices on the host).

Shapes: q, k [B, T, Hg, K]; v [B, T, H, V] (H a multiple of Hg); g, beta [B, T, H];
initial_state and the final state [N, H, K, V] float32; cu_seqlens [N + 1] int (then B == 1);
o [B, T, H, V] (v's dtype). Decode: state_pool [S, H, K, V] float32/bfloat16, slot_indices
[B] int, T <= 16; A_log, dt_bias [H]; a, b [B, T, H]; intermediate states [B, T, H, K, V]
float32. KV cache: k, v [n, kv_heads, dim] float32; q and o [B, Tq, Hq, dim] float32.
"""

from typing import Any, List, Optional, Tuple

CUDA_BUILT: bool
"""True when this build runs CUDA arrays (the cargo feature ``cuda``)."""

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_checkpointed",
    "fused_recurrent_gated_delta_rule",
    "gated_delta_rule_decode",
    "KvCache",
    "CudaKvCache",
]

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
    """Chunked GDN prefill: q, k [B, T, Hg, K]; v [B, T, H, V]; g, beta [B, T, H];
    initial_state [N, H, K, V] f32; cu_seqlens [N + 1]. Returns (o [B, T, H, V],
    final_state [N, H, K, V] f32 or None)."""
    ...

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
    """chunk_gated_delta_rule plus the state every checkpoint_every tokens (a positive
    multiple of 64) of each sequence, counted from its own start. Returns (o [B, T, H, V],
    final_state [N, H, K, V] f32 or None, checkpoints [C, H, K, V] f32, offsets): sequence n
    has L_n // checkpoint_every checkpoints, rows offsets[n]:offsets[n + 1] (offsets: N + 1
    ints), its state after token c * checkpoint_every at row offsets[n] + c - 1."""
    ...

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
    """Token-by-token GDN prefill; the shapes of :func:`chunk_gated_delta_rule`."""
    ...

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
    """GDN decode in place: q, k [B, T, Hg, K] (T <= 16); v [B, T, H, V]; state_pool
    [S, H, K, V] f32/bf16 (written in place); slot_indices [B] (negative skips); g, beta
    [B, T, H], or A_log, dt_bias [H] with a, b [B, T, H]. Returns (o [B, T, H, V],
    intermediate states [B, T, H, K, V] f32 or None)."""
    ...

class KvCache:
    """Compressed KV cache of one attention layer (CPU)."""

    def __init__(
        self,
        dim: int,
        kv_heads: int,
        batch: int,
        bits_k: int = 4,
        bits_v: int = 2,
        seed: int = 0,
        norms: str = "f32",
        codebook: str = "lloyd-max",
    ) -> None: ...
    def append(self, seq: int, k: Any, v: Any) -> None:
        """Appends k, v [n, kv_heads, dim] float32 to sequence ``seq``."""
        ...
    def attend(self, q: Any, scale: Optional[float] = None) -> Any:
        """q [B, Tq, Hq, dim] float32 -> o [B, Tq, Hq, dim] float32 (causal over the last Tq
        positions)."""
        ...
    def bytes(self) -> int: ...
    def seq_len(self, seq: int) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def bits_k(self) -> int: ...
    @property
    def bits_v(self) -> int: ...

class CudaKvCache:
    """The paged compressed KV cache on a CUDA GPU (build feature ``cuda``): k, v
    [B, Tn, kv_heads, dim] and q [B, Tq, Hq, dim] on the GPU (f32/f16/bf16); o [B, Tq, Hq, dim]
    f32 on the GPU; on the caller's stream."""

    def __init__(self, dim: int, kv_heads: int, batch: int, max_tokens: int, bits_k: int = 4,
                 bits_v: int = 2, seed: int = 0, norms: str = "f32",
                 codebook: str = "lloyd-max", page_tokens: int = 64,
                 device: Optional[int] = None, stream: Any = None) -> None: ...
    def append(self, k: Any, v: Any, new_lens: Optional[Any] = None, *,
               stream: Any = None) -> None: ...
    def attend(self, q: Any, scale: Optional[float] = None, *, stream: Any = None) -> Any: ...
    def bytes(self) -> int: ...
    def seq_len(self, seq: int) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def batch(self) -> int: ...
