"""The catalogue of built-in accelerators: ``name[:key=value,...]`` -> (accelerator, config) -> handles.

Importing this module imports the accelerator packages, each of which registers its accelerators
with :mod:`kinegen.accelerators.base`; nothing below this module imports it. Every entry point
(the CLI's ``--cache``/``--attention``, the profiler's ``--config``, the web app, the Python API)
parses specs here, with :func:`parse_spec`, and applies them with :func:`accelerate`.
"""

from __future__ import annotations

from typing import Any

from ..caching import diffusers_caches, map_guided  # noqa: F401  (registers the caches)
from ..dasa import apply as dasa_apply  # noqa: F401  (registers dasa)
from ..errors import ConfigError
from ..omniselect import apply as omniselect_apply  # noqa: F401  (registers omniselect)
from ..sparse_attn import apply, backends  # noqa: F401  (registers the attention accelerators)
from .base import ACCELERATORS, KINDS, Accelerator, AcceleratorHandle, RunInfo, build_config, get_accelerator

__all__ = ["accelerate", "get_accelerator", "list_accelerators", "parse_spec", "parse_specs"]


def list_accelerators(kind: str | None = None) -> list[Accelerator]:
    """Every registered accelerator (of ``kind``, if given), in registration order."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"Unknown accelerator kind {kind!r}; valid kinds: {', '.join(KINDS)}.")
    return [a for a in ACCELERATORS.values() if kind is None or a.kind == kind]


def parse_spec(spec: str | Any, kind: str | None = None) -> tuple[Accelerator, Any]:
    """``"name"`` or ``"name:key=value,..."`` (or a registered config object) -> (accelerator, config).

    With ``kind``, an accelerator of another kind is refused (``--cache`` takes caches only).
    """
    if isinstance(spec, str):
        if not spec.strip():
            raise ConfigError("An accelerator spec must be a non-empty string such as 'first-block:threshold=0.08'.")
        name, _, options = spec.strip().partition(":")
        acc = get_accelerator(name.strip())
        config = None
    else:
        acc = next((a for a in ACCELERATORS.values() if isinstance(spec, a.config_cls)), None)
        if acc is None:
            raise ConfigError(f"{type(spec).__name__} is not a registered accelerator config; pass a spec string "
                              f"such as 'mapguided:speedup=2' or one of the registered configs.")
        config = spec
    if kind is not None and acc.kind != kind:
        names = ", ".join(a.name for a in list_accelerators(kind))
        raise ConfigError(f"{acc.name} is {_a(acc.kind)} {acc.kind} accelerator; {_a(kind)} {kind} accelerator was "
                          f"expected ({names}).")
    return acc, (config if config is not None else build_config(acc, options))


def parse_specs(specs) -> list[tuple[Accelerator, Any]]:
    """Several specs (strings, config objects or parsed pairs), at most one of each kind."""
    resolved = [s if isinstance(s, tuple) else parse_spec(s) for s in specs]
    for kind in KINDS:
        names = [a.name for a, _ in resolved if a.kind == kind]
        if len(names) > 1:
            raise ConfigError(f"Only one {kind} accelerator at a time; got {', '.join(names)}.")
    return resolved


def accelerate(pipe, *specs: str | Any, run: RunInfo | None = None) -> list[AcceleratorHandle]:
    """Apply accelerators to ``pipe`` and return their handles (remove them in reverse order).

    Each spec is a string ``"name:key=value,..."``, a registered config instance, or an already
    parsed ``(accelerator, config)`` pair. On any error, accelerators already applied by this call
    are removed again.
    """
    resolved = parse_specs(specs)
    run = run or RunInfo()
    diffusion = [acc for acc, _ in resolved if acc.kind != "prune"]  # pruners check their omni family themselves
    if diffusion:
        from ..adapters import check_supports, get_adapter

        adapter = run.adapter or get_adapter(pipe)
        for acc in diffusion:
            check_supports(adapter, acc)
    handles: list[AcceleratorHandle] = []
    try:
        for acc, config in resolved:
            handles.append(acc.apply(pipe, config, run))
    except BaseException:
        for h in reversed(handles):
            h.remove()
        raise
    return handles


def _a(word: str) -> str:
    """The indefinite article before ``word`` ("a cache", "an attention")."""
    return "an" if word[:1].lower() in "aeiou" else "a"
