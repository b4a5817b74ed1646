"""diffusers' built-in caches, registered as peers under short names.

Each entry exposes the settings that matter with documented defaults and enables the
diffusers hook through ``transformer.enable_cache(...)`` (on both transformers of a Wan 2.2
pipeline). Nothing here re-implements a cache; this module only makes them selectable as
``--cache NAME[:key=value,...]`` and removable.

- ``first-block`` (``FirstBlockCacheConfig``): skip the remaining blocks when the first block's residual
  changed less than ``threshold``.
- ``taylorseer`` (``TaylorSeerCacheConfig``): compute every ``cache_interval`` steps, forecast features
  in between with a Taylor series.
- ``mag`` (``MagCacheConfig``): skip steps while the accumulated residual-magnitude error stays below
  ``threshold``.
- ``pab`` (``PyramidAttentionBroadcastConfig``): reuse attention outputs across ``spatial_skip`` steps in
  a timestep window.
- ``faster`` (``FasterCacheConfig``): reuse attention outputs with frequency-weighted correction, and the
  unconditional branch.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import math

from ..accelerators.base import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters import get_adapter, transformers_of
from ..errors import ConfigError


def _enable(pipe, name: str, make_config, config, stats=None) -> AcceleratorHandle:
    transformers = transformers_of(pipe)
    enabled = []
    try:
        for t in transformers:
            t.enable_cache(make_config())
            enabled.append(t)
    except Exception:
        for t in enabled:
            t.disable_cache()
        raise

    def remove():
        for t in enabled:
            t.disable_cache()

    return AcceleratorHandle(name, config, remove, stats)


def _require_shared_state_ok(name: str, run: RunInfo) -> None:
    """PAB and FasterCache keep one state for all calls; separate CFG calls would mix the branches."""
    if run.guidance_calls == "separate":
        raise ConfigError(
            f"{name} keeps a single cache for every transformer call, but this run makes separate conditional "
            "and unconditional calls per step, so it would reuse one branch's attention in the other. Use "
            "guidance that needs no second call (--guidance 1 on Wan; no --true-cfg-scale on FLUX/HunyuanVideo) "
            "or a cache with per-branch state (first-block, taylorseer, mag).")


def _timestep_callback(pipe):
    if not hasattr(type(pipe), "current_timestep"):
        raise ConfigError(f"{type(pipe).__name__} does not expose current_timestep, which this cache needs.")
    return lambda: pipe.current_timestep


# ---------------------------------------------------------------------------- first-block


@dataclasses.dataclass
class FirstBlockCacheSpec:
    """diffusers FirstBlockCache (ParaAttention's FBCache). ``threshold``: relative L1 change of the
    first block's residual below which the remaining blocks are skipped (0.05-0.12 typical)."""

    threshold: float = 0.05

    def __post_init__(self):
        if self.threshold < 0:
            raise ValueError("threshold must be >= 0")


def apply_first_block(pipe, config: FirstBlockCacheSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.hooks import FirstBlockCacheConfig

    return _enable(pipe, "first-block", lambda: FirstBlockCacheConfig(threshold=config.threshold), config)


# ---------------------------------------------------------------------------- taylorseer


@dataclasses.dataclass
class TaylorSeerSpec:
    """diffusers TaylorSeerCache: full compute every ``cache_interval`` steps, Taylor forecast of order
    ``max_order`` between; dense before ``disable_cache_before_step``."""

    cache_interval: int = 5
    disable_cache_before_step: int = 3
    max_order: int = 1
    use_lite_mode: bool = False

    def __post_init__(self):
        if self.cache_interval < 1 or self.max_order < 0 or self.disable_cache_before_step < 0:
            raise ValueError("cache_interval must be >= 1, max_order and disable_cache_before_step >= 0")


def apply_taylorseer(pipe, config: TaylorSeerSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.hooks import TaylorSeerCacheConfig

    dtype = pipe.transformer.dtype  # keep the Taylor factors in the model's precision
    # diffusers' default patterns (``^blocks.*attn`` with fullmatch) miss Wan's ``attn1``/``attn2`` and
    # CogVideoX's ``attn1``; name the attention modules from the adapter instead.
    patterns = (run.adapter or get_adapter(pipe)).attention_module_patterns()
    return _enable(pipe, "taylorseer", lambda: TaylorSeerCacheConfig(
        cache_interval=config.cache_interval, disable_cache_before_step=config.disable_cache_before_step,
        max_order=config.max_order, use_lite_mode=config.use_lite_mode, taylor_factors_dtype=dtype,
        cache_identifiers=None if config.use_lite_mode else patterns), config)


# ---------------------------------------------------------------------------- mag


_MAG_RATIOS: dict[tuple[str, int], list[float]] = {}


@dataclasses.dataclass
class MagCacheSpec:
    """diffusers MagCache. ``threshold``: accumulated error budget; ``max_skip_steps``: K; ``retention_ratio``:
    fraction of initial steps never skipped. ``ratios``: ``auto`` uses diffusers' FLUX ratios on FLUX and
    otherwise calibrates once per model and step count with one dense run (MagCache's own calibration
    mode, on the first prompt); ``calibrate`` forces that; or a ``/``-separated list of ratios."""

    threshold: float = 0.06
    max_skip_steps: int = 3
    retention_ratio: float = 0.2
    ratios: str = "auto"

    def __post_init__(self):
        if self.threshold < 0 or self.max_skip_steps < 0 or not 0 <= self.retention_ratio <= 1:
            raise ValueError("threshold >= 0, max_skip_steps >= 0 and 0 <= retention_ratio <= 1 are required")
        if self.ratios not in ("auto", "calibrate"):  # checked when parsed, not after the model has loaded
            try:
                values = [float(x) for x in str(self.ratios).replace(" ", "/").split("/") if x]
            except ValueError:
                values = []
            if not values or not all(math.isfinite(v) for v in values):
                raise ValueError(f"ratios must be auto, calibrate or numbers separated by '/'; got {self.ratios!r}")


def calibrate_mag_ratios(pipe, run: RunInfo) -> list[float]:
    """Run MagCache's calibration mode once (no skipping) and return the conditional branch's ratios."""
    from diffusers.hooks import MagCacheConfig

    steps = run.require_steps("mag")
    if run.dense_call is None:
        raise ConfigError("mag: this model has no shipped MagCache ratios and calibrating them needs a run; "
                          "pass ratios=r1/r2/... or use it through kinegen generate/profile.")
    buf = io.StringIO()
    handle = _enable(pipe, "mag", lambda: MagCacheConfig(calibrate=True, num_inference_steps=steps), None)
    try:
        with contextlib.redirect_stdout(buf):
            run.dense_call()
    finally:
        handle.remove()
    lines = buf.getvalue().splitlines()
    found = [ast.literal_eval(lines[i + 1].strip()) for i, line in enumerate(lines)
             if "Calibration Complete" in line and i + 1 < len(lines)]
    if not found:
        raise ConfigError("mag: calibration produced no ratios (is the step count right?).")
    return [float(x) for x in found[0]]


def apply_mag(pipe, config: MagCacheSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.hooks import MagCacheConfig

    steps = run.require_steps("mag")
    source = config.ratios
    shipped = (run.adapter or get_adapter(pipe)).mag_ratios()
    if source not in ("auto", "calibrate"):
        try:
            ratios = [float(x) for x in source.replace(" ", "/").split("/") if x]
        except ValueError:
            raise ConfigError("mag: ratios must be auto, calibrate or numbers separated by '/'.") from None
        origin = "given"
    elif source == "auto" and shipped is not None:
        ratios, origin = shipped
    else:
        key = (run.model_key or str(id(pipe.transformer)), steps)
        if key not in _MAG_RATIOS or source == "calibrate":
            _MAG_RATIOS[key] = calibrate_mag_ratios(pipe, run)
        ratios, origin = _MAG_RATIOS[key], "calibrated with one dense run"
    return _enable(pipe, "mag", lambda: MagCacheConfig(
        threshold=config.threshold, max_skip_steps=config.max_skip_steps, retention_ratio=config.retention_ratio,
        num_inference_steps=steps, mag_ratios=list(ratios)), config,
        stats=lambda: {"ratios_source": origin, "num_ratios": len(ratios)})


# ---------------------------------------------------------------------------- pab


@dataclasses.dataclass
class PABSpec:
    """diffusers Pyramid Attention Broadcast: recompute self-attention every ``spatial_skip`` steps
    (cross-attention every ``cross_skip``; 0 disables) while the timestep is inside [``low``, ``high``]."""

    spatial_skip: int = 2
    cross_skip: int = 0
    low: int = 100
    high: int = 800

    def __post_init__(self):
        if self.spatial_skip < 1 or self.cross_skip < 0 or not 0 <= self.low < self.high:
            raise ValueError("spatial_skip >= 1, cross_skip >= 0 and 0 <= low < high are required")


def apply_pab(pipe, config: PABSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.hooks import PyramidAttentionBroadcastConfig

    _require_shared_state_ok("pab", run)
    cb = _timestep_callback(pipe)
    return _enable(pipe, "pab", lambda: PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=config.spatial_skip,
        spatial_attention_timestep_skip_range=(config.low, config.high),
        cross_attention_block_skip_range=config.cross_skip or None,
        cross_attention_timestep_skip_range=(config.low, config.high),
        current_timestep_callback=cb), config)


# ---------------------------------------------------------------------------- faster


@dataclasses.dataclass
class FasterCacheSpec:
    """diffusers FasterCache: reuse self-attention every ``spatial_skip`` steps with low/high-frequency
    weighting, and reuse the unconditional branch every ``uncond_skip`` steps. Needs batched CFG
    (CogVideoX); elsewhere only the attention part applies, and runs whose guidance makes separate
    conditional/unconditional calls are refused (one shared state would mix the branches)."""

    spatial_skip: int = 2
    uncond_skip: int = 5
    alpha: float = 1.1

    def __post_init__(self):
        if self.spatial_skip < 1 or self.uncond_skip < 1:
            raise ValueError("spatial_skip and uncond_skip must be >= 1")


def apply_faster(pipe, config: FasterCacheSpec, run: RunInfo) -> AcceleratorHandle:
    from diffusers.hooks import FasterCacheConfig

    _require_shared_state_ok("faster", run)
    cb = _timestep_callback(pipe)
    latent_format = (run.adapter or get_adapter(pipe)).latent_format
    tensor_format = {"BNC": "BCHW"}.get(latent_format, latent_format)
    # Only batched CFG carries an unconditional half to reuse; otherwise treat every call as one branch.
    distilled = run.guidance_calls != "batched"
    return _enable(pipe, "faster", lambda: FasterCacheConfig(
        spatial_attention_block_skip_range=config.spatial_skip, unconditional_batch_skip_range=config.uncond_skip,
        alpha_low_frequency=config.alpha, alpha_high_frequency=config.alpha, tensor_format=tensor_format,
        is_guidance_distilled=distilled, current_timestep_callback=cb,
        attention_weight_callback=lambda _: 0.5), config)


register_accelerator("first-block", FirstBlockCacheSpec, apply_first_block, kind="cache",
                     summary="diffusers FirstBlockCache (threshold on the first block's residual change)")
register_accelerator("taylorseer", TaylorSeerSpec, apply_taylorseer, kind="cache",
                     summary="diffusers TaylorSeerCache (Taylor-series feature forecasting)")
register_accelerator("mag", MagCacheSpec, apply_mag, kind="cache",
                     summary="diffusers MagCache (residual-magnitude error model; calibrated on the fly if needed)")
register_accelerator("pab", PABSpec, apply_pab, kind="cache",
                     summary="diffusers Pyramid Attention Broadcast (attention reuse in a timestep window)")
register_accelerator("faster", FasterCacheSpec, apply_faster, kind="cache",
                     summary="diffusers FasterCache (attention reuse + unconditional-branch reuse)")
