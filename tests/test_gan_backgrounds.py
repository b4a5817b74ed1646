"""The rule-based background reader of the GAN evaluation: exact on the data, ``other`` off it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kinegen.data.shape_images import DEFAULT_CLASSES, HELD_OUT_SEED, batch
from kinegen.data.shapes import BACKGROUNDS, TEXTURES, ClipSpec, ObjectSpec, render_clip, texture_mask
from kinegen.evaluation.gan_backgrounds import OTHER, compare_backgrounds, read_background


def _truth(seed: int, label: int) -> tuple[str, str]:
    """Replays the draws of ``render_image`` to get the background it drew."""
    rng = np.random.default_rng([seed, label])
    if DEFAULT_CLASSES[label][1] in ("triangle", "star"):
        rng.uniform(0, 2 * math.pi)
    rng.uniform(0.22, 0.32), rng.uniform(0.35, 0.65), rng.uniform(0.35, 0.65)
    return str(rng.choice(list(BACKGROUNDS))), str(rng.choice(TEXTURES, p=[0.55, 0.15, 0.15, 0.15]))


@pytest.mark.parametrize("size", [32, 64])
def test_reader_is_exact_on_held_out_procedural_images(size):
    n = 480 if size == 32 else 120
    seeds, labels = HELD_OUT_SEED + 3_000_000 + np.arange(n), np.arange(n) % 12
    images = batch(seeds, labels, size)
    truth = [_truth(int(s), int(c)) for s, c in zip(seeds, labels, strict=True)]
    reads = [read_background(im) for im in images]
    assert reads == truth
    assert len(set(truth)) == 16  # every colour x texture pair was tested


def test_reader_says_other_off_the_data():
    magenta = np.full((32, 32, 3), (200, 30, 200), np.uint8)
    framed = np.full((32, 32, 3), BACKGROUNDS["gray"], np.uint8)
    framed[:3], framed[-3:], framed[:, :3], framed[:, -3:] = (BACKGROUNDS["brown"],) * 4  # a brown frame
    assert read_background(magenta) == (OTHER, OTHER)
    assert read_background(framed) == (OTHER, OTHER)


def test_compare_backgrounds_separates_the_data_from_one_background():
    seeds, labels = HELD_OUT_SEED + 4_000_000 + np.arange(480), np.arange(480) % 12
    real, other_real = batch(seeds[:240], labels[:240]), batch(seeds[240:], labels[240:])
    same = compare_backgrounds(real, other_real, labels[240:])
    assert same["colour_tv"] < 0.15 and same["texture_tv"] < 0.15 and same["pair_tv"] < 0.3  # sampling noise
    assert same["colour_tv_by_class"] < 0.3
    assert same["other"] == 0.0 and same["missed_pairs"] == []
    # A generator that draws every shape on a plain gray background.
    gray = np.stack([render_clip(ClipSpec((ObjectSpec(shape, colour, "left", "", 0.27, (0.5, 0.5), 0.0, 0.3),),
                                          "gray", "plain", "", 0), frames=1, height=32, width=32)[0]
                     for colour, shape in DEFAULT_CLASSES] * 20)
    one = compare_backgrounds(real, gray, np.arange(len(gray)) % 12)
    assert one["fake"]["colours"]["gray"] == 1.0 and one["fake"]["textures"]["plain"] == 1.0
    assert one["colour_tv"] > 0.6 and one["colour_tv_by_class"] > 0.6 and len(one["missed_pairs"]) >= 14


def test_backgrounds_tied_to_the_class_fail_within_a_class_only():
    """Each class always on one background, the backgrounds spread evenly over the classes: the pooled colours
    match the data, the colours within a class do not."""
    seeds, labels = HELD_OUT_SEED + 6_000_000 + np.arange(480), np.arange(480) % 12
    real = batch(seeds, labels)
    names = list(BACKGROUNDS)
    tied = np.stack([render_clip(ClipSpec((ObjectSpec(shape, colour, "left", "", 0.27, (0.5, 0.5), 0.0, 0.3),),
                                          names[c % 4], "plain", "", 0), frames=1, height=32, width=32)[0]
                     for c, (colour, shape) in enumerate(DEFAULT_CLASSES)] * 40)
    m = compare_backgrounds(real, tied, np.arange(len(tied)) % 12)
    assert m["colour_tv"] < 0.1 and m["colour_tv_by_class"] == pytest.approx(0.75, abs=0.08)


# at 32x32: checkered cells of 4 pixels, diagonal stripes of 3
@pytest.mark.parametrize("texture, half_period", [("checkered", 4), ("striped", 3)])
def test_texture_mask_shift_moves_the_pattern(texture, half_period):
    base = texture_mask(texture, 32, 32)
    assert set(np.unique(base)) == {0.0, 1.0}
    assert np.array_equal(texture_mask(texture, 32, 32, dx=2 * half_period), base)  # a full period: the same
    assert np.array_equal(texture_mask(texture, 32, 32, dy=2 * half_period), base)
    assert np.array_equal(texture_mask(texture, 32, 32, dx=half_period), 1 - base)  # half a period: inverted
    assert np.array_equal(texture_mask(texture, 32, 32, dy=1)[:-1], base[1:])  # one row down is the next row
    with pytest.raises(ValueError, match="patterned textures: checkered, striped"):
        texture_mask("noisy", 32, 32)
