"""Kinegen: fast video and image generation on diffusers pipelines.

The public API::

    import kinegen

    pipe = kinegen.load_pipeline("tiny-wan")                       # name, local folder or hub id
    result = kinegen.generate(pipe, "a red circle moving right", seed=0,
                              accelerators=["first-block:threshold=0.08"])
    result.save("out.mp4")

    handles = kinegen.accelerate(pipe, "mag:threshold=0.1", run=kinegen.RunInfo(num_inference_steps=30))
    ...
    for h in handles: h.remove()

    report = kinegen.profile(pipe, ["a red circle"], ["first-block", "taylorseer"], repeats=3)
    report.save("profile/")

Heavy dependencies (torch, diffusers) are imported on first use, so ``import kinegen`` and
``kinegen --help`` stay fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_pipeline": ("loading", "load_pipeline"),
    "check_model_folder": ("loading", "check_model_folder"),
    "describe_models": ("loading", "describe_models"),
    "generate": ("generation", "generate"),
    "prepare": ("generation", "prepare"),
    "run_job": ("generation", "run_job"),
    "GenerationJob": ("generation", "GenerationJob"),
    "GenerationRequest": ("generation", "GenerationRequest"),
    "GenerationResult": ("generation", "GenerationResult"),
    "generate_class_images": ("generation", "generate_class_images"),
    "ClassImagesResult": ("generation", "ClassImagesResult"),
    "accelerate": ("accelerators.catalog", "accelerate"),
    "list_accelerators": ("accelerators.catalog", "list_accelerators"),
    "parse_spec": ("accelerators.catalog", "parse_spec"),
    "RunInfo": ("accelerators.base", "RunInfo"),
    "profile": ("profiling.runner", "profile"),
    "ProfileReport": ("profiling.runner", "ProfileReport"),
    "get_adapter": ("adapters", "get_adapter"),
    "MODELS": ("registry", "MODELS"),
    "KinegenError": ("errors", "KinegenError"),
    "MPGANPipeline": ("pipelines.mpgan", "MPGANPipeline"),
    "MPGANGenerator": ("pipelines.mpgan", "MPGANGenerator"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kinegen' has no attribute {name!r}")
