"""Where Map-Guided Caching's TVMap comes from (``map=``): one strategy per source, chosen by name.

=============  ==========================================================================================
``predicted``  the trained Map Predictor (:mod:`kinegen.models.map_predictor`) on this run's features
``average``    the predictor's average map, the same for every prompt (ablation)
``recorded``   one dense run with the recording hook per model, size, step count, group size and
               guidance, kept for the process and reused
``oracle``     this very request recorded densely first (ablation: the best a predictor could do)
``auto``       ``predicted`` when a predictor fits this model, size and weights, otherwise ``recorded``
               (the stats say why)
=============  ==========================================================================================

:func:`make_source` builds one from :data:`SOURCES` before any hook is installed (recording needs the
pipeline dense). A source answers :meth:`MapSource.map_for` at the run's first transformer call, once
the predictor's input features are known, and carries the step-sensitivity profile that weights the
planner's costs (from the predictor folder, ``kinegen calibrate``). :func:`record_map` is the
recording pass itself (also what calibration records with).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from ..accelerators.base import RunInfo
from ..adapters import transformers_of
from ..errors import ConfigError
from .map_guided_config import MapGuidedCacheConfig
from .map_guided_controller import MapGuidedCache
from .tvmap import TVMap, resample

# Recorded maps by (model, size, steps, group size, guidance), shared by the runs of a process.
_RECORDED_MAPS: dict[tuple, TVMap] = {}


@dataclasses.dataclass
class SourceContext:
    """What a source may look at: the settings, the run, the transformer and its block groups."""

    config: MapGuidedCacheConfig
    run: RunInfo
    transformer: torch.nn.Module
    group_names: list[str]


class MapSource:
    """One way to get a run's map. ``name`` as ``map=`` spells it, ``note`` what the stats say."""

    name = ""
    note = ""
    sensitivity: np.ndarray | None = None  # the step-sensitivity profile the planner weights drift by
    bound_off = ""  # why the fidelity bound does not hold for this run ("": it does); then the cache computes all

    def prepare(self, pipe) -> None:
        """Work done once before the hooks are installed (a recording run)."""

    def map_for(self, run) -> TVMap | None:
        """The map of a run (``run.steps``, ``run.features``, ``run.text_dim`` are set); ``None`` if no map."""
        raise NotImplementedError


class NoMap(MapSource):
    """No map: a recording run (every block computed) or a fixed plan."""

    def __init__(self, name: str, note: str):
        self.name, self.note = name, note

    def map_for(self, run) -> None:
        return None


RECORDING = NoMap("record", "recording (every block computed)")


class PredictedMap(MapSource):
    name = "predicted"
    note = "predicted by the Map Predictor"

    def __init__(self, ctx: SourceContext, predictor):
        self.predictor = predictor
        self.groups = list(ctx.group_names)
        self.sensitivity = _profile(predictor, ctx.config)

    @classmethod
    def create(cls, ctx: SourceContext) -> PredictedMap:
        predictor, why = load_predictor(ctx)
        if predictor is not None and (size := _size_mismatch(predictor, ctx.run)):
            raise ConfigError(f"mapguided: {size}. Calibrate at this size (`kinegen calibrate ... "
                              "--height H --width W --frames F`) or use map=recorded.")
        if predictor is not None and (guidance := _guidance_mismatch(predictor, ctx.run)):
            raise ConfigError(f"mapguided: {guidance}. Calibrate at this guidance (`kinegen calibrate ... "
                              "--guidance G`, then refit on all the maps.jsonl records together with --maps) or use "
                              "map=recorded (map=auto does).")
        return cls(ctx, _required(predictor, why, ctx))

    def map_for(self, run) -> TVMap:
        _check_features(self.predictor, run)
        with torch.no_grad():
            log_map = self.predictor(run.features[None])[0]
        return TVMap(resample(np.exp(log_map.double().numpy()), run.steps), self.groups)


class AverageMap(PredictedMap):
    name = "average"
    note = "the Map Predictor's average map (same for every prompt)"

    @classmethod
    def create(cls, ctx: SourceContext) -> AverageMap:
        predictor, why = load_predictor(ctx)  # any size: the average map does not read the run
        return cls(ctx, _required(predictor, why, ctx))

    def map_for(self, run) -> TVMap:
        _check_features(self.predictor, run)
        return TVMap(resample(np.exp(self.predictor.mean_log_map.detach().double().numpy()), run.steps), self.groups)


