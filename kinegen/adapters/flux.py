"""FLUX.1 and FLUX.1 Kontext (``FluxPipeline``, ``FluxKontextPipeline``; ``FluxTransformer2DModel``).

Joint attention, text first, then image: 19 dual-stream blocks then 38 single-stream blocks.
Latents arrive packed, ``[B, N, C]``, one token per 2x2 latent patch; ``img_ids[:, 1:]`` hold each
token's (row, column). The grid is ``(1, H, W)``. Kontext appends the reference image's tokens after
the generated ones (``img_ids[:, 0] == 1``); they count as ``num_extra_tokens``. Guidance is distilled.
diffusers ships MagCache ratios for FLUX.
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter, TokenLayout


@dataclasses.dataclass(frozen=True)
class FluxAdapter(ModelAdapter):
    def spatial_multiple(self, pipe) -> int:
        return int(pipe.vae_scale_factor) * 2  # 2x2 latent patches packed into one token

    def patch_size(self, transformer):
        return 1, 2, 2  # 2x2 latent packing done by the pipeline; the transformer's own patch is 1

    def token_layout(self, transformer, forward_kwargs):
        ids = forward_kwargs["img_ids"]
        ids = ids[0] if ids.ndim == 3 else ids
        target = ids[ids[:, 0] == 0]
        h = int(target[:, 1].max().item()) + 1
        w = int(target[:, 2].max().item()) + 1
        text = forward_kwargs["encoder_hidden_states"].shape[1]
        extra = int(ids.shape[0] - target.shape[0])
        return TokenLayout(grid=(1, h, w), num_text_tokens=text, text_position="first", num_extra_tokens=extra)

    def mag_ratios(self):
        from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

        return [float(x) for x in FLUX_MAG_RATIOS], "diffusers FLUX_MAG_RATIOS"


@dataclasses.dataclass(frozen=True)
class FluxKontextAdapter(FluxAdapter):
    def call_kwargs(self, request):
        kw = super().call_kwargs(request)
        # Kontext rescales its output to `max_area` (default 1024^2) at the requested aspect ratio;
        # asking for the requested area keeps the requested size.
        kw["max_area"] = request.height * request.width
        if request.image is not None:
            kw["image"] = request.image
        return kw


_FLUX_STRUCTURE = dict(
    transformer_class="FluxTransformer2DModel", block_lists=("transformer_blocks", "single_transformer_blocks"),
    self_attention={"transformer_blocks": "attn", "single_transformer_blocks": "attn"}, cross_attention={},
    text_mode="joint", text_position="first", latent_format="BNC",
)
FLUX = FluxAdapter(name="flux", pipeline_classes=("FluxPipeline",), kind="image", cfg_mode="distilled",
                   **_FLUX_STRUCTURE)
FLUX_KONTEXT = FluxKontextAdapter(name="flux_kontext", pipeline_classes=("FluxKontextPipeline",), kind="image",
                                  cfg_mode="distilled", takes_image=True, **_FLUX_STRUCTURE)
