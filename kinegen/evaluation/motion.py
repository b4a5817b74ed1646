"""Reading a shape's motion by tracking it, for windows anywhere in a long video.

The adherence classifier (:mod:`kinegen.evaluation.adherence`) learned motion from 17-frame training clips, which
always start near the middle of the frame. Later windows of a long video start anywhere and contain bounces off
the edges, and there it misreads the *ground truth* itself: on the procedural long videos of 16 training and 16
held-out prompts it reads 70-76% of windows' motion family right (shape and colour: 100%). A diagonal mover
near a wall is read as growing or moving right. So for long videos motion is read by tracking instead, which
does not care where in the frame the shape is:

1. the shape is the set of pixels near its colour (the colour the classifier reads, so that a wrong colour is
   counted once, under colour, not again under motion);
2. per frame its centroid ``(x, y)`` and its equivalent radius ``sqrt(area / pi)``;
3. over the window, the path lengths along x, along y and of the radius, and the turns of the vertical path,
   decide the motion family: ``horizontal`` (left/right), ``vertical`` (up/down), ``diagonal``, ``size``
   (growing/shrinking), ``bouncing`` (vertical hops: at least two turns), ``still`` (no movement) or ``lost``
   (the shape is missing from some frame).

A family survives a bounce off an edge (a shape moving right that bounces moves left: still horizontal), which is
why long-video windows are compared by family; :func:`read_direction` also gives the direction, for the first
window where the prompt's exact motion is expected. Checked on the procedural long videos in
``tests/test_motion_reading.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..data.shapes import COLOURS

FAMILY = {"left": "horizontal", "right": "horizontal", "up": "vertical", "down": "vertical", "growing": "size",
          "shrinking": "size", "diagonal": "diagonal", "bouncing": "bouncing"}

COLOUR_RADIUS = 90.0  # RGB distance within which a pixel counts as the shape's colour
STILL_PIXELS = 0.03  # less path than this (share of the frame side) over a window: the shape does not move
MIN_AREA = 4  # pixels: fewer in any frame and the shape is lost


@dataclass(frozen=True)
class Track:
    """Per-frame centroid ``x``, ``y`` and equivalent radius ``r`` of one shape, in pixels."""

    x: np.ndarray
    y: np.ndarray
    r: np.ndarray
    side: int

    @property
    def lost(self) -> bool:
        return bool(np.isnan(self.x).any())


def track(frames: np.ndarray, colour: str) -> Track:
    """Track the pixels of ``colour`` (a name of :data:`kinegen.data.shapes.COLOURS`) through ``frames``
    (uint8 or float in [0, 1], ``[F, H, W, 3]``); frames without the colour get NaN."""
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; choose one of {', '.join(COLOURS)}")
    x = np.asarray(frames)
    if x.dtype != np.uint8:
        x = np.clip(np.asarray(x, np.float32) * 255.0, 0, 255)
    x = x.astype(np.float32)
    dist = np.linalg.norm(x - np.asarray(COLOURS[colour], np.float32), axis=-1)  # [F, H, W]
    mask = dist < COLOUR_RADIUS
    area = mask.sum(axis=(1, 2)).astype(np.float64)
    f, h, w = mask.shape
    yy, xx = np.mgrid[0:h, 0:w]
    with np.errstate(invalid="ignore", divide="ignore"):
        cx = (mask * xx).sum(axis=(1, 2)) / area
        cy = (mask * yy).sum(axis=(1, 2)) / area
    missing = area < MIN_AREA
    cx[missing] = cy[missing] = np.nan
    return Track(cx, cy, np.sqrt(area / math.pi), min(h, w))


def _turns(d: np.ndarray, eps: float) -> int:
    """Sign changes of a path's steps, ignoring steps shorter than ``eps``."""
    s = np.sign(d[np.abs(d) > eps])
    return int((s[1:] != s[:-1]).sum())


def read_family(t: Track) -> str:
    """The motion family of a tracked window: horizontal, vertical, diagonal, size, bouncing, still or lost."""
    if t.lost:
        return "lost"
    dx, dy, dr = np.diff(t.x), np.diff(t.y), np.diff(t.r)
    px, py, pr = np.abs(dx).sum(), np.abs(dy).sum(), np.abs(dr).sum()
    longest = max(px, py, pr)
    if longest < STILL_PIXELS * t.side:
        return "still"
    if pr == longest and pr > 1.5 * max(px, py):
        return "size"
    if min(px, py) > 0.4 * max(px, py):
        return "diagonal"
    if px > py:
        return "horizontal"
    return "bouncing" if _turns(dy, 0.005 * t.side) >= 2 else "vertical"


def read_direction(t: Track) -> str:
    """The exact motion name (as in :data:`kinegen.data.shapes.MOTIONS`) where the family has one; the family
    (``still``, ``lost``) otherwise. For a window without bounces, such as a video's first 17 frames."""
    family = read_family(t)
    if family == "horizontal":
        return "right" if t.x[-1] >= t.x[0] else "left"
    if family == "vertical":
        return "down" if t.y[-1] >= t.y[0] else "up"
    if family == "size":
        return "growing" if t.r[-1] >= t.r[0] else "shrinking"
    return family


def motion_right(frames: np.ndarray, colour: str, motion: str, exact: bool) -> tuple[bool, str]:
    """Whether ``frames`` show ``motion`` of the shape of ``colour``: the exact motion (``exact``) or its family;
    returns ``(right, reading)``."""
    t = track(frames, colour)
    if exact:
        reading = read_direction(t)
        return reading == motion, reading
    reading = read_family(t)
    return reading == FAMILY[motion], reading
