"""CogVideoX (``CogVideoXPipeline``, ``CogVideoXTransformer3DModel``): joint attention, text first, then video.

Latents arrive as ``[B, F, C, H, W]`` (frames before channels). Spatial patch 2; CogVideoX
1.5 also patches time (``patch_size_t = 2``, latent frames padded to a multiple). Classifier-free
guidance runs both branches in one batched call. The VAE decodes the latent frames after the
first in pairs, so frame counts are 8k + 1.
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter, TokenLayout, _ceil_div


@dataclasses.dataclass(frozen=True)
class CogVideoXAdapter(ModelAdapter):
    def patch_size(self, transformer):
        c = transformer.config
        return int(c.patch_size_t or 1), int(c.patch_size), int(c.patch_size)

    def temporal_factor(self, pipe):
        """4x time compression times the VAE's latent-frame batch (2): an even latent count would decode to
        extra frames (49 frames for CogVideoX-2b/5b, 81 for 1.5)."""
        factor = int(pipe.vae_scale_factor_temporal)
        return factor * int(getattr(pipe.vae, "num_latent_frames_batch_size", 1) or 1)

    def token_layout(self, transformer, forward_kwargs):
        _, f, _, h, w = forward_kwargs["hidden_states"].shape
        pt, ph, pw = self.patch_size(transformer)
        text = forward_kwargs["encoder_hidden_states"].shape[1]
        return TokenLayout(grid=(_ceil_div(f, pt), h // ph, w // pw), num_text_tokens=text, text_position="first")


COGVIDEOX = CogVideoXAdapter(
    name="cogvideox", pipeline_classes=("CogVideoXPipeline",), kind="video", cfg_mode="cfg", cfg_calls="batched",
    transformer_class="CogVideoXTransformer3DModel", block_lists=("transformer_blocks",),
    self_attention={"transformer_blocks": "attn1"}, cross_attention={}, text_mode="joint", text_position="first",
    latent_format="BFCHW", sparse_attention=True,
)
