"""Reading a shape's motion by tracking it, for windows anywhere in a long video.

The adherence classifier (:mod:`kinegen.evaluation.adherence`) learned motion from 17-frame training clips, which
always start near the middle of the frame. Later windows of a long video start anywhere and contain bounces off
the edges, and there it misreads the *ground truth* itself: on the procedural long videos of 16 training and 16
held-out prompts it reads 70-76% of windows' motion family right (shape and colour: 100%). A diagonal mover
near a wall is read as growing or moving right. So for long videos motion is read by tracking instead, which
does not care where in the frame the shape is:

1. the shape is the set of pixels near its colour (the colour the classifier reads, so that a wrong colour is
   counted once, under colour, not again under motion);
2. per frame the centroid ``(x, y)`` of the largest blob of that colour and its equivalent radius
   ``sqrt(area / pi)``;
3. over the window, the path lengths along x, along y and of the radius, counting only swings longer than 5% of
   the frame (generated shapes jitter), and the turns of the vertical path, decide the motion family:
   ``horizontal`` (left/right), ``vertical`` (up/down), ``diagonal``, ``size`` (growing/shrinking), ``bouncing``
   (vertical hops: at least two turns), ``still`` (no movement) or ``lost`` (the shape is missing from more than
   two frames in a row).

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
SWING = 0.05  # movements shorter than this share of the frame side are jitter; none longer: the shape stands still
MIN_AREA = 4  # pixels: a smaller blob is no shape
MAX_GAP = 2  # frames without the shape that are filled in rather than counted as lost


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
    """Track the shape of ``colour`` (a name of :data:`kinegen.data.shapes.COLOURS`) through ``frames`` (uint8 or
    float in [0, 1], ``[F, H, W, 3]``): per frame, the largest connected blob of pixels near the colour (specks of
    the colour elsewhere are ignored). A frame without it gets NaN; gaps of up to :data:`MAX_GAP` frames are
    filled from the frames around them (a one-frame flicker is not a lost shape)."""
    import cv2

    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; choose one of {', '.join(COLOURS)}")
    x = np.asarray(frames)
    if x.dtype != np.uint8:
        x = np.clip(np.asarray(x, np.float32) * 255.0, 0, 255)
    dist = np.linalg.norm(x.astype(np.float32) - np.asarray(COLOURS[colour], np.float32), axis=-1)  # [F, H, W]
    masks = (dist < COLOUR_RADIUS).astype(np.uint8)
    n, h, w = masks.shape
    cx, cy, area = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n)
    for f in range(n):
        count, _, stats, centroids = cv2.connectedComponentsWithStats(masks[f], connectivity=8)
        if count < 2:
            continue
        best = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
        if stats[best, cv2.CC_STAT_AREA] >= MIN_AREA:
            cx[f], cy[f] = centroids[best]
            area[f] = stats[best, cv2.CC_STAT_AREA]
    r = np.where(area > 0, np.sqrt(area / math.pi), np.nan)
    return Track(*(_fill_gaps(v) for v in (cx, cy, r)), side=min(h, w))


def _fill_gaps(v: np.ndarray) -> np.ndarray:
    """Linear interpolation over runs of at most :data:`MAX_GAP` NaNs inside the track; longer runs stay NaN."""
    v = v.copy()
    bad = np.isnan(v)
    if not bad.any() or bad.all():
        return v
    idx = np.arange(len(v))
    filled = np.interp(idx, idx[~bad], v[~bad])
    run_start = None
    for i in range(len(v) + 1):
        if i < len(v) and bad[i]:
            run_start = i if run_start is None else run_start
        elif run_start is not None:
            if i - run_start <= MAX_GAP and run_start > 0 and i < len(v):
                v[run_start:i] = filled[run_start:i]
            run_start = None
    return v


def _zigzag(v: np.ndarray, delta: float) -> tuple[float, int]:
    """Path length and number of turns of a 1-D track, counting only swings of at least ``delta`` (a zigzag
    filter): a generated shape's jitter of a pixel or two adds nothing, a real movement counts in full."""
    pivots, trend, extreme = [float(v[0])], 0, float(v[0])
    for x in map(float, v[1:]):
        if trend == 0:
            if abs(x - pivots[-1]) >= delta:
                trend, extreme = (1 if x > pivots[-1] else -1), x
        elif (x - extreme) * trend > 0:
            extreme = x
        elif (extreme - x) * trend >= delta:
            pivots.append(extreme)
            trend, extreme = -trend, x
    if trend:
        pivots.append(extreme)
    return float(np.abs(np.diff(pivots)).sum()), max(0, len(pivots) - 2)


def read_family(t: Track) -> str:
    """The motion family of a tracked window: horizontal, vertical, diagonal, size, bouncing, still or lost."""
    if t.lost:
        return "lost"
    delta = SWING * t.side
    (px, _), (py, turns_y), (pr, _) = (_zigzag(v, delta) for v in (t.x, t.y, t.r))
    if max(px, py, pr) == 0:
        return "still"
    if pr > 1.5 * max(px, py):
        return "size"
    if min(px, py) > 0.4 * max(px, py):
        return "diagonal"
    if px > py:
        return "horizontal"
    return "bouncing" if turns_y >= 2 else "vertical"


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
