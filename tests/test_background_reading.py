"""The background reader of the long-video benchmark on the procedural videos (ground truth) and on a background
that changed colour (what the VAE's long-clip failure draws)."""

import dataclasses

import numpy as np

from kinegen.data.shapes import BACKGROUNDS, TEXTURES, ClipSpec, render_long_clip, sample_clip
from kinegen.evaluation.background import prompt_background, read_background


def test_reads_every_background_and_texture_of_ground_truth_videos():
    base = sample_clip(7_000_000 + 1_000_003, split="train", num_objects=1)
    large = dataclasses.replace(base.primary, size=0.21, motion="growing")  # the largest shape, growing 1.45x
    for name in BACKGROUNDS:
        for texture in TEXTURES:
            spec = ClipSpec(objects=(large,), background=name, texture=texture, caption="", seed=base.seed)
            frames = render_long_clip(spec, 49, height=64, width=64)
            assert [read_background(frames[s:s + 17]) for s in (0, 16, 32)] == [name] * 3, (name, texture)
            assert read_background(frames[:17].astype(np.float32) / 255) == name  # frames in [0, 1] too


def test_a_background_that_changed_colour_reads_as_the_new_one():
    spec = sample_clip(7_000_000 + 1_000_003 + 1, split="train", num_objects=1)
    frames = render_long_clip(spec, 17, height=64, width=64).copy()
    other = next(n for n in BACKGROUNDS if n != spec.background)
    frames[:, :, :] = np.array(BACKGROUNDS[other], np.uint8)  # the shape gone too: only the new colour
    assert read_background(frames) == other


def test_the_background_a_prompt_names():
    assert prompt_background("a purple star expanding on a checkered gray background") == "gray"
    assert prompt_background("a green square moving diagonally up and to the right over a plain navy backdrop") == \
        "navy"
    assert prompt_background("a yellow block falling") is None
