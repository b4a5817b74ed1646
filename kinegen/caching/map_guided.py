"""Map-Guided Caching: a per-run Temporal Variation Map, predicted before denoising, planned globally.

Before the first denoising step the Map Predictor (:mod:`kinegen.models.map_predictor`) turns
the prompt embedding, the initial noise, the size, the step count and the guidance into a TVMap
(:mod:`kinegen.caching.tvmap`): for each block group and step, how much the group's contribution
will change. The planners (:mod:`kinegen.caching.planner`) choose, per group, on which steps to
compute and where to reuse, minimising the accumulated predicted drift weighted by the step-sensitivity
profile measured at calibration, within the compute budget of the requested speedup. By default
(``planner="nested"``, :func:`planner.nested_plan`) the groups are nested in execution order, so the
computed groups of a step always form a prefix of the network; ``planner="dp"`` plans every group on
its own (the DP orientation planner + the quantity planner), ``planner="threshold"`` is the greedy
per-step ablation. During denoising the block hooks only look up a host-side boolean plan: no device
syncs, no thresholds.

Reuse modes (``reuse=``, :mod:`kinegen.caching.map_guided_reuse`), at a reused step ``t`` with
anchor ``s`` (and the anchor before it ``s'``):

- ``output``: ``h_g^t = h_g^s`` (the group's cached output);
- ``residual``: ``h_g^t = x_g^t + r_g^s`` (input plus the cached residual; default);
- ``extrapolate``: ``h_g^t = x_g^t + r_g^s + (t-s)/(s-s') (r_g^s - r_g^{s'})`` (first order).

Maps come from (``map=``, :mod:`kinegen.caching.map_guided_sources`): ``predicted`` (the trained
predictor), ``average`` (the predictor's average map, the same for every prompt), ``recorded``
(recorded once with a dense run per model, size and step count, then reused), ``oracle`` (this very
request recorded densely first; for ablations) or ``auto`` (predicted where a trained predictor for the
model exists, otherwise recorded). The run's stats say which was used and why.

Where things are:

- this module: the entry points: :func:`apply_map_guided_cache` (the accelerator ``mapguided``),
  :func:`record_map` (one dense run that records the true map) and :func:`apply_fixed_plan` (a given
  plan instead of a planned one; calibration's sensitivity probes), and their handle;
- :mod:`~kinegen.caching.map_guided_config`: :class:`MapGuidedCacheConfig`;
- :mod:`~kinegen.caching.map_guided_sources`: the map sources, predictor lookup, recording;
- :mod:`~kinegen.caching.map_guided_controller`: the controller of one transformer (steps per
  guidance branch, prediction, planning, block execution, stats) and its diffusers hooks;
- :mod:`~kinegen.caching.map_guided_reuse`: what a block group computes, remembers and reuses.

The step count comes from ``RunInfo.num_inference_steps`` only (required); which step a call is, per
guidance branch, from :class:`kinegen.accelerators.base.StepTracker`.
"""

from __future__ import annotations

import numpy as np

from ..accelerators.base import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters import transformers_of
from ..errors import ConfigError
from . import planner as planners
from .map_guided_config import MAP_SOURCES, PLANNERS, REUSE_MODES, MapGuidedCacheConfig
from .map_guided_controller import BlockGroups, MapGuidedCache
from .map_guided_sources import RECORDING, NoMap, SourceContext, make_source, record_map

__all__ = ["MAP_SOURCES", "PLANNERS", "REUSE_MODES", "MapGuidedCache", "MapGuidedCacheConfig",
           "MapGuidedCacheHandle", "apply_fixed_plan", "apply_map_guided_cache", "record_map"]


class MapGuidedCacheHandle(AcceleratorHandle):
    """What the ``apply_*`` functions return: ``stats()``, ``remove()``, ``save_heatmap(path)``."""

    def __init__(self, config, controllers: list[MapGuidedCache]):
        self.controllers = controllers

        def remove():
            for c in controllers:
                c.uninstall()
                c.transformer._kinegen_mapguided = None

        super().__init__("mapguided", config, remove, self._stats)

    def _stats(self) -> dict:
        if len(self.controllers) == 1:
            return self.controllers[0].stats()
        return {"transformers": [c.stats() for c in self.controllers]}

    def save_heatmap(self, path, index: int = 0) -> str:
        """Write the last run's map and plan as a PNG heatmap."""
        from ..plotting import save_heatmap

        c = self.controllers[index]
        run = c.run or c.last
        if run is None or run.map is None:
            raise RuntimeError("mapguided: no map yet; run the pipeline first.")
        plan = run.plan.compute if run.plan is not None else None
        chosen = run.chosen_speedup or 1.0
        title = f"{c.info.model_key} speedup {chosen:.2f} ({c.source.note})"
        return save_heatmap(path, run.map, plan, c.group_names, title)


