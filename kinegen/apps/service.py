"""The web app's service layer: models loaded once, runs serialised per model, limits, history.

Everything here is plain Python (no Gradio), so the behaviour the web UI and its API promise
(validation, rate limits, output files, history) is tested directly. :mod:`kinegen.apps.web` and
the tab modules in :mod:`kinegen.apps.tabs` only lay out the page and turn
:class:`~kinegen.errors.KinegenError` into messages.

Concurrency: Gradio's queue bounds how many runs execute at once (``AppConfig.concurrency``,
shared by every generate, GAN and profile event) and how many may wait (``max_queue``). On
top of that each loaded pipeline has a lock, because accelerators install hooks on the shared
pipeline for the duration of a run.

Where a generation runs is the service's *runner*: :class:`LocalRunner` (``kinegen app``: the models load in
this process) or :class:`kinegen.serve.client.RemoteRunner` (``kinegen serve``'s front end: each generation is
an HTTP request to the Ray Serve backend, whose replicas run it with a :class:`LocalRunner` of their own). The
rules around a run (validation, the rate limit, output files, history) stay here, the same for both.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InvalidRequestError, PromptWarning, RunCancelled
from ..plotting import save_block_pattern, save_heatmap
from ..registry import DEFAULT_APP_MODELS
from ..text import slug

log = logging.getLogger("kinegen.app")


@dataclasses.dataclass
class AppConfig:
    """What the server offers and how much it accepts (``kinegen app --help`` sets these).

    Attributes:
        models: text-to-video/image models offered on the Generate and Profile tabs (registry names
            or local folders); the first is the default.
        gan_models: class-conditional GANs offered on the GAN tab.
        output_dir: every output (videos, grids, heatmaps, reports) and ``history.jsonl`` go here; the
            server serves files from this folder only.
        concurrency: runs executing at once on the device (generate, GAN and profile together).
        max_queue: runs that may wait; later ones are turned away with a message.
        rate_limit: runs per user per minute (0 = unlimited); users are told apart by login name, else
            by client address.
        auth: ``[(user, password), ...]`` to require a login (None = open).
        omni_models: omni models offered on the Understand tab (default: the bundled one where installed).
        max_upload_mb, max_upload_seconds, max_question_chars: bounds of the Understand tab's uploads and questions.
    """

    models: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_APP_MODELS))
    gan_models: list[str] = dataclasses.field(default_factory=lambda: ["kinegen-shapes-gan"])
    output_dir: Path = Path("kinegen-app-outputs")
    concurrency: int = 1
    max_queue: int = 16
    rate_limit: int = 0
    auth: list[tuple[str, str]] | None = None
    max_side: int = 512
    max_frames: int = 81
    max_steps: int = 100
    max_prompt_chars: int = 500
    max_gan_images: int = 64
    max_profile_prompts: int = 4
    max_profile_configs: int = 6
    max_profile_repeats: int = 3
    history_size: int = 50
    preview_every: int = 0  # 0 = about five previews per run
    omni_models: list[str] = dataclasses.field(default_factory=lambda: _installed_omni_models())
    max_upload_mb: float = 50.0  # uploads to the Understand tab
    max_upload_seconds: float = 60.0
    max_question_chars: int = 300

    def __post_init__(self):
        self.output_dir = Path(self.output_dir)
        if self.concurrency < 1 or self.max_queue < 1:
            raise ConfigError("concurrency and max_queue must be at least 1.")
        if self.rate_limit < 0:
            raise ConfigError("rate_limit must be 0 (off) or a positive number of runs per minute.")
        if not self.models and not self.gan_models:
            raise ConfigError("Offer at least one model (models or gan_models).")


def _installed_omni_models() -> list[str]:
    from ..pipelines.omni_understand import default_omni_models

    return default_omni_models()


class RateLimiter:
    """At most ``per_minute`` runs per user in any sliding 60 s window (0 = unlimited)."""

    def __init__(self, per_minute: int, clock=time.monotonic):
        self.per_minute, self.clock = per_minute, clock
        self._runs: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def check(self, user: str) -> None:
        if self.per_minute <= 0:
            return
        now = self.clock()
        with self._lock:
            runs = self._runs[user]
            while runs and now - runs[0] >= 60:
                runs.popleft()
            if len(runs) >= self.per_minute:
                wait = 60 - (now - runs[0])
                raise InvalidRequestError(f"Rate limit: {self.per_minute} runs per minute per user on this "
                                          f"server; try again in {wait:.0f} s.")
            runs.append(now)

    def refund(self, user: str) -> None:
        """Give back ``user``'s latest run (one the backend turned away before it ran)."""
        if self.per_minute <= 0:
            return
        with self._lock:
            if self._runs[user]:
                self._runs[user].pop()


