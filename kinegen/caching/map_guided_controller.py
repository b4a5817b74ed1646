"""The controller of Map-Guided Caching on one transformer, and the diffusers hooks that call it.

Hooks (diffusers ``ModelHook``; :meth:`MapGuidedCache.install`): a root hook on the transformer
calls :meth:`MapGuidedCache.begin_call` / :meth:`~MapGuidedCache.end_call` around every transformer
call, and one hook per block hands the block's call to :meth:`MapGuidedCache.block_forward`. The
hooks hold no logic of their own.

A run (one pipeline call) goes like this:

1. **First call, step 0.** :class:`~kinegen.accelerators.base.StepTracker` says which step (and
   guidance branch) the call is; step 0 of a branch already seen starts a new run. The Map
   Predictor's input features are read from the call's arguments, and the map source
   (:mod:`kinegen.caching.map_guided_sources`) gives the run's TVMap. Step 0 is computed in full and
   timed.
2. **Step 1** (or step 0 when the overhead is already known): the planner (:mod:`kinegen.caching.planner`)
   turns the map, the requested speedup and the measured share of time outside the blocks into a
   boolean plan ``compute[step, group]``, shared by the guidance branches.
3. **Every block call** looks up its cell of the plan: compute (and remember what the reuse mode
   needs), or stand in with the cached contribution (:mod:`kinegen.caching.map_guided_reuse`). The
   inner blocks of a reused group pass their input through; the group's last block returns the
   approximation.

State is kept per cache context (``"cond"``/``"uncond"``: diffusers' ``StateManager``), so separate
classifier-free-guidance calls never share caches. With ``record`` every block is computed and each
step's TVMap entries are kept (:meth:`MapGuidedCache.recorded`).
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from diffusers.hooks import ModelHook

from ..accelerators.base import RunInfo, StepTracker
from ..adapters import get_adapter
from ..errors import ConfigError, FidelityWarning
from ..models.map_predictor import features_of_call
from ..parallel import decide_on_rank0
from . import map_guided_reuse as reuse
from . import planner as planners
from .map_guided_config import MIN_BOUND_STEPS
from .tvmap import TVMap

if TYPE_CHECKING:
    from .map_guided_config import MapGuidedCacheConfig
    from .map_guided_sources import MapSource

HOOK_ROOT = "kinegen_mapguided_root"
HOOK_BLOCK = "kinegen_mapguided_block"

# (seconds outside, seconds inside the blocks) of fully computed transformer calls, by model, token grid and
# group size: shared by the runs of a process.
_OVERHEADS: dict[tuple, list[tuple[float, float]]] = {}
# what planning decides for a run (rank 0's, under --parallel)
_PLAN_FIELDS = ("plan", "overhead_used", "capped_to", "bound", "warning", "chosen_speedup", "plan_s")


@dataclasses.dataclass
class BlockGroups:
    """The transformer's blocks in execution order, cut into groups of ``group_size`` (within one block list)."""

    groups: list[list[tuple[str, torch.nn.Module]]]
    names: list[str]  # "blocks.3", or "blocks.0-1" for a group of two
    costs: np.ndarray  # [G], a group costs its number of blocks

    @classmethod
    def of(cls, transformer, group_size: int) -> BlockGroups:
        adapter = get_adapter(transformer)
        groups = []
        for list_name in adapter.block_lists:
            blocks = [(f"{list_name}.{i}", b) for i, b in enumerate(getattr(transformer, list_name))]
            for i in range(0, len(blocks), group_size):
                groups.append(blocks[i:i + group_size])
        names = [g[0][0] if len(g) == 1 else f"{g[0][0]}-{g[-1][0].rsplit('.', 1)[1]}" for g in groups]
        return cls(groups, names, np.array([float(len(g)) for g in groups]))


