"""How deltakv meets the caller's arrays and streams: inputs through DLPack (made contiguous
where the prefill needs it), results handed back as the caller's kind on the caller's device,
and the CUDA stream a call runs on (the package's stream rule, in its docstring)."""

import sys
from typing import Any, List, Optional, Tuple


def _root_module(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def _input(x: Any) -> Any:
    """``x`` ready for DLPack: torch tensors detached (a view, no copy)."""
    if _root_module(x) == "torch":
        return x.detach()
    return x


def _contiguous_input(x: Any) -> Any:
    """:func:`_input`, made C-contiguous (one copy) when it is a non-contiguous NumPy array
    or torch tensor; other arrays pass as they are (deltakv refuses non-contiguous ones)."""
    x = _input(x)
    root = _root_module(x)
    if root == "torch" and not x.is_contiguous():
        return x.contiguous()
    if root == "numpy" and hasattr(x, "flags") and not x.flags.c_contiguous:
        import numpy as np

        return np.ascontiguousarray(x)
    return x


def _stream_handle(stream: Any) -> int:
    """A DLPack stream integer from ``stream``: a ``torch.cuda.Stream`` (``cuda_stream``), a
    CuPy stream (``ptr``) or an integer; 0, the legacy default stream's handle, becomes 1, its
    DLPack number."""
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute):
            stream = getattr(stream, attribute)
            break
    stream = int(stream)
    return 1 if stream == 0 else stream


def _cuda_stream(x: Any, stream: Any) -> Optional[int]:
    """The DLPack stream integer deltakv's work on ``x``'s device is queued on: ``stream`` when
    given, else the current stream of torch or CuPy for their CUDA arrays, else None (the CPU,
    or the legacy default stream for other CUDA arrays)."""
    if stream is not None:
        return _stream_handle(stream)
    device = getattr(x, "__dlpack_device__", None)
    if device is None or int(device()[0]) != 2:  # kDLCUDA
        return None
    root = _root_module(x)
    if root == "torch":
        return _stream_handle(sys.modules["torch"].cuda.current_stream(x.device))
    if root == "cupy":
        return _stream_handle(sys.modules["cupy"].cuda.get_current_stream())
    return None


def _device_stream(device: Optional[int], stream: Any) -> Optional[int]:
    """The DLPack stream integer for work on CUDA ``device`` that no array names: ``stream``
    when given, else torch's current stream there when torch is imported, else None (the
    legacy default stream)."""
    if stream is not None:
        return _stream_handle(stream)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        index = torch.cuda.current_device() if device is None else device
        return _stream_handle(torch.cuda.current_stream(index))
    return None


def _as_kind_of(result: Any, like: Any) -> Any:
    """The exported ``result`` as an array of ``like``'s library, through its ``from_dlpack``
    (no copy); NumPy for anything without one."""
    root = _root_module(like)
    if root == "torch":
        return sys.modules["torch"].from_dlpack(result)
    if root in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.from_dlpack(result)
    module = sys.modules.get(root)
    if root != "numpy" and module is not None and hasattr(module, "from_dlpack"):
        return module.from_dlpack(result)
    import numpy as np

    return np.from_dlpack(result)


def _ones_like_kind(like: Any, shape: Tuple[int, ...]) -> Any:
    """float32 ones of ``shape``, of ``like``'s library on ``like``'s device."""
    root = _root_module(like)
    if root == "torch":
        torch = sys.modules["torch"]
        return torch.ones(shape, dtype=torch.float32, device=like.device)
    if root == "cupy":
        cupy = sys.modules["cupy"]
        with like.device:
            return cupy.ones(shape, dtype=cupy.float32)
    if root == "numpy":
        import numpy as np

        return np.ones(shape, dtype=np.float32)
    raise NotImplementedError(
        f"beta=None builds ones for torch, CuPy and NumPy arrays only, got a {type(like)!r}: "
        "pass beta"
    )


def _keep_for_stream(made: List[Any], handle: int) -> None:
    """Marks the torch CUDA tensors ``made`` here (on torch's current stream; all on one
    device) as used by the stream ``handle`` deltakv queued its reads of them on, so that
    torch's allocator does not hand their memory out again before those reads are done."""
    torch = sys.modules.get("torch")
    made = [x for x in made if _root_module(x) == "torch" and x.is_cuda]
    if torch is None or not made:
        return
    device = made[0].device
    if _stream_handle(torch.cuda.current_stream(device)) == handle:
        return
    stream = torch.cuda.ExternalStream(handle, device=device)
    for copy in made:
        copy.record_stream(stream)
