"""Typing stub of deltakv (CPU): FLA-compatible Gated DeltaNet prefill.

Shapes: q, k [B, T, Hg, K]; v [B, T, H, V]; g, beta [B, T, H]; initial_state and the final
state [N, H, K, V] float32; cu_seqlens [N + 1] int (then B == 1); o [B, T, H, V] (v's dtype).
"""

from typing import Any, Optional, Tuple

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
) -> Tuple[Any, Optional[Any]]: ...
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
) -> Tuple[Any, Optional[Any]]: ...