def apply_map_guided_cache(pipe_or_transformer, config: MapGuidedCacheConfig | None = None,
                           run: RunInfo | None = None) -> MapGuidedCacheHandle:
    """Install Map-Guided Caching on a pipeline's transformer(s) (or on a transformer).

    ``run.num_inference_steps`` is required. Removable with ``handle.remove()``; ``handle.stats()``
    has the map, the plan, the requested and achieved compute fractions and the map's source.
    """
    config = config or MapGuidedCacheConfig()
    run = run or RunInfo()
    steps = run.require_steps("mapguided")

    def controller(transformer) -> MapGuidedCache:
        groups = BlockGroups.of(transformer, config.group_size)
        if config.record:
            return MapGuidedCache(transformer, config, run, RECORDING, groups=groups)
        _check_reachable(config, steps)
        source = make_source(SourceContext(config, run, transformer, groups.names))
        source.prepare(pipe_or_transformer)
        return MapGuidedCache(transformer, config, run, source, groups=groups)

    return _install(config, transformers_of(pipe_or_transformer), controller)


def apply_fixed_plan(pipe, plan, run: RunInfo, *, group_size: int = 1, reuse: str = "residual",
                     note: str = "a fixed plan") -> MapGuidedCacheHandle:
    """Execute a given plan, ``plan[step, group]`` (True = compute), on the pipeline's first transformer.

    No map is predicted or recorded and nothing is planned; reuse works as in
    :func:`apply_map_guided_cache`. ``plan`` must be ``[run.num_inference_steps, groups]`` for the
    groups of ``group_size`` blocks. ``note`` is the stats' ``map_source``.
    """
    steps = run.require_steps("mapguided")
    config = MapGuidedCacheConfig(speedup=1.0, max_error=float("inf"), sensitivity=False, group_size=group_size,
                                  reuse=reuse)  # the plan is given: no bound applies
    fixed = np.asarray(plan, dtype=bool)

    def controller(transformer) -> MapGuidedCache:
        groups = BlockGroups.of(transformer, group_size)
        if fixed.shape != (steps, len(groups.names)):
            raise ConfigError(f"mapguided: a fixed plan must be [steps, groups] = {(steps, len(groups.names))}; "
                              f"got {fixed.shape}")
        return MapGuidedCache(transformer, config, run, NoMap("fixed", note), planner=planners.fixed_plan(fixed),
                              groups=groups)

    return _install(config, transformers_of(pipe)[:1], controller)


def _install(config, transformers, make_controller) -> MapGuidedCacheHandle:
    """One controller per transformer, hooks installed; on any error, those already installed are removed."""
    controllers = []
    try:
        for t in transformers:
            if getattr(t, "_kinegen_mapguided", None) is not None:
                raise ConfigError("mapguided is already applied to this transformer; remove it first.")
            c = make_controller(t)
            c.install()
            t._kinegen_mapguided = c
            controllers.append(c)
    except BaseException:
        for c in controllers:
            c.uninstall()
            c.transformer._kinegen_mapguided = None
        raise
    return MapGuidedCacheHandle(config, controllers)


def _check_reachable(config: MapGuidedCacheConfig, steps: int) -> None:
    """Fail before the run when the speedup cannot be met even with zero overhead."""
    top = planners.max_speedup(steps, config.guards, config.overhead or 0.0)
    if config.speedup is not None and config.speedup > top * (1 + 1e-9):
        g = config.guards
        raise ConfigError(
            f"mapguided: speedup={config.speedup:g} is not reachable with {steps} steps (warmup={g.warmup}, "
            f"cooldown={g.cooldown}, max_reuse={g.max_reuse}): at most {top:.2f}x. Lower the speedup, raise "
            "max_reuse, or use more steps.")


register_accelerator("mapguided", MapGuidedCacheConfig, apply_map_guided_cache, kind="cache",
                     summary="Map-Guided Caching (predicted TVMap + DP orientation/quantity planners)")
