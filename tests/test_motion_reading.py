"""The tracking motion reader on the procedural long videos (ground truth) and on broken ones."""

import numpy as np
import pytest

from kinegen.data.shapes import render_long_clip, sample_clip, window_motion
from kinegen.evaluation.motion import FAMILY, motion_right, read_direction, read_family, track


def _specs(n, split):
    return [sample_clip(7_000_000 + 1_000_003 + i, split=split, num_objects=1) for i in range(n)]


@pytest.mark.parametrize("split", ["train", "held_out"])
def test_reads_every_window_of_ground_truth_long_videos(split):
    for spec in _specs(6, split):
        o = spec.primary
        frames = render_long_clip(spec, 113, height=64, width=64)
        assert read_direction(track(frames[:17], o.colour)) == o.motion
        for start in range(0, 97, 16):
            window = frames[start:start + 17]
            assert read_family(track(window, o.colour)) == FAMILY[o.motion], (o, start)
            # in a window without a bounce the direction is the one the trajectory shows
            seen = {window_motion(o, (start + k) / 16, (start + k + 1) / 16) for k in range(16)}
            if len(seen) == 1 and o.motion not in ("diagonal", "bouncing"):
                assert read_direction(track(window, o.colour)) == seen.pop()


def test_a_frozen_or_vanished_shape_is_not_motion():
    spec = next(s for s in _specs(20, "train") if s.primary.motion == "right")
    frames = render_long_clip(spec, 17, height=64, width=64)
    frozen = np.repeat(frames[:1], 17, axis=0)
    assert motion_right(frozen, spec.primary.colour, "right", exact=True) == (False, "still")
    gone = frames.copy()
    gone[8] = gone[0, :1, :1]  # one frame of background only: a flicker, filled in
    assert read_direction(track(gone, spec.primary.colour)) == "right"
    gone[7:10] = gone[0, :1, :1]  # three frames: the shape is lost
    assert read_family(track(gone, spec.primary.colour)) == "lost"
    assert motion_right(frames, spec.primary.colour, "right", exact=True) == (True, "right")
    assert motion_right(frames[::-1], spec.primary.colour, "right", exact=True) == (False, "left")
    assert motion_right(frames[::-1], spec.primary.colour, "right", exact=False) == (True, "horizontal")


def test_unknown_colour_says_which_exist():
    with pytest.raises(ValueError, match="choose one of red"):
        track(np.zeros((2, 8, 8, 3), np.uint8), "teal")


def test_jitter_of_a_generated_shape_is_not_motion():
    """Shifted by up to 2 pixels frame to frame (as a generated shape wobbles), with a speck of its colour
    elsewhere, a still shape stays still and a mover keeps its family."""
    spec = next(s for s in _specs(20, "train") if s.primary.motion == "down")
    frames = render_long_clip(spec, 17)  # 128 x 128
    rng = np.random.default_rng(0)
    wobble = lambda clip: np.stack([np.roll(f, tuple(rng.integers(-2, 3, 2)), axis=(0, 1)) for f in clip])  # noqa: E731
    still = wobble(np.repeat(frames[:1], 17, axis=0))
    still[:, 2:4, 2:4] = frames[0][tuple(np.argwhere(frames[0].sum(-1) != frames[0, 0, 0].sum())[0])]  # a speck
    assert read_family(track(still, spec.primary.colour)) == "still"
    assert read_direction(track(wobble(frames), spec.primary.colour)) == "down"
