"""Which tokens are dynamic: cheap latent differences, smoothed over chunks (reference note, sections 4.5 and 5).

At each chunk commit, from the chunk's clean latents and the previous chunk's last clean frame:

1. **score**: per latent frame, the mean over channels of ``|z_t - z_{t-1}|``, average-pooled to the transformer's
   patch grid (one value per token; section 5's latent difference, already in token space, no decode). With
   ``centre`` each latent frame's per-channel mean over the frame is taken off first: a causal VAE codes a still
   scene differently at each latent position of a clip or segment, a shift shared by every place that would
   otherwise read as motion everywhere (docs/dasa.md, "Where it departs");
2. **dilation**: a max-filter (3x3 by default) on the token grid, so the edges of moving things stay dynamic;
3. **entry**: a token enters the dynamic set when its score is among the frame's top ``keep`` share (the budget),
   or reaches ``threshold``; its score relative to that entry level is its *membership* (1 = the level). With
   ``floor`` (and a budget under half the frame) membership is measured from the frame's median score, its
   background level, so that a background changing a little everywhere (flicker, texture re-rendered) sits at 0
   and not just under 1;
4. **smoothing**: an exponential moving average of the membership over frames, chunk after chunk; a dynamic token
   turns static only when the average falls below ``low`` (hysteresis), so masks do not flicker (section 4.5);
5. **keyframes**: a frame whose mean difference jumps to ``scene_jump`` times its running mean (a scene change), or
   a prompt switch (the pipeline re-caches), makes the chunk a keyframe: kept whole, computed fully, and the
   dynamics restart from it (section 4.5).

While a chunk is denoised, :meth:`DynamicsTracker.moved` reads the same score from the chunk's own clean-latent
prediction (section 5: "the current chunk's step-1 x0 prediction") against half the peak of the last committed
frame: places the chunk is moving into, which the dynamics of the chunks before it cannot know
(``DASAConfig.recheck``).

``select="uniform"`` or ``"random"`` replaces steps 1-4 by a fixed strided or a random ``keep`` share of each frame
(the peers "uniform or random token dropping" at the same budget; keyframes still apply).

:class:`DynamicsTracker` holds that state for one run; its :attr:`~DynamicsTracker.dynamic` map (before a chunk is
denoised: the previous chunk's dynamics) is also what region compute allocation reads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PEAK_SHARE = 0.5
""":meth:`DynamicsTracker.moved`: a place moves when its score over the frame's background level is at least this
share of the last committed frame's strongest (its peak over its background): the shape itself, not the top of a
budget that, on a small shape, reaches into the background's noise."""

SCENE_FLOOR = 0.05
"""The smallest running mean difference a scene jump is measured against (normalised latents have unit scale; a
near-still video must not call every small motion a scene change)."""


def latent_motion(latents: torch.Tensor, previous: torch.Tensor, patch: tuple[int, int],
                  centre: bool = False) -> torch.Tensor:
    """``[F, H', W']``: per latent frame of ``latents`` ``[B, C, F, h, w]``, the mean over channels (and batch) of
    its absolute difference from the frame before (``previous`` ``[B, C, 1, h, w]`` before the first), average-pooled
    over each ``patch`` (the token grid). ``centre``: each frame's per-channel spatial mean taken off first."""
    seq = torch.cat([previous.to(latents), latents], dim=2).float()
    if centre:
        seq = seq - seq.mean(dim=(3, 4), keepdim=True)
    diff = (seq[:, :, 1:] - seq[:, :, :-1]).abs().mean(dim=(0, 1))  # [F, h, w]
    return F.avg_pool2d(diff[:, None], kernel_size=patch, stride=patch)[:, 0]


