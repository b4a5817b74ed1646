"""Stage timers: where one generation's time goes (text encoders, transformer, VAE decode).

``StageTimer(pipe)`` instruments a pipeline for the duration of a ``with`` block, with
forward hooks on the text encoders and transformer(s) and a wrapper on ``vae.decode``,
synchronising CUDA around each stage so that the numbers are wall-clock times of the work.
The transformer time includes any cache hook or attention processor installed on it.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

from .adapters import transformers_of


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


class StageTimer:
    """Accumulates seconds per stage: ``text_encoder``, ``transformer``, ``vae_decode``."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._handles = []
        self._restore = []
        self._device = getattr(pipe, "_execution_device", None)

    # -- instrumentation ----------------------------------------------------------

    def _hook_module(self, module: torch.nn.Module, stage: str) -> None:
        start: list[float] = []

        def pre(*_args, **_kwargs):
            _sync(self._device)
            start.append(time.perf_counter())

        def post(*_args, **_kwargs):
            _sync(self._device)
            self.seconds[stage] += time.perf_counter() - start.pop()
            self.calls[stage] += 1

        self._handles.append(module.register_forward_pre_hook(pre))
        self._handles.append(module.register_forward_hook(post))

    def _wrap_method(self, obj, name: str, stage: str) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            _sync(self._device)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                _sync(self._device)
                self.seconds[stage] += time.perf_counter() - t0
                self.calls[stage] += 1

        had_instance_attr = name in vars(obj)
        setattr(obj, name, timed)
        self._restore.append((obj, name, original, had_instance_attr))

    def __enter__(self):
        for t in transformers_of(self.pipe):
            self._hook_module(t, "transformer")
        for name in ("text_encoder", "text_encoder_2"):
            enc = getattr(self.pipe, name, None)
            if isinstance(enc, torch.nn.Module):
                self._hook_module(enc, "text_encoder")
        vae = getattr(self.pipe, "vae", None)
        if vae is not None and hasattr(vae, "decode"):
            self._wrap_method(vae, "decode", "vae_decode")
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        _sync(self._device)
        self.seconds["total"] = time.perf_counter() - self._t0
        for h in self._handles:
            h.remove()
        for obj, name, original, had in reversed(self._restore):
            if had:
                setattr(obj, name, original)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
        self._handles.clear()
        self._restore.clear()

    def summary(self) -> dict[str, float]:
        """Seconds per stage, plus ``other`` (scheduler, latents, post-processing) and ``total``."""
        out = {k: self.seconds.get(k, 0.0) for k in ("text_encoder", "transformer", "vae_decode")}
        out["total"] = self.seconds.get("total", 0.0)
        out["other"] = max(0.0, out["total"] - sum(out[k] for k in ("text_encoder", "transformer", "vae_decode")))
        out["transformer_calls"] = self.calls.get("transformer", 0)
        return out
