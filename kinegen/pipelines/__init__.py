"""Pipelines Kinegen owns (diffusers ``DiffusionPipeline`` subclasses)."""

from .mpgan import MPGANGenerator, MPGANPipeline, MPGANPipelineOutput
from .wan_ar import WanAutoregressiveOutput, WanAutoregressivePipeline

__all__ = ["MPGANGenerator", "MPGANPipeline", "MPGANPipelineOutput", "WanAutoregressiveOutput",
           "WanAutoregressivePipeline"]
