"""``apply_hva`` / ``apply_kmeans_sparse``: clustered sparse attention as the self-attention of a video DiT.

How it plugs in without patching diffusers:

* A root hook on each transformer (a diffusers ``ModelHook``) reads the token layout of the call from the
  model-family adapter (grid, text tokens and their position) and counts denoising steps per cache
  context, so Wan's conditional and unconditional passes keep separate clustering state.
* Each self-attention module's processor is wrapped (Wan's ``attn1``, HunyuanVideo's and CogVideoX's
  joint attention). The wrapper runs the original processor (projections, norms, RoPE unchanged) inside a
  ``TorchFunctionMode`` that catches its one ``scaled_dot_product_attention`` over the full sequence
  and answers it with this layer's :class:`~kinegen.sparse_attn.hva.HVAttention` (or the baseline). Any
  other attention in the call (Wan I2V's image cross-attention) passes through untouched. The modules run
  diffusers' ``native`` backend (SDPA) while wrapped, since other backends would bypass the interception.
* Dense warm-up steps (the first ``dense_warmup`` share of steps) and dense leading layers
  (``dense_layers``) run the original processor.
* Calls with fewer video tokens than ``min_tokens`` run the original processor too, and the handle's stats
  carry a ``warning`` that says so (the CLI, the app and the profiler print it): at a few hundred tokens a
  grid holds only a handful of tiles, clustering costs more than the attention it saves, and dropping a
  share of so few clusters loses the prompt (HVA at density 0.3 on the bundled model's default 320 tokens
  turned a blue circle green, 15.9 dB against dense).

State: one attention module per (transformer, cache context, layer); ``handle.remove()`` restores every
processor and backend and drops the state.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..accelerators.base import AcceleratorHandle, RunInfo, StepTracker, register_accelerator
from ..adapters import get_adapter, transformers_of
from ..errors import ConfigError
from .hva import HVAConfig, HVAttention, KMeansSparseAttention, KMeansSparseConfig
from .svg2 import SVG2Attention, SVG2Config


@dataclasses.dataclass
class _BranchState:
    """One guidance branch: the current step and this branch's attention module per layer."""

    step: int = 0
    layers: dict[int, Any] = dataclasses.field(default_factory=dict)

    def reset(self):
        self.step = 0
        self.layers.clear()


class _Controller:
    """Per transformer: the current layout and step, and the attention modules per branch and layer."""

    def __init__(self, transformer, make_attention, config, run: RunInfo):
        from diffusers.hooks.hooks import StateManager

        self.transformer = transformer
        self.adapter = get_adapter(transformer)
        if not self.adapter.sparse_attention:
            raise ConfigError(f"sparse attention needs video tokens on a grid and one attention call over the "
                              f"sequence; {type(transformer).__name__} is a {self.adapter.name} model.")
        self.make_attention = make_attention
        self.config = config
        self.steps = run.require_steps(type(config).__name__) if config.dense_warmup > 0 else \
            int(run.num_inference_steps or 0)
        self.tracker = StepTracker(self.steps)
        self.state = StateManager(_BranchState)
        self.layout = None
        self.sparse_calls = 0
        self.dense_calls = 0
        self.small_calls = 0  # of the dense calls: those below min_tokens
        self.smallest = None  # video tokens of the smallest such call
        self.layer_stats: dict[tuple[str, int], Any] = {}  # (cache context, layer) -> its attention module

    def branch(self) -> _BranchState:
        from diffusers.hooks.hooks import CacheContext

        if self.state._context is None:
            self.state.set_context(CacheContext(name="inference"))
        return self.state.get_state()

    def begin(self, kwargs) -> None:
        self.layout = self.adapter.token_layout(self.transformer, kwargs)
        st = self.branch()
        step = self.tracker.on_call(self.state._context)
        if step.new_run:
            st.reset()  # a new generation: fresh clustering state
        st.step = step.index

    def reset(self) -> None:
        self.tracker.reset()
        self.state.reset()

    def sparse_now(self, layer: int) -> bool:
        warm = math.ceil(self.config.dense_warmup * self.steps) if self.steps else 0
        return self.branch().step >= warm and layer >= self.config.dense_layers and not self.too_small()

    def too_small(self) -> bool:
        """This call's grid has fewer video tokens than ``min_tokens`` (counted; the stats say so)."""
        tokens = math.prod(self.layout.grid)
        if tokens >= self.config.min_tokens:
            return False
        self.small_calls += 1
        self.smallest = tokens if self.smallest is None else min(self.smallest, tokens)
        return True

    def attention(self, layer: int):
        st = self.branch()
        if layer not in st.layers:
            st.layers[layer] = self.make_attention(layer)
        return st.layers[layer]