class _Branch:
    """What one guidance branch (cache context) keeps during a run."""

    def __init__(self):
        self.reset()

    def reset(self, *args, **kwargs):
        self.step = 0
        self.group_in: dict[int, reuse.Pair] = {}  # input of each group at this step
        self.cache: dict[int, reuse.GroupCache] = {}
        self.record: dict[tuple[int, int], torch.Tensor] = {}  # (step, group) -> TVMap entry


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
    chosen_speedup: float | None = None  # the transformer speedup the plan stands for
    bound: float | None = None  # the fidelity bound the plan was made under (0 when caching is off for the run)
    warning: str = ""  # what was done to a speed request beyond the fidelity bound
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
    """The controller behind the hooks of one transformer (see the module docstring).

    Args:
        config: the settings (speedup, reuse, guards, overhead, group size).
        run: the run it is applied to; its ``num_inference_steps`` is required.
        source: where the run's map comes from (:mod:`kinegen.caching.map_guided_sources`); it also
            carries the step-sensitivity profile.
        planner: ``plan(v, speedup, guards, costs, overhead, weights) -> Plan``; default the config's
            planner (:data:`kinegen.caching.planner.PLANNERS`).
        record: compute every block and record the true map.
    """

    def __init__(self, transformer, config: MapGuidedCacheConfig, run: RunInfo, source: MapSource, *,
                 planner=None, record: bool = False, groups: BlockGroups | None = None):
        from diffusers.hooks.hooks import StateManager

        self.transformer = transformer
        self.config = config
        self.info = run
        self.steps = run.require_steps("mapguided")
        self.source = source
        self.record_only = record or config.record
        self.planner = planner or planners.PLANNERS[config.planner]
        self.adapter = get_adapter(transformer)
        layout = groups or BlockGroups.of(transformer, config.group_size)
        self.groups, self.group_names, self.group_costs = layout.groups, layout.names, layout.costs
        self.state = StateManager(_Branch)
        self.tracker = StepTracker(self.steps)
        self.run: _RunState | None = None
        self.last: _RunState | None = None
        self.last_records: dict[str, dict] = {}
        self.sync = transformer.device.type == "cuda"
        self._signature = inspect.signature(type(transformer).forward)
        self._registries: list = []
        self._hooks_installed = False

    @property
    def sensitivity(self) -> np.ndarray | None:
        """The step-sensitivity profile in use (normalised time), or ``None``."""
        return self.source.sensitivity

    # -- transformer calls -----------------------------------------------------------------

    def begin_call(self, args, kwargs) -> None:
        """Root hook, before the transformer runs: count the step, start a run, predict, plan."""
        branch = self._branch()
        step = self.tracker.on_call(self.state._context)
        if step.new_run and (self.run is None or step.branch in self.run.branches):
            self._finish_run()
            self.run = _RunState(steps=self.steps)
        if self.run is None:  # joined mid-run (e.g. the second expert of Wan 2.2): plan now
            self.run = _RunState(steps=self.steps)
        run = self.run
        if step.new_run:
            branch.reset()
        run.branches.add(step.branch)
        branch.step = step.index
        run.calls += 1
        if run.features is None:
            self._predict(run, self._signature.bind_partial(self.transformer, *args, **kwargs).arguments)
        if run.plan is None and not self.record_only and (step.index >= 1 or self._overhead() is not None):
            self._plan(run)
        run.fully_computed = run.plan is None or bool(run.plan.compute[min(step.index, self.steps - 1)].all())
        if run.fully_computed and self.config.overhead is None:
            run.t_call = self._clock()
            run.t_first = run.t_last = None

    def end_call(self) -> None:
        """Root hook, after the transformer ran: on a fully computed call, note the time outside the blocks."""
        run = self.run
        if run is None or not run.fully_computed or self.config.overhead is not None:
            return
        if run.t_first is not None and run.t_last is not None:
            total = self._clock() - run.t_call
            inside = run.t_last - run.t_first
            if total > 0:
                _OVERHEADS.setdefault(self._size_key(run), []).append((max(0.0, total - inside), inside))

    def reset(self) -> None:
        """End of a pipeline call (diffusers resets stateful hooks)."""
        self._finish_run()
        self.state.reset()
        self.tracker.reset()

    def _branch(self) -> _Branch:
        from diffusers.hooks.hooks import CacheContext

        if self.state._context is None:
            self.state.set_context(CacheContext(name="inference"))
        return self.state.get_state()

    def _finish_run(self) -> None:
        if self.run is not None:
            self.last = self.run
            if self.record_only:
                self.last_records = self._collect_records()
        self.run = None

    def _clock(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    # -- the map and the plan --------------------------------------------------------------

    def _predict(self, run: _RunState, call: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        feats = features_of_call(self.adapter, self.transformer, call, run.steps, self.info.guidance_scale)
        run.grid, run.text_dim, run.features = feats.grid, feats.text_dim, feats.vector
        if self.record_only:
            return
        tvmap = self.source.map_for(run)
        run.map = None if tvmap is None else tvmap.values
        run.map_source = self.source.note
        run.predict_s = time.perf_counter() - t0

    def _plan(self, run: _RunState) -> None:
        """The plan of the run (:meth:`_make_plan`). Under context parallelism (``--parallel``) rank 0 makes it and
        every rank follows it (:func:`kinegen.parallel.decide_on_rank0`): the overhead each rank measures differs,
        and ranks that disagreed on a block would wait for each other forever in its attention."""
        for name, value in decide_on_rank0(self.transformer, lambda: self._make_plan(run)).items():
            setattr(run, name, value)

    def _make_plan(self, run: _RunState) -> dict[str, Any]:
        """The plan of the run: the fastest within the fidelity bound, or the requested speedup unless its
        predicted error passes the bound (then the bound, with a warning). Returns the fields it set."""
        t0 = time.perf_counter()
        overhead = self._overhead() or 0.0
        run.overhead_used = overhead
        c = self.config
        weights = None if self.sensitivity is None else planners.resample_profile(self.sensitivity, run.steps)
        bound = c.error_bound(run.steps)
        target = c.speedup
        off = self.source.bound_off
        if not off and bound <= 0.0 and c.max_error is None and target != 1.0:
            off = (f"mapguided: at {run.steps} steps (fewer than {MIN_BOUND_STEPS}) the planner's error estimate does "
                   "not hold: on the bundled model every plan measured at 10 steps changed objects' colours. Caching "
                   "is off (1.00x); max_error=X or max_error=inf caches anyway.")
        run.bound = 0.0 if off else bound
        if off:  # the bound does not hold for this run: compute everything, and say so
            run.plan = planners.Plan(np.ones((run.steps, len(self.groups)), dtype=bool), self.group_costs, 0.0)
            run.warning = off
            warnings.warn(run.warning, FidelityWarning, stacklevel=2)
        elif target is not None:
            top = planners.max_speedup(run.steps, c.guards, overhead)
            if target > top:  # the measured overhead leaves less to save than the request needs: plan the most
                run.capped_to = target = top
            run.plan = self.planner(run.map, target, c.guards, self.group_costs, overhead, weights)
            err = planners.error_per_step(run.plan)
            if err > bound:
                run.plan, _ = planners.fastest_within(self.planner, run.map, bound, c.guards, self.group_costs,
                                                      overhead, weights)
                limit = (f"the hard limit {bound:g} past which objects start to change colour or shape"
                         if c.max_error is None else f"max_error={bound:g}")
                run.warning = (
                    f"mapguided: speedup={c.speedup:g} would reach a predicted error of {err:.3g} per step, past "
                    f"{limit}; served at {planners.transformer_speedup(run.plan, overhead):.2f}x, the fastest plan "
                    "within it. max_error=X sets another limit; max_error=inf forces the speedup (the output may "
                    "break).")
                warnings.warn(run.warning, FidelityWarning, stacklevel=2)
        else:
            run.plan, _ = planners.fastest_within(self.planner, run.map, bound, c.guards, self.group_costs,
                                                  overhead, weights)
        run.chosen_speedup = planners.transformer_speedup(run.plan, overhead)
        run.plan_s = time.perf_counter() - t0
        return {name: getattr(run, name) for name in _PLAN_FIELDS}

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

    # -- block calls ---------------------------------------------------------------------------

    def block_forward(self, hook: _BlockHook, args, kwargs):
        """Block hook: compute the block, or stand in for it with the group's cached contribution."""
        meta, g = hook.meta, hook.group
        branch, run = self._branch(), self.run
        t = branch.step
        inp = reuse.block_inputs(meta, args, kwargs)
        if hook.first:
            branch.group_in[g] = inp
            if run is not None and run.fully_computed and g == 0:
                run.t_first = self._clock()
        if self._computes(run, branch, g, t, hook.last):
            out = hook.fn_ref.original_forward(*args, **kwargs)
            if run is not None:
                run.executed += 1
            if hook.last:
                self._remember(branch, g, t, reuse.block_outputs(meta, out))
                if run is not None and run.fully_computed and g == len(self.groups) - 1:
                    run.t_last = self._clock()
            return out
        run.reused += 1
        if not hook.last:  # inner blocks of a reused group: the group's last block stands in for all of them
            return reuse.pack_outputs(meta, *inp)
        approx = reuse.REUSE[self.config.reuse](branch.cache[g], t, branch.group_in[g])
        return reuse.pack_outputs(meta, *approx)

    def _computes(self, run: _RunState | None, branch: _Branch, g: int, t: int, last: bool) -> bool:
        """The plan's cell ``(t, g)``; a planned reuse with nothing cached yet is computed (and counted)."""
        if self.record_only or run is None or run.plan is None or t >= run.plan.compute.shape[0] \
                or bool(run.plan.compute[t, g]):
            return True
        if branch.cache.get(g) is None:
            if last:
                run.forced_no_cache += 1
            return True
        return False

    def _remember(self, branch: _Branch, g: int, t: int, out: reuse.Pair) -> None:
        """After a group's last block computed: keep what the reuse mode needs (and, recording, the map entry)."""
        cache = branch.cache.setdefault(g, reuse.GroupCache())
        if self.config.reuse == "output" and not self.record_only:
            reuse.remember_output(cache, t, out)
            return
        prev, prev_step = cache.res, cache.res_step
        res = reuse.remember_residual(cache, t, branch.group_in[g], out)
        if self.record_only and prev is not None and prev_step == t - 1:
            branch.record[(t, g)] = reuse.variation(res, prev, out)

    # -- recording -------------------------------------------------------------------------------

    def _collect_records(self) -> dict[str, dict]:
        out = {}
        for name, st in self.state._state_cache.items():
            if not st.record:
                continue
            values = np.full((self.steps, len(self.groups)), np.nan)
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

    # -- hooks -------------------------------------------------------------------------------------

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

    # -- stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        run = self.run or self.last
        out: dict[str, Any] = {"map_source": self.source.note, "reuse": self.config.reuse,
                               "groups": list(self.group_names),
                               "sensitivity": ("the predictor's step-sensitivity profile"
                                               if self.sensitivity is not None else "none (every step weighted 1)")}
        if run is None:
            return out
        total = run.executed + run.reused
        out.update({
            "requested_speedup": self.config.speedup,
            "max_error": self.config.error_bound(run.steps) if run.bound is None else run.bound,
            "chosen_speedup": run.chosen_speedup,
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
            out["predicted_error_per_step"] = planners.error_per_step(run.plan)
        if run.warning:
            out["warning"] = run.warning
        return out


class _RootHook(ModelHook):
    """On the transformer: tells the controller a call begins and ends."""

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
    """On each block: hands the call to the controller, which computes it or reuses the cache."""

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
        return self.ctrl.block_forward(self, args, kwargs)

    def reset_state(self, module):
        return module
