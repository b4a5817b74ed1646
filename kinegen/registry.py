"""The model registry: names users type, and what Kinegen knows about each model family.

A *family* says how a diffusers pipeline of that kind is driven: its pipeline class,
whether it makes video or images, which sizes and frame counts it accepts, and how a
:class:`~kinegen.generation.GenerationRequest` becomes pipeline keyword arguments.
A *model spec* is one named checkpoint (or a tiny model built in code) of a family,
with its default generation settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .errors import ModelNotFoundError

# ---------------------------------------------------------------------------- families


@dataclasses.dataclass(frozen=True)
class Family:
    """How to drive one diffusers pipeline family.

    Attributes:
        name: short family name (``wan``, ``hunyuan_video``, ``cogvideox``, ``flux``, ``flux_kontext``).
        pipeline_class: the diffusers pipeline class name.
        kind: ``"video"`` (writes mp4) or ``"image"`` (writes png).
        cfg_mode: ``"cfg"`` when ``guidance_scale`` is classifier-free guidance (negative prompt
            used when it is above 1), ``"distilled"`` when it is an embedded guidance value
            (classifier-free guidance then needs ``true_cfg_scale`` above 1 and a negative prompt).
        takes_image: the pipeline edits an input image (FLUX Kontext).
        conditioning: ``"text"`` (a prompt, many denoising steps) or ``"class"`` (a class label, one
            generator forward: the MP-GAN; driven by :func:`kinegen.generation.generate_class_images`).
    """

    name: str
    pipeline_class: str
    kind: str
    cfg_mode: str
    takes_image: bool = False
    conditioning: str = "text"

    def spatial_multiple(self, pipe) -> int:
        """Height and width must be multiples of this (VAE downsampling x transformer patch)."""
        t = pipe.transformer
        if self.name == "wan":
            return int(pipe.vae_scale_factor_spatial) * int(t.config.patch_size[1])
        if self.name in ("hunyuan_video", "cogvideox"):
            return int(pipe.vae_scale_factor_spatial) * int(t.config.patch_size)
        # FLUX packs 2x2 latent patches into one token.
        return int(pipe.vae_scale_factor) * 2

    def temporal_factor(self, pipe) -> int | None:
        """Frame counts must be ``k * factor + 1``; ``None`` for image families.

        The VAEs compress time 4x after the first frame. CogVideoX's VAE also decodes the latent
        frames after the first in pairs, so an even latent count would decode to extra frames:
        its frame counts are 8k + 1 (49 for CogVideoX-2b/5b, 81 for 1.5).
        """
        if self.kind != "video":
            return None
        factor = int(pipe.vae_scale_factor_temporal)
        if self.name == "cogvideox":
            factor *= int(getattr(pipe.vae, "num_latent_frames_batch_size", 1) or 1)
        return factor

    def guidance_calls(self, request) -> str:
        """How this request's guidance runs: ``none``, ``batched`` or ``separate`` transformer calls."""
        if self.cfg_mode == "cfg":
            if request.guidance <= 1.0:
                return "none"
            return "batched" if self.name == "cogvideox" else "separate"
        true_cfg = request.true_cfg_scale is not None and request.true_cfg_scale > 1.0
        return "separate" if true_cfg and request.negative_prompt is not None else "none"

    def call_kwargs(self, request) -> dict[str, Any]:
        """Pipeline keyword arguments for a validated request (without ``generator``)."""
        kw: dict[str, Any] = dict(
            prompt=request.prompt,
            height=request.height,
            width=request.width,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance,
            output_type="np",
        )
        if self.kind == "video":
            kw["num_frames"] = request.frames
        if request.negative_prompt is not None:
            kw["negative_prompt"] = request.negative_prompt
        if self.cfg_mode == "distilled" and request.true_cfg_scale is not None:
            kw["true_cfg_scale"] = request.true_cfg_scale
        if self.takes_image:
            # Kontext rescales its output to `max_area` (default 1024^2) at the requested aspect ratio;
            # asking for the requested area keeps the requested size.
            kw["max_area"] = request.height * request.width
            if request.image is not None:
                kw["image"] = request.image
        return kw


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("wan", "WanPipeline", "video", "cfg"),
        Family("hunyuan_video", "HunyuanVideoPipeline", "video", "distilled"),
        Family("cogvideox", "CogVideoXPipeline", "video", "cfg"),
        Family("flux", "FluxPipeline", "image", "distilled"),
        Family("flux_kontext", "FluxKontextPipeline", "image", "distilled", takes_image=True),
        Family("mpgan", "MPGANPipeline", "image", "none", conditioning="class"),
    ]
}

