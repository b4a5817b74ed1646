"""Map-Guided Caching: a per-run Temporal Variation Map, predicted before denoising, planned globally.

Before the first denoising step the Map Predictor (:mod:`kinegen.models.map_predictor`) turns
the prompt embedding, the initial noise, the size, the step count and the guidance into a TVMap
(:mod:`kinegen.caching.tvmap`): for each block group and step, how much the group's contribution
will change. The planners (:mod:`kinegen.caching.planner`) choose, per group, on which steps to
compute and where to reuse, minimising the accumulated predicted drift weighted by the step-sensitivity
profile measured at calibration, within the compute budget of the requested speedup. By default
(``planner="nested"``, :func:`planner.nested_plan`) the groups are nested in execution order, so the
computed groups of a step always form a prefix of the network; ``planner="dp"`` plans every group on
its own (orientation + quantity planners), ``planner="threshold"`` is the greedy per-step ablation.
During denoising the block hooks only look up a host-side boolean plan: no device syncs, no thresholds.

Hooks (diffusers ``ModelHook``): one root hook on the transformer (counts steps per guidance
branch, predicts and plans at step 0, measures the time spent outside the blocks) and one hook per
block (computes, or reuses the group's cached contribution). State is kept per cache context
(``"cond"``/``"uncond"``), so separate classifier-free-guidance calls never share caches; the
plan is shared by the branches of one run. Reuse modes (``reuse=``):

- ``output``: ``h_g^t = h_g^s`` (the group's cached output);
- ``residual``: ``h_g^t = x_g^t + r_g^s`` (input plus the cached residual; default);
- ``extrapolate``: ``h_g^t = x_g^t + r_g^s + (t-s)/(s-s') (r_g^s - r_g^{s'})`` (first order).

Maps come from (``map=``): ``predicted`` (the trained predictor), ``average`` (the predictor's
average map, the same for every prompt), ``recorded`` (recorded once with a dense run per model,
size and step count, then reused), ``oracle`` (this very request recorded densely first; for
ablations) or ``auto`` (predicted where a trained predictor for the model exists, otherwise
recorded, otherwise an error). The run's stats say which was used and why.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers.hooks import ModelHook

from ..accelerate import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters import get_adapter, transformers_of
from ..errors import ConfigError
from . import planner as planners
from .tvmap import TVMap, resample, save_heatmap

REUSE_MODES = ("output", "residual", "extrapolate")
MAP_SOURCES = ("auto", "predicted", "average", "recorded", "oracle")
PLANNERS = ("nested", "dp", "threshold")
HOOK_ROOT = "kinegen_mapguided_root"
HOOK_BLOCK = "kinegen_mapguided_block"

# Per-process memory shared by runs: recorded maps, and (seconds outside, seconds inside the blocks) of
# fully computed transformer calls, by model and size.
_RECORDED_MAPS: dict[tuple, TVMap] = {}
_OVERHEADS: dict[tuple, list[tuple[float, float]]] = {}


@dataclasses.dataclass
class MapGuidedCacheConfig:
    """Settings of Map-Guided Caching (``--cache mapguided:speedup=3``).

    Attributes:
        speedup: requested transformer speedup (1 = no reuse, bit-identical to dense).
        reuse: ``output``, ``residual`` or ``extrapolate`` (see the module docstring).
        map: ``auto``, ``predicted``, ``average``, ``recorded`` or ``oracle``.
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
        num_inference_steps: step count when neither the pipeline nor the caller passes one.
        record: compute everything and record the true map (calibration).
    """

    speedup: float = 2.0
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
    num_inference_steps: int | None = None
    record: bool = False

    def __post_init__(self):
        if not math.isfinite(self.speedup) or self.speedup < 1.0:
            raise ValueError(f"speedup must be >= 1 (1 = no caching), got {self.speedup}")
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
        if self.num_inference_steps is not None and self.num_inference_steps < 2:
            raise ValueError("num_inference_steps must be >= 2")

    @property
    def guards(self) -> planners.Guards:
        return planners.Guards(self.warmup, self.cooldown, self.max_reuse)


# ---------------------------------------------------------------------------- features


def _mean_text_embedding(enc: torch.Tensor | None) -> torch.Tensor:
    """Mean over non-padding tokens (zero rows are padding in Wan) and over the batch."""
    if enc is None:
        raise ConfigError("mapguided: the transformer call has no encoder_hidden_states to predict a map from.")
    enc = enc.detach().float()
    if enc.ndim == 2:
        enc = enc[None]
    keep = (enc.abs().sum(-1, keepdim=True) > 0).float()
    return ((enc * keep).sum(1) / keep.sum(1).clamp_min(1.0)).mean(0)


def _latent_stats(latents: torch.Tensor, latent_format: str) -> torch.Tensor:
    """Per-channel mean and std of the first transformer input, averaged over the batch."""
    x = latents.detach().float()
    cdim = {"BCFHW": 1, "BFCHW": 2, "BNC": 2}[latent_format]
    x = x.movedim(cdim, -1).reshape(x.shape[0], -1, x.shape[cdim])
    return torch.cat([x.mean(1).mean(0), x.std(1).mean(0)])


def run_features(grid: tuple[int, int, int], steps: int, guidance: float, text: torch.Tensor,
                 latent_stats: torch.Tensor) -> torch.Tensor:
    """The Map Predictor's input vector (see :mod:`kinegen.models.map_predictor`)."""
    f, h, w = grid
    scalars = torch.tensor([math.log1p(f), math.log1p(h * w), steps / 50.0, guidance / 10.0])
    return torch.cat([text.cpu(), latent_stats.cpu(), scalars]).float()


