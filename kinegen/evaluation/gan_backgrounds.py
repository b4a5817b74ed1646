"""Which background an image of the procedural shapes has: its colour (gray, black, brown, navy) and texture
(plain, checkered, striped, noisy), read by rule from the pixels, and how far a generator's backgrounds are
from the data's.

The GAN is conditioned on the shape's class only, so its backgrounds are judged as a distribution: a
generator that reproduces the data draws the four colours a quarter of the time each and the textures at
the data's rates (plain 55%, each pattern 15%; :mod:`kinegen.data.shape_images`). The reading uses how the
data are drawn (:func:`kinegen.data.shapes._background`):

- every texture adds the same amount to the three channels, so a pixel's *chroma* (the pixel less its
  channel mean) is the base colour's whatever the texture; gray and black share a chroma and differ in
  brightness;
- the patterned textures sit at fixed places (:func:`kinegen.data.shapes.texture_mask`), so their
  brightness correlates with the pattern; noise spreads the brightness (its median absolute deviation)
  without the pattern; plain has neither.

The base colour is read from the outer ring of the image (the median of its pixels' chroma and brightness:
the shape covers at most part of it), the texture from every pixel whose chroma is the base's (the shape's
pixels are not). An image whose ring is no base colour, or whose background colour covers less than half of
it (a frame around a field of another colour; in the data the shape leaves at least 62%), reads as
``"other"``. On held-out procedural images the reader is right on both attributes for every image
(tests/test_gan_backgrounds.py).
"""

from __future__ import annotations

import numpy as np

from ..data.shapes import BACKGROUNDS, TEXTURES, texture_mask

OTHER = "other"
RING = 2  # pixels of the border that the base colour is read from
MAX_CHROMA_ERROR = 16.0  # the ring's median chroma may be this far from the base's (0-255 units)
MAX_OFFSET = (-30.0, 60.0)  # and its brightness this far from the base (textures add 0 to +28, noise +-)
MIN_BACKGROUND = 0.5  # the least share of an image in the background colour (the data's least is 0.62)
TEXTURE_SPREAD = 2.5  # brightness MAD (0-255) above which an unpatterned background is noisy (data: 0 plain,
#                       5 to 13 noisy)
PATTERN_CORRELATION = 0.6  # correlation with a pattern above which the texture is that pattern


def _chroma(x: np.ndarray) -> np.ndarray:
    return x - x.mean(-1, keepdims=True)


