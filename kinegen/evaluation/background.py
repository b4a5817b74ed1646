"""Reading the background of a window of a generated video: the colour the prompt names, or not.

The adherence classifier reads the shape, its colour and its motion, not the background, so a video whose
background turns from gray to brown halfway through still reads right on every attribute. The background is
read here the simple way the procedural clips allow: their four background colours
(:data:`kinegen.data.shapes.BACKGROUNDS`) are far apart (55 or more in RGB), and a texture only brightens part of
the background (checkered cells by 15, stripes by 28) or adds noise of a few tens, so the lower quartile of every
channel over every pixel of the window (the shape, brighter than any background, covers far less than a quarter)
is nearest to the colour the background was drawn in. (The median is not: stripes cover more than half of a
striped background.)
Checked on the procedural long videos themselves by ``benchmarks/long_video_readers.py``.
"""

from __future__ import annotations

import re

import numpy as np

from ..data.shapes import BACKGROUNDS


def prompt_background(prompt: str) -> str | None:
    """The background colour a prompt names (``"... on a checkered gray background"`` -> ``"gray"``), or None
    when it names none (``"a yellow block falling"``)."""
    named = [w for w in re.findall(r"[a-z]+", prompt.lower()) if w in BACKGROUNDS]
    return named[-1] if named else None


def read_background(frames: np.ndarray) -> str:
    """The background colour of frames ``[F, H, W, 3]`` (uint8 or floats in [0, 1]): the one of
    :data:`~kinegen.data.shapes.BACKGROUNDS` nearest to the lower quartile of each channel over all their pixels."""
    x = np.asarray(frames, np.float32)
    if x.max() <= 1.0:
        x = x * 255
    low = np.percentile(x.reshape(-1, 3), 25, axis=0)
    names = list(BACKGROUNDS)
    dist = [np.linalg.norm(low - np.array(BACKGROUNDS[n], np.float32)) for n in names]
    return names[int(np.argmin(dist))]