# ---------------------------------------------------------------------------- predictor lookup


def bundled_predictor_dir(model_key: str) -> Path | None:
    from ..loading import ASSETS_DIR

    folder = Path(ASSETS_DIR) / "predictors" / model_key
    return folder if (folder / "config.json").is_file() else None


def _load_predictor(config: MapGuidedCacheConfig, run: RunInfo, transformer, group_names: list[str]):
    """(predictor or None, reason it is absent)."""
    from ..models.map_predictor import MapPredictor, fingerprints_match, weights_fingerprint

    explicit = bool(config.predictor)
    folder = Path(config.predictor) if explicit else bundled_predictor_dir(run.model_key)
    if folder is None:
        return None, f"no trained Map Predictor ships for {run.model_key or 'this model'}"
    pred = MapPredictor.load(folder)
    c = pred.config
    problems = []
    if c.transformer_class != type(transformer).__name__:
        problems.append(f"it was trained for {c.transformer_class}, this model is {type(transformer).__name__}")
    if list(c.group_names) != list(group_names):
        problems.append(f"its {len(c.group_names)} block groups differ from this model's {len(group_names)} "
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


# ---------------------------------------------------------------------------- state


class _Entry:
    """One group's cache in one branch."""

    __slots__ = ("res", "res_step", "prev", "prev_step", "out")

    def __init__(self):
        self.res = self.prev = self.out = None
        self.res_step = self.prev_step = -1


class _BranchState:
    """Per cache context (guidance branch)."""

    def __init__(self):
        self.reset()

    def reset(self, *args, **kwargs):
        self.calls = 0
        self.step = 0
        self.group_in: dict[int, tuple] = {}
        self.cache: dict[int, _Entry] = {}
        self.record: dict[tuple[int, int], torch.Tensor] = {}


@dataclasses.dataclass
class _RunState:
    """One pipeline call: the map, the plan and what was executed, shared by the branches."""

    steps: int
    branches: set = dataclasses.field(default_factory=set)
    map: np.ndarray | None = None
    map_source: str = ""
    features: torch.Tensor | None = None
    text_dim: int = 0
    grid: tuple | None = None
    plan: planners.Plan | None = None
    overhead_used: float | None = None
    capped_to: float | None = None
    predict_s: float = 0.0
    plan_s: float = 0.0
    executed: int = 0  # block evaluations run
    reused: int = 0  # block evaluations replaced by the cache
    forced_no_cache: int = 0  # planned reuse with nothing cached yet (computed instead)
    calls: int = 0
    t_call: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    fully_computed: bool = True


class MapGuidedCache:
    """The controller behind the hooks of one transformer (see the module docstring)."""

    def __init__(self, transformer, config: MapGuidedCacheConfig, run: RunInfo, record_only: bool = False):
        from diffusers.hooks.hooks import StateManager

        self.transformer = transformer
        self.config = config
        self.info = run
        self.record_only = record_only or config.record
        self.adapter = get_adapter(transformer)
        self.groups: list[list[tuple[str, torch.nn.Module]]] = []
        for list_name in self.adapter.block_lists:
            blocks = [(f"{list_name}.{i}", b) for i, b in enumerate(getattr(transformer, list_name))]
            for i in range(0, len(blocks), config.group_size):
                self.groups.append(blocks[i:i + config.group_size])
        self.group_names = [g[0][0] if len(g) == 1 else f"{g[0][0]}-{g[-1][0].rsplit('.', 1)[1]}"
                            for g in self.groups]
        self.group_costs = np.array([float(len(g)) for g in self.groups])
        self.state = StateManager(_BranchState)
        self.run: _RunState | None = None
        self.last: _RunState | None = None
        self.last_records: dict[str, dict] = {}
        self.predictor = None
        self.predictor_note = ""
        self.sensitivity: np.ndarray | None = None  # the step-sensitivity profile in use (normalised time)
        self.plan_override: np.ndarray | None = None  # a fixed [steps, groups] plan (sensitivity probes)
        self.sync = transformer.device.type == "cuda"
        self._signature = inspect.signature(type(transformer).forward)
        self._registries: list = []
        self._hooks_installed = False

    # -- steps and runs ----------------------------------------------------------------

    def _steps(self) -> int:
        ctx = self.state._context
        steps = (ctx.num_inference_steps if ctx is not None and ctx.num_inference_steps else None) \
            or self.info.num_inference_steps or self.config.num_inference_steps
        if not steps:
            raise ConfigError("mapguided needs the number of inference steps: pass RunInfo(num_inference_steps=...) "
                              "or num_inference_steps= in the config.")
        return int(steps)

    def _branch(self) -> _BranchState:
        from diffusers.hooks.hooks import CacheContext

        if self.state._context is None:
            self.state.set_context(CacheContext(name="inference"))
        return self.state.get_state()

    def begin_call(self, args, kwargs) -> None:
        st = self._branch()
        steps = self._steps()
        ctx = self.state._context
        step = ctx.step_index if ctx.step_index is not None else st.calls % steps
        name = ctx.name
        if step == 0 and (self.run is None or name in self.run.branches):
            self._finish_run()
            self.run = _RunState(steps=steps)
        if self.run is None:  # joined mid-run (e.g. the second expert of Wan 2.2): plan now
            self.run = _RunState(steps=steps)
        run = self.run
        if step == 0:
            st.group_in.clear()
            st.cache.clear()
            st.record.clear()
        run.branches.add(name)
        st.step = step
        run.calls += 1
        if run.features is None:
            bound = self._signature.bind_partial(self.transformer, *args, **kwargs).arguments
            self._predict(run, bound)
        if run.plan is None and not self.record_only and (step >= 1 or self._overhead() is not None):
            self._plan(run)
        run.fully_computed = run.plan is None or bool(run.plan.compute[min(step, steps - 1)].all())
        if run.fully_computed and self.config.overhead is None:
            if self.sync:
                torch.cuda.synchronize()
            run.t_call = time.perf_counter()
            run.t_first = run.t_last = None

    def end_call(self) -> None:
        st = self._branch()
        run = self.run
        st.calls += 1
        if run is None:
            return
        if run.fully_computed and self.config.overhead is None and run.t_first is not None and run.t_last is not None:
            if self.sync:
                torch.cuda.synchronize()
            total = time.perf_counter() - run.t_call
            inside = run.t_last - run.t_first
            if total > 0:
                _OVERHEADS.setdefault(self._size_key(run), []).append((max(0.0, total - inside), inside))

    def _finish_run(self) -> None:
        if self.run is not None:
            self.last = self.run
            if self.record_only:
                self.last_records = self._collect_records()
        self.run = None

    def reset(self) -> None:
        self._finish_run()
        self.state.reset()

    # -- the map and the plan ------------------------------------------------------------

    def _size_key(self, run: _RunState) -> tuple:
        return (self.info.model_key or id(self.transformer), run.grid, self.config.group_size)

    def _overhead(self) -> float | None:
        if self.config.overhead is not None:
            return self.config.overhead
        if self.run is None or self.run.grid is None:
            return None
        got = _OVERHEADS.get(self._size_key(self.run))
        if not got:
            return None
        # the fastest observation of each part (the first call of a process is slow for one-off reasons)
        outside, inside = min(o for o, _ in got), min(i for _, i in got)
        return outside / (outside + inside) if outside + inside > 0 else 0.0

    def _predict(self, run: _RunState, bound: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        layout = self.adapter.token_layout(self.transformer, bound)
        run.grid = tuple(int(x) for x in layout.grid)
        text = _mean_text_embedding(bound.get("encoder_hidden_states"))
        run.text_dim = int(text.numel())
        stats = _latent_stats(bound["hidden_states"], self.adapter.latent_format)
        guidance = float(self.info.guidance_scale if self.info.guidance_scale is not None else 1.0)
        run.features = run_features(run.grid, run.steps, guidance, text, stats)
        if self.record_only:
            return
        source = self.source
        if source in ("predicted", "average") and run.features.numel() != self.predictor.config.feature_dim:
            raise ConfigError(
                f"mapguided: the Map Predictor expects {self.predictor.config.feature_dim} input features (text width "
                f"{self.predictor.config.text_dim}), this model gives {run.features.numel()} (text width "
                f"{run.text_dim}); it was trained for another model. Calibrate this one with `kinegen calibrate`.")
        if source == "predicted":
            with torch.no_grad():
                log_map = self.predictor(run.features[None])[0]
            run.map = resample(np.exp(log_map.double().numpy()), run.steps)
        elif source == "average":
            run.map = resample(np.exp(self.predictor.average_log_map().double().numpy()), run.steps)
        elif source in ("recorded", "oracle"):
            run.map = self.recorded_map.resample(run.steps).values
        run.map_source = self.source_note
        run.predict_s = time.perf_counter() - t0

    def _plan(self, run: _RunState) -> None:
        t0 = time.perf_counter()
        overhead = self._overhead() or 0.0
        run.overhead_used = overhead
        target = self.config.speedup
        top = planners.max_speedup(run.steps, self.config.guards, overhead)
        if target > top:  # the measured overhead leaves less to save than the request needs: say so, plan the most
            run.capped_to = target = top
        if self.plan_override is not None:
            fixed = np.asarray(self.plan_override, dtype=bool)
            if fixed.shape != (run.steps, len(self.groups)):
                raise ConfigError(f"mapguided: a fixed plan must be [steps, groups] = {(run.steps, len(self.groups))}; "
                                  f"got {fixed.shape}")
            run.plan = planners.Plan(fixed, self.group_costs, 0.0)
            run.plan_s = time.perf_counter() - t0
            return
        plan_fn = {"nested": planners.nested_plan, "dp": planners.quantity_plan,
                   "threshold": planners.threshold_plan}[self.config.planner]
        weights = None if self.sensitivity is None else resample_profile(self.sensitivity, run.steps)
        run.plan = plan_fn(run.map, target, self.config.guards, self.group_costs, overhead, weights)
        run.plan_s = time.perf_counter() - t0

    # -- block execution -------------------------------------------------------------------

    def block_forward(self, hook, module, args, kwargs):
        meta = hook.meta
        st = self._branch()
        run = self.run
        g, t = hook.group, st.step
        hidden = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args, kwargs)
        enc = None
        if meta.return_encoder_hidden_states_index is not None:
            enc = meta._get_parameter_from_args_kwargs(meta.encoder_hidden_states_argument_name, args, kwargs)
        if hook.first:
            st.group_in[g] = (hidden, enc)
            if run is not None and run.fully_computed and g == 0:
                if self.sync:
                    torch.cuda.synchronize()
                run.t_first = time.perf_counter()
        compute = (self.record_only or run is None or run.plan is None or t >= run.plan.compute.shape[0]
                   or bool(run.plan.compute[t, g]))
        if not compute and st.cache.get(g) is None:
            compute = True
            if hook.last and run is not None:
                run.forced_no_cache += 1
        if compute:
            out = hook.fn_ref.original_forward(*args, **kwargs)
            if run is not None:
                run.executed += 1
            if hook.last:
                self._store(st, g, t, out, meta)
                if run is not None and run.fully_computed and g == len(self.groups) - 1:
                    if self.sync:
                        torch.cuda.synchronize()
                    run.t_last = time.perf_counter()
            return out
        run.reused += 1
        if not hook.last:
            return _pack(meta, hidden, enc)
        h_in, e_in = st.group_in[g]
        return _pack(meta, *self._approximate(st.cache[g], t, h_in, e_in))

    def _store(self, st: _BranchState, g: int, t: int, out, meta) -> None:
        h_out, e_out = _unpack(meta, out)
        h_in, e_in = st.group_in[g]
        entry = st.cache.setdefault(g, _Entry())
        if self.config.reuse == "output" and not self.record_only:
            entry.out = (h_out, e_out)
            entry.res_step = t
            return
        res = (h_out - h_in, None if e_out is None else e_out - e_in)
        if self.record_only and entry.res is not None and entry.res_step == t - 1:
            num = (res[0] - entry.res[0]).abs().sum()
            den = h_out.abs().sum()
            if res[1] is not None:
                num = num + (res[1] - entry.res[1]).abs().sum()
                den = den + e_out.abs().sum()
            st.record[(t, g)] = (num / den.clamp_min(1e-12)).detach().float()
        entry.prev, entry.prev_step = entry.res, entry.res_step
        entry.res, entry.res_step = res, t

    def _approximate(self, entry: _Entry, t: int, h_in, e_in):
        mode = self.config.reuse
        if mode == "output":
            return entry.out
        (rh, re_) = entry.res
        if mode == "extrapolate" and entry.prev is not None:
            a = (t - entry.res_step) / (entry.res_step - entry.prev_step)
            ph, pe = entry.prev
            rh = rh + a * (rh - ph)
            re_ = None if re_ is None else re_ + a * (re_ - pe)
        if rh.shape != h_in.shape:
            raise RuntimeError(f"mapguided: cached residual {tuple(rh.shape)} does not fit the block input "
                               f"{tuple(h_in.shape)}; did the sequence length change within a run?")
        return h_in + rh, (None if e_in is None else e_in + re_)

    # -- recording ------------------------------------------------------------------------

    def _collect_records(self) -> dict[str, dict]:
        out = {}
        for name, st in self.state._state_cache.items():
            if not st.record:
                continue
            steps = self.last.steps if self.last else self._steps()
            values = np.full((steps, len(self.groups)), np.nan)
            for (t, g), v in st.record.items():
                values[t, g] = float(v)
            values[0] = values[1]
            out[name] = {"values": values}
        return out

    def recorded(self) -> dict:
        """The last recorded run: its map (mean over guidance branches), grid and predictor features."""
        if not self.last_records:
            raise RuntimeError("mapguided: nothing recorded yet (run the pipeline with record=True first).")
        maps = np.stack([r["values"] for r in self.last_records.values()])
        if np.isnan(maps).any():
            raise RuntimeError("mapguided: the recorded map has gaps (some steps were not computed twice in a row).")
        return {"map": TVMap(maps.mean(0), list(self.group_names)), "grid": self.last.grid,
                "features": self.last.features, "text_dim": self.last.text_dim}

    # -- sources ---------------------------------------------------------------------------

    def resolve_source(self, pipe) -> None:
        """Pick the map source before any hook runs (recording needs a clean, dense pipeline)."""
        c, info = self.config, self.info
        if self.record_only:
            self.source, self.source_note = "record", "recording (every block computed)"
            return
        want = c.map
        if want in ("auto", "predicted", "average"):
            self.predictor, self.predictor_note = _load_predictor(c, info, self.transformer, self.group_names)
            if self.predictor is not None and info.shape_key is not None:
                sizes = [tuple(x) for x in self.predictor.config.trained_sizes]
                if sizes and tuple(info.shape_key) not in sizes:
                    note = (f"the Map Predictor was calibrated at (frames, height, width) {sizes}; this run's "
                            f"size {tuple(info.shape_key)} is not among them")
                    if want == "predicted":
                        raise ConfigError(f"mapguided: {note}. Calibrate at this size (`kinegen calibrate ... "
                                          "--height H --width W --frames F`) or use map=recorded.")
                    if want == "auto":
                        self.predictor, self.predictor_note = None, note
        if want == "auto":
            want = "predicted" if self.predictor is not None else "recorded"
        if c.sensitivity:
            holder = self.predictor
            if holder is None and want in ("recorded", "oracle"):
                holder, _ = _load_predictor(c, info, self.transformer, self.group_names)
            if holder is not None and holder.config.sensitivity:
                self.sensitivity = np.asarray(holder.config.sensitivity, dtype=np.float64)
        if want in ("predicted", "average") and self.predictor is None:
            raise ConfigError(f"mapguided: map={c.map} needs a trained Map Predictor, but {self.predictor_note}. "
                              "Train one with `kinegen calibrate --model M --prompts FILE`, pass predictor=FOLDER, "
                              "or use map=recorded.")
        self.source = want
        if want == "predicted":
            self.source_note = "predicted by the Map Predictor"
        elif want == "average":
            self.source_note = "the Map Predictor's average map (same for every prompt)"
        else:
            self._record_for(pipe, want)
            fallback = f" ({self.predictor_note})" if c.map == "auto" and self.predictor_note else ""
            self.source_note = ("oracle: this request recorded with a dense run first" if want == "oracle" else
                                "recorded once with a dense run for this model, size and step count" + fallback)

    def _record_for(self, pipe, want: str) -> None:
        key = (self.info.model_key or id(self.transformer), self.info.shape_key, self.info.num_inference_steps,
               self.config.group_size, self.info.guidance_scale)
        if want == "recorded" and key in _RECORDED_MAPS:
            self.recorded_map = _RECORDED_MAPS[key]
            return
        if self.info.dense_call is None:
            raise ConfigError(f"mapguided: map={want} records a map with one dense run, and no run was given "
                              "(use it through kinegen generate/profile, or pass a predictor).")
        rec = record_map(pipe, self.info, group_size=self.config.group_size)
        self.recorded_map = rec["map"]
        if want == "recorded":
            _RECORDED_MAPS[key] = rec["map"]

    # -- install ---------------------------------------------------------------------------

    def install(self) -> None:
        from diffusers.hooks import HookRegistry

        root = HookRegistry.check_if_exists_or_initialize(self.transformer)
        root.register_hook(_RootHook(self), HOOK_ROOT)
        self._registries.append(root)
        for g, group in enumerate(self.groups):
            for i, (_, block) in enumerate(group):
                reg = HookRegistry.check_if_exists_or_initialize(block)
                reg.register_hook(_BlockHook(self, g, first=i == 0, last=i == len(group) - 1), HOOK_BLOCK)
                self._registries.append(reg)
        root.invalidate_child_registries_cache()
        self._hooks_installed = True

    def uninstall(self) -> None:
        if not self._hooks_installed:
            return
        root, *blocks = self._registries
        for reg in blocks:
            reg.remove_hook(HOOK_BLOCK, recurse=False)
        root.remove_hook(HOOK_ROOT, recurse=False)
        root.invalidate_child_registries_cache()
        self._registries.clear()
        self._hooks_installed = False

    # -- stats -----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        run = self.run or self.last
        out: dict[str, Any] = {"map_source": getattr(self, "source_note", ""), "reuse": self.config.reuse,
                               "groups": list(self.group_names),
                               "sensitivity": ("the predictor's step-sensitivity profile"
                                               if self.sensitivity is not None else "none (every step weighted 1)")}
        if run is None:
            return out
        total = run.executed + run.reused
        out.update({
            "requested_speedup": self.config.speedup,
            "steps": run.steps,
            "achieved_compute_fraction": run.executed / total if total else 1.0,
            "planned_compute_fraction": run.plan.compute_fraction if run.plan is not None else 1.0,
            "block_evaluations": total, "block_evaluations_executed": run.executed,
            "computed_without_cache": run.forced_no_cache,
            "overhead_fraction_used": run.overhead_used,
            "speedup_capped_to": run.capped_to,
            "predict_ms": run.predict_s * 1e3, "plan_ms": run.plan_s * 1e3,
            "token_grid": list(run.grid) if run.grid else None,
        })
        if run.map is not None:
            out["map"] = np.asarray(run.map).round(6).tolist()
        if run.plan is not None:
            out["plan"] = run.plan.compute.astype(int).tolist()
            out["predicted_error"] = run.plan.predicted_error
        return out


def _unpack(meta, out):
    if meta.return_encoder_hidden_states_index is None:
        return (out[0] if isinstance(out, tuple) else out), None
    return out[meta.return_hidden_states_index], out[meta.return_encoder_hidden_states_index]


def _pack(meta, hidden, enc):
    if meta.return_encoder_hidden_states_index is None:
        return hidden
    ret = [None] * (max(meta.return_hidden_states_index, meta.return_encoder_hidden_states_index) + 1)
    ret[meta.return_hidden_states_index] = hidden
    ret[meta.return_encoder_hidden_states_index] = enc
    return tuple(ret)


class _RootHook(ModelHook):
    _is_stateful = True

    def __init__(self, ctrl: MapGuidedCache):
        super().__init__()
        self.ctrl = ctrl
        self.state_manager = ctrl.state

    def pre_forward(self, module, *args, **kwargs):
        self.ctrl.begin_call(args, kwargs)
        return args, kwargs

    def post_forward(self, module, output):
        self.ctrl.end_call()
        return output

    def reset_state(self, module):
        self.ctrl.reset()
        return module


class _BlockHook(ModelHook):
    _is_stateful = True

    def __init__(self, ctrl: MapGuidedCache, group: int, first: bool, last: bool):
        super().__init__()
        self.ctrl = ctrl
        self.state_manager = ctrl.state
        self.group, self.first, self.last = group, first, last
        self.meta = None

    def initialize_hook(self, module):
        from diffusers.hooks._helpers import TransformerBlockRegistry

        try:
            self.meta = TransformerBlockRegistry.get(type(module))
        except ValueError:
            raise ConfigError(f"mapguided: diffusers has no block metadata for {type(module).__name__}; register it "
                              "with diffusers.hooks._helpers.TransformerBlockRegistry.") from None
        return module

    @torch.compiler.disable
    def new_forward(self, module, *args, **kwargs):
        return self.ctrl.block_forward(self, module, args, kwargs)

    def reset_state(self, module):
        return module


# ---------------------------------------------------------------------------- public API


class MapGuidedCacheHandle(AcceleratorHandle):
    """What :func:`apply_map_guided_cache` returns: ``stats()``, ``remove()``, ``save_heatmap(path)``."""

    def __init__(self, config, controllers: list[MapGuidedCache]):
        self.controllers = controllers

        def remove():
            for c in controllers:
                c.uninstall()

        super().__init__("mapguided", config, remove, self._stats)

    def _stats(self) -> dict:
        if len(self.controllers) == 1:
            return self.controllers[0].stats()
        return {"transformers": [c.stats() for c in self.controllers]}

    def save_heatmap(self, path, index: int = 0) -> str:
        """Write the last run's map and plan as a PNG heatmap."""
        c = self.controllers[index]
        run = c.run or c.last
        if run is None or run.map is None:
            raise RuntimeError("mapguided: no map yet; run the pipeline first.")
        plan = run.plan.compute if run.plan is not None else None
        title = f"{c.info.model_key} speedup {c.config.speedup:g} ({c.source_note})"
        return save_heatmap(path, run.map, plan, c.group_names, title)


def apply_map_guided_cache(pipe_or_transformer, config: MapGuidedCacheConfig | None = None,
                           run: RunInfo | None = None) -> MapGuidedCacheHandle:
    """Install Map-Guided Caching on a pipeline's transformer(s) (or on a transformer).

    Removable with ``handle.remove()``; ``handle.stats()`` has the map, the plan, the requested and
    achieved compute fractions and the map's source.
    """
    config = config or MapGuidedCacheConfig()
    run = run or RunInfo()
    transformers = transformers_of(pipe_or_transformer)
    if config.num_inference_steps and not run.num_inference_steps:
        run = dataclasses.replace(run, num_inference_steps=config.num_inference_steps)
    controllers = []
    try:
        for t in transformers:
            if getattr(t, "_kinegen_mapguided", None) is not None:
                raise ConfigError("mapguided is already applied to this transformer; remove it first.")
            c = MapGuidedCache(t, config, run)
            if not c.record_only and run.num_inference_steps:
                _check_reachable(c, run.num_inference_steps)
            c.resolve_source(pipe_or_transformer)
            c.install()
            t._kinegen_mapguided = c
            controllers.append(c)
    except BaseException:
        for c in controllers:
            c.uninstall()
            c.transformer._kinegen_mapguided = None
        raise
    handle = MapGuidedCacheHandle(config, controllers)
    inner = handle._remove

    def remove():
        inner()
        for c in controllers:
            c.transformer._kinegen_mapguided = None

    handle._remove = remove
    return handle


def resample_profile(profile: np.ndarray, steps: int) -> np.ndarray:
    """A per-step weight profile stored on its own step grid, read at ``steps`` points of normalised time."""
    profile = np.asarray(profile, dtype=np.float64)
    if len(profile) == steps:
        return profile
    return np.interp(np.linspace(0, 1, steps), np.linspace(0, 1, len(profile)), profile)


def _check_reachable(c: MapGuidedCache, steps: int) -> None:
    """Fail before the run when the speedup cannot be met even with zero overhead."""
    top = planners.max_speedup(steps, c.config.guards, c.config.overhead or 0.0)
    if c.config.speedup > top * (1 + 1e-9):
        g = c.config.guards
        raise ConfigError(
            f"mapguided: speedup={c.config.speedup:g} is not reachable with {steps} steps (warmup={g.warmup}, "
            f"cooldown={g.cooldown}, max_reuse={g.max_reuse}): at most {top:.2f}x. Lower the speedup, raise "
            "max_reuse, or use more steps.")


def record_map(pipe, run: RunInfo, group_size: int = 1) -> dict:
    """Run ``run.dense_call`` once with every block computed; return the map, token grid and predictor features."""
    config = MapGuidedCacheConfig(record=True, group_size=group_size)
    c = MapGuidedCache(transformers_of(pipe)[0], config, run, record_only=True)
    c.source, c.source_note = "record", "recording (every block computed)"
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


def apply_mapguided_spec(pipe, config: MapGuidedCacheConfig, run: RunInfo) -> AcceleratorHandle:
    return apply_map_guided_cache(pipe, config, run)


register_accelerator("mapguided", MapGuidedCacheConfig, apply_mapguided_spec, kind="cache",
                     summary="Map-Guided Caching (predicted TVMap + DP orientation/quantity planners)")
