"""Everything Kinegen knows about one model family, in one frozen dataclass.

An adapter answers, for one family (Wan, HunyuanVideo, CogVideoX, FLUX, FLUX Kontext, the MP-GAN):

1. *How is its pipeline driven?* Which pipeline classes belong to it, whether it makes video or
   images, how guidance works (``cfg_mode``, ``guidance_calls``), which sizes and frame counts it
   takes (``spatial_multiple``, ``temporal_factor``) and how a validated request becomes pipeline
   keyword arguments (``call_kwargs``).
2. *Where are the blocks?* ``blocks(t)`` lists them in execution order (the unit that caches hook),
   with qualified names such as ``"transformer_blocks.3"``.
3. *Which attention modules are self-attention?* ``self_attention_modules(t)`` (the modules whose
   processor sparse attention replaces) and ``cross_attention_modules(t)``.
4. *How are tokens laid out?* ``token_layout(t, forward_kwargs)``: the (frames, height, width) grid
   of video tokens after patchify, in raster order, and where text tokens sit in the self-attention
   sequence (``first``, ``last``, or ``none`` when text enters through cross-attention).
5. *What applies to it?* ``sparse_attention`` (HyperVAttention and its baseline), shipped MagCache
   ratios (``mag_ratios``), a cheap preview of noisy latents (``preview_frame``).

Nothing outside :mod:`kinegen.adapters` tests a family's name; it asks the adapter.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the functions that use it: `kinegen --help` stays fast
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
    """Static facts about one model family, and functions over its pipelines and transformers.

    Attributes:
        name: short family name (``wan``, ``hunyuan_video``, ``cogvideox``, ``flux``, ``flux_kontext``, ``mpgan``).
        pipeline_classes: the pipeline class names it drives (the first is the one it loads by default).
        kind: ``"video"`` (writes mp4) or ``"image"`` (writes png).
        cfg_mode: ``"cfg"`` when ``guidance_scale`` is classifier-free guidance (negative prompt used when it
            is above 1), ``"distilled"`` when it is an embedded guidance value (classifier-free guidance then
            needs ``true_cfg_scale`` above 1 and a negative prompt), ``"none"`` for one-step generators.
        cfg_calls: how CFG runs when on: ``"separate"`` transformer calls per branch or one ``"batched"`` call.
        takes_image: the pipeline edits an input image (FLUX Kontext).
        conditioning: ``"text"`` (a prompt, many denoising steps) or ``"class"`` (a class label, one generator
            forward: the MP-GAN, driven by :func:`kinegen.generation.generate_class_images`).
        transformer_class: the diffusers transformer class name; ``None`` for families without a denoising
            transformer (no accelerator applies to them).
        block_lists: names of the ``ModuleList`` attributes holding blocks, in execution order.
        self_attention: per block list, the attribute of a block that is its self-attention module
            (joint text+video attention counts as self-attention).
        cross_attention: per block list, the attribute of its text cross-attention module, if any.
        text_mode: ``"cross"`` (text via cross-attention) or ``"joint"`` (text tokens in self-attention).
        text_position: ``"none"``, ``"first"`` or ``"last"``: where text sits in the self-attention sequence.
        latent_format: layout of the transformer's ``hidden_states`` input: ``"BCFHW"`` (Wan, HunyuanVideo),
            ``"BFCHW"`` (CogVideoX) or ``"BNC"`` (FLUX's packed 2x2 patches).
        sparse_attention: clustered sparse self-attention (``hva``, ``kmeans-sparse``) applies: video tokens
            on a (frames, height, width) grid and one SDPA call over the whole sequence.
        autoregressive: the pipeline generates chunk by chunk against a KV cache; only accelerators that require
            ``autoregressive`` apply (step caches and whole-sequence sparse attention assume one denoising loop).
        kv_window: an autoregressive pipeline whose KV cache keeps a sink and a rolling window that a call can set
            (``window_frames``, ``sink_frames``; Kinegen's ``WanAutoregressivePipeline``).
    """

    name: str
    pipeline_classes: tuple[str, ...]
    kind: str
    cfg_mode: str
    cfg_calls: str = "separate"
    takes_image: bool = False
    conditioning: str = "text"
    transformer_class: str | None = None
    block_lists: tuple[str, ...] = ()
    self_attention: dict[str, str] = dataclasses.field(default_factory=dict)
    cross_attention: dict[str, str] = dataclasses.field(default_factory=dict)
    text_mode: str = "cross"
    text_position: str = "none"
    latent_format: str = "BCFHW"
    sparse_attention: bool = False
    autoregressive: bool = False
    kv_window: bool = False

    # -- driving the pipeline -----------------------------------------------------------

    def pipeline_class(self, class_name: str):
        """The class object for ``class_name`` (one of ``pipeline_classes``), for loading a folder."""
        import diffusers

        return getattr(diffusers, class_name, None)

    def spatial_multiple(self, pipe) -> int:
        """Height and width must be multiples of this (VAE downsampling x transformer patch)."""
        return int(pipe.vae_scale_factor_spatial) * self.patch_size(pipe.transformer)[1]

    def temporal_factor(self, pipe) -> int | None:
        """Frame counts must be ``k * factor + 1``; ``None`` for image families (the VAEs compress time
        4x after the first frame)."""
        return int(pipe.vae_scale_factor_temporal) if self.kind == "video" else None

    def guidance_calls(self, request) -> str:
        """How this request's guidance runs: ``none``, ``batched`` or ``separate`` transformer calls."""
        if self.cfg_mode == "cfg":
            return "none" if request.guidance <= 1.0 else self.cfg_calls
        true_cfg = request.true_cfg_scale is not None and request.true_cfg_scale > 1.0
        return "separate" if true_cfg and request.negative_prompt is not None else "none"

    def check_request(self, pipe, request) -> None:
        """Family rules beyond sizes and frame counts, checked before a run (default: none)."""

    def call_kwargs(self, request) -> dict[str, Any]:
        """Pipeline keyword arguments for a validated request (without ``generator``)."""
        kw: dict[str, Any] = dict(prompt=request.prompt, height=request.height, width=request.width,
                                  num_inference_steps=request.steps, guidance_scale=request.guidance,
                                  output_type="np")
        if self.kind == "video":
            kw["num_frames"] = request.frames
        if request.negative_prompt is not None:
            kw["negative_prompt"] = request.negative_prompt
        if self.cfg_mode == "distilled" and request.true_cfg_scale is not None:
            kw["true_cfg_scale"] = request.true_cfg_scale
        return kw

    def preview_frame(self, pipe, latents: torch.Tensor):
        """The first frame of noisy ``latents`` as a uint8 image, or ``None`` where a preview would cost a
        full decode (the default)."""
        return None

    def mag_ratios(self) -> tuple[list[float], str] | None:
        """MagCache ratios shipped for this family and where they come from (diffusers ships FLUX's), or
        ``None``: MagCache then calibrates them with one dense run."""
        return None

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

    def attention_module_patterns(self) -> list[str]:
        """Regular expressions naming every self- and cross-attention module (for diffusers' TaylorSeer)."""
        return sorted({rf"{lst}\.\d+\.{attr}" for table in (self.self_attention, self.cross_attention)
                       for lst, attr in table.items()})

    def patch_size(self, transformer) -> tuple[int, int, int]:
        """(temporal, height, width) patch size of the patch embedding."""
        raise NotImplementedError(f"{self.name} has no patch size")

    # -- token layout ---------------------------------------------------------------

    def token_layout(self, transformer, forward_kwargs: dict[str, Any]) -> TokenLayout:
        """The self-attention token layout of a forward called with ``forward_kwargs``."""
        raise NotImplementedError(f"{self.name} has no token layout")

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, pipeline_classes=list(self.pipeline_classes), kind=self.kind,
                    cfg_mode=self.cfg_mode, transformer_class=self.transformer_class,
                    block_lists=list(self.block_lists), self_attention=self.self_attention,
                    cross_attention=self.cross_attention, text_mode=self.text_mode,
                    text_position=self.text_position, latent_format=self.latent_format,
                    sparse_attention=self.sparse_attention)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
