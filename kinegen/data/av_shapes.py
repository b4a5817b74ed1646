"""Moving shapes with sound: the procedural audio-video clips the omni model and the tri-modal relevance model are
trained and evaluated on (issue 22), with questions that need the picture, the sound, or both.

A clip lasts ``seconds`` (4 by default). It shows one or two coloured shapes over a plain background; with two, the
first is on screen for the first part of the clip and the second for the rest. Every shape sounds its own tone
(``low``, ``middle`` or ``high``, drawn per clip, so that a shape's pitch can only be heard, not seen) while it is on
screen, and a shape that bounces off the edges makes a click at each bounce. Everything is a pure function of the
seed: :func:`sample_av_clip` gives the same :class:`AVClip` every time; :func:`render_frames` and
:func:`render_audio` draw it at any frame times and sample rate.

Questions (:func:`questions_for`) come from templates tagged with the senses they need: ``video`` (what colour is
the circle?), ``audio`` (how many clicks are there?) or ``both`` (which shape makes the high tone?), plus a
``describe`` question whose answer is a caption in the text-to-video model's vocabulary. The held-out split is the
shapes' one (:func:`kinegen.data.shapes.is_held_out` on shape, colour and motion): clips of the held-out split
contain at least one held-out combination, training clips none.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .shapes import BACKGROUNDS, COLOURS, SHAPES, _polygon, is_held_out

AV_MOTIONS = ("left", "right", "up", "down", "bouncing")
PITCHES = {"low": 262.0, "middle": 523.0, "high": 1047.0}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
SAMPLE_RATE = 16000


@dataclasses.dataclass(frozen=True)
class AVObject:
    """One shape: what it is, how it moves, its tone, and when it is on screen (seconds).

    Positions are fractions of the frame; ``velocity`` is in frames per second (fractions of the frame per
    second). A bouncing shape moves diagonally and reflects off the edges; the others move in a straight line that
    stays inside the frame while they are on screen.
    """

    shape: str
    colour: str
    motion: str
    pitch: str
    t_on: float
    t_off: float
    start: tuple[float, float]
    velocity: tuple[float, float]
    size: float = 0.16


@dataclasses.dataclass(frozen=True)
class AVClip:
    objects: tuple[AVObject, ...]
    background: str
    seconds: float
    seed: int

    def visible(self, t: float) -> list[AVObject]:
        return [o for o in self.objects if o.t_on <= t < o.t_off]


# ---------------------------------------------------------------------------- sampling


def _fold(x: float, lo: float, hi: float) -> float:
    span = hi - lo
    y = (x - lo) % (2 * span)
    return lo + (y if y <= span else 2 * span - y)


def position(obj: AVObject, t: float) -> tuple[float, float]:
    """Centre of ``obj`` at time ``t`` (seconds from the clip's start)."""
    dt = t - obj.t_on
    x, y = obj.start[0] + obj.velocity[0] * dt, obj.start[1] + obj.velocity[1] * dt
    if obj.motion == "bouncing":
        r = obj.size * 1.3
        return _fold(x, r, 1 - r), _fold(y, r, 1 - r)
    return x, y


def bounce_times(obj: AVObject, step: float = 1e-3) -> list[float]:
    """Times at which a bouncing shape hits an edge (its velocity flips), within its time on screen."""
    if obj.motion != "bouncing":
        return []
    ts = np.arange(obj.t_on, obj.t_off, step)
    pts = np.array([position(obj, float(t)) for t in ts])
    if len(pts) < 3:
        return []
    d = np.sign(np.diff(pts, axis=0))
    flips = np.nonzero(np.any((d[1:] != d[:-1]) & (d[1:] != 0) & (d[:-1] != 0), axis=1))[0]
    out: list[float] = []
    for i in flips:
        t = float(ts[i + 1])
        if not out or t - out[-1] > 0.05:
            out.append(t)
    return out


def _sample_object(rng: np.random.Generator, shape: str, colour: str, motion: str, pitch: str, t_on: float,
                   t_off: float) -> AVObject:
    size = float(rng.uniform(0.13, 0.18))
    dur = t_off - t_on
    if motion == "bouncing":
        speed = float(rng.uniform(0.55, 0.8))
        ang = float(rng.choice([1, 3, 5, 7]) * math.pi / 4 + rng.uniform(-0.3, 0.3))
        start = (float(rng.uniform(0.3, 0.7)), float(rng.uniform(0.3, 0.7)))
        velocity = (speed * math.cos(ang), speed * math.sin(ang))
        return AVObject(shape, colour, motion, pitch, t_on, t_off, start, velocity, size)
    travel = float(rng.uniform(0.35, 0.5))
    v = travel / dur
    margin = size * 1.3
    lo, hi = margin, 1 - margin
    other = float(rng.uniform(0.3, 0.7))
    if motion in ("left", "right"):
        x0 = float(rng.uniform(lo + travel, hi)) if motion == "left" else float(rng.uniform(lo, hi - travel))
        return AVObject(shape, colour, motion, pitch, t_on, t_off, (x0, other), (-v if motion == "left" else v, 0.0),
                        size)
    y0 = float(rng.uniform(lo + travel, hi)) if motion == "up" else float(rng.uniform(lo, hi - travel))
    return AVObject(shape, colour, motion, pitch, t_on, t_off, (other, y0), (0.0, -v if motion == "up" else v), size)


def sample_av_clip(seed: int, split: str = "train", seconds: float = 4.0, num_objects: int | None = None) -> AVClip:
    """The clip of ``seed`` in ``split`` (``train`` or ``held_out``)."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out'; got {split!r}")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, 2201])
    n = num_objects or int(rng.choice([1, 2], p=[0.35, 0.65]))
    while True:
        combos = []
        for _ in range(n):
            combos.append((str(rng.choice(SHAPES)), str(rng.choice(list(COLOURS))), str(rng.choice(AV_MOTIONS))))
        shapes = [c[0] for c in combos]
        colours = [c[1] for c in combos]
        if n == 2 and (shapes[0] == shapes[1] or colours[0] == colours[1]):
            continue  # two shapes are told apart by shape and by colour
        held = [is_held_out(*c) for c in combos]
        if (split == "held_out") == any(held) and (split == "held_out" or not any(held)):
            break
    pitches = list(rng.choice(list(PITCHES), size=n, replace=False))
    if n == 1:
        windows = [(0.0, seconds)]
    else:
        cut = float(rng.uniform(0.4, 0.6)) * seconds
        windows = [(0.0, cut), (cut, seconds)]
    objects = tuple(_sample_object(rng, s, c, m, str(p), a, b)
                    for (s, c, m), p, (a, b) in zip(combos, pitches, windows, strict=True))
    background = str(rng.choice(list(BACKGROUNDS)))
    return AVClip(objects, background, float(seconds), seed)


# ---------------------------------------------------------------------------- rendering


def render_frames(clip: AVClip, times, height: int = 64, width: int = 64) -> np.ndarray:
    """uint8 ``[len(times), height, width, 3]``: the clip at ``times`` (seconds)."""
    import cv2

    bg = np.broadcast_to(np.array(BACKGROUNDS[clip.background], np.float32), (height, width, 3))
    side = min(height, width)
    out = np.empty((len(times), height, width, 3), np.uint8)
    for i, t in enumerate(times):
        img = bg.copy()
        for obj in clip.visible(float(t)):
            cx, cy = position(obj, float(t))
            px, py, r = cx * width, cy * height, obj.size * side
            colour = tuple(float(v) for v in COLOURS[obj.colour])
            if obj.shape == "circle":
                cv2.circle(img, (round(px * 16), round(py * 16)), max(1, round(r * 16)), colour, -1, cv2.LINE_AA, 4)
            else:
                pts = np.round(_polygon(obj.shape, px, py, r, 0.0) * 16).astype(np.int32)
                cv2.fillPoly(img, [pts], colour, cv2.LINE_AA, 4)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def render_audio(clip: AVClip, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono ``[seconds * sample_rate]`` in [-1, 1]: each shape's tone while on screen (10 ms fades, two
    weak harmonics), a 12 ms decaying noise click at each bounce, and faint background noise."""
    n = int(round(clip.seconds * sample_rate))
    t = np.arange(n) / sample_rate
    rng = np.random.default_rng([clip.seed, 77])
    audio = rng.normal(0, 0.003, n)
    fade = int(0.01 * sample_rate)
    for obj in clip.objects:
        a, b = int(obj.t_on * sample_rate), int(obj.t_off * sample_rate)
        f = PITCHES[obj.pitch]
        seg = t[a:b]
        tone = np.sin(2 * np.pi * f * seg) + 0.3 * np.sin(4 * np.pi * f * seg) + 0.1 * np.sin(6 * np.pi * f * seg)
        env = np.ones(b - a)
        k = min(fade, (b - a) // 2)
        if k:
            env[:k] = np.linspace(0, 1, k)
            env[-k:] = np.linspace(1, 0, k)
        audio[a:b] += 0.2 * tone * env
        for tb in bounce_times(obj):
            c = int(tb * sample_rate)
            m = min(int(0.012 * sample_rate), n - c)
            if m > 0:
                audio[c:c + m] += 0.7 * rng.normal(0, 1, m) * np.exp(-np.arange(m) / (0.003 * sample_rate))
    return np.clip(audio, -1, 1).astype(np.float32)


# ---------------------------------------------------------------------------- questions


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    answer: str
    needs: str  # "video", "audio", "both" or "describe"
    template: str


def caption(clip: AVClip) -> str:
    """The clip in the text-to-video model's words: 'a red circle bouncing and a blue square moving left on a gray
    background'."""
    parts = []
    for o in clip.objects:
        motion = "bouncing" if o.motion == "bouncing" else f"moving {o.motion}"
        parts.append(f"a {o.colour} {o.shape} {motion}")
    return " and ".join(parts) + f" on a {clip.background} background"


def questions_for(clip: AVClip) -> list[Question]:
    """Every question the clip answers, with its answer (one word, or the caption for ``describe``)."""
    qs: list[Question] = []
    objs = clip.objects
    clicks = sum(len(bounce_times(o)) for o in objs)
    for o in objs:
        qs.append(Question(f"what colour is the {o.shape}?", o.colour, "video", "colour_of_shape"))
        qs.append(Question(f"what shape is {o.colour}?", o.shape, "video", "shape_of_colour"))
        motion = "bounce" if o.motion == "bouncing" else o.motion
        qs.append(Question(f"how does the {o.colour} {o.shape} move?", motion, "video", "motion_of_object"))
        qs.append(Question(f"which shape makes the {o.pitch} tone?", o.shape, "both", "shape_of_tone"))
        qs.append(Question(f"what colour is the shape that makes the {o.pitch} tone?", o.colour, "both",
                           "colour_of_tone"))
        qs.append(Question(f"what tone does the {o.shape} make?", o.pitch, "both", "tone_of_shape"))
    if len(objs) == 1:
        qs.append(Question("is the tone low, middle or high?", objs[0].pitch, "audio", "pitch"))
    else:
        qs.append(Question("which tone comes first?", objs[0].pitch, "audio", "first_tone"))
    qs.append(Question("how many clicks are there?", NUMBER_WORDS[min(clicks, 10)], "audio", "clicks"))
    qs.append(Question("how many tones are there?", NUMBER_WORDS[len(objs)], "audio", "tones"))
    bouncers = [o for o in objs if bounce_times(o)]
    if len(objs) == 2 and len(bouncers) == 1:
        qs.append(Question("what colour is the shape that bounces when the click sounds?", bouncers[0].colour, "both",
                           "colour_of_click"))
    qs.append(Question("describe the video.", caption(clip), "describe", "describe"))
    return qs


def question_vocabulary() -> list[str]:
    """Every word a question or answer can contain (for a word-level tokenizer)."""
    words = set()
    for seed in range(400):
        for split in ("train", "held_out"):
            for q in questions_for(sample_av_clip(seed, split)):
                words.update(_words(q.text))
                words.update(_words(q.answer))
    words.update(COLOURS)
    words.update(SHAPES)
    words.update(PITCHES)
    words.update(NUMBER_WORDS)
    words.update(BACKGROUNDS)
    return sorted(words)


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"[a-z]+|[?.,]", text.lower())
