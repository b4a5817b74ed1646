"""Running out of memory: recognise an allocator failure, free what can be freed, and say what to try.

``with out_of_memory_guard(request): ...`` is used where work runs (``run_job``, loading, the CLI's commands and
the web service), so an out-of-memory request becomes one :class:`~kinegen.errors.OutOfMemory` message and
never a traceback, a held lock or a half-freed device.
"""

from __future__ import annotations

import re
import traceback

from .errors import KinegenError, OutOfMemory

_OOM_TEXT = ("out of memory", "can't allocate memory", "not enough memory")


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocator failure: ``torch.OutOfMemoryError`` (CUDA), ``MemoryError``, or the
    ``RuntimeError`` the CPU and MPS allocators raise."""
    if isinstance(e, KinegenError):
        return False
    if isinstance(e, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__):
        return True  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class)
    return isinstance(e, RuntimeError) and any(t in str(e).lower() for t in _OOM_TEXT)


def free_memory() -> None:
    """Collect garbage and hand the CUDA (or MPS) caching allocator's free blocks back."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover (torch is a dependency)
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def _oom_size(request) -> str:
    """``512x512x81`` (width x height x frames) for a video request, ``1024x1024`` for an image."""
    size = f"{request.width}x{request.height}"
    frames = getattr(request, "frames", None)
    return f"{size}x{frames}" if frames and frames > 1 else size


class out_of_memory_guard:  # noqa: N801 (used as a context manager, like contextlib's)
    """``with out_of_memory_guard(request): ...`` turns an allocator failure into :class:`OutOfMemory` with what to
    try, after freeing what it can: the failed call's frames (which hold its tensors) are cleared, garbage is
    collected and the CUDA cache emptied. Locks taken by enclosing ``with`` blocks are released as usual.

    ``request`` (a ``GenerationRequest``) names the size in the message; ``doing`` and ``hint`` replace the
    default wording (for a load, say)."""

    def __init__(self, request=None, *, doing: str | None = None, hint: str | None = None):
        self.request, self.doing, self.hint = request, doing, hint

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if e is None or not is_out_of_memory(e):
            return False
        asked = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)", str(e))
        traceback.clear_frames(tb)  # the failed call's locals (activations, latents) go now, not with `e`
        free_memory()
        if self.doing:
            doing = self.doing
        elif self.request is not None:
            doing = f"at {_oom_size(self.request)}"
        else:
            doing = "during the run"
        if self.hint:
            hint = self.hint
        elif self.request is not None and (getattr(self.request, "frames", None) or 1) == 1:
            hint = "try a smaller size, --cpu-offload or --vae-tiling"
        else:
            hint = "try fewer frames, a smaller size, --cpu-offload or --vae-tiling"
        more = f" (tried to allocate {asked[1]})" if asked else ""
        raise OutOfMemory(f"Out of memory {doing}{more}: {hint}.") from None
