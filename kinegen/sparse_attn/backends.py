"""Dense attention backends, selectable like any accelerator: ``--attention dense-attention:backend=xformers``.

A thin, removable wrapper over diffusers' attention dispatcher (``ModelMixin.set_attention_backend``):
``native`` is torch's scaled_dot_product_attention (the default), ``_native_math`` its reference
math kernel, ``xformers`` / ``flash`` / ``sage`` need their packages (and a GPU). Only the backend
of the transformer's attention modules changes; removing it restores each module's previous backend.

``ModelMixin.set_attention_backend`` also sets diffusers' process-wide active backend, which every other model in
the process falls back to (a processor whose ``_attention_backend`` is None). Left set, one user's ``_native_math``
run would move every later run in a long-lived process (the app, the service, a test session) onto the math kernel;
so the process-wide backend is put back at once, and the choice lives only on this transformer's processors.
"""

from __future__ import annotations

import dataclasses

from ..accelerators.base import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters import transformers_of
from ..errors import ConfigError

INSTALL_HINTS = {
    "xformers": "pip install xformers (or KINEGEN_EXTRAS=dev,gpu ./scripts/setup.sh); it needs a CUDA GPU",
    "flash": "pip install flash-attn; it needs a CUDA GPU",
    "sage": "pip install sageattention; it needs a CUDA GPU",
}


@dataclasses.dataclass
class DenseAttentionSpec:
    """diffusers attention backend for every attention module of the transformer (``native`` = torch SDPA)."""

    backend: str = "native"

    def __post_init__(self):
        from diffusers.models.attention_dispatch import AttentionBackendName

        valid = [b.value for b in AttentionBackendName]
        if self.backend not in valid:
            raise ValueError(f"backend must be one of {', '.join(valid)}; got {self.backend!r}")


def _processors(transformer):
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    for module in transformer.modules():
        if isinstance(module, (Attention, AttentionModuleMixin)) and module.processor is not None:
            yield module.processor


def apply_dense_attention(pipe, config: DenseAttentionSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _AttentionBackendRegistry,
        _check_attention_backend_requirements,
    )

    try:
        _check_attention_backend_requirements(AttentionBackendName(config.backend))
    except (RuntimeError, ImportError) as e:
        hint = next((h for k, h in INSTALL_HINTS.items() if config.backend.startswith(k)), "")
        raise ConfigError(f"dense-attention: backend {config.backend!r} is not usable here ({e})."
                          + (f" {hint}." if hint else "")) from None
    saved = []
    process_wide = _AttentionBackendRegistry._active_backend
    try:
        for t in transformers_of(pipe):
            saved += [(p, getattr(p, "_attention_backend", None)) for p in _processors(t)]
            t.set_attention_backend(config.backend)  # validates, fetches hub kernels, sets each processor
    finally:
        _AttentionBackendRegistry.set_active_backend(process_wide)  # ... and the process-wide one: undone

    def remove():
        for p, backend in saved:
            p._attention_backend = backend

    return AcceleratorHandle("dense-attention", config, remove, lambda: {"processors": len(saved)})


register_accelerator("dense-attention", DenseAttentionSpec, apply_dense_attention, kind="attention",
                     summary="dense attention through a diffusers backend (native SDPA, math, xformers, flash, ...)")
