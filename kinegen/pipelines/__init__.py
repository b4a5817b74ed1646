"""Pipelines Kinegen owns (diffusers ``DiffusionPipeline`` subclasses)."""

from .mpgan import MPGANGenerator, MPGANPipeline, MPGANPipelineOutput

__all__ = ["MPGANGenerator", "MPGANPipeline", "MPGANPipelineOutput"]