def _ring(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    keep = np.zeros((h, w), bool)
    keep[:RING], keep[-RING:], keep[:, :RING], keep[:, -RING:] = True, True, True, True
    return img[keep]


def read_base(img: np.ndarray) -> str:
    """The background colour of one ``[H, W, 3]`` image (0-255): a name of ``BACKGROUNDS`` or ``"other"``."""
    ring = _ring(img.astype(np.float32))
    chroma, brightness = np.median(_chroma(ring), axis=0), float(np.median(ring.mean(-1)))
    best, best_err = OTHER, MAX_CHROMA_ERROR
    for name, rgb in BACKGROUNDS.items():
        base = np.asarray(rgb, np.float32)
        offset = brightness - float(base.mean())
        err = float(np.linalg.norm(chroma - _chroma(base)))
        if MAX_OFFSET[0] <= offset <= MAX_OFFSET[1] and err < best_err:
            best, best_err = name, err
    return best


def background_mask(img: np.ndarray, base: str) -> np.ndarray:
    """``[H, W]`` bool: the pixels whose chroma is that of the background colour ``base``."""
    rgb = np.asarray(BACKGROUNDS[base], np.float32)
    return np.linalg.norm(_chroma(img.astype(np.float32)) - _chroma(rgb), axis=-1) < MAX_CHROMA_ERROR


def background_brightness(img: np.ndarray, base: str, background: np.ndarray) -> np.ndarray:
    """The brightness above the base colour (0-255 units) of the pixels of ``background`` (a
    :func:`background_mask`): what every texture adds."""
    return (img.astype(np.float32) - np.asarray(BACKGROUNDS[base], np.float32)).mean(-1)[background]


def read_texture(img: np.ndarray, base: str, background: np.ndarray | None = None) -> str:
    """The texture of one image whose background colour is ``base``: a name of ``TEXTURES`` or ``"other"``
    (``background``: its :func:`background_mask`, when already at hand)."""
    if base == OTHER:
        return OTHER
    if background is None:
        background = background_mask(img, base)
    brightness = background_brightness(img, base, background)
    if brightness.std() < 1e-3:
        return "plain"
    h, w = img.shape[:2]
    for pattern in ("checkered", "striped"):
        mask = texture_mask(pattern, h, w)[background]
        if mask.std() > 0 and np.corrcoef(brightness, mask)[0, 1] > PATTERN_CORRELATION:
            return pattern
    # The median absolute deviation, not the std: a thin dark outline around a generated shape is not noise.
    spread = float(np.median(np.abs(brightness - np.median(brightness))))
    return "plain" if spread < TEXTURE_SPREAD else "noisy"


def read_background(img: np.ndarray) -> tuple[str, str]:
    """``(colour, texture)`` of one uint8 ``[H, W, 3]`` image; ``("other", "other")`` when the ring is no
    background colour or when less than ``MIN_BACKGROUND`` of the image is (a frame around another field)."""
    base = read_base(img)
    if base == OTHER:
        return OTHER, OTHER
    background = background_mask(img, base)
    if background.mean() < MIN_BACKGROUND:
        return OTHER, OTHER
    return base, read_texture(img, base, background)


def background_frequencies(images: np.ndarray) -> dict:
    """How often each colour and texture (and ``"other"``) is read in uint8 ``[N, H, W, 3]`` images."""
    return _frequencies([read_background(im) for im in images])


def _frequencies(reads: list[tuple[str, str]]) -> dict:
    n = max(len(reads), 1)
    colours = {c: sum(r[0] == c for r in reads) / n for c in (*BACKGROUNDS, OTHER)}
    textures = {t: sum(r[1] == t for r in reads) / n for t in (*TEXTURES, OTHER)}
    pairs = {f"{c} {t}": sum(r == (c, t) for r in reads) / n for c in BACKGROUNDS for t in TEXTURES}
    pairs[OTHER] = sum(OTHER in r for r in reads) / n
    return {"colours": colours, "textures": textures, "pairs": pairs}


def _total_variation(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def compare_backgrounds(real: np.ndarray, fake: np.ndarray, fake_labels: np.ndarray | None = None) -> dict:
    """The generated images' background colours and textures against the real images': frequencies of both,
    total-variation distances (0 = the same distribution, 1 = disjoint) of the colours, the textures and the
    16 (colour, texture) pairs (``"other"`` counted as one more value), and the pairs that the real images
    show and the generated ones never do.

    With ``fake_labels``, also the colours and textures *within each class* against the real images' (the
    data draw the background independently of the class, so every class should show all of them), averaged
    over the classes: a generator that ties a background to each class can match the pooled frequencies and
    still fail these.
    """
    fake_reads = [read_background(im) for im in fake]
    r, f = background_frequencies(real), _frequencies(fake_reads)
    missed = [k for k, v in r["pairs"].items() if k != OTHER and v > 0 and f["pairs"][k] == 0]
    out = {"colour_tv": _total_variation(r["colours"], f["colours"]),
           "texture_tv": _total_variation(r["textures"], f["textures"]),
           "pair_tv": _total_variation(r["pairs"], f["pairs"]),
           "other": f["colours"][OTHER], "missed_pairs": missed, "real": r, "fake": f}
    if fake_labels is not None:
        per_class = [_frequencies([rd for rd, y in zip(fake_reads, fake_labels, strict=True) if y == c])
                     for c in np.unique(fake_labels)]
        out["colour_tv_by_class"] = float(np.mean([_total_variation(r["colours"], p["colours"]) for p in per_class]))
        out["texture_tv_by_class"] = float(np.mean([_total_variation(r["textures"], p["textures"])
                                                    for p in per_class]))
    return out