def check_bounds(config: AppConfig, request) -> None:
    """The server's own bounds (``config``'s ``max_*``), on top of what the model accepts (a ``GenerationRequest``
    checks the model-free rules itself when it is built)."""
    c = config
    for name, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt or "")):
        if len(text) > c.max_prompt_chars:
            raise InvalidRequestError(f"The {name} has {len(text)} characters; this server accepts up to "
                                      f"{c.max_prompt_chars}.")
    for name in ("height", "width"):
        v = getattr(request, name)
        if v is not None and v > c.max_side:
            raise InvalidRequestError(f"{name} {v} is above this server's limit of {c.max_side} pixels.")
    if request.frames is not None and request.frames > c.max_frames:
        raise InvalidRequestError(f"{request.frames} frames is above this server's limit of {c.max_frames}.")
    if request.steps is not None and request.steps > c.max_steps:
        raise InvalidRequestError(f"{request.steps} steps is above this server's limit of {c.max_steps}.")


def _accelerators_text(entry: dict[str, Any]) -> str:
    """The History table's accelerators cell: a generation's specs (or "dense"), a profile's configurations (one
    per ``;``); a GAN has none (one generator forward), so its truncation is shown instead."""
    if entry["type"] == "gan":
        return f"one step, truncation {entry['request'].get('truncation', 1.0):g}"
    if entry["type"] == "profile":  # each line a configuration, itself maybe 'a+b'
        return "; ".join(entry.get("accelerators") or [])
    return " + ".join(entry.get("accelerators") or []) or "dense"


def _stop_when_set(cancel: threading.Event | None, step_callback=None):
    """A step callback that raises :class:`RunCancelled` once ``cancel`` is set, then calls ``step_callback``."""

    def check(*step):
        if cancel is not None and cancel.is_set():
            raise RunCancelled("The run was cancelled; nothing was written.")
        if step_callback is not None and step:
            step_callback(*step)

    return check


class PartialVideo:
    """The growing preview of a chunk-by-chunk run: each :meth:`write` puts the frames so far in a new mp4
    (atomically) in a private folder under the output folder (so the server may hand it to the browser), and
    :meth:`close` removes that folder, so a finished or stopped run leaves nothing of its previews behind. Writes
    after ``close`` (a run stopped while the page was still drawing) do nothing. Thread-safe."""

    def __init__(self, output_dir: Path, fps: int = 16):
        self.folder = Path(output_dir) / f".partial-{uuid.uuid4().hex}"
        self.fps = fps
        self._lock = threading.Lock()
        self._count = 0
        self._closed = False

    def write(self, frames) -> str | None:
        """Write ``frames`` ``[F, H, W, 3]`` as the next preview; its path, or None once closed or without frames."""
        from ..media import write_video

        with self._lock:
            if self._closed or len(frames) == 0:
                return None
            self.folder.mkdir(parents=True, exist_ok=True)
            self._count += 1
            return str(write_video(self.folder / f"preview-{self._count:04d}.mp4", frames, fps=self.fps))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            shutil.rmtree(self.folder, ignore_errors=True)


