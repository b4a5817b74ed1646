"""Procedural data: captioned clips of moving shapes, deterministic by seed, at any size and length."""

from .shapes import (
                     BACKGROUNDS,
                     COLOURS,
                     MOTIONS,
                     SHAPES,
                     TEXTURES,
                     ClipSpec,
                     ObjectSpec,
                     caption_vocabulary,
                     is_held_out,
                     render_clip,
                     sample_clip,
)

__all__ = ["BACKGROUNDS", "COLOURS", "MOTIONS", "SHAPES", "TEXTURES", "ClipSpec", "ObjectSpec",
           "caption_vocabulary", "is_held_out", "render_clip", "sample_clip"]