class _Intercept(TorchFunctionMode):
    """Answers the SDPA call over the whole self-attention sequence with a sparse attention module."""

    def __init__(self, ctrl: _Controller, attn):
        super().__init__()
        self.ctrl, self.attn = ctrl, attn
        self.hits = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and self.hits == 0:
            q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")])[:3]
            lay = self.ctrl.layout
            if q is not None and q.dim() == 4 and q.shape[-2] == lay.seq_len and k.shape[-2] == lay.seq_len:
                self.hits += 1
                mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
                return self._sparse(q, k, v, mask, kwargs.get("scale"))
        return func(*args, **kwargs)

    def _sparse(self, q, k, v, mask, scale):
        lay = self.ctrl.layout
        if lay.num_extra_tokens:
            raise ConfigError("sparse attention does not handle extra (reference-image) tokens")
        key_valid = None
        if mask is not None:  # a key-padding mask (HunyuanVideo's padded text): [B, 1, 1 or S, S]
            m = mask if mask.dtype == torch.bool else mask > -1e4
            key_valid = m.reshape(m.shape[0], -1, m.shape[-1])[:, -1] if m.dim() >= 2 else None
        pos = {"first": "start", "last": "end"}.get(lay.text_position, "end")
        # Inside __torch_function__ this mode is off the stack: the sparse attention's own torch calls run plainly.
        return self.attn(q, k, v, grid=lay.grid, scale=scale, text_tokens=lay.num_text_tokens, text_position=pos,
                         key_valid=key_valid)


class _WrappedProcessor:
    """Calls the original processor, with the layer's sparse attention standing in for its SDPA."""

    def __init__(self, ctrl: _Controller, layer: int, original):
        self.ctrl, self.layer, self.original = ctrl, layer, original

    def __getattr__(self, name):  # diffusers reads attributes such as _attention_backend off processors
        return getattr(self.original, name)

    def run(self, attn_module, *args, **kwargs):
        if not self.ctrl.sparse_now(self.layer):
            self.ctrl.dense_calls += 1
            return self.original(attn_module, *args, **kwargs)
        attn = self.ctrl.attention(self.layer)
        mode = _Intercept(self.ctrl, attn)
        with mode:
            out = self.original(attn_module, *args, **kwargs)
        if mode.hits != 1:
            raise RuntimeError(f"sparse attention did not find this layer's attention call ({type(self.original)}); "
                               "the processor must use SDPA (diffusers' native backend).")
        self.ctrl.sparse_calls += 1
        # The module, not its stats: reading stats waits for the GPU, so they are read once, in stats().
        self.ctrl.layer_stats[(self.ctrl.state._context.name, self.layer)] = attn
        return out


def _wrap(ctrl: _Controller, layer: int, original) -> _WrappedProcessor:
    """A wrapper whose ``__call__`` has the original's signature: diffusers' ``Attention`` drops keyword
    arguments (such as CogVideoX's ``image_rotary_emb``) that a processor's signature does not name."""
    import inspect

    sig = inspect.signature(original.__call__)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs)

    __call__.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    cls = type(f"Sparse{type(original).__name__}", (_WrappedProcessor,), {"__call__": __call__})
    return cls(ctrl, layer, original)


_LOCK = threading.Lock()


def _restore(module, processor, backend) -> None:
    module.set_processor(processor)
    if hasattr(processor, "_attention_backend"):
        processor._attention_backend = backend