@dataclasses.dataclass
class RunOutput:
    """What a runner hands back for one generation request.

    Attributes:
        result: the run: ``kind``, ``request`` (the model's defaults filled in), ``timings``, ``accelerators``
            (each accelerator's stats), ``warnings``, ``chunks`` and ``save(path)`` (writes the output atomically):
            a :class:`~kinegen.generation.GenerationResult`, or the remote runner's copy of one.
        dense: the dense run of the same request (``compare``), or None.
        psnr_db: the accelerated output's PSNR against the dense one (with ``dense``).
        extra: where it ran, for the history (the remote runner: the backend's replica and attempts).
    """

    result: Any
    dense: Any = None
    psnr_db: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class LocalRunner:
    """Runs generations in this process: each offered model loads once (on first use) and is reused, one run at a
    time per model. ``kinegen app`` uses it, and so does each replica of ``kinegen serve``'s backend."""

    local = True

    def __init__(self, config: AppConfig):
        self.config = config
        self.locks: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)
        self.load_lock = threading.Lock()
        self._omni: dict[str, Any] = {}

    def pipeline(self, model: str, kind: str = "text"):
        """The loaded pipeline for an offered model (loaded on first use, then reused)."""
        offered = self.config.models if kind == "text" else self.config.gan_models
        if model not in offered:
            raise InvalidRequestError(f"Model {model!r} is not offered by this server; choose one of: "
                                      f"{', '.join(offered)}.")
        from ..loading import load_pipeline

        with self.load_lock:  # two first requests must not load the same model twice
            pipe = load_pipeline(model, cache=True)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def omni(self, model: str):
        """The loaded understanding pipeline of an offered omni model (loaded on first use, then reused)."""
        if model not in self.config.omni_models:
            raise InvalidRequestError(f"Omni model {model!r} is not offered by this server; choose one of: "
                                      f"{', '.join(self.config.omni_models)}.")
        from ..pipelines.omni_understand import OmniUnderstandingPipeline

        with self.load_lock:
            if model not in self._omni:
                self._omni[model] = OmniUnderstandingPipeline.load(model)
        return self._omni[model]

    def omni_lock(self, model: str) -> threading.Lock:
        """Pruning hooks are installed on the shared model for one run: one run at a time per model."""
        return self.locks[f"omni:{model}"]

    def model_defaults(self, model: str) -> dict[str, Any]:
        """The model's default settings (and ``autoregressive: True`` for a chunk-by-chunk model)."""
        from ..loading import resolve_model

        spec = resolve_model(model).spec
        if spec is None:
            return {}
        d = {"height": spec.height, "width": spec.width, "frames": spec.frames or 1, "steps": spec.steps,
             "guidance": spec.guidance, "kind": spec.kind}
        if spec.adapter.autoregressive:
            d["autoregressive"] = True
        return d

    def frame_counts(self, model: str) -> list[int]:
        """The frame counts up to ``max_frames`` that ``model`` accepts at its default size, as its adapter checks
        them. Loads the model."""
        from ..errors import KinegenError
        from ..generation import GenerationRequest, prepare

        pipe = self.pipeline(model)
        counts = []
        for frames in range(1, self.config.max_frames + 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PromptWarning)
                    prepare(pipe, GenerationRequest(prompt="x", frames=frames))
            except KinegenError:
                continue
            counts.append(frames)
        return counts

    def run(self, model: str, request, accelerators: list[str], *, compare: bool = False, check=None, admit=None,
            refund=None, step_callback=None, chunk_callback=None, cancel: threading.Event | None = None) -> RunOutput:
        """Resolve ``request`` against the model (its defaults filled in, its rules checked), ``check`` the filled
        request (the server's bounds), ``admit`` it (the rate limit), then run it (and, with ``compare`` and
        accelerators, the dense baseline) while holding the model. ``refund`` is for runners that learn of a refusal
        after ``admit``; this one never needs it."""
        from ..generation import prepare, run_job
        from ..profiling import metrics

        pipe = self.pipeline(model)
        with warnings.catch_warnings():  # the page shows them (result.warnings); the log needs no copy
            warnings.simplefilter("ignore", PromptWarning)
            job = prepare(pipe, request)
        if check is not None:
            check(job.request)  # the model's defaults filled in, bounds again
        if admit is not None:
            admit()
        with self.locks[model]:  # run_job turns running out of memory into one message, lock released
            _stop_when_set(cancel)()  # cancelled while it waited for the model: do not start
            result = run_job(job, accelerators, step_callback=step_callback, chunk_callback=chunk_callback)
            dense = None
            if compare and accelerators:
                _stop_when_set(cancel)()
                dense = run_job(job, step_callback=_stop_when_set(cancel))
        psnr = None if dense is None else metrics.psnr(dense.frames, result.frames)
        return RunOutput(result=result, dense=dense, psnr_db=psnr)