class RecordedMap(MapSource):
    name = "recorded"
    keep = True  # recorded once per model, size and step count, then reused

    def __init__(self, ctx: SourceContext, fallback: str = ""):
        self.ctx = ctx
        self.note = self._note() + (f" ({fallback})" if fallback else "")
        self.recorded: TVMap | None = None
        if ctx.config.sensitivity:  # a predictor folder still holds the model's sensitivity profile
            self.sensitivity = _profile(load_predictor(ctx)[0], ctx.config)

    @classmethod
    def create(cls, ctx: SourceContext) -> RecordedMap:
        return cls(ctx)

    def _note(self) -> str:
        return "recorded once with a dense run for this model, size and step count"

    def prepare(self, pipe) -> None:
        run, c = self.ctx.run, self.ctx.config
        key = (run.model_key or id(self.ctx.transformer), run.shape_key, run.num_inference_steps, c.group_size,
               run.guidance_scale)
        if self.keep and key in _RECORDED_MAPS:
            self.recorded = _RECORDED_MAPS[key]
            return
        if run.dense_call is None:
            raise ConfigError(f"mapguided: map={self.name} records a map with one dense run, and no run was given "
                              "(use it through kinegen generate/profile, or pass a predictor).")
        self.recorded = record_map(pipe, run, group_size=c.group_size)["map"]
        if self.keep:
            _RECORDED_MAPS[key] = self.recorded

    def map_for(self, run) -> TVMap:
        return self.recorded.resample(run.steps)


class OracleMap(RecordedMap):
    name = "oracle"
    keep = False  # this very request, every time

    def _note(self) -> str:
        return "oracle: this request recorded with a dense run first"


def auto_source(ctx: SourceContext) -> MapSource:
    """``predicted`` when a predictor fits this model, size, guidance and weights; otherwise ``recorded``, saying
    why. A guidance outside the predictor's calibrated range also switches the fidelity bound off (no map is
    recorded then, unless ``max_error`` is given: the cache computes everything)."""
    predictor, why = load_predictor(ctx)
    if predictor is not None and (size := _size_mismatch(predictor, ctx.run)):
        predictor, why = None, size
    if predictor is not None and (guidance := _guidance_mismatch(predictor, ctx.run)):
        if ctx.config.max_error is None and ctx.config.speedup != 1.0:
            off = NoMap("off", f"none: {guidance}")
            off.bound_off = (
                f"mapguided: {guidance}. There the fidelity bound does not hold either (on the bundled model at "
                "guidance 6, even a 1.3x plan changed objects' colours), so caching is off (1.00x). Calibrate the "
                "predictor at this guidance, or give max_error=X (max_error=inf) to cache anyway on a recorded map.")
            return off
        predictor, why = None, guidance
    if predictor is not None:
        return PredictedMap(ctx, predictor)
    return RecordedMap(ctx, fallback=why)


SOURCES = {"auto": auto_source, "predicted": PredictedMap.create, "average": AverageMap.create,
           "recorded": RecordedMap.create, "oracle": OracleMap.create}
"""``map=`` -> ``factory(SourceContext) -> MapSource`` (the names of ``MapGuidedCacheConfig.map``)."""


def make_source(ctx: SourceContext) -> MapSource:
    """The source ``ctx.config.map`` names (fails with the valid names)."""
    try:
        factory = SOURCES[ctx.config.map]
    except KeyError:
        raise ConfigError(f"mapguided: unknown map source {ctx.config.map!r}; valid: {', '.join(SOURCES)}.") from None
    return factory(ctx)


# ---------------------------------------------------------------------------- recording


def record_map(pipe, run: RunInfo, group_size: int = 1) -> dict:
    """Run ``run.dense_call`` once with every block computed, on the pipeline's first transformer.

    Returns ``{"map": TVMap, "grid": token grid, "features": the predictor's input, "text_dim": int}``.
    """
    config = MapGuidedCacheConfig(record=True, group_size=group_size)
    c = MapGuidedCache(transformers_of(pipe)[0], config, run, RECORDING, record=True)
    c.install()
    try:
        run.dense_call()
        c.reset()
        if not c.last_records:
            raise ConfigError("mapguided: the dense run made no transformer calls to record a map from; pass a "
                              "dense_call that runs the pipeline (kinegen generate/profile do).")
        return c.recorded()
    finally:
        c.uninstall()


