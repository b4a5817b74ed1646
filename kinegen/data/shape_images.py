"""Procedural class-conditional images for the GAN: one shape of one colour on a background.

A class is a (colour, shape) pair; ``DEFAULT_CLASSES`` has 12 (four shapes in red, blue and
yellow). An image is a pure function of ``(seed, class)``: position, size, rotation, background
colour and texture vary with the seed. Seeds below ``HELD_OUT_SEED`` are for training, seeds from
it on are held out (the evaluation classifier trains on those, never on the GAN's images).
"""

from __future__ import annotations

import math

import numpy as np

from .shapes import BACKGROUNDS, TEXTURES, ClipSpec, ObjectSpec, render_clip

DEFAULT_CLASSES: tuple[tuple[str, str], ...] = tuple(
    (colour, shape) for colour in ("red", "blue", "yellow") for shape in ("circle", "square", "triangle", "star"))
HELD_OUT_SEED = 10_000_000
# Offsets within the held-out range, far enough apart never to meet:
CLASSIFIER_SEEDS = 0  # the GAN evaluation classifier's training and test images
REFERENCE_SEEDS = 1_000_000  # the real reference images of the GAN metrics


def class_names(classes=DEFAULT_CLASSES) -> list[str]:
    return [f"{colour} {shape}" for colour, shape in classes]


TEXTURE_PRIOR = (0.55, 0.15, 0.15, 0.15)  # the shares of ``TEXTURES`` (plain, checkered, striped, noisy) drawn


def _image_spec(seed: int, label: int, classes=DEFAULT_CLASSES, texture: str | None = None) -> ClipSpec:
    colour, shape = classes[label]
    rng = np.random.default_rng([seed, label])
    rotation = float(rng.uniform(0, 2 * math.pi)) if shape in ("triangle", "star") else 0.0
    obj = ObjectSpec(shape, colour, "left", "", float(rng.uniform(0.22, 0.32)),
                     (float(rng.uniform(0.35, 0.65)), float(rng.uniform(0.35, 0.65))), 0.0, rotation)
    background = str(rng.choice(list(BACKGROUNDS)))
    drawn = str(rng.choice(TEXTURES, p=list(TEXTURE_PRIOR)))
    if texture is not None and texture not in TEXTURES:
        raise ValueError(f"unknown texture {texture!r}; textures: {', '.join(TEXTURES)}")
    return ClipSpec((obj,), background, texture or drawn, f"{colour} {shape}", seed)


def render_image(seed: int, label: int, size: int = 32, classes=DEFAULT_CLASSES, texture: str | None = None
                 ) -> np.ndarray:
    """uint8 ``[size, size, 3]`` image of class ``label``. ``texture`` (one of ``TEXTURES``) replaces the seed's
    background texture and keeps everything else, for probes that ask what a texture alone changes."""
    return render_clip(_image_spec(seed, label, classes, texture), frames=1, height=size, width=size)[0]


def image_texture(seed: int, label: int, classes=DEFAULT_CLASSES) -> int:
    """The index in ``TEXTURES`` of the background texture of image ``(seed, label)``."""
    return TEXTURES.index(_image_spec(seed, label, classes).texture)


def batch(seeds, labels, size: int = 32, classes=DEFAULT_CLASSES) -> np.ndarray:
    """uint8 ``[N, size, size, 3]``: :func:`render_image` of each ``(seed, label)``."""
    return np.stack([render_image(int(s), int(c), size, classes) for s, c in zip(seeds, labels, strict=True)])
