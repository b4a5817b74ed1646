"""HunyuanVideo (``HunyuanVideoPipeline``, ``HunyuanVideoTransformer3DModel``): joint attention, video then text.

20 dual-stream blocks (``transformer_blocks``) then 40 single-stream blocks
(``single_transformer_blocks``); every block attends over ``[video, text]``, with padded
text positions masked. Patch size (1, 2, 2) on ``[B, C, F, H, W]`` latents. Guidance is
distilled (an embedded value); true CFG needs ``true_cfg_scale`` and a negative prompt.
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter, TokenLayout


@dataclasses.dataclass(frozen=True)
class HunyuanVideoAdapter(ModelAdapter):
    def patch_size(self, transformer):
        c = transformer.config
        return int(c.patch_size_t), int(c.patch_size), int(c.patch_size)

    def token_layout(self, transformer, forward_kwargs):
        _, _, f, h, w = forward_kwargs["hidden_states"].shape
        pt, ph, pw = self.patch_size(transformer)
        text = forward_kwargs["encoder_hidden_states"].shape[1]
        return TokenLayout(grid=(f // pt, h // ph, w // pw), num_text_tokens=text, text_position="last")


HUNYUAN_VIDEO = HunyuanVideoAdapter(
    name="hunyuan_video", pipeline_classes=("HunyuanVideoPipeline",), kind="video", cfg_mode="distilled",
    transformer_class="HunyuanVideoTransformer3DModel",
    block_lists=("transformer_blocks", "single_transformer_blocks"),
    self_attention={"transformer_blocks": "attn", "single_transformer_blocks": "attn"}, cross_attention={},
    text_mode="joint", text_position="last", sparse_attention=True,
)
