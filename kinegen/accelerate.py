"""The accelerator registry: ``name[:key=value,...]`` -> (config dataclass, apply function).

Every accelerator, ours or a peer's, registers here once and is then reachable the same
way from the CLI (``--cache first-block:threshold=0.08``), the profiler (``--config ...``),
the Python API (``kinegen.accelerate(pipe, "mag:threshold=0.1")``) and the web UI.

An apply function has one signature::

    apply(pipe, config, run: RunInfo) -> AcceleratorHandle

and the handle it returns has ``.stats()`` (a JSON-able dict) and ``.remove()`` (restore
the pipeline exactly). ``kind`` groups accelerators that cannot be stacked: at most one
``cache`` and one ``attention`` accelerator at a time.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import torch

from .errors import ConfigError

KINDS = ("cache", "attention")


@dataclasses.dataclass
class RunInfo:
    """What an accelerator may need to know about the run it is applied to.

    Attributes:
        num_inference_steps: denoising steps of the coming call(s).
        dense_call: runs the same generation once without accelerators (for peers that
            calibrate on the fly, such as MagCache on a model without shipped ratios).
        model_key: identifies the model, for per-model calibration caches.
        guidance_calls: how classifier-free guidance runs: ``"none"`` (one transformer call per step),
            ``"batched"`` (conditional and unconditional in one batch, e.g. CogVideoX) or ``"separate"``
            (two calls per step, e.g. Wan); caches without per-branch state need to know.
        guidance_scale: the classifier-free guidance scale of the run (an input of the Map Predictor).
        shape_key: ``(frames, height, width)`` of the request, for per-size calibrations.
    """

    num_inference_steps: int | None = None
    guidance_calls: str = "none"
    guidance_scale: float | None = None
    shape_key: tuple[int | None, int, int] | None = None
    dense_call: Callable[[], Any] | None = None
    model_key: str = ""


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


@dataclasses.dataclass(frozen=True)
class Accelerator:
    name: str
    config_cls: type
    apply: Callable[[Any, Any, RunInfo], AcceleratorHandle]
    kind: str
    summary: str
    families: tuple[str, ...] | None = None  # families it supports; None = every adapter-covered model


ACCELERATORS: dict[str, Accelerator] = {}


def register_accelerator(name: str, config_cls: type, apply: Callable, *, kind: str, summary: str,
                         families: tuple[str, ...] | None = None) -> Accelerator:
    """Register an accelerator under ``name``; its config must be a dataclass with defaults for every field."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    if name in ACCELERATORS:
        raise ValueError(f"accelerator {name!r} is already registered")
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError("config_cls must be a dataclass")
    acc = Accelerator(name, config_cls, apply, kind, summary, families)
    ACCELERATORS[name] = acc
    return acc


def _ensure_builtins() -> None:
    from .caching import diffusers_caches, map_guided  # noqa: F401  (registers the caches)
    from .sparse_attn import apply, backends  # noqa: F401  (registers the attention accelerators)


def list_accelerators(kind: str | None = None) -> list[Accelerator]:
    _ensure_builtins()
    return [a for a in ACCELERATORS.values() if kind is None or a.kind == kind]


def get_accelerator(name: str) -> Accelerator:
    _ensure_builtins()
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise ConfigError(f"Unknown accelerator {name!r}. Valid names: {', '.join(ACCELERATORS)}.") from None


# ---------------------------------------------------------------------------- parsing


def _coerce(text: str, typ: Any, key: str, name: str):
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(text, inner[0], key, name)
    try:
        if typ is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
        if origin is tuple:
            parts = [p for p in text.replace("-", " ").replace("/", " ").split()]
            return tuple(_coerce(p, args[0], key, name) for p in parts)
    except ValueError:
        pass
    else:
        raise ConfigError(f"{name}: cannot handle the type of {key}")
    tname = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{name}: {key}={text!r} is not a valid {tname}.")


def parse_spec(spec: str) -> tuple[Accelerator, Any]:
    """Parse ``"name"`` or ``"name:key=value,key=value"`` into (accelerator, config instance)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("An accelerator spec must be a non-empty string such as 'first-block:threshold=0.08'.")
    name, _, rest = spec.strip().partition(":")
    acc = get_accelerator(name.strip())
    hints = typing.get_type_hints(acc.config_cls)
    fields = {f.name for f in dataclasses.fields(acc.config_cls) if f.init and not f.name.startswith("_")}
    kwargs = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise ConfigError(f"{acc.name}: expected key=value, got {item!r}.")
        if key not in fields:
            raise ConfigError(f"{acc.name}: unknown key {key!r}. Valid keys: {', '.join(sorted(fields)) or '(none)'}.")
        kwargs[key] = _coerce(value.strip(), hints[key], key, acc.name)
    try:
        return acc, acc.config_cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{acc.name}: {e}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
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


def spec_label(spec: str | Any) -> str:
    """A short label for reports: the spec string itself, or ``name`` for a config object."""
    if isinstance(spec, str):
        return spec.strip()
    for acc in list_accelerators():
        if isinstance(spec, acc.config_cls):
            return acc.name
    return type(spec).__name__


# ---------------------------------------------------------------------------- applying


def accelerate(pipe, *specs: str | Any, run: RunInfo | None = None) -> list[AcceleratorHandle]:
    """Apply accelerators to ``pipe`` and return their handles (remove them in reverse order).

    Each spec is a string ``"name:key=value,..."`` or a registered config instance.
    On any error, accelerators already applied by this call are removed again.
    """
    from .registry import family_for_pipeline

    run = run or RunInfo()
    resolved = []
    for spec in specs:
        if isinstance(spec, str):
            resolved.append(parse_spec(spec))
            continue
        acc = next((a for a in list_accelerators() if isinstance(spec, a.config_cls)), None)
        if acc is None:
            raise ConfigError(f"{type(spec).__name__} is not a registered accelerator config.")
        resolved.append((acc, spec))
    kinds = [a.kind for a, _ in resolved]
    for kind in KINDS:
        if kinds.count(kind) > 1:
            names = [a.name for a, _ in resolved if a.kind == kind]
            raise ConfigError(f"Only one {kind} accelerator at a time; got {', '.join(names)}.")
    for acc, _ in resolved:
        if acc.families is not None:
            family = family_for_pipeline(pipe).name if not isinstance(pipe, torch.nn.Module) else None
            if family not in acc.families:
                raise ConfigError(f"{acc.name} does not support {family or type(pipe).__name__}; it supports "
                                  f"{', '.join(acc.families)} pipelines.")
    handles: list[AcceleratorHandle] = []
    try:
        for acc, config in resolved:
            handles.append(acc.apply(pipe, config, run))
    except BaseException:
        for h in reversed(handles):
            h.remove()
        raise
    return handles