def _stamp() -> str:
    """A time stamp plus a short random part: two runs finishing in the same second never share a name."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Service:
    """Loads each model once, runs requests against it one at a time, and keeps the history.

    ``runner`` decides where generations run: a :class:`LocalRunner` on ``config`` (the default: ``kinegen app``),
    or a remote one (``kinegen serve``'s front end). GAN grids and profiles run only with a local runner.
    """

    def __init__(self, config: AppConfig, runner=None):
        self.config = config
        self.runner = runner if runner is not None else LocalRunner(config)
        self.output_dir = config.output_dir.resolve()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.limiter = RateLimiter(config.rate_limit)
        self._history_lock = threading.Lock()
        self.history: collections.deque = collections.deque(maxlen=config.history_size)
        self._read_history()
        self._remove_stale_previews()

    @property
    def _locks(self) -> dict[str, threading.Lock]:
        """One lock per loaded model (a local runner's)."""
        return self.runner.locks

    @property
    def _load_lock(self) -> threading.Lock:
        return self.runner.load_lock

    def _remove_stale_previews(self, older_than_s: float = 3600.0) -> None:
        """Remove preview folders a killed server left behind (a live run writes to its folder every chunk, so
        one untouched for an hour belongs to no run, even where two servers share the output folder)."""
        now = time.time()
        for folder in self.output_dir.glob(".partial-*"):
            with contextlib.suppress(OSError):
                if folder.is_dir() and now - folder.stat().st_mtime > older_than_s:
                    shutil.rmtree(folder, ignore_errors=True)
                    log.info("removed a stale preview folder %s", folder)

    # ------------------------------------------------------------------ models

    def pipeline(self, model: str, kind: str = "text"):
        """The loaded pipeline for an offered model (loaded on first use, then reused)."""
        return self.runner.pipeline(model, kind)

    def model_defaults(self, model: str) -> dict[str, Any]:
        """The model's default settings (and ``autoregressive: True`` for a chunk-by-chunk model)."""
        return self.runner.model_defaults(model)

    def frame_counts(self, model: str) -> list[int]:
        """The frame counts up to ``max_frames`` that ``model`` accepts at its default size (an autoregressive
        model takes only those that split into its chunks), as its adapter checks them. Loads the model."""
        return self.runner.frame_counts(model)

    def partial_video(self, model: str) -> PartialVideo:
        """A writer of a chunk-by-chunk run's growing preview (see :class:`PartialVideo`), at the model's frame rate
        (16 for a model this server does not know: the run itself then says what is wrong)."""
        from ..errors import KinegenError
        from ..loading import resolve_model

        try:
            spec = resolve_model(model).spec if model in self.config.models else None
        except KinegenError:
            spec = None
        return PartialVideo(self.output_dir, fps=spec.fps if spec is not None else 16)

    def class_names(self, model: str) -> list[str]:
        return list(self.pipeline(model, "gan").class_names)

    def texture_names(self, model: str) -> list[str]:
        """The background textures a GAN takes as labels (empty for one trained without them)."""
        return list(self.pipeline(model, "gan").texture_names)

    # ------------------------------------------------------------------ validation

    def check_request(self, request) -> None:
        """The server's own bounds, on top of what the model accepts (a ``GenerationRequest`` checks the
        model-free rules itself when it is built)."""
        check_bounds(self.config, request)

    @staticmethod
    def accelerator_specs(cache: str | None, cache_options: str = "", attention: str | None = None,
                          attention_options: str = "") -> list[str]:
        """``("mapguided", "speedup=3")`` -> ``["mapguided:speedup=3"]``, each checked against the registry."""
        from ..accelerators.catalog import parse_spec

        specs = []
        for name, opts, kind in ((cache, cache_options, "cache"), (attention, attention_options, "attention")):
            if not name or name == "none":
                continue
            opts = (opts or "").strip().replace(" ", "")
            spec = f"{name}:{opts}" if opts else name
            parse_spec(spec, kind=kind)  # unknown name, key or value, or the wrong kind: a ConfigError
            specs.append(spec)
        return specs

    # ------------------------------------------------------------------ runs

    def generate(self, model: str, request, accelerators=(), *, compare: bool = False, user: str = "anonymous",
                 step_callback=None, chunk_callback=None, cancel: threading.Event | None = None) -> dict[str, Any]:
        """One generation (and, with ``compare``, the dense run of the same request).

        Returns the output paths, timings, accelerator stats and (compare) speedup and PSNR against dense; for an
        autoregressive model also ``chunks`` (one dict per chunk: transformer seconds, KV bytes, when its frames
        were ready, ...), and ``chunk_callback(done, total, frames_so_far)`` follows the video as it grows
        (:func:`kinegen.generation.run_job`; a local runner only).
        Once ``cancel`` is set (the page's run was cancelled or its client left), the run stops at its next
        denoising step, or does not start if it is still waiting for the model, with :class:`RunCancelled`; an
        exception from ``step_callback`` stops it the same way. A stopped run writes and records nothing, and the
        model is free for the next request. Running out of memory is an :class:`~kinegen.errors.OutOfMemory`
        that says what to try.
        """
        self.check_request(request)
        accelerators = list(accelerators)
        if cancel is not None:
            step_callback = _stop_when_set(cancel, step_callback)
            chunk_callback = _stop_when_set(cancel, chunk_callback)
        ran = self.runner.run(model, request, accelerators, compare=compare, check=self.check_request,
                              admit=lambda: self.limiter.check(user), refund=lambda: self.limiter.refund(user),
                              step_callback=step_callback, chunk_callback=chunk_callback, cancel=cancel)
        result, dense = ran.result, ran.dense
        request = result.request
        stem = f"{_stamp()}-{slug(request.prompt, 40)}-seed{request.seed}"
        ext = ".mp4" if result.kind == "video" else ".png"
        out: dict[str, Any] = {"output": str(result.save(self.output_dir / f"{stem}{ext}")),
                               "kind": result.kind, "request": request.to_dict(), "model": model,
                               "accelerators": accelerators, "timings": result.timings,
                               "stats": result.accelerators, "warnings": result.warnings}
        if result.chunks:
            out["chunks"] = result.chunks
        if dense is not None:
            out["dense_output"] = str(dense.save(self.output_dir / f"{stem}-dense{ext}"))
            out["dense_timings"] = dense.timings
            out["speedup"] = dense.timings["total"] / max(result.timings["total"], 1e-9)
            out["transformer_speedup"] = dense.timings["transformer"] / max(result.timings["transformer"], 1e-9)
            out["psnr_db"] = ran.psnr_db
        for st in result.accelerators:
            if st.get("map") and st.get("plan"):
                out["heatmap"] = save_heatmap(self.output_dir / f"{stem}-plan.png", st["map"], st["plan"],
                                              st.get("groups"), f"{st['name']}: planned "
                                              f"{st.get('chosen_speedup') or 1:.2f}x, map {st.get('map_source')}")
            if st.get("block_pattern") is not None:
                out["block_pattern"] = save_block_pattern(self.output_dir / f"{stem}-blocks.png",
                                                          st["block_pattern"], st.get("density"))
        out.update(ran.extra)  # where it ran (the remote runner: the backend's replica)
        self._remember({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "type": "generate", "user": user,
                        "model": model, "request": out["request"], "accelerators": accelerators,
                        "output": out["output"], "total_s": result.timings["total"], **ran.extra})
        return out

    def generate_gan(self, model: str, classes, num_images: int, seed: int, truncation: float,
                     user: str = "anonymous", texture: str | None = None) -> dict[str, Any]:
        """A grid of class images; ``texture``: every image's background texture (GANs with texture labels)."""
        from ..generation import generate_class_images

        if not 1 <= int(num_images) <= self.config.max_gan_images:
            raise InvalidRequestError(f"Images per grid: 1 to {self.config.max_gan_images}; got {num_images}.")
        pipe = self.pipeline(model, "gan")
        self.limiter.check(user)
        with self._locks[model]:
            res = generate_class_images(pipe, list(classes) or None, num_images=int(num_images), seed=int(seed),
                                        truncation=float(truncation), texture=texture or None)
        name = "-".join(dict.fromkeys(slug(c, 16) for c in res.class_names))[:60]
        path = res.save(self.output_dir / f"{_stamp()}-gan-{name}-seed{seed}.png")
        self._remember({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "type": "gan", "user": user, "model": model,
                        "request": {"prompt": ", ".join(dict.fromkeys(res.class_names)), "seed": int(seed),
                                    "num_images": int(num_images), "truncation": float(truncation),
                                    **({"texture": res.texture} if res.texture else {})},
                        "accelerators": [], "output": str(path), "total_s": res.timings["total"]})
        return {"output": str(path), "timings": res.timings, "classes": res.class_names, "texture": res.texture}

    def understand(self, model: str, video: str | os.PathLike, question: str, prune: str | None = None,
                   user: str = "anonymous") -> dict[str, Any]:
        """Answer ``question`` about an uploaded ``video`` (its sound included) with an offered omni model, pruned
        with ``prune`` (``"omniselect:keep=0.3"``, or None). The upload is checked first: its size, its length, that
        it is a video (:func:`kinegen.media_av.read_av` with this server's bounds). Writes a picture of the kept
        tokens over the frames and the waveform."""
        from ..media_av import read_av
        from ..plotting import save_kept_tokens

        c = self.config
        if model not in c.omni_models:
            raise InvalidRequestError(f"This server offers the omni models {', '.join(c.omni_models) or '(none)'}; "
                                      f"got {model!r}.")
        question = (question or "").strip()
        if not question:
            raise InvalidRequestError("Ask a question about the video.")
        if len(question) > c.max_question_chars:
            raise InvalidRequestError(f"Questions are limited to {c.max_question_chars} characters here.")
        if not video:
            raise InvalidRequestError("Upload a video first.")
        pipe = self.runner.omni(model)
        av_in = read_av(video, fps=pipe.processor.config.fps, max_seconds=c.max_upload_seconds,
                        max_bytes=int(c.max_upload_mb * 2**20))
        pipe.processor.check_question(question)
        if prune:
            from ..accelerators.catalog import parse_spec

            parse_spec(prune, kind="prune")
        self.limiter.check(user)
        with self.runner.omni_lock(model):
            r = pipe.understand(av_in, question, prune=prune)
        stem = f"{_stamp()}-understand-{slug(question, 32)}"
        picture = save_kept_tokens(self.output_dir / f"{stem}.png", av_in.frames, r.video_kept_mask, r.video_grid,
                                   av_in.audio, r.audio_kept_mask,
                                   title=f"kept {r.media_kept} of {r.media_tokens} tokens"
                                         + (f" ({r.regime} regime)" if r.regime and r.regime != "-" else ""))
        out = {**r.to_dict(), "picture": picture, "model": model}
        self._remember({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "type": "understand", "user": user,
                        "model": model, "request": {"prompt": question, "seed": 0}, "accelerators":
                        [prune] if prune else [], "output": picture, "total_s": sum(r.timings.values())})
        return out

    def profile(self, model: str, prompts: list[str], configs: list[str], *, seeds: int = 1, repeats: int = 1,
                steps: int | None = None, user: str = "anonymous", progress=None) -> dict[str, Any]:
        from ..generation import GenerationRequest, prepare
        from ..profiling.report import markdown_table
        from ..profiling.runner import parse_config, profile

        c = self.config
        prompts = [p.strip() for p in prompts if p.strip()]
        configs = [x.strip() for x in configs if x.strip()]
        if not prompts or not configs:
            raise InvalidRequestError("Give at least one prompt and one configuration (one per line).")
        if len(prompts) > c.max_profile_prompts or len(configs) > c.max_profile_configs:
            raise InvalidRequestError(f"This server profiles up to {c.max_profile_prompts} prompts and "
                                      f"{c.max_profile_configs} configurations at a time.")
        if not 1 <= repeats <= c.max_profile_repeats or not 1 <= seeds <= 2:
            raise InvalidRequestError(f"repeats: 1 to {c.max_profile_repeats}; seeds: 1 or 2.")
        parsed = [parse_config(x) for x in configs]
        pipe = self.pipeline(model)
        for p in prompts:  # the model's defaults filled in, then the server's bounds
            self.check_request(prepare(pipe, GenerationRequest(prompt=p, steps=steps)).request)
        self.limiter.check(user)
        out_dir = self.output_dir / f"{_stamp()}-profile"
        fields = {"steps": steps} if steps else {}
        with self._locks[model]:
            report = profile(pipe, prompts, parsed, seeds=seeds, repeats=repeats, warmup=1, output_dir=out_dir,
                             progress=progress, **fields)
        archive = shutil.make_archive(str(out_dir), "zip", root_dir=out_dir)
        plots = sorted(str(p) for p in out_dir.glob("*.png"))
        self._remember({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "type": "profile", "user": user,
                        "model": model, "request": {"prompt": " | ".join(prompts), "seed": 0},
                        "accelerators": configs, "output": archive, "total_s": None})
        return {"table": markdown_table(report), "plots": plots, "archive": archive, "dir": str(out_dir),
                "runs": report.runs}

    # ------------------------------------------------------------------ history

    def _read_history(self) -> None:
        path = self.output_dir / "history.jsonl"
        if not path.is_file():
            return
        for line in path.read_text().splitlines()[-self.config.history_size:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash: skip it, keep the rest
            output = entry.get("output") if isinstance(entry, dict) else None
            # only outputs inside the output folder: the page hands an entry's file to the browser
            if isinstance(output, str) and Path(output).exists() and self.is_served(output):
                self.history.append(entry)

    def _remember(self, entry: dict[str, Any]) -> None:
        """Add a finished run to the history and append it to ``history.jsonl``. The file only ever gains whole
        lines: a write that fails (a full disk) is cut back to where it started, and a line cut by a crash is ended
        first so that the next entry is not glued to it. A failed write loses the run neither its output nor its
        place in this server's history (it is logged)."""
        line = (json.dumps(entry, default=str) + "\n").encode()
        with self._history_lock:
            self.history.append(entry)
            path = self.output_dir / "history.jsonl"
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                log.warning("could not record the run in %s: %s", path, e)
                return
            start = None
            try:
                start = os.fstat(fd).st_size
                if start and os.pread(fd, 1, start - 1) != b"\n":
                    line = b"\n" + line
                done = 0
                while done < len(line):
                    done += os.write(fd, line[done:])
            except OSError as e:
                if start is not None:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                log.warning("could not record the run in %s (%s); the file is as it was", path, e)
            finally:
                os.close(fd)

    def history_rows(self) -> list[list[Any]]:
        """Newest first: [time, type, model, prompt, seed, accelerators, seconds, output name]."""
        with self._history_lock:
            entries = list(self.history)
        rows = []
        for e in reversed(entries):
            r = e["request"]
            total = e.get("total_s")
            rows.append([e["time"], e["type"], e["model"], r.get("prompt", ""), r.get("seed", 0),
                         _accelerators_text(e), None if total is None else round(total, 2), Path(e["output"]).name])
        return rows

    def history_entry(self, output_name: str) -> dict[str, Any]:
        """The entry whose output file is named ``output_name`` (the last column of a history row)."""
        with self._history_lock:
            entries = list(self.history)
        for e in reversed(entries):
            if Path(e["output"]).name == output_name:
                return e
        raise InvalidRequestError("That run is no longer in this server's history; refresh the History tab.")

    def is_served(self, path: str | Path) -> bool:
        """Only files inside the output folder are handed to the browser."""
        try:
            Path(path).resolve().relative_to(self.output_dir)
            return True
        except ValueError:
            return False
