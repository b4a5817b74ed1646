"""Reading the background of a window of a generated video: the colour the prompt names, or not.

The adherence classifier reads the shape, its colour and its motion, not the background, so a video whose
background turns from gray to brown halfway through still reads right on every attribute. Each frame's
background colour is read by the rule the GAN's background metrics use
(:func:`kinegen.evaluation.gan_backgrounds.read_base`: the chroma and brightness of the frame's outer ring against
the four background colours of :data:`kinegen.data.shapes.BACKGROUNDS`, or ``"other"`` when none fits), and a
window reads as the colour most of its frames read. Checked on the procedural long videos themselves by
``benchmarks/long_video_readers.py`` and ``tests/test_background_reading.py``.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from ..data.shapes import BACKGROUNDS
from .gan_backgrounds import read_base


def prompt_background(prompt: str) -> str | None:
    """The background colour a prompt names (``"... on a checkered gray background"`` -> ``"gray"``), or None
    when it names none (``"a yellow block falling"``)."""
    named = [w for w in re.findall(r"[a-z]+", prompt.lower()) if w in BACKGROUNDS]
    return named[-1] if named else None


def read_background(frames: np.ndarray) -> str:
    """The background colour of frames ``[F, H, W, 3]`` (uint8, or floats in [0, 1]): the reading of most frames
    by :func:`~kinegen.evaluation.gan_backgrounds.read_base`, a name of ``BACKGROUNDS`` or ``"other"``."""
    x = np.asarray(frames)
    if x.dtype != np.uint8:
        x = np.clip(np.asarray(x, np.float32) * 255, 0, 255).round()
    return Counter(read_base(f) for f in x).most_common(1)[0][0]