PIPELINE_CLASS_TO_FAMILY = {f.pipeline_class: f.name for f in FAMILIES.values()}
# Variants that drive the same way as their base family.
PIPELINE_CLASS_TO_FAMILY.update({"WanImageToVideoPipeline": "wan"})


def family_for_pipeline(pipe) -> Family:
    """The family of a loaded pipeline, from its class name."""
    name = type(pipe).__name__
    if name not in PIPELINE_CLASS_TO_FAMILY:
        supported = ", ".join(sorted(PIPELINE_CLASS_TO_FAMILY))
        raise ModelNotFoundError(
            f"Kinegen does not know how to drive a {name}. Supported pipelines: {supported}."
        )
    return FAMILIES[PIPELINE_CLASS_TO_FAMILY[name]]


# ---------------------------------------------------------------------------- models


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One named model: where it comes from and how it generates by default.

    Exactly one of ``repo_id`` (a hub checkpoint), ``builder`` (a tiny model built in
    code) or ``bundled`` (a folder under assets/models) says where its weights are.
    """

    name: str
    family: str
    description: str
    height: int
    width: int
    steps: int
    guidance: float
    frames: int | None = None
    fps: int = 16
    repo_id: str | None = None
    builder: Callable[[], Any] | None = None
    bundled: str | None = None
    size_note: str = ""
    call_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def kind(self) -> str:
        return FAMILIES[self.family].kind

    @property
    def source(self) -> str:
        if self.builder is not None:
            return "built in code (random weights)"
        if self.bundled is not None:
            return f"bundled: assets/models/{self.bundled}"
        return f"hub: {self.repo_id}"


def _tiny(name: str):
    def build():
        from .models import tiny

        return tiny.build_tiny_pipeline(name)

    return build


MODELS: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a model to the registry (names are unique)."""
    if spec.name in MODELS:
        raise ValueError(f"model {spec.name!r} is already registered")
    if spec.family not in FAMILIES:
        raise ValueError(f"unknown family {spec.family!r}; known: {', '.join(FAMILIES)}")
    MODELS[spec.name] = spec
    return spec