def _install(pipe_or_transformer, name: str, config, make_attention, run: RunInfo | None) -> AcceleratorHandle:
    from diffusers.hooks import HookRegistry, ModelHook

    run = run or RunInfo()
    transformers = transformers_of(pipe_or_transformer) if hasattr(pipe_or_transformer, "components") else \
        [pipe_or_transformer]
    undo, controllers = [], []

    class _Root(ModelHook):
        _is_stateful = True

        def __init__(self, ctrl):
            import inspect

            super().__init__()
            self.ctrl = ctrl
            self.state_manager = ctrl.state
            self.signature = inspect.signature(type(ctrl.transformer).forward)  # once, not per forward

        def pre_forward(self, module, *args, **kwargs):
            bound = self.signature.bind_partial(module, *args, **kwargs).arguments if args else dict(kwargs)
            self.ctrl.begin(bound)
            return args, kwargs

        def reset_state(self, module):
            self.ctrl.reset()
            return module

    from diffusers.models.attention_dispatch import AttentionBackendName

    hook_name = f"kinegen_{name}"

    def remove():
        for fn in reversed(undo):
            fn()

    def wrap(t) -> None:
        ctrl = _Controller(t, make_attention, config, run)
        registry = HookRegistry.check_if_exists_or_initialize(t)
        if registry.get_hook(hook_name) is not None:
            raise ConfigError(f"{name} is already applied to this transformer; remove it first.")
        registry.register_hook(_Root(ctrl), hook_name)
        undo.append(lambda r=registry: r.remove_hook(hook_name, recurse=False))
        for layer, (_, module) in enumerate(ctrl.adapter.self_attention_modules(t)):
            original, backend = module.processor, getattr(module.processor, "_attention_backend", None)
            module.set_processor(_wrap(ctrl, layer, original))
            if hasattr(original, "_attention_backend"):  # SDPA, so that the interception sees the call
                original._attention_backend = AttentionBackendName.NATIVE
            undo.append(lambda m=module, p=original, b=backend: _restore(m, p, b))
        controllers.append(ctrl)

    with _LOCK:
        try:
            for t in transformers:
                wrap(t)
        except Exception:
            remove()  # a failure on a later transformer must not leave the earlier ones wrapped
            raise

    def stats():
        out = {"sparse_calls": sum(c.sparse_calls for c in controllers),
               "dense_calls": sum(c.dense_calls for c in controllers)}
        small = [c for c in controllers if c.small_calls]
        if small:
            tokens = min(c.smallest for c in small)
            out["small_calls"] = sum(c.small_calls for c in small)
            out["warning"] = (f"{name}: {tokens} video tokens per attention call is below min_tokens="
                              f"{config.min_tokens}, where sparse attention does not pay and can lose the prompt; "
                              f"{out['small_calls']} calls ran dense. Generate larger (more frames or pixels) to "
                              f"use it, or set min_tokens=0 to force it.")
        per_layer = [a.last_stats for c in controllers for a in c.layer_stats.values()]
        if per_layer:
            for key in ("density", "tile_efficiency", "clustering_s", "merging_s", "attention_s", "layout_s"):
                out[key] = float(sum(s[key] for s in per_layer) / len(per_layer))
            out["distance_evals"] = int(sum(s["distance_evals"] for s in per_layer))
            out["block_pattern"] = per_layer[0]["block_pattern"].float().cpu().tolist()
        return out

    handle = AcceleratorHandle(name, config, remove, stats)
    handle.controllers = controllers
    return handle


def apply_hva(pipe_or_transformer, config: HVAConfig | None = None, run: RunInfo | None = None) -> AcceleratorHandle:
    """Install HyperVAttention as the self-attention of a Wan, HunyuanVideo or CogVideoX transformer
    (or of every transformer of a pipeline). Removable: ``handle.remove()``."""
    config = config or HVAConfig()
    return _install(pipe_or_transformer, "hva", config, lambda layer: HVAttention(config), run)


def apply_svg2(pipe_or_transformer, config: SVG2Config | None = None, run: RunInfo | None = None) -> AcceleratorHandle:
    """Sparse VideoGen 2 as its public code runs it (:mod:`kinegen.sparse_attn.svg2`), installed the same way
    as :func:`apply_hva`: the faithful peer."""
    config = config or SVG2Config()
    return _install(pipe_or_transformer, "svg2", config, lambda layer: SVG2Attention(config), run)


def apply_kmeans_sparse(pipe_or_transformer, config: KMeansSparseConfig | None = None,
                        run: RunInfo | None = None) -> AcceleratorHandle:
    """The SVG2-style baseline installed the same way as :func:`apply_hva`."""
    config = config or KMeansSparseConfig()
    return _install(pipe_or_transformer, "kmeans-sparse", config, lambda layer: KMeansSparseAttention(config), run)


register_accelerator("hva", HVAConfig, apply_hva, kind="attention", requires="sparse_attention",
                     summary="HyperVAttention: 3D local-window clustered block-sparse self-attention")
register_accelerator("kmeans-sparse", KMeansSparseConfig, apply_kmeans_sparse, kind="attention",
                     requires="sparse_attention",
                     summary="simplified SVG2-style baseline (tile layout, global budget); the faithful peer is svg2")
register_accelerator("svg2", SVG2Config, apply_svg2, kind="attention", requires="sparse_attention",
                     summary="Sparse VideoGen 2 as published: k-means, per-cluster top-p, one key list per cluster")
