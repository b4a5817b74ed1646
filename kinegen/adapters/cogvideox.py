"""CogVideoX (``CogVideoXTransformer3DModel``): joint attention, text tokens first, then video.

Latents arrive as ``[B, F, C, H, W]`` (frames before channels). Spatial patch 2; CogVideoX
1.5 also patches time (``patch_size_t = 2``, latent frames padded to a multiple).
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter, TokenLayout, _ceil_div


@dataclasses.dataclass(frozen=True)
class CogVideoXAdapter(ModelAdapter):
    def patch_size(self, transformer):
        c = transformer.config
        return int(c.patch_size_t or 1), int(c.patch_size), int(c.patch_size)

    def token_layout(self, transformer, forward_kwargs):
        _, f, _, h, w = forward_kwargs["hidden_states"].shape
        pt, ph, pw = self.patch_size(transformer)
        text = forward_kwargs["encoder_hidden_states"].shape[1]
        return TokenLayout(grid=(_ceil_div(f, pt), h // ph, w // pw), num_text_tokens=text, text_position="first")


COGVIDEOX = CogVideoXAdapter(
    name="cogvideox", transformer_class="CogVideoXTransformer3DModel", block_lists=("transformer_blocks",),
    self_attention={"transformer_blocks": "attn1"}, cross_attention={}, text_mode="joint", text_position="first",
    latent_format="BFCHW",
)