for _spec in [
    # Real checkpoints (diffusers-format repositories).
    ModelSpec("wan2.1-t2v-1.3b", "wan", "Wan 2.1 text-to-video, 1.3B", 480, 832, 50, 5.0, frames=81,
              fps=16, repo_id="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", size_note="~30 GB (umT5-XXL text encoder)"),
    ModelSpec("wan2.1-t2v-14b", "wan", "Wan 2.1 text-to-video, 14B", 720, 1280, 50, 5.0, frames=81,
              fps=16, repo_id="Wan-AI/Wan2.1-T2V-14B-Diffusers", size_note="~70 GB"),
    ModelSpec("wan2.2-t2v-a14b", "wan", "Wan 2.2 text-to-video, 2x14B mixture of experts", 720, 1280, 40,
              4.0, frames=81, fps=16, repo_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers", size_note="~120 GB"),
    ModelSpec("wan2.2-ti2v-5b", "wan", "Wan 2.2 text/image-to-video, 5B", 704, 1280, 50, 5.0, frames=121,
              fps=24, repo_id="Wan-AI/Wan2.2-TI2V-5B-Diffusers", size_note="~35 GB"),
    ModelSpec("hunyuanvideo", "hunyuan_video", "HunyuanVideo text-to-video, 13B", 720, 1280, 50, 6.0,
              frames=129, fps=24, repo_id="hunyuanvideo-community/HunyuanVideo", size_note="~40 GB"),
    ModelSpec("cogvideox-2b", "cogvideox", "CogVideoX text-to-video, 2B", 480, 720, 50, 6.0, frames=49,
              fps=8, repo_id="THUDM/CogVideoX-2b", size_note="~14 GB"),
    ModelSpec("cogvideox-5b", "cogvideox", "CogVideoX text-to-video, 5B", 480, 720, 50, 6.0, frames=49,
              fps=8, repo_id="THUDM/CogVideoX-5b", size_note="~22 GB"),
    ModelSpec("flux.1-dev", "flux", "FLUX.1 [dev] text-to-image, 12B", 1024, 1024, 28, 3.5,
              repo_id="black-forest-labs/FLUX.1-dev", size_note="~34 GB (gated: accept the licence first)"),
    ModelSpec("flux.1-kontext-dev", "flux_kontext", "FLUX.1 Kontext [dev] image editing, 12B", 1024, 1024,
              28, 2.5, repo_id="black-forest-labs/FLUX.1-Kontext-dev",
              size_note="~34 GB (gated: accept the licence first)"),
    # Trained by this repository (kinegen train) and shipped in assets/models/: runs offline on a CPU.
    ModelSpec("kinegen-shapes-t2v", "wan", "Wan-architecture text-to-video trained here on moving shapes (bundled)",
              128, 128, 20, 4.0, frames=17, fps=8, bundled="kinegen-shapes-t2v"),
    ModelSpec("kinegen-shapes-gan", "mpgan", "class-conditional MP-GAN trained here on 12 shape/colour classes, "
              "32x32, one step (bundled)", 32, 32, 1, 0.0, bundled="kinegen-shapes-gan"),
    # Tiny random-weight models built in code: for tests, CI and a first run without downloads.
    ModelSpec("tiny-wan", "wan", "tiny random Wan 2.1 (tests; output is noise)", 64, 64, 4, 5.0, frames=9,
              builder=_tiny("tiny-wan")),
    ModelSpec("tiny-hunyuanvideo", "hunyuan_video", "tiny random HunyuanVideo (tests; output is noise)", 32,
              32, 4, 6.0, frames=5, fps=24, builder=_tiny("tiny-hunyuanvideo"),
              call_defaults={"prompt_template": {"template": "{}", "crop_start": 0}, "max_sequence_length": 32}),
    ModelSpec("tiny-cogvideox", "cogvideox", "tiny random CogVideoX (tests; output is noise)", 32, 32, 4, 6.0,
              frames=9, fps=8, builder=_tiny("tiny-cogvideox"), call_defaults={"max_sequence_length": 32}),
    ModelSpec("tiny-flux", "flux", "tiny random FLUX.1 (tests; output is noise)", 32, 32, 4, 3.5,
              builder=_tiny("tiny-flux"), call_defaults={"max_sequence_length": 32}),
    ModelSpec("tiny-flux-kontext", "flux_kontext", "tiny random FLUX.1 Kontext (tests; output is noise)", 32,
              32, 4, 2.5, builder=_tiny("tiny-flux-kontext"),
              call_defaults={"max_sequence_length": 32, "_auto_resize": False}),
]:
    register_model(_spec)

DEFAULT_MODEL = "kinegen-shapes-t2v"
"""Used when no ``--model`` is given: the bundled text-to-video model (docs/bundled_model.md)."""


def get_model_spec(name: str) -> ModelSpec:
    """The spec of a registered model; a clear error listing the names otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        names = ", ".join(MODELS)
        raise ModelNotFoundError(
            f"Unknown model {name!r}. Registered models: {names}. "
            "You can also pass a local diffusers folder or a hub id (owner/name)."
        ) from None
