"""Model families: one adapter module per family, one registry line each.

>>> adapter = get_adapter(pipe)            # or get_adapter(pipe.transformer), adapter_for_family("wan")
>>> adapter.kind, adapter.spatial_multiple(pipe), adapter.call_kwargs(request)
>>> adapter.blocks(pipe.transformer)       # [("blocks.0", WanTransformerBlock), ...]
>>> adapter.token_layout(pipe.transformer, forward_kwargs).grid   # (F, H, W) after patchify

Nothing outside this package tests a family's name; it asks the adapter. Adding a family is one
new module (a :class:`ModelAdapter` instance, subclassed where a rule differs) plus one line in
``_BUILTIN`` below.
"""

from __future__ import annotations

from ..errors import ConfigError, UnsupportedModelError
from .anyflow import ANYFLOW_FAR
from .base import ModelAdapter, TokenLayout
from .cogvideox import COGVIDEOX
from .flux import FLUX, FLUX_KONTEXT
from .hunyuan_video import HUNYUAN_VIDEO
from .mpgan import MPGAN
from .wan import WAN, WAN_AR

ADAPTERS: dict[str, ModelAdapter] = {}  # family name -> adapter
_BY_PIPELINE: dict[str, ModelAdapter] = {}
_BY_TRANSFORMER: dict[str, ModelAdapter] = {}


def register_adapter(adapter: ModelAdapter) -> ModelAdapter:
    """Register a family (unique name and pipeline classes); the first family of a transformer class
    answers for bare transformers of that class."""
    taken = [c for c in adapter.pipeline_classes if c in _BY_PIPELINE]
    if adapter.name in ADAPTERS or taken:
        raise ValueError(f"family {adapter.name!r} or pipeline classes {taken} are already registered")
    ADAPTERS[adapter.name] = adapter
    for cls in adapter.pipeline_classes:
        _BY_PIPELINE[cls] = adapter
    if adapter.transformer_class is not None:
        _BY_TRANSFORMER.setdefault(adapter.transformer_class, adapter)
    return adapter


_BUILTIN = (WAN, WAN_AR, HUNYUAN_VIDEO, COGVIDEOX, FLUX, FLUX_KONTEXT, MPGAN, ANYFLOW_FAR)
for _a in _BUILTIN:
    register_adapter(_a)


def adapter_for_family(name: str) -> ModelAdapter:
    """The adapter of a family by name; the error lists the families."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise UnsupportedModelError(f"Unknown model family {name!r}; known: {', '.join(ADAPTERS)}.") from None


def adapter_for_pipeline_class(class_name: str) -> ModelAdapter:
    """The family that drives a pipeline class (``"WanPipeline"``); the error lists the supported classes."""
    try:
        return _BY_PIPELINE[class_name]
    except KeyError:
        raise UnsupportedModelError(f"Kinegen does not know how to drive a {class_name}. Supported pipelines: "
                                    f"{', '.join(sorted(_BY_PIPELINE))}.") from None


def _is_module(obj) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def transformers_of(pipe_or_transformer) -> list:
    """The denoising transformer(s) of a pipeline (Wan 2.2 A14B has two), or ``[transformer]``."""
    if _is_module(pipe_or_transformer):
        return [pipe_or_transformer]
    found = [getattr(pipe_or_transformer, n, None) for n in ("transformer", "transformer_2")]
    found = [t for t in found if t is not None]
    if not found:
        raise UnsupportedModelError(f"{type(pipe_or_transformer).__name__} has no `transformer` component.")
    return found


def get_adapter(pipe_or_transformer) -> ModelAdapter:
    """The adapter of a pipeline (by its class) or of a transformer (by its class or a base class)."""
    if not _is_module(pipe_or_transformer):
        return adapter_for_pipeline_class(type(pipe_or_transformer).__name__)
    for cls in type(pipe_or_transformer).__mro__:
        if cls.__name__ in _BY_TRANSFORMER:
            return _BY_TRANSFORMER[cls.__name__]
    raise UnsupportedModelError(
        f"No Kinegen adapter for {type(pipe_or_transformer).__name__}. Supported transformers: "
        f"{', '.join(sorted(_BY_TRANSFORMER))}. Register one with kinegen.adapters.register_adapter()."
    )


CAPABILITIES = {
    "sparse_attention": "video tokens on a (frames, height, width) grid and one attention call over the sequence",
    "autoregressive": "chunk-by-chunk generation with a KV cache",
}
"""What each capability an accelerator may require (``Accelerator.requires``) means, for error messages."""


def check_supports(adapter: ModelAdapter, accelerator) -> None:
    """Refuse an accelerator that does not apply to a family, naming the families it does apply to."""
    need = accelerator.requires

    def ok(a: ModelAdapter) -> bool:
        if a.transformer_class is None or (a.autoregressive and need != "autoregressive"):
            return False
        return need is None or bool(getattr(a, need))

    if not ok(adapter):
        fits = ", ".join(a.name for a in ADAPTERS.values() if ok(a)) or "none yet"
        if adapter.transformer_class is None:
            why = "it has no denoising transformer"
        elif adapter.autoregressive and need != "autoregressive":
            why = "it generates chunk by chunk with a KV cache, which this accelerator does not handle"
        else:
            why = f"it needs {CAPABILITIES.get(need, need)}"
        raise ConfigError(f"{accelerator.name} does not apply to {adapter.name} models ({why}); it supports the "
                          f"families {fits}.")


__all__ = ["ADAPTERS", "ModelAdapter", "TokenLayout", "adapter_for_family", "adapter_for_pipeline_class",
           "check_supports", "get_adapter", "register_adapter", "transformers_of"]
