"""The model registry: the names users type, each with its family and its default generation settings.

A *model spec* is one named checkpoint (or a tiny model built in code, or a model bundled in
assets/models) of a family. What a family is (how its pipeline is driven, its size and frame
rules, its blocks and token layout) lives in its adapter, :mod:`kinegen.adapters`; a spec names
its family by the adapter's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .adapters import ADAPTERS, adapter_for_family
from .errors import ModelNotFoundError

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
    evaluator: str | None = None  # "adherence": the shipped classifier reads its outputs' shape, colour, motion

    @property
    def adapter(self):
        """The family's adapter (:class:`kinegen.adapters.ModelAdapter`)."""
        return adapter_for_family(self.family)

    @property
    def kind(self) -> str:
        return self.adapter.kind

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
    if spec.family not in ADAPTERS:
        raise ValueError(f"unknown family {spec.family!r}; known: {', '.join(ADAPTERS)}")
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
              128, 128, 20, 4.0, frames=17, fps=8, bundled="kinegen-shapes-t2v", evaluator="adherence"),
    ModelSpec("kinegen-shapes-ar", "wan_ar", "kinegen-shapes-t2v turned causal here: long videos chunk by chunk with "
              "a KV cache (bundled; coded in overlapping VAE segments of 17 frames, see its card)", 128, 128, 20,
              2.0, frames=121, fps=24,
              bundled="kinegen-shapes-ar"),
    ModelSpec("kinegen-shapes-gan", "mpgan", "class-conditional GAN (the R3GAN baseline of kinegen train gan) "
              "trained here on 12 shape/colour classes, 32x32, one step (bundled)", 32, 32, 1, 0.0,
              bundled="kinegen-shapes-gan"),
    # Tiny random-weight models built in code: for tests, CI and a first run without downloads.
    ModelSpec("tiny-wan", "wan", "tiny random Wan 2.1 (tests; output is noise)", 64, 64, 4, 5.0, frames=9,
              builder=_tiny("tiny-wan")),
    ModelSpec("tiny-wan-ar", "wan_ar", "tiny random Wan, chunk by chunk with a KV cache (tests; output is noise)",
              32, 32, 2, 3.0, frames=17, builder=_tiny("tiny-wan-ar")),
    ModelSpec("tiny-anyflow-far", "anyflow_far", "tiny random AnyFlow-FAR (diffusers' AnyFlowFARPipeline), chunk by "
              "chunk with a two-tier KV cache (tests; output is noise)", 32, 32, 2, 1.0, frames=25,
              builder=_tiny("tiny-anyflow-far")),
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
# What `kinegen app` offers: the default model first, then its chunk-by-chunk version (the app's autoregressive
# mode). The app loads a model when it is first picked, so offering one costs nothing until then.
DEFAULT_APP_MODELS = (DEFAULT_MODEL, "kinegen-shapes-ar")
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
