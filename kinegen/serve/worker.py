"""One backend replica's work, without Ray: its model loaded once, requests validated and run with the app's
:class:`~kinegen.apps.service.LocalRunner`, outputs encoded for the HTTP answer, and a cheap health check.
:class:`kinegen.serve.backend.Generator` wraps it in a Ray Serve deployment."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..apps.service import AppConfig, LocalRunner, _stamp, _stop_when_set, check_bounds
from ..errors import ConfigError, InvalidRequestError, KinegenError, RunCancelled
from ..text import slug
from .protocol import GenerateBody, check_body, encode_file, jsonable

log = logging.getLogger("kinegen.serve")

MEDIA_TYPES = {"video": "video/mp4", "image": "image/png"}


def error_event(e: BaseException) -> dict[str, Any]:
    """The stream's ``error`` event for an exception: a user's error (ours) as its message with status 400 (and
    ``refused`` when the request was turned away before it ran); anything else is a bug, named, with status 500."""
    if isinstance(e, KinegenError):
        refused = isinstance(e, (InvalidRequestError, ConfigError)) and not isinstance(e, RunCancelled)
        return {"event": "error", "status": 400, "message": str(e), "kind": type(e).__name__, "refused": refused}
    return {"event": "error", "status": 500, "kind": type(e).__name__, "refused": False,
            "message": f"The run failed on the backend ({type(e).__name__}: {e}); the replica logged it. The backend "
                       "is still up; try other settings."}


def _device_broken(e: BaseException) -> bool:
    """Whether an exception means the device itself is unusable (a CUDA error), so the replica must be replaced."""
    text = str(e)
    return "CUDA error" in text or "device-side assert" in text or "CUBLAS_STATUS" in text


def _slim_stats(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accelerator stats for the wire: a ``[heads, q, k]`` block pattern averaged over heads (the picture shows
    that mean anyway), everything as JSON types."""
    import numpy as np

    out = []
    for st in stats:
        st = dict(st)
        pattern = st.get("block_pattern")
        if pattern is not None and np.ndim(pattern) == 3:
            st["block_pattern"] = np.asarray(pattern, dtype=np.float32).mean(0).round(3)
        out.append(jsonable(st))
    return out


