"""What every accelerator builds on: the run it is applied to, its handle, the registry, a step tracker.

This module is a leaf: it imports nothing of Kinegen's except :mod:`kinegen.errors` and
:mod:`kinegen.text`. Accelerator packages import it and register themselves here;
:mod:`kinegen.accelerators.catalog` (above them) imports the packages so that every built-in is
registered, and offers ``accelerate``/``parse_spec`` to the rest of Kinegen.

An apply function has one signature::

    apply(pipe, config, run: RunInfo) -> AcceleratorHandle

and the handle it returns has ``.stats()`` (a JSON-able dict) and ``.remove()`` (restore the
pipeline exactly). ``kind`` groups accelerators that cannot be stacked: at most one ``cache`` and
one ``attention`` accelerator at a time (diffusion pipelines), and one ``prune`` (token pruning of
an omni thinker's prefill, :mod:`kinegen.omniselect`).

The step count reaches an accelerator by one channel only: ``RunInfo.num_inference_steps``. Which
step a transformer call belongs to is answered by one :class:`StepTracker` per hook, per guidance
branch (diffusers' cache context ``"cond"``/``"uncond"``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..text import parse_bool

KINDS = ("cache", "attention", "prune")


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What an accelerator may know about the run it is applied to (built once per generation).

    Attributes:
        num_inference_steps: denoising steps of the coming call(s): the only place accelerators
            read the step count from.
        guidance_calls: how classifier-free guidance runs: ``"none"`` (one transformer call per step),
            ``"batched"`` (conditional and unconditional in one batch, e.g. CogVideoX) or ``"separate"``
            (two calls per step, e.g. Wan); caches without per-branch state need to know.
        guidance_scale: the classifier-free guidance scale of the run (an input of the Map Predictor).
        shape_key: ``(frames, height, width)`` of the request, for per-size calibrations.
        dense_call: runs the same generation once without accelerators (for accelerators that
            calibrate on the fly: MagCache without shipped ratios, Map-Guided Caching's recorded maps).
        model_key: identifies the model, for per-model calibration caches and shipped predictors.
        adapter: the model family's adapter (:class:`kinegen.adapters.ModelAdapter`), when known.
    """

    num_inference_steps: int | None = None
    guidance_calls: str = "none"
    guidance_scale: float | None = None
    shape_key: tuple[int | None, int, int] | None = None
    dense_call: Callable[[], Any] | None = None
    model_key: str = ""
    adapter: Any = None

    def require_steps(self, who: str) -> int:
        """The step count, or a clear error naming ``who`` needs it."""
        if not self.num_inference_steps:
            raise ConfigError(f"{who} needs the number of denoising steps: pass "
                              "run=RunInfo(num_inference_steps=N) (kinegen.generate and profile do).")
        return int(self.num_inference_steps)


class AcceleratorHandle:
    """An applied accelerator: ``stats()`` reports what it did, ``remove()`` undoes it."""

    def __init__(self, name: str, config: Any, remove: Callable[[], None], stats: Callable[[], dict] | None = None):
        self.name = name
        self.config = config
        self._remove = remove
        self._stats = stats
        self.removed = False

    def stats(self) -> dict[str, Any]:
        base = {"name": self.name, "config": config_to_dict(self.config)}
        if self._stats is not None:
            base.update(self._stats())
        return base

    def remove(self) -> None:
        if not self.removed:
            self._remove()
            self.removed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self):
        return f"AcceleratorHandle({self.name}, {self.config!r})"


# ---------------------------------------------------------------------------- the registry


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One registered accelerator.

    Attributes:
        requires: a capability the model family's adapter must declare (``"sparse_attention"``), or
            ``None`` when every family with a transformer is supported.
    """

    name: str
    config_cls: type
    apply: Callable[[Any, Any, RunInfo], AcceleratorHandle]
    kind: str
    summary: str
    requires: str | None = None

    def keys(self) -> dict[str, Any]:
        """The config's keys and their defaults, as ``kinegen models --accelerators`` shows them."""
        return {f.name: f.default for f in dataclasses.fields(self.config_cls) if f.init}


ACCELERATORS: dict[str, Accelerator] = {}


