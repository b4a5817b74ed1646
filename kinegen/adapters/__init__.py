"""Model-family adapters: one registry from transformer class to what accelerators need.

>>> adapter = get_adapter(pipe)            # or get_adapter(pipe.transformer)
>>> adapter.blocks(pipe.transformer)       # [("blocks.0", WanTransformerBlock), ...]
>>> adapter.self_attention_modules(pipe.transformer)
>>> adapter.token_layout(pipe.transformer, forward_kwargs).grid   # (F, H, W) after patchify

Accelerators never test a model's class themselves; they ask this registry.
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedModelError
from .base import ModelAdapter, TokenLayout
from .cogvideox import COGVIDEOX
from .flux import FLUX
from .hunyuan_video import HUNYUAN_VIDEO
from .wan import WAN

ADAPTERS: dict[str, ModelAdapter] = {}


def register_adapter(adapter: ModelAdapter) -> ModelAdapter:
    """Register an adapter for its ``transformer_class`` (one adapter per class)."""
    if adapter.transformer_class in ADAPTERS:
        raise ValueError(f"an adapter for {adapter.transformer_class} is already registered")
    ADAPTERS[adapter.transformer_class] = adapter
    return adapter


for _a in (WAN, HUNYUAN_VIDEO, COGVIDEOX, FLUX):
    register_adapter(_a)


def transformers_of(pipe_or_transformer) -> list[torch.nn.Module]:
    """The denoising transformer(s) of a pipeline (Wan 2.2 A14B has two), or ``[transformer]``."""
    if isinstance(pipe_or_transformer, torch.nn.Module):
        return [pipe_or_transformer]
    found = [getattr(pipe_or_transformer, n, None) for n in ("transformer", "transformer_2")]
    found = [t for t in found if t is not None]
    if not found:
        raise UnsupportedModelError(f"{type(pipe_or_transformer).__name__} has no `transformer` component.")
    return found


def get_adapter(pipe_or_transformer) -> ModelAdapter:
    """The adapter for a transformer (or a pipeline's transformer); a clear error if none exists."""
    transformer = transformers_of(pipe_or_transformer)[0]
    for cls in type(transformer).__mro__:
        if cls.__name__ in ADAPTERS:
            return ADAPTERS[cls.__name__]
    raise UnsupportedModelError(
        f"No Kinegen adapter for {type(transformer).__name__}. Supported transformers: "
        f"{', '.join(sorted(ADAPTERS))}. Register one with kinegen.adapters.register_adapter()."
    )


__all__ = ["ADAPTERS", "ModelAdapter", "TokenLayout", "get_adapter", "register_adapter", "transformers_of"]