class GenerationWorker:
    """Loads ``model`` once and runs one request at a time on it.

    Args:
        model: a registry name or a local diffusers folder.
        limits: the server's bounds (``max_side``, ``max_frames``, ``max_steps``, ``max_prompt_chars``).
        output_dir: where ``output: "path"`` requests are written.
        threads: torch's CPU threads for this replica (None: leave torch's default).
        replica: this replica's id, returned with every answer (default: the process id).
    """

    def __init__(self, model: str, limits: dict[str, int] | None = None,
                 output_dir: str | Path = "kinegen-serve-outputs", threads: int | None = None, replica: str = ""):
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        self.model = model
        self.config = AppConfig(models=[model], gan_models=[], output_dir=Path(output_dir), **(limits or {}))
        self.runner = LocalRunner(self.config)
        t0 = time.perf_counter()
        self.pipe = self.runner.pipeline(model)  # loaded now: a replica is ready when its model is
        self.load_s = time.perf_counter() - t0
        self.replica = replica or f"pid{os.getpid()}"
        self.broken: str | None = None  # set when a run broke the device: the health check then fails
        self._info: dict[str, Any] | None = None
        self._info_lock = threading.Lock()
        log.info("replica %s: %s loaded in %.1f s", self.replica, model, self.load_s)

    def info(self) -> dict[str, Any]:
        """The model's name, defaults and (autoregressive) valid frame counts, as ``/models`` lists them."""
        with self._info_lock:
            if self._info is None:
                defaults = self.runner.model_defaults(self.model)
                counts = self.runner.frame_counts(self.model) if defaults.get("autoregressive") else None
                self._info = {"name": self.model, "defaults": jsonable(defaults), "frame_counts": counts}
        return self._info

    def check_health(self) -> None:
        """A real, cheap check (milliseconds): no run has broken the device, the device still computes (2 + 2 on
        it) and the model's first weights are still finite. Raises when the replica should be replaced."""
        import torch

        if self.broken:
            raise RuntimeError(f"a run broke this replica's device ({self.broken}); it needs replacing")
        module = next((c for c in self.pipe.components.values() if isinstance(c, torch.nn.Module)), None)
        param = next(module.parameters(), None) if module is not None else None
        device = param.device if param is not None else torch.device("cpu")
        with torch.no_grad():
            two = torch.full((2,), 2.0, device=device)
            if float(two.sum()) != 4.0:
                raise RuntimeError(f"the device {device} no longer computes 2 + 2 = 4")
            if param is not None and not bool(torch.isfinite(param.detach().reshape(-1)[:4096]).all()):
                raise RuntimeError(f"the weights of {self.model} are no longer finite")

    def generate(self, body: dict[str, Any] | GenerateBody, emit=None, cancel: threading.Event | None = None
                 ) -> dict[str, Any]:
        """Validate and run one request; the :class:`~kinegen.serve.protocol.GenerateResponse` fields.

        ``emit(event)`` gets the ``step`` and ``chunk`` events. Once ``cancel`` is set the run stops at its next
        step with :class:`~kinegen.errors.RunCancelled`. A :class:`~kinegen.errors.KinegenError` says what was wrong
        with the request; any other exception is a bug (and, if it broke the device, fails the health check)."""
        body = body if isinstance(body, GenerateBody) else GenerateBody.model_validate(body)
        started = time.perf_counter()
        request, specs = check_body(body, self.config)  # again: a replica may be called without the ingress
        step_cb = chunk_cb = None
        if emit is not None:
            step_cb = lambda i, n, _latents: emit({"event": "step", "step": int(i) + 1, "steps": int(n)})
            chunk_cb = lambda done, total, _frames: emit({"event": "chunk", "done": int(done), "total": int(total)})
        if cancel is not None:
            step_cb, chunk_cb = _stop_when_set(cancel, step_cb), _stop_when_set(cancel, chunk_cb)
        try:
            ran = self.runner.run(self.model, request, specs, compare=body.compare,
                                  check=lambda r: check_bounds(self.config, r), step_callback=step_cb,
                                  chunk_callback=chunk_cb, cancel=cancel)
        except KinegenError:
            raise
        except Exception as e:
            if _device_broken(e):
                self.broken = f"{type(e).__name__}: {e}"
            log.exception("replica %s: run failed", self.replica)
            raise
        result = ran.result
        stem = f"{_stamp()}-{slug(result.request.prompt, 40)}-seed{result.request.seed}"
        out: dict[str, Any] = {
            "model": self.model, "kind": result.kind, "request": jsonable(result.request.to_dict()),
            "accelerators": specs, "timings": jsonable(result.timings), "stats": _slim_stats(result.accelerators),
            "warnings": list(result.warnings), "chunks": jsonable(result.chunks), "replica": self.replica,
            "replica_pid": os.getpid(), **self._media(result, body.output, stem)}
        if ran.dense is not None:
            dense_file = self._media(ran.dense, body.output, f"{stem}-dense")
            out["dense"] = {"timings": jsonable(ran.dense.timings), **dense_file}
            out["psnr_db"] = jsonable(ran.psnr_db)
        out["run_s"] = time.perf_counter() - started
        return out

    def _media(self, result, output: str, stem: str) -> dict[str, Any]:
        """The run's file: written under the output folder (``path``) or encoded into the answer (``bytes``); both
        through :meth:`GenerationResult.save`, so the file is checked and written atomically."""
        ext = ".mp4" if result.kind == "video" else ".png"
        media = {"media_type": MEDIA_TYPES[result.kind]}
        if output == "path":
            self.config.output_dir.mkdir(parents=True, exist_ok=True)
            media["path"] = str(result.save(self.config.output_dir.resolve() / f"{stem}{ext}"))
            return media
        with tempfile.TemporaryDirectory(prefix="kinegen-replica-") as tmp:
            media["data"] = encode_file(Path(result.save(Path(tmp) / f"out{ext}")).read_bytes())
        return media


__all__ = ["GenerationWorker", "error_event"]
