"""What an accelerator needs to know about a transformer family, in one place.

An adapter answers three questions for one transformer class:

1. *Where are the blocks?* ``blocks(t)`` lists them in execution order (the unit that
   caches hook), with qualified names such as ``"transformer_blocks.3"``.
2. *Which attention modules are self-attention?* ``self_attention_modules(t)`` (the
   modules whose processor sparse attention replaces) and ``cross_attention_modules(t)``.
3. *How are tokens laid out?* ``token_layout(t, forward_kwargs)`` reads the transformer's
   forward arguments and returns a :class:`TokenLayout`: the (frames, height, width) grid of
   video tokens after patchify, in raster order, and where text tokens sit in the
   self-attention sequence (``first``, ``last``, or ``none`` when text enters through
   cross-attention).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """The self-attention sequence of one transformer forward.

    The sequence is ``[text, video, extra]`` when ``text_position == "first"``,
    ``[video, text]`` when ``"last"`` and ``[video]`` when ``"none"``; video tokens are in raster
    order ``idx = f * H * W + h * W + w`` over ``grid = (F, H, W)``. ``num_extra_tokens`` counts
    tokens appended after the video tokens (FLUX Kontext's reference-image tokens).
    """

    grid: tuple[int, int, int]
    num_text_tokens: int = 0
    text_position: str = "none"
    num_extra_tokens: int = 0

    @property
    def num_video_tokens(self) -> int:
        f, h, w = self.grid
        return f * h * w

    @property
    def seq_len(self) -> int:
        return self.num_video_tokens + self.num_text_tokens + self.num_extra_tokens

    @property
    def video_slice(self) -> slice:
        start = self.num_text_tokens if self.text_position == "first" else 0
        return slice(start, start + self.num_video_tokens)

    @property
    def text_slice(self) -> slice:
        if self.text_position == "first":
            return slice(0, self.num_text_tokens)
        if self.text_position == "last":
            end = self.seq_len - self.num_extra_tokens if self.num_extra_tokens else self.seq_len
            return slice(self.num_video_tokens, end)
        return slice(0, 0)


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    """Static facts about one transformer class, and functions over an instance of it.

    Attributes:
        transformer_class: the diffusers class name it covers.
        block_lists: names of the ``ModuleList`` attributes holding blocks, in execution order.
        self_attention: per block list, the attribute of a block that is its self-attention module
            (joint text+video attention counts as self-attention).
        cross_attention: per block list, the attribute of its text cross-attention module, if any.
        text_mode: ``"cross"`` (text via cross-attention) or ``"joint"`` (text tokens in self-attention).
        text_position: ``"none"``, ``"first"`` or ``"last"``: where text sits in the self-attention sequence.
        latent_format: layout of the transformer's ``hidden_states`` input: ``"BCFHW"`` (Wan, HunyuanVideo),
            ``"BFCHW"`` (CogVideoX) or ``"BNC"`` (FLUX's packed 2x2 patches).
    """

    name: str
    transformer_class: str
    block_lists: tuple[str, ...]
    self_attention: dict[str, str]
    cross_attention: dict[str, str]
    text_mode: str
    text_position: str
    latent_format: str = "BCFHW"

    # -- structure ------------------------------------------------------------------

    def blocks(self, transformer: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
        """All blocks in execution order as ``(qualified_name, module)``."""
        out = []
        for list_name in self.block_lists:
            for i, block in enumerate(getattr(transformer, list_name)):
                out.append((f"{list_name}.{i}", block))
        return out

    def _attn(self, transformer, table: dict[str, str]) -> list[tuple[str, torch.nn.Module]]:
        out = []
        for list_name in self.block_lists:
            attr = table.get(list_name)
            if attr is None:
                continue
            for i, block in enumerate(getattr(transformer, list_name)):
                out.append((f"{list_name}.{i}.{attr}", getattr(block, attr)))
        return out

    def self_attention_modules(self, transformer) -> list[tuple[str, torch.nn.Module]]:
        """Self-attention (or joint attention) modules, one per block, in execution order."""
        return self._attn(transformer, self.self_attention)

    def cross_attention_modules(self, transformer) -> list[tuple[str, torch.nn.Module]]:
        """Text cross-attention modules (empty for joint-attention families)."""
        return self._attn(transformer, self.cross_attention)

    def patch_size(self, transformer) -> tuple[int, int, int]:
        """(temporal, height, width) patch size of the patch embedding."""
        raise NotImplementedError

    # -- token layout ---------------------------------------------------------------

    def token_layout(self, transformer, forward_kwargs: dict[str, Any]) -> TokenLayout:
        """The self-attention token layout of a forward called with ``forward_kwargs``."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, transformer_class=self.transformer_class, block_lists=list(self.block_lists),
                    self_attention=self.self_attention, cross_attention=self.cross_attention,
                    text_mode=self.text_mode, text_position=self.text_position, latent_format=self.latent_format)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
