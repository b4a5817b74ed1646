"""AnyFlow-FAR (diffusers 0.42 ``AnyFlowFARPipeline``, ``AnyFlowFARTransformer3DModel``): chunk-by-chunk video with a
two-tier KV cache, run through Kinegen like any video family.

What the family is (``diffusers/models/transformers/transformer_anyflow_far.py`` and
``diffusers/pipelines/anyflow/pipeline_anyflow_far.py``; AnyFlow, arXiv:2605.13724, on the FAR backbone,
arXiv:2503.19325; ../shared/reference/autoregressive_dasa.md, section 2):

- a Wan 2.1 backbone conditioned on two timesteps (the flow map from ``t`` to ``r``), text through cross-attention
  (``attn2``), latents laid out ``[B, F, C, H, W]``, Wan's VAE (4x in time, 8x in space);
- the latent frames are split into chunks by ``transformer.config.chunk_partition`` (released checkpoints:
  ``(1, 3, 3, 3, 3, 3, 3, 2)`` = 21 latent frames = 81 video frames); each chunk is denoised against a KV cache of the
  earlier ones, the ``full_chunk_limit - 1`` most recent at full resolution and older ones re-embedded by a coarser
  ``compressed_patch_size`` patch embedding (4x fewer tokens with (1, 4, 4));
- guidance, when above 1, runs both branches as one batch; released checkpoints are guidance-distilled and sample at
  1.0 in a few steps per chunk.

Kinegen drives it through :class:`kinegen.pipelines.anyflow_far.KinegenAnyFlowFARPipeline`, which turns a frame count
into a chunk partition (``far_chunk_partition`` in the same module) and runs the cached attention on exact
sequences (docs/autoregressive.md, "AnyFlow-FAR models"); a folder it saves is still a stock ``AnyFlowFARPipeline``
folder.
"""

from __future__ import annotations

import dataclasses

from ..errors import InvalidRequestError
from .base import ModelAdapter


@dataclasses.dataclass(frozen=True)
class AnyFlowFARAdapter(ModelAdapter):
    """AnyFlow-FAR: sizes are multiples of the VAE's 8x times the coarser (compressed) patch, frame counts ``4k + 1``
    that make at least ``full_chunk_limit - 1`` chunks; only autoregressive accelerators apply."""

    def pipeline_class(self, class_name: str):
        from ..pipelines.anyflow_far import KinegenAnyFlowFARPipeline

        return KinegenAnyFlowFARPipeline if class_name in self.pipeline_classes else None

    def patch_size(self, transformer):
        pt, ph, pw = transformer.config.patch_size
        return int(pt), int(ph), int(pw)

    def spatial_multiple(self, pipe) -> int:
        """Committed chunks are re-embedded with ``compressed_patch_size`` ((1, 4, 4)), whose Conv3d drops the edge of
        a latent that it does not divide: sizes are multiples of the VAE factor times the larger patch."""
        cfg = pipe.transformer.config
        return int(pipe.vae_scale_factor_spatial) * max(int(cfg.patch_size[1]), int(cfg.compressed_patch_size[1]))

    def latent_frames(self, pipe, frames: int) -> int:
        return (frames - 1) // int(pipe.vae_scale_factor_temporal) + 1

    def chunk_partition(self, pipe, frames: int) -> list[int]:
        """Latent frames per chunk for ``frames`` video frames on this pipeline
        (:func:`kinegen.pipelines.anyflow_far.far_chunk_partition`)."""
        from ..pipelines.anyflow_far import far_chunk_partition

        cfg = pipe.transformer.config
        return far_chunk_partition(self.latent_frames(pipe, frames), cfg.chunk_partition, cfg.full_chunk_limit,
                                   int(pipe.vae_scale_factor_temporal))

    def check_request(self, pipe, request) -> None:
        """The frames must split into chunks, and frames and sizes must fit the model's RoPE tables
        (``rope_max_seq_len`` positions per axis: latent frames, and latent rows and columns after patching)."""
        self.chunk_partition(pipe, request.frames)
        cfg = pipe.transformer.config
        n, ft = int(cfg.rope_max_seq_len), int(pipe.vae_scale_factor_temporal)
        per_position = int(pipe.vae_scale_factor_spatial) * int(cfg.patch_size[1])  # pixels per RoPE position
        if self.latent_frames(pipe, request.frames) > n:
            raise InvalidRequestError(f"{request.frames} frames is past the model's RoPE table ({n} latent frames); "
                                      f"generate at most {ft * (n - 1) + 1} frames.")
        side = max(request.height, request.width)
        if side > n * per_position:
            raise InvalidRequestError(f"{side} pixels is past the model's RoPE table ({n} positions); height and width "
                                      f"go up to {n * per_position}.")

    def preview_frame(self, pipe, latents):
        """The first latent frame of a chunk (``[B, F, C, H, W]``), decoded alone by Wan's VAE as Wan's preview is."""
        from .wan import WAN

        return WAN.preview_frame(pipe, latents.transpose(1, 2))


ANYFLOW_FAR = AnyFlowFARAdapter(
    name="anyflow_far", pipeline_classes=("AnyFlowFARPipeline", "KinegenAnyFlowFARPipeline"), kind="video",
    cfg_mode="cfg", cfg_calls="batched", transformer_class="AnyFlowFARTransformer3DModel", block_lists=("blocks",),
    self_attention={"blocks": "attn1"}, cross_attention={"blocks": "attn2"}, text_mode="cross", text_position="none",
    latent_format="BFCHW", autoregressive=True,
)
