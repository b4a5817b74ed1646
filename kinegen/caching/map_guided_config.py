"""The settings of Map-Guided Caching (``--cache mapguided:key=value,...``) and the names they accept."""

from __future__ import annotations

import dataclasses
import math

from . import planner as planners
from .map_guided_reuse import REUSE

REUSE_MODES = tuple(REUSE)  # output, residual, extrapolate
MAP_SOURCES = ("auto", "predicted", "average", "recorded", "oracle")  # kinegen.caching.map_guided_sources.SOURCES
PLANNERS = tuple(planners.PLANNERS)  # nested, dp, threshold

DEFAULT_MAX_ERROR = 0.08
"""The bound a request without ``speedup`` or ``max_error`` plans under (predicted error per step,
:func:`kinegen.caching.planner.error_per_step`): the largest at which no held-out prompt of the bundled model
changed colour, shape or motion and PSNR stayed above 30 dB (benchmarks/caching.md, "The fidelity bound")."""

HARD_MAX_ERROR = 0.10
"""A requested ``speedup`` whose plan would pass this is served at this bound instead, with a warning: past it
objects in outputs of the bundled model start to change colour (benchmarks/caching.md)."""

MIN_BOUND_STEPS = 20
"""Below this many steps the bounds above do not hold and are 0 (caching off, with a warning) unless
``max_error`` is given: at 10 steps every plan measured on the bundled model, even 1.18x at a predicted error
of 0.03 per step, changed objects' colours on held-out prompts (benchmarks/caching.md)."""


@dataclasses.dataclass
class MapGuidedCacheConfig:
    """Settings of Map-Guided Caching (``--cache mapguided``, ``--cache mapguided:speedup=2.5``).

    The step count is not a setting: it comes from the run (``RunInfo.num_inference_steps``).

    Attributes:
        speedup: requested transformer speedup (1 = no reuse, bit-identical to dense); unset (the default), the
            fastest plan within ``max_error``.
        max_error: the predicted error per step a plan may reach (the planner's own estimate of how far reuse
            moves the output, :func:`kinegen.caching.planner.error_per_step`). Unset: ``DEFAULT_MAX_ERROR``
            without a ``speedup`` (the default: a plan that does not visibly change the video), and
            ``HARD_MAX_ERROR`` with one: a speedup that would pass it is served at it, with a warning; both are
            0 below ``MIN_BOUND_STEPS`` steps and at a guidance outside the range the model's predictor was
            calibrated at (caching off, with a warning; :mod:`kinegen.caching.map_guided_sources`). ``inf`` turns
            the bound off (a high speedup can then change colours and shapes).
        reuse: ``output``, ``residual`` or ``extrapolate`` (:mod:`kinegen.caching.map_guided_reuse`).
        map: ``auto``, ``predicted``, ``average``, ``recorded`` or ``oracle``
            (:mod:`kinegen.caching.map_guided_sources`).
        predictor: folder of a trained Map Predictor; empty = the one shipped for this model, if any.
        planner: ``nested`` (orientation + quantity planners, groups nested so that computed groups
            always form a prefix of the network), ``dp`` (the same planners, each group on its own) or
            ``threshold`` (greedy per-step rule, ablation).
        group_size: contiguous blocks planned as one unit (within one block list).
        warmup / cooldown: first / last steps always computed (at least 1 each).
        max_reuse: most consecutive steps a group may reuse its cache.
        sensitivity: weight each step's drift by the step-sensitivity profile the predictor folder holds
            (measured by ``kinegen calibrate``: how much an error made at that step moves the output).
        overhead: share of transformer time outside the blocks; ``None`` measures it on fully computed steps.
        record: compute everything and record the true map (calibration; see also
            :func:`kinegen.caching.map_guided.record_map`).
    """

    speedup: float | None = None
    max_error: float | None = None
    reuse: str = "residual"
    map: str = "auto"
    predictor: str = ""
    planner: str = "nested"
    group_size: int = 1
    warmup: int = 1
    cooldown: int = 1
    max_reuse: int = 4
    sensitivity: bool = True
    overhead: float | None = None
    record: bool = False

    def __post_init__(self):
        if self.speedup is not None and (not math.isfinite(self.speedup) or self.speedup < 1.0):
            raise ValueError(f"speedup must be >= 1 (1 = no caching), got {self.speedup}")
        if self.max_error is not None and not self.max_error >= 0.0:
            raise ValueError(f"max_error must be >= 0 (inf turns the bound off), got {self.max_error}")
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, got {self.reuse!r}")
        if self.map not in MAP_SOURCES:
            raise ValueError(f"map must be one of {', '.join(MAP_SOURCES)}, got {self.map!r}")
        if self.planner not in PLANNERS:
            raise ValueError(f"planner must be one of {', '.join(PLANNERS)}, got {self.planner!r}")
        if self.group_size < 1 or self.warmup < 1 or self.cooldown < 1 or self.max_reuse < 1:
            raise ValueError("group_size, warmup, cooldown and max_reuse must be >= 1")
        if self.overhead is not None and not 0.0 <= self.overhead < 1.0:
            raise ValueError("overhead must be in [0, 1)")

    def error_bound(self, steps: int) -> float:
        """The bound in force for a run of ``steps``: ``max_error`` if given, else the default (no speedup) or the
        hard limit, and 0 below ``MIN_BOUND_STEPS``."""
        if self.max_error is not None:
            return self.max_error
        if steps < MIN_BOUND_STEPS:
            return 0.0
        return DEFAULT_MAX_ERROR if self.speedup is None else HARD_MAX_ERROR

    @property
    def guards(self) -> planners.Guards:
        return planners.Guards(self.warmup, self.cooldown, self.max_reuse)