# ---------------------------------------------------------------------------- finding a predictor


def bundled_predictor_dir(model_key: str) -> Path | None:
    """``assets/predictors/MODEL`` when a predictor ships for the model."""
    from ..loading import ASSETS_DIR

    folder = Path(ASSETS_DIR) / "predictors" / model_key
    return folder if (folder / "config.json").is_file() else None


def load_predictor(ctx: SourceContext):
    """(the Map Predictor for this model, or ``None`` and the reason none fits).

    An explicit ``predictor=`` folder that does not fit is an error; a shipped one that does not fit is
    only a reason (``auto`` then records).
    """
    from ..models.map_predictor import MapPredictor, fingerprints_match, weights_fingerprint

    config, run, transformer = ctx.config, ctx.run, ctx.transformer
    explicit = bool(config.predictor)
    folder = Path(config.predictor) if explicit else bundled_predictor_dir(run.model_key)
    if folder is None:
        return None, f"no trained Map Predictor ships for {run.model_key or 'this model'}"
    pred = MapPredictor.load(folder)
    c = pred.config
    problems = []
    if c.transformer_class != type(transformer).__name__:
        problems.append(f"it was trained for {c.transformer_class}, this model is {type(transformer).__name__}")
    if list(c.group_names) != list(ctx.group_names):
        problems.append(f"its {len(c.group_names)} block groups differ from this model's {len(ctx.group_names)} "
                        f"(group_size={config.group_size})")
    if run.model_key and c.model_key and c.model_key != run.model_key and not explicit:
        problems.append(f"it belongs to {c.model_key}, not {run.model_key}")
    if c.transformer_fingerprint and not problems and not fingerprints_match(
            c.transformer_fingerprint, weights_fingerprint(transformer)):
        problems.append("it was calibrated on other weights of this model (retrained or fine-tuned since)")
    if problems:
        msg = f"Map Predictor {folder} does not fit: " + "; ".join(problems) + \
              ". Train one for this model with `kinegen calibrate --model M --prompts FILE`."
        if explicit:
            raise ConfigError(msg)
        return None, msg
    return pred, ""


def _size_mismatch(predictor, run: RunInfo) -> str:
    """Why the predictor's calibration sizes exclude this run's size ("" when they do not)."""
    if run.shape_key is None:
        return ""
    sizes = [tuple(x) for x in predictor.config.trained_sizes]
    if sizes and tuple(run.shape_key) not in sizes:
        return (f"the Map Predictor was calibrated at (frames, height, width) {sizes}; this run's "
                f"size {tuple(run.shape_key)} is not among them")
    return ""


def _guidance_mismatch(predictor, run: RunInfo) -> str:
    """Why the predictor's calibration guidance scales exclude this run's guidance ("" when they do not)."""
    seen = predictor.config.trained_guidance
    if not seen:
        return ""
    g = 1.0 if run.guidance_scale is None else float(run.guidance_scale)
    if min(seen) - 1e-6 <= g <= max(seen) + 1e-6:
        return ""
    return (f"the Map Predictor was calibrated at guidance {', '.join(f'{x:g}' for x in seen)}; this run's "
            f"guidance {g:g} is outside that range, where its maps are not trusted (the shipped predictor's missed a "
            "third of the true drift at guidance 6)")


def _required(predictor, why: str, ctx: SourceContext):
    if predictor is None:
        raise ConfigError(f"mapguided: map={ctx.config.map} needs a trained Map Predictor, but {why}. "
                          "Train one with `kinegen calibrate --model M --prompts FILE`, pass predictor=FOLDER, "
                          "or use map=recorded.")
    return predictor


def _profile(predictor, config: MapGuidedCacheConfig) -> np.ndarray | None:
    if predictor is None or not config.sensitivity or not predictor.config.sensitivity:
        return None
    return np.asarray(predictor.config.sensitivity, dtype=np.float64)


def _check_features(predictor, run) -> None:
    c = predictor.config
    if run.features.numel() != c.feature_dim:
        raise ConfigError(
            f"mapguided: the Map Predictor expects {c.feature_dim} input features (text width {c.text_dim}), "
            f"this model gives {run.features.numel()} (text width {run.text_dim}); it was trained for another "
            "model. Calibrate this one with `kinegen calibrate`.")
