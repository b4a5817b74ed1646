"""Moving shapes: the procedural video data every bundled model and evaluator is trained on.

A clip is one or two coloured shapes moving over a plain or textured background, with a
caption drawn from varied templates and synonyms. Everything is a pure function of a seed:
``sample_clip(seed)`` gives the same :class:`ClipSpec` (and caption) every time, and
``render_clip(spec, frames, height, width)`` draws it at any size and length; positions,
sizes and speeds are fractions of the frame, so a clip looks the same at every resolution.

Attributes:
    shapes: circle, square, triangle, star.
    colours: red, green, blue, yellow, white, purple, orange.
    motions: left, right, up, down, diagonal (one of four directions, named in the caption),
        bouncing, growing, shrinking.
    backgrounds: gray, black, brown, navy; plain or with a checkered, striped or noisy texture.

Held-out split: the (shape, colour, motion) triples with ``is_held_out`` true (about one in
ten, chosen so that every single attribute value and every pair still occurs in training)
never appear in training clips; evaluations on "held-out combinations" use only them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SHAPES = ("circle", "square", "triangle", "star")
COLOURS = {
    "red": (220, 40, 40), "green": (40, 185, 60), "blue": (45, 95, 235), "yellow": (240, 215, 40),
    "white": (245, 245, 245), "purple": (150, 60, 205), "orange": (250, 140, 25),
}
MOTIONS = ("left", "right", "up", "down", "diagonal", "bouncing", "growing", "shrinking")
DIAGONALS = {"up-right": (1, -1), "up-left": (-1, -1), "down-right": (1, 1), "down-left": (-1, 1)}
BACKGROUNDS = {"gray": (105, 105, 105), "black": (18, 18, 18), "brown": (95, 62, 38), "navy": (22, 30, 72)}
TEXTURES = ("plain", "checkered", "striped", "noisy")
COLOUR_NAMES = tuple(COLOURS)

# ---------------------------------------------------------------------------- held-out split


def is_held_out(shape: str, colour: str, motion: str) -> bool:
    """True for the ~10% of (shape, colour, motion) triples kept out of training.

    The rule ``(3 s + 5 c + 7 m) % 10 == 4`` over the attribute indices removes about one triple in
    ten; for any two fixed attributes, the third ranges over several training values, so every pair
    is still seen.
    """
    s, c, m = SHAPES.index(shape), COLOUR_NAMES.index(colour), MOTIONS.index(motion)
    return (3 * s + 5 * c + 7 * m) % 10 == 4


def combinations(split: str = "all") -> list[tuple[str, str, str]]:
    """All (shape, colour, motion) triples of a split: ``train``, ``held_out`` or ``all``."""
    out = []
    for s in SHAPES:
        for c in COLOUR_NAMES:
            for m in MOTIONS:
                held = is_held_out(s, c, m)
                if split == "all" or (split == "held_out") == held:
                    out.append((s, c, m))
    return out


# ---------------------------------------------------------------------------- specs


@dataclasses.dataclass(frozen=True)
class ObjectSpec:
    """One moving shape. Positions and sizes are fractions of the frame (x to the right, y down)."""

    shape: str
    colour: str
    motion: str
    direction: str = ""  # for diagonal motion: up-right, up-left, down-right, down-left
    size: float = 0.14  # radius as a fraction of min(height, width)
    start: tuple[float, float] = (0.5, 0.5)
    travel: float = 0.5  # distance covered over the clip, as a fraction of the frame
    rotation: float = 0.0


@dataclasses.dataclass(frozen=True)
class ClipSpec:
    objects: tuple[ObjectSpec, ...]
    background: str
    texture: str
    caption: str
    seed: int

    @property
    def primary(self) -> ObjectSpec:
        return self.objects[0]


# ---------------------------------------------------------------------------- captions

SHAPE_WORDS = {
    "circle": ["circle", "circle", "ball", "disc"],
    "square": ["square", "square", "box", "block"],
    "triangle": ["triangle"],
    "star": ["star"],
}
MOTION_PHRASES = {
    "left": ["moving to the left", "moving left", "drifts left", "slides to the left", "travels left"],
    "right": ["moving to the right", "moving right", "drifts right", "slides to the right", "travels right"],
    "up": ["moving up", "moving upward", "rising", "floats up", "drifts up"],
    "down": ["moving down", "moving downward", "falling", "sinks down", "drifts down"],
    "bouncing": ["bouncing", "bouncing up and down", "hopping", "bounces"],
    "growing": ["growing", "getting bigger", "expanding", "grows larger"],
    "shrinking": ["shrinking", "getting smaller", "contracting", "shrinks"],
}
DIAGONAL_PHRASES = {
    "up-right": ["moving diagonally up and to the right", "drifts diagonally up and right"],
    "up-left": ["moving diagonally up and to the left", "drifts diagonally up and left"],
    "down-right": ["moving diagonally down and to the right", "drifts diagonally down and right"],
    "down-left": ["moving diagonally down and to the left", "drifts diagonally down and left"],
}
SIZE_WORDS = {"small": (0.09, 0.12), "": (0.12, 0.17), "large": (0.17, 0.21)}
BACKGROUND_TEMPLATES = ["on a {bg} background", "over a {bg} backdrop", "against a {bg} background"]
TEXTURE_WORDS = {"plain": ["", "plain"], "checkered": ["checkered"], "striped": ["striped"],
                 "noisy": ["noisy", "grainy"]}


def _motion_phrase(obj: ObjectSpec, rng: np.random.Generator) -> str:
    if obj.motion == "diagonal":
        return str(rng.choice(DIAGONAL_PHRASES[obj.direction]))
    return str(rng.choice(MOTION_PHRASES[obj.motion]))


def _object_phrase(obj: ObjectSpec, size_word: str, rng: np.random.Generator, article: bool = True) -> str:
    words = [w for w in (size_word, obj.colour, str(rng.choice(SHAPE_WORDS[obj.shape]))) if w]
    noun = " ".join(words)
    if article:
        noun = ("an " if noun[0] in "aeiou" else "a ") + noun
    return f"{noun} {_motion_phrase(obj, rng)}"


def make_caption(objects, size_words, background: str, texture: str, rng: np.random.Generator) -> str:
    parts = [_object_phrase(o, w, rng) for o, w in zip(objects, size_words, strict=True)]
    text = " and ".join(parts)
    if rng.random() < 0.85:
        tex = str(rng.choice(TEXTURE_WORDS[texture]))
        bg = f"{tex} {background}".strip()
        text += " " + str(rng.choice(BACKGROUND_TEMPLATES)).format(bg=bg)
    return text


def caption_vocabulary() -> list[str]:
    """Every word a caption can contain (the bundled tokenizer's vocabulary)."""
    words = set("a an and on over against background backdrop".split())
    words.update(COLOURS, BACKGROUNDS, SHAPES)
    for table in (SHAPE_WORDS, MOTION_PHRASES, DIAGONAL_PHRASES, TEXTURE_WORDS):
        for phrases in table.values():
            for p in phrases:
                words.update(p.split())
    words.update(w for w in SIZE_WORDS if w)
    return sorted(w for w in words if w)


# ---------------------------------------------------------------------------- sampling


def _sample_object(rng: np.random.Generator, shape: str, colour: str, motion: str) -> tuple[ObjectSpec, str]:
    size_word = str(rng.choice(list(SIZE_WORDS), p=[0.2, 0.6, 0.2]))
    lo, hi = SIZE_WORDS[size_word]
    size = float(rng.uniform(lo, hi))
    travel = float(rng.uniform(0.4, 0.6))
    direction = ""
    jitter = lambda: float(rng.uniform(-0.06, 0.06))  # noqa: E731
    if motion in ("left", "right"):
        x0 = 0.5 + (travel / 2 if motion == "left" else -travel / 2)
        start = (x0 + jitter(), float(rng.uniform(0.3, 0.7)))
    elif motion in ("up", "down"):
        y0 = 0.5 + (travel / 2 if motion == "up" else -travel / 2)
        start = (float(rng.uniform(0.3, 0.7)), y0 + jitter())
    elif motion == "diagonal":
        direction = str(rng.choice(list(DIAGONALS)))
        dx, dy = DIAGONALS[direction]
        travel = float(rng.uniform(0.3, 0.45))
        start = (0.5 - dx * travel / 2 + jitter(), 0.5 - dy * travel / 2 + jitter())
    elif motion == "bouncing":
        start = (float(rng.uniform(0.3, 0.7)), 0.7 + jitter() / 2)
        travel = float(rng.uniform(0.3, 0.4))  # bounce height
    else:  # growing / shrinking around a fixed centre
        start = (float(rng.uniform(0.35, 0.65)), float(rng.uniform(0.35, 0.65)))
        size = float(rng.uniform(0.13, 0.17))
    rotation = float(rng.uniform(0, 2 * math.pi)) if shape in ("triangle", "star") and rng.random() < 0.3 else 0.0
    return ObjectSpec(shape, colour, motion, direction, size, start, travel, rotation), size_word


def sample_clip(seed: int, split: str = "train", num_objects: int | None = None,
                combo: tuple[str, str, str] | None = None) -> ClipSpec:
    """The clip for ``seed``: attributes, layout and caption, all determined by the seed.

    Args:
        split: ``train`` draws only training triples, ``held_out`` only held-out ones, ``all`` any.
        num_objects: 1 or 2 (default: 2 with probability 0.2).
        combo: force the primary object's (shape, colour, motion).
    """
    rng = np.random.default_rng(seed)
    pool = combinations(split)
    n = num_objects or (2 if rng.random() < 0.2 else 1)
    first = combo or pool[int(rng.integers(len(pool)))]
    triples = [first]
    if n == 2:
        # Two shapes share the frame without colliding: split it across the first one's motion (top and
        # bottom halves for sideways or diagonal motion, left and right halves otherwise) and give the
        # second a motion that stays in its half.
        sideways = first[2] in ("left", "right", "diagonal")
        allowed = ("left", "right", "growing", "shrinking") if sideways else ("up", "down", "bouncing", "growing",
                                                                                "shrinking")
        second = [t for t in pool if t[2] in allowed and (t[0], t[1]) != (first[0], first[1])]
        triples.append(second[int(rng.integers(len(second)))])
    objs, words = [], []
    for shape, colour, motion in triples:
        o, w = _sample_object(rng, shape, colour, motion)
        objs.append(o)
        words.append(w)
    if n == 2:
        halves = (0.27, 0.73)
        placed = []
        for o, centre in zip(objs, halves, strict=True):
            o = dataclasses.replace(o, size=min(o.size, 0.1), travel=min(o.travel, 0.45))
            if sideways:
                y = centre + (o.start[1] - 0.5) * 0.15 if o.motion != "diagonal" else centre
                o = dataclasses.replace(o, start=(o.start[0], y), travel=0.12 if o.motion == "diagonal" else o.travel)
                if o.motion == "diagonal":  # start so that the 0.12 diagonal run stays inside the half
                    dx, dy = DIAGONALS[o.direction]
                    o = dataclasses.replace(o, start=(0.5 - dx * 0.3, centre - dy * 0.06))
            else:
                x = centre + (o.start[0] - 0.5) * 0.15
                o = dataclasses.replace(o, start=(x, o.start[1]))
            placed.append(o)
        objs = placed
        words = [w if w != "large" else "" for w in words]
    background = str(rng.choice(list(BACKGROUNDS)))
    texture = str(rng.choice(TEXTURES, p=[0.55, 0.15, 0.15, 0.15]))
    caption = make_caption(objs, words, background, texture, rng)
    return ClipSpec(tuple(objs), background, texture, caption, seed)


def size_word(obj: ObjectSpec) -> str:
    """The size adjective an object's radius supports (``small``, ``large`` or none)."""
    if obj.motion in ("growing", "shrinking"):
        return ""
    for word, (lo, hi) in SIZE_WORDS.items():
        if word and lo <= obj.size < hi + 1e-9:
            return word
    return ""


def recaption(spec: ClipSpec, seed: int) -> str:
    """Another true caption for the same clip: new synonyms and templates; size words kept or dropped."""
    rng = np.random.default_rng(seed)
    words = [size_word(o) if rng.random() < 0.7 else "" for o in spec.objects]
    return make_caption(spec.objects, words, spec.background, spec.texture, rng)


# ---------------------------------------------------------------------------- rendering


def _trajectory(obj: ObjectSpec, u: float) -> tuple[float, float, float]:
    """Centre (x, y) and radius scale of ``obj`` at clip time ``u`` in [0, 1]."""
    x, y = obj.start
    if obj.motion == "left":
        return x - obj.travel * u, y, 1.0
    if obj.motion == "right":
        return x + obj.travel * u, y, 1.0
    if obj.motion == "up":
        return x, y - obj.travel * u, 1.0
    if obj.motion == "down":
        return x, y + obj.travel * u, 1.0
    if obj.motion == "diagonal":
        dx, dy = DIAGONALS[obj.direction]
        return x + dx * obj.travel * u, y + dy * obj.travel * u, 1.0
    if obj.motion == "bouncing":  # two bounces: |sin| arcs
        return x, y - obj.travel * abs(math.sin(2 * math.pi * u)), 1.0
    if obj.motion == "growing":
        return x, y, 0.45 + 1.0 * u
    return x, y, 1.45 - 1.0 * u  # shrinking


def _fold(x: float, lo: float, hi: float) -> float:
    """``x`` reflected back and forth into ``[lo, hi]`` (a triangle wave): a position bouncing off two walls."""
    span = hi - lo
    if span <= 0:
        return lo
    y = (x - lo) % (2 * span)
    return lo + (y if y <= span else 2 * span - y)


def long_trajectory(obj: ObjectSpec, t: float) -> tuple[float, float, float]:
    """Centre (x, y) and radius scale of ``obj`` at time ``t`` measured in clip lengths (``t = 1`` is the end of a
    17-frame training clip), for videos longer than a clip: the same speed, reflected off the frame's edges.

    On ``0 <= t <= 1`` it is :func:`_trajectory` exactly, so a long video starts as the training clip of the same
    spec. After that, straight and diagonal motions bounce off the edges (each axis folds between the object
    touching one edge and touching the other), growing and shrinking alternate between the sizes a clip spans,
    and bouncing (already periodic) goes on hopping.
    """
    if 0 <= t <= 1:
        return _trajectory(obj, t)
    if obj.motion in ("growing", "shrinking"):
        grow = obj.motion == "growing"
        return obj.start[0], obj.start[1], _fold(0.45 + t if grow else 1.45 - t, 0.45, 1.45)
    if obj.motion == "bouncing":
        return _trajectory(obj, t)
    (x, y, _), (x1, y1, _) = _trajectory(obj, 0.0), _trajectory(obj, 1.0)
    r = obj.size * (1.25 if obj.shape == "square" else 1.0)  # as drawn (a square's corners reach 1.25 r)
    lo_x, hi_x = min(r, x, x1), max(1 - r, x, x1)  # the clip's own path always lies inside the walls
    lo_y, hi_y = min(r, y, y1), max(1 - r, y, y1)
    return _fold(x + (x1 - x) * t, lo_x, hi_x), _fold(y + (y1 - y) * t, lo_y, hi_y), 1.0


def window_motion(obj: ObjectSpec, t0: float, t1: float) -> str:
    """The motion a viewer sees between times ``t0`` and ``t1`` (clip lengths) of :func:`long_trajectory`: after a
    bounce a shape "moving right" moves left, a growing one shrinks; diagonal and bouncing stay what they are."""
    if obj.motion in ("diagonal", "bouncing"):
        return obj.motion
    a, b = long_trajectory(obj, t0), long_trajectory(obj, t1)
    if obj.motion in ("growing", "shrinking"):
        return "growing" if b[2] >= a[2] else "shrinking"
    if obj.motion in ("left", "right"):
        return "right" if b[0] >= a[0] else "left"
    return "down" if b[1] >= a[1] else "up"


def _polygon(shape: str, cx: float, cy: float, r: float, rot: float) -> np.ndarray:
    if shape == "square":
        k, phase, radii = 4, math.pi / 4 + rot, [r * 1.25]
    elif shape == "triangle":
        k, phase, radii = 3, -math.pi / 2 + rot, [r * 1.3]
    else:  # star
        k, phase, radii = 10, -math.pi / 2 + rot, [r * 1.35, r * 0.55]
    pts = []
    for i in range(k):
        a = phase + 2 * math.pi * i / k
        rr = radii[i % len(radii)]
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return np.array(pts)


def texture_mask(texture: str, h: int, w: int, dy: int = 0, dx: int = 0) -> np.ndarray:
    """The 0/1 ``[h, w]`` pattern of a checkered or striped background (cells of 1/8, stripes of 1/10 of the
    shorter side, anchored at the top-left corner; ``dy``, ``dx`` shift it by that many pixels, which the data
    never do: a probe of whether a generator draws the pattern at another phase)."""
    yy, xx = np.mgrid[dy:dy + h, dx:dx + w]
    if texture == "checkered":
        cell = max(2, min(h, w) // 8)
        return ((yy // cell + xx // cell) % 2).astype(np.float32)
    if texture == "striped":
        stripe = max(2, min(h, w) // 10)
        return (((xx + yy) // stripe) % 2).astype(np.float32)
    raise ValueError(f"no pattern for texture {texture!r}; patterned textures: checkered, striped")


def _background(name: str, texture: str, h: int, w: int, seed: int) -> np.ndarray:
    base = np.array(BACKGROUNDS[name], np.float32)
    img = np.broadcast_to(base, (h, w, 3)).copy()
    if texture == "checkered":
        mask = texture_mask(texture, h, w)[..., None]
        img = img * (1 - 0.25 * mask) + 0.25 * mask * np.minimum(base + 60, 255)
    elif texture == "striped":
        img = img + 28 * texture_mask(texture, h, w)[..., None]
    elif texture == "noisy":
        rng = np.random.default_rng(seed + 7919)
        small = rng.normal(0, 18, (max(2, h // 4), max(2, w // 4), 1)).astype(np.float32)
        import cv2

        img = img + cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)[..., None]
    return np.clip(img, 0, 255)


def _draw_objects(spec: ClipSpec, canvas: np.ndarray, u: float, colour_of, trajectory=None) -> None:
    """Draw every object of ``spec`` at time ``u`` (in [0, 1] for a clip; any time with ``long_trajectory``)
    onto ``canvas`` (in place)."""
    import cv2

    height, width = canvas.shape[:2]
    side = min(height, width)
    shift = 4  # cv2 fixed-point bits: sub-pixel positions
    for obj in spec.objects:
        cx, cy, scale = (trajectory or _trajectory)(obj, u)
        px, py, r = cx * width, cy * height, obj.size * side * scale
        colour = colour_of(obj)
        if obj.shape == "circle":
            cv2.circle(canvas, (round(px * 16), round(py * 16)), max(1, round(r * 16)), colour, -1, cv2.LINE_AA,
                       shift)
        else:
            pts = np.round(_polygon(obj.shape, px, py, r, obj.rotation) * 16).astype(np.int32)
            cv2.fillPoly(canvas, [pts], colour, cv2.LINE_AA, shift)


def _check_size(frames: int, height: int, width: int) -> None:
    if frames < 1 or height < 8 or width < 8:
        raise ValueError("a clip needs at least 1 frame and 8x8 pixels")


def render_clip(spec: ClipSpec, frames: int = 17, height: int = 128, width: int = 128) -> np.ndarray:
    """Draw ``spec`` as uint8 ``[frames, height, width, 3]`` (anti-aliased, 4x supersampled edges)."""
    _check_size(frames, height, width)
    bg = _background(spec.background, spec.texture, height, width, spec.seed)
    out = np.empty((frames, height, width, 3), np.uint8)
    for f in range(frames):
        img = bg.copy()
        _draw_objects(spec, img, f / max(frames - 1, 1), lambda obj: tuple(float(v) for v in COLOURS[obj.colour]))
        out[f] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def render_long_clip(spec: ClipSpec, frames: int, height: int = 128, width: int = 128, start: int = 0,
                     clip_frames: int = 17) -> np.ndarray:
    """Frames ``start .. start + frames - 1`` of an endless video of ``spec`` moving at the speed of its
    ``clip_frames``-frame training clip (frame ``clip_frames - 1`` is the clip's last) and bouncing off the edges
    (:func:`long_trajectory`); uint8 ``[frames, height, width, 3]``. Its first ``clip_frames`` frames are
    :func:`render_clip` of the spec."""
    _check_size(frames, height, width)
    bg = _background(spec.background, spec.texture, height, width, spec.seed)
    out = np.empty((frames, height, width, 3), np.uint8)
    for f in range(frames):
        img = bg.copy()
        _draw_objects(spec, img, (start + f) / (clip_frames - 1),
                      lambda obj: tuple(float(v) for v in COLOURS[obj.colour]), long_trajectory)
        out[f] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def render_mask(spec: ClipSpec, frames: int = 17, height: int = 128, width: int = 128) -> np.ndarray:
    """Object coverage of ``spec`` as float32 ``[frames, height, width]`` in [0, 1], aligned with
    :func:`render_clip` (same trajectories and anti-aliased edges)."""
    _check_size(frames, height, width)
    out = np.zeros((frames, height, width), np.float32)
    for f in range(frames):
        img = np.zeros((height, width), np.float32)
        _draw_objects(spec, img, f / max(frames - 1, 1), lambda obj: 1.0)
        out[f] = img
    return out


def render_long_mask(spec: ClipSpec, frames: int, height: int = 128, width: int = 128, start: int = 0,
                     clip_frames: int = 17) -> np.ndarray:
    """Object coverage float32 ``[frames, height, width]`` in [0, 1] aligned with :func:`render_long_clip`."""
    _check_size(frames, height, width)
    out = np.zeros((frames, height, width), np.float32)
    for f in range(frames):
        img = np.zeros((height, width), np.float32)
        _draw_objects(spec, img, (start + f) / (clip_frames - 1), lambda obj: 1.0, long_trajectory)
        out[f] = img
    return out
