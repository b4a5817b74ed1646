"""Procedural data: deterministic by seed, captions true to what is rendered, held-out split respected."""

from __future__ import annotations

import numpy as np
import pytest

from kinegen.data.shapes import (
    COLOURS,
    DIAGONALS,
    MOTION_PHRASES,
    SHAPE_WORDS,
    SHAPES,
    combinations,
    is_held_out,
    recaption,
    render_clip,
    sample_clip,
)


def test_same_seed_same_clip():
    a, b = sample_clip(42), sample_clip(42)
    assert a == b
    np.testing.assert_array_equal(render_clip(a, 9, 64, 80), render_clip(b, 9, 64, 80))
    assert sample_clip(43) != a


@pytest.mark.parametrize("frames, h, w", [(1, 16, 16), (5, 48, 96), (33, 128, 128), (17, 256, 144)])
def test_any_size_and_length(frames, h, w):
    spec = sample_clip(7)  # a purple triangle moving left by `travel` of the width, starting at `start`
    o = spec.primary
    assert (o.shape, o.colour, o.motion) == ("triangle", "purple", "left")
    clip = render_clip(spec, frames, h, w)
    assert clip.shape == (frames, h, w, 3) and clip.dtype == np.uint8
    xs, ys, _ = _object_track(clip, o.colour)
    # the same scene at every size: positions are fractions of the frame
    assert xs[0] / w == pytest.approx(o.start[0], abs=0.03) and ys[0] / h == pytest.approx(o.start[1], abs=0.03)
    if frames > 1:
        assert xs[-1] / w == pytest.approx(o.start[0] - o.travel, abs=0.03)
        assert np.all(np.diff(xs) <= 1e-9) and np.ptp(ys) / h < 0.03


def _object_track(clip: np.ndarray, colour: str):
    """Centroid and area of the pixels close to ``colour`` in every frame."""
    target = np.array(COLOURS[colour], np.int16)
    near = (np.abs(clip.astype(np.int16) - target).max(-1) < 40)
    ys, xs, areas = [], [], []
    for m in near:
        yy, xx = np.nonzero(m)
        ys.append(yy.mean())
        xs.append(xx.mean())
        areas.append(m.sum())
    return np.array(xs), np.array(ys), np.array(areas)


@pytest.mark.parametrize("seed", range(40))
def test_caption_matches_rendered_attributes(seed):
    spec = sample_clip(seed, num_objects=1)
    o = spec.primary
    cap = spec.caption
    assert o.colour in cap.split()
    assert any(w in cap.split() for w in SHAPE_WORDS[o.shape])
    if o.motion == "diagonal":
        v, hzt = o.direction.split("-")
        assert "diagonally" in cap and v in cap and ("right" if hzt == "right" else "left") in cap
    else:
        assert any(p in cap for p in MOTION_PHRASES[o.motion])
    assert spec.background in cap or "background" not in cap and "backdrop" not in cap

    clip = render_clip(spec, 17, 128, 128)
    xs, ys, areas = _object_track(clip, o.colour)
    assert areas.min() > 20, "the shape must be visible in every frame"
    dx, dy, growth = xs[-1] - xs[0], ys[-1] - ys[0], areas[-1] / areas[0]
    expected = {
        "right": dx > 30, "left": dx < -30, "down": dy > 30, "up": dy < -30,
        "growing": growth > 2, "shrinking": growth < 0.5,
        "bouncing": abs(dy) < 5 and (ys.min() < ys[0] - 20),
    }
    if o.motion == "diagonal":
        sx, sy = DIAGONALS[o.direction]
        assert dx * sx > 20 and dy * sy > 20
    else:
        assert expected[o.motion], (o.motion, dx, dy, growth)


def test_recaption_keeps_the_facts():
    spec = sample_clip(3, num_objects=1)
    caps = {recaption(spec, s) for s in range(20)}
    assert len(caps) > 5
    for cap in caps:
        assert spec.primary.colour in cap


def test_held_out_split():
    held = combinations("held_out")
    train = combinations("train")
    assert 0.07 < len(held) / (len(held) + len(train)) < 0.15
    for s in range(300):
        spec = sample_clip(s, split="train")
        assert not any(is_held_out(o.shape, o.colour, o.motion) for o in spec.objects)
    for s in range(50):
        o = sample_clip(s, split="held_out", num_objects=1).primary
        assert is_held_out(o.shape, o.colour, o.motion)
    # every pair of attribute values still occurs in training
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert {(t[a], t[b]) for t in combinations("all")} == {(t[a], t[b]) for t in train}
    assert {t[0] for t in train} == set(SHAPES)


def test_two_object_captions_name_both():
    two = [sample_clip(s) for s in range(200) if len(sample_clip(s).objects) == 2]
    assert len(two) > 20
    for spec in two[:10]:
        for o in spec.objects:
            assert o.colour in spec.caption
        assert " and a" in spec.caption


@pytest.mark.parametrize("seed", range(6))
def test_mask_marks_exactly_the_object(seed):
    from kinegen.data.shapes import render_mask

    spec = sample_clip(seed, num_objects=1)
    clip, mask = render_clip(spec, 9, 96, 96), render_mask(spec, 9, 96, 96)
    assert mask.shape == (9, 96, 96) and mask.min() >= 0 and mask.max() == 1
    near = (np.abs(clip.astype(np.int16) - np.array(COLOURS[spec.primary.colour], np.int16)).max(-1) < 40)
    inside = mask > 0.99
    # every fully covered pixel has the object's colour; the object's colour off the mask is background noise
    assert near[inside].mean() > 0.99
    assert near[mask < 0.01].mean() < 0.01 or spec.texture == "noisy"


def test_long_clips_start_as_the_training_clip_and_bounce_off_the_edges():
    """Long videos for the autoregressive model: frames 0-16 are the training clip; after that a shape keeps its
    speed, stays inside the frame (reflected at the walls) and a window after a wall moves the other way."""
    from kinegen.data.shapes import long_trajectory, render_long_clip, window_motion

    for seed in range(12):
        spec = sample_clip(seed, num_objects=1)
        np.testing.assert_array_equal(render_long_clip(spec, 17, 48, 48), render_clip(spec, 17, 48, 48))
        o = spec.primary
        if o.motion not in ("left", "right", "up", "down", "diagonal"):
            continue
        axis = 1 if o.motion in ("up", "down") else 0
        path = np.array([long_trajectory(o, f / 16)[axis] for f in range(241)])
        step = abs(path[1] - path[0])
        speeds = np.abs(np.diff(path))
        r = o.size * (1.25 if o.shape == "square" else 1.0)
        # Constant speed except in the frames that touch a wall (there the path folds back part way).
        assert np.mean(np.isclose(speeds, step, atol=1e-9)) > 0.8
        assert path.min() >= min(r, path[0], path[16]) - 1e-9 and path.max() <= max(1 - r, path[0], path[16]) + 1e-9
    right = sample_clip(0, num_objects=1, combo=("circle", "red", "right"))
    o = right.primary
    wall = next(f for f in range(1, 241) if long_trajectory(o, f / 16)[0] < long_trajectory(o, (f - 1) / 16)[0])
    assert window_motion(o, 0, 1) == "right" and window_motion(o, wall / 16, (wall + 8) / 16) == "left"
    assert render_long_clip(right, 5, 32, 32, start=236).shape == (5, 32, 32, 3)
