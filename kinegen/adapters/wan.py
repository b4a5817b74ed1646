"""Wan 2.1 / 2.2 (``WanTransformer3DModel``): video-only self-attention, text via cross-attention.

Latents ``[B, C, F, H, W]`` are patchified by a Conv3d with ``patch_size = (1, 2, 2)`` and
flattened in raster order; the umT5 text tokens enter only through ``attn2``.
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter, TokenLayout


@dataclasses.dataclass(frozen=True)
class WanAdapter(ModelAdapter):
    def patch_size(self, transformer):
        pt, ph, pw = transformer.config.patch_size
        return int(pt), int(ph), int(pw)

    def token_layout(self, transformer, forward_kwargs):
        _, _, f, h, w = forward_kwargs["hidden_states"].shape
        pt, ph, pw = self.patch_size(transformer)
        return TokenLayout(grid=(f // pt, h // ph, w // pw))


WAN = WanAdapter(
    name="wan", transformer_class="WanTransformer3DModel", block_lists=("blocks",),
    self_attention={"blocks": "attn1"}, cross_attention={"blocks": "attn2"}, text_mode="cross",
    text_position="none",
)
