"""The MP-GAN (``MPGANPipeline``, Kinegen's own): a class-conditional one-step generator.

No prompt, no denoising transformer, no accelerators: one generator forward per image, driven by
:func:`kinegen.generation.generate_class_images`. The pipeline class is Kinegen's, not diffusers'.
"""

from __future__ import annotations

import dataclasses

from .base import ModelAdapter


@dataclasses.dataclass(frozen=True)
class MPGANAdapter(ModelAdapter):
    def pipeline_class(self, class_name: str):
        from ..pipelines import MPGANPipeline

        return MPGANPipeline if class_name == "MPGANPipeline" else None


MPGAN = MPGANAdapter(name="mpgan", pipeline_classes=("MPGANPipeline",), kind="image", cfg_mode="none",
                     conditioning="class")