def register_accelerator(name: str, config_cls: type, apply: Callable, *, kind: str, summary: str,
                         requires: str | None = None) -> Accelerator:
    """Register an accelerator under ``name``; its config must be a dataclass with defaults for every field."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    if name in ACCELERATORS:
        raise ValueError(f"accelerator {name!r} is already registered")
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError("config_cls must be a dataclass")
    acc = Accelerator(name, config_cls, apply, kind, summary, requires)
    ACCELERATORS[name] = acc
    return acc


def get_accelerator(name: str) -> Accelerator:
    """A registered accelerator by name; the error lists the registered names (sorted: the registration order
    depends on which package was imported first)."""
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise ConfigError(f"Unknown accelerator {name!r}. Valid names: {', '.join(sorted(ACCELERATORS))}.") from None


# ---------------------------------------------------------------------------- configs from text


def _coerce(text: str, typ: Any, key: str, name: str):
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(text, inner[0], key, name)
    try:
        if typ is bool:
            return parse_bool(text)
        if typ is int:
            return int(text)
        if typ is float:
            value = float(text)
            if value != value:  # nan: it would pass every bound check
                raise ValueError(text)
            return value
        if typ is str:
            return text
        if origin is tuple:
            parts = text.replace("-", " ").replace("/", " ").split()
            return tuple(_coerce(p, args[0], key, name) for p in parts)
    except ValueError:
        pass
    else:
        raise ConfigError(f"{name}: cannot handle the type of {key}")
    tname = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{name}: {key}={text!r} is not a valid {tname}.")


def build_config(acc: Accelerator, options: str = ""):
    """``acc``'s config from ``"key=value,key=value"``: unknown keys, bad values and invalid settings
    (including backends that do not exist) fail here, with the valid choices."""
    hints = typing.get_type_hints(acc.config_cls)
    fields = {f.name for f in dataclasses.fields(acc.config_cls) if f.init and not f.name.startswith("_")}
    kwargs = {}
    for item in filter(None, (p.strip() for p in options.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise ConfigError(f"{acc.name}: expected key=value, got {item!r}.")
        if key not in fields:
            raise ConfigError(f"{acc.name}: unknown key {key!r}. Valid keys: {', '.join(sorted(fields)) or '(none)'}.")
        if key in kwargs:
            raise ConfigError(f"{acc.name}: {key} is given twice; give it once.")
        kwargs[key] = _coerce(value.strip(), hints[key], key, acc.name)
    try:
        return acc.config_cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{acc.name}: {e}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain values (tuples as lists, anything else exotic as its repr); writers pass
    it through :func:`kinegen.text.json_safe` for strict JSON."""
    if not dataclasses.is_dataclass(config):
        return {"repr": repr(config)}
    out = {}
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if isinstance(v, tuple):
            v = list(v)
        elif not isinstance(v, (int, float, str, bool, type(None))):
            v = repr(v)
        out[f.name] = v
    return out


# ---------------------------------------------------------------------------- steps per guidance branch


@dataclasses.dataclass(frozen=True)
class Step:
    """Where one transformer call sits: its guidance branch, its step index, and whether it starts a run."""

    branch: str
    index: int
    new_run: bool


class StepTracker:
    """Which denoising step each transformer call belongs to, per guidance branch.

    The step *count* comes from :attr:`RunInfo.num_inference_steps` (``None`` when unknown: calls are
    then numbered without wrapping). The step *index* is the pipeline's own when its cache context
    carries one (diffusers sets ``step_index`` in ``cache_context``), otherwise the branch's call
    count modulo the step count. Branches are told apart by the cache context's name, so Wan's
    separate conditional and unconditional calls each see steps 0, 1, 2, ...
    """

    def __init__(self, num_steps: int | None):
        self.num_steps = int(num_steps) if num_steps else None
        self._calls: dict[str, int] = {}

    def on_call(self, context=None) -> Step:
        """Count one transformer call under ``context`` (a diffusers ``CacheContext`` or ``None``)."""
        branch = getattr(context, "name", None) or "inference"
        calls = self._calls.get(branch, 0)
        index = getattr(context, "step_index", None)
        if index is None:
            index = calls % self.num_steps if self.num_steps else calls
        self._calls[branch] = calls + 1
        return Step(branch, int(index), new_run=int(index) == 0)

    def reset(self) -> None:
        self._calls.clear()