def dilate(scores: torch.Tensor, size: int) -> torch.Tensor:
    """A ``size`` x ``size`` max-filter over ``[F, H', W']`` (edges padded by the border values' own max)."""
    if size == 1:
        return scores
    return F.max_pool2d(scores[:, None], kernel_size=size, stride=1, padding=size // 2)[:, 0]


def background_level(score: torch.Tensor, keep: float, threshold: float | None, floor: bool) -> float:
    """Where membership is measured from: the frame's median score with ``floor`` and a budget of under half the
    frame, else 0."""
    return float(score.median()) if floor and threshold is None and keep < 0.5 else 0.0


def membership(score: torch.Tensor, keep: float, threshold: float | None, base: float = 0.0) -> torch.Tensor:
    """Score over the entry level, ``[H', W']``: >= 1 enters the dynamic set. With a budget, the level is the
    ``ceil(keep * tokens)``-th largest score and those tokens are at least 1 (ties and a still frame included).
    ``base`` is :func:`background_level`: with ``floor`` (a budget of under half the frame) the frame's median
    score, so ``(s - median) / (level - median)`` puts the frame's typical token at 0 and the hysteresis lets it
    go."""
    if threshold is not None:
        return score / threshold
    flat = score.flatten()
    k = max(1, math.ceil(keep * flat.numel()))
    top = flat.topk(k)
    u = (flat - base) / (top.values[-1] - base).clamp(min=1e-12)
    u[top.indices] = u[top.indices].clamp(min=1.0)
    return u.view_as(score)


class DynamicsTracker:
    """The dynamics of one run, updated at each chunk commit (see the module docstring).

    Attributes:
        dynamic: ``[H', W']`` bool, the current dynamic set (None: no history yet or just after a keyframe, which
            counts as everything dynamic).
        keyframe: whether the last chunk was a keyframe (its successor is then computed fully).
        keyframes: how many chunks were keyframes (the first chunk, scene changes and prompt switches).
    """

    def __init__(self, keep: float, threshold: float | None, ema: float, low: float, dilate_size: int,
                 scene_jump: float | None, select: str = "dynamics", anchor_every: int = 1, centre: bool = True,
                 floor: bool = True):
        self.keep, self.threshold, self.ema, self.low = keep, threshold, ema, low
        self.centre, self.floor = centre, floor
        self.dilate_size, self.scene_jump, self.select = dilate_size, scene_jump, select
        self.anchor_every = anchor_every
        self.peak: float | None = None  # the last frame scored: its highest score over its background level
        self.frames_seen = 0  # seeds the random selection
        self.keyframes = 0
        self.scene_changes = 0
        self.reset()

    @classmethod
    def from_config(cls, config, **overrides) -> DynamicsTracker:
        """The tracker of a :class:`~kinegen.dasa.config.DASAConfig`, some settings replaced (``keep=...``)."""
        names = ("keep", "threshold", "ema", "low", "scene_jump", "select", "anchor_every", "centre", "floor")
        settings = {name: getattr(config, name) for name in names} | {"dilate_size": config.dilate}
        return cls(**(settings | overrides))

    def reset(self) -> None:
        self.since_keyframe = 0  # chunks committed since the last keyframe
        self.dynamic: torch.Tensor | None = None
        self.smooth: torch.Tensor | None = None
        self.mean_diff: float | None = None
        self.keyframe = True

    def update(self, latents: torch.Tensor, previous: torch.Tensor | None, patch: tuple[int, int],
               force_keyframe: bool = False) -> list[torch.Tensor | None]:
        """A committed chunk's clean latents ``[B, C, F, h, w]`` -> per frame, the flat ``[H' * W']`` bool mask of
        tokens to keep in the KV cache, or None for the whole frame (its first frame in an anchor chunk, and every
        frame of a keyframe: the video's first chunk, ``force_keyframe`` (a prompt switch), a scene change)."""
        frames = latents.shape[2]
        if previous is None or force_keyframe:
            return self._keyframe(frames)
        scores = latent_motion(latents, previous, patch, self.centre)
        if self._scene_change(scores.mean(dim=(1, 2)).tolist()):
            self.scene_changes += 1
            return self._keyframe(frames)
        if self.select != "dynamics":
            return self._selected(scores)
        masks: list[torch.Tensor | None] = []
        for score in dilate(scores, self.dilate_size):
            base = background_level(score, self.keep, self.threshold, self.floor)
            u = membership(score, self.keep, self.threshold, base)
            self.peak = float(score.max()) - base
            self.smooth = u if self.smooth is None else self.ema * self.smooth + (1 - self.ema) * u
            held = torch.ones_like(u, dtype=torch.bool) if self.dynamic is None else self.dynamic
            self.dynamic = (u >= 1) | (held & (self.smooth >= self.low))
            if not bool(self.dynamic.any()):  # a still frame under a threshold: keep its strongest token
                self.dynamic.view(-1)[self.smooth.argmax()] = True
            masks.append(self.dynamic.flatten().clone())
        return self._anchored(masks)

    def moved(self, x0: torch.Tensor, previous: torch.Tensor, patch: tuple[int, int]) -> torch.Tensor | None:
        """``[H', W']`` bool: the places where a chunk's predicted clean latents ``x0`` ``[B, C, F, h, w]`` differ
        from the frame before (``previous`` ``[B, C, 1, h, w]``), in any frame (dilated as the dynamics are), by at
        least :data:`PEAK_SHARE` of the last committed frame's peak, each over its frame's background level: where
        the chunk is moving now. Measured from the background level (with ``floor``), a prediction that is blurrier
        than the committed frame everywhere does not count as motion everywhere. None before any frame was scored,
        after a still one (no peak to compare with), or with a peer's selection (which reads no motion)."""
        if self.peak is None or self.peak <= 0 or self.select != "dynamics":
            return None
        scores = dilate(latent_motion(x0, previous, patch, self.centre), self.dilate_size)
        base = torch.tensor([background_level(s, self.keep, self.threshold, self.floor) for s in scores])
        return (scores - base.view(-1, 1, 1).to(scores) >= PEAK_SHARE * self.peak).any(dim=0)

    def _anchored(self, masks: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Keep the chunk's first frame whole when the chunk is an anchor: every ``anchor_every``-th chunk after a
        keyframe (1: every chunk; 0: none, a first frame is then compressed like the rest)."""
        self.since_keyframe += 1
        if self.anchor_every and self.since_keyframe % self.anchor_every == 0:
            masks[0] = None
        self.keyframe = False
        return masks

    def _selected(self, scores: torch.Tensor) -> list[torch.Tensor | None]:
        """The peers' masks: ``ceil(keep * tokens)`` tokens per frame, evenly strided (``uniform``, shifted by one
        place per frame so that every place is kept in turn) or drawn at random (``random``, seeded per frame)."""
        n = scores[0].numel()
        k = max(1, math.ceil(self.keep * n))
        masks: list[torch.Tensor | None] = []
        for _ in range(scores.shape[0]):
            mask = torch.zeros(n, dtype=torch.bool)
            if self.select == "uniform":
                mask[(torch.floor(torch.arange(k) * (n / k)).long() + self.frames_seen) % n] = True
            else:
                gen = torch.Generator().manual_seed(self.frames_seen)
                mask[torch.randperm(n, generator=gen)[:k]] = True
            self.frames_seen += 1
            masks.append(mask.to(scores.device))
        self.dynamic = masks[-1].view_as(scores[0])
        return self._anchored(masks)

    def _scene_change(self, means: list[float]) -> bool:
        """Whether a frame's mean difference jumps above ``scene_jump`` times the running mean (updated here)."""
        jump = False
        for g in means:
            if self.scene_jump is not None and self.mean_diff is not None:
                jump |= g > self.scene_jump * max(self.mean_diff, SCENE_FLOOR)
            self.mean_diff = g if self.mean_diff is None else self.ema * self.mean_diff + (1 - self.ema) * g
        return jump

    def _keyframe(self, frames: int) -> list[None]:
        self.keyframes += 1
        self.reset()
        return [None] * frames
