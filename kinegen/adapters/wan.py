"""Wan 2.1 / 2.2 (``WanPipeline``, ``WanTransformer3DModel``): video-only self-attention, text via cross-attention.

Latents ``[B, C, F, H, W]`` are patchified by a Conv3d with ``patch_size = (1, 2, 2)`` and
flattened in raster order; the umT5 text tokens enter only through ``attn2``. Classifier-free
guidance runs the conditional and unconditional passes as separate transformer calls. Wan's VAE
is causal in time, so the first latent frame decodes on its own: a cheap preview.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError, InvalidRequestError
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

    def preview_frame(self, pipe, latents):
        """Latent frame 0 of the first sample, un-normalised with the VAE's statistics and decoded alone."""
        import numpy as np
        import torch

        vae = pipe.vae
        z = latents[:1, :, :1].to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(z)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(z)
        with torch.no_grad():
            x = vae.decode(z * std + mean, return_dict=False)[0]
        img = ((x[0, :, 0].float().clamp(-1, 1) + 1) / 2).permute(1, 2, 0).cpu().numpy()
        return (img * 255).round().astype(np.uint8)


WAN = WanAdapter(
    name="wan", pipeline_classes=("WanPipeline", "WanImageToVideoPipeline"), kind="video", cfg_mode="cfg",
    transformer_class="WanTransformer3DModel", block_lists=("blocks",), self_attention={"blocks": "attn1"},
    cross_attention={"blocks": "attn2"}, text_mode="cross", text_position="none", sparse_attention=True,
)


@dataclasses.dataclass(frozen=True)
class WanAutoregressiveAdapter(WanAdapter):
    """Kinegen's chunk-by-chunk Wan (``WanAutoregressivePipeline``, docs/autoregressive.md): the same transformer
    and VAE, block-causal attention with a KV cache; guidance runs both branches as one batch."""

    def pipeline_class(self, class_name: str):
        from ..pipelines import WanAutoregressivePipeline

        return WanAutoregressivePipeline if class_name == "WanAutoregressivePipeline" else None

    def check_request(self, pipe, request) -> None:
        pipe.check_frames(request.frames)  # the frames must split into the pipeline's chunks
        try:  # the sink fits the window and a chunk fits in it
            pipe.cache_config(request.sink_frames, request.window_frames)
        except ConfigError as e:
            raise InvalidRequestError(str(e)) from None

    def call_kwargs(self, request) -> dict:
        kw = super().call_kwargs(request)
        kw.update({k: getattr(request, k) for k in ("window_frames", "sink_frames") if getattr(request, k) is not None})
        return kw


WAN_AR = WanAutoregressiveAdapter(
    name="wan_ar", pipeline_classes=("WanAutoregressivePipeline",), kind="video", cfg_mode="cfg",
    cfg_calls="batched", transformer_class="WanTransformer3DModel", block_lists=("blocks",),
    self_attention={"blocks": "attn1"},
    cross_attention={"blocks": "attn2"}, text_mode="cross", text_position="none", autoregressive=True,
    kv_window=True,
)
