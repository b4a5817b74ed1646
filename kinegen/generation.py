"""One generation: a validated request in, frames + timings + accelerator stats out.

>>> pipe = kinegen.load_pipeline("tiny-wan")
>>> result = kinegen.generate(pipe, "a red circle moving right", seed=0, accelerators=["first-block"])
>>> result.save("out.mp4")

The request is checked against what the loaded pipeline accepts *before* anything runs
(sizes divisible by the VAE x patch factor, frame counts of the form k * 4 + 1, step and
guidance ranges, prompt length), so a bad request fails in milliseconds with a message
that names the nearest valid values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .accelerators.base import RunInfo
from .accelerators.catalog import accelerate
from .adapters import ModelAdapter
from .errors import InvalidRequestError, PromptWarning
from .memory import out_of_memory_guard
from .registry import ModelSpec

MAX_PROMPT_CHARS = 2000
MAX_STEPS = 1000
MAX_SIDE = 4096
MAX_FRAMES = 1025


@dataclasses.dataclass
class GenerationRequest:
    """Everything that decides one output. ``None`` fields take the model's defaults.

    The checks that need no model (prompt, ranges of steps, frames, sizes, guidance, seed) run when the
    request is built, so a bad request fails before any model loads; :func:`prepare` checks the rest
    against the loaded pipeline.
    """

    prompt: str
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    steps: int | None = None
    guidance: float | None = None
    seed: int = 0
    true_cfg_scale: float | None = None
    image: Any = None  # input image for editing models (PIL.Image or a path)
    # the KV cache of a chunk-by-chunk model, in latent frames (None: the model's own): the rolling window, sinks
    # included, or "global" for every frame; and the sink (the first frames, kept for ever)
    window_frames: int | str | None = None
    sink_frames: int | None = None

    def __post_init__(self):
        _check_model_free(self)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["image"] = None if self.image is None else str(getattr(self.image, "filename", "") or "<image>")
        return d


@dataclasses.dataclass
class GenerationResult:
    """Frames ``[F, H, W, 3]`` float32 in [0, 1] (F = 1 for images), with what produced them."""

    frames: np.ndarray
    kind: str
    fps: int
    request: GenerationRequest
    timings: dict[str, float]
    accelerators: list[dict[str, Any]]
    warnings: list[str] = dataclasses.field(default_factory=list)  # about the request (unknown prompt words)
    # one dict per chunk for an autoregressive model (see :func:`run_job`); empty for every other model
    chunks: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def save(self, path: str | os.PathLike) -> Path:
        """Write an mp4 (video) or an image file, atomically."""
        from .media import check_output_path, write_output

        path = check_output_path(path, self.kind)
        return write_output(path, self.frames, self.kind, fps=self.fps)


# ---------------------------------------------------------------------------- checks


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_model_free(r: GenerationRequest) -> None:
    if not isinstance(r.prompt, str) or not r.prompt.strip():
        raise InvalidRequestError("The prompt is empty; describe what to generate, e.g. \"a red circle moving right\".")
    if len(r.prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"The prompt has {len(r.prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
    if r.negative_prompt is not None and not isinstance(r.negative_prompt, str):
        raise InvalidRequestError(f"The negative prompt must be text; got {type(r.negative_prompt).__name__}.")
    if r.negative_prompt is not None and len(r.negative_prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"The negative prompt is longer than {MAX_PROMPT_CHARS} characters.")
    if r.steps is not None and (not _is_int(r.steps) or not 1 <= r.steps <= MAX_STEPS):
        raise InvalidRequestError(f"steps must be an integer between 1 and {MAX_STEPS}; got {r.steps!r}.")
    if r.frames is not None and (not _is_int(r.frames) or not 1 <= r.frames <= MAX_FRAMES):
        raise InvalidRequestError(f"frames must be an integer between 1 and {MAX_FRAMES}; got {r.frames!r}.")
    for name in ("height", "width"):
        v = getattr(r, name)
        if v is not None and (not _is_int(v) or not 1 <= v <= MAX_SIDE):
            raise InvalidRequestError(f"{name} must be a positive integer up to {MAX_SIDE}; got {v!r}.")
    for name in ("guidance", "true_cfg_scale"):
        v = getattr(r, name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 100):  # nan too
            raise InvalidRequestError(f"{name} must be a number between 0 and 100; got {v!r}.")
    if r.window_frames is not None and r.window_frames != "global" and (
            not _is_int(r.window_frames) or not 1 <= r.window_frames <= MAX_FRAMES):
        raise InvalidRequestError(f"window_frames must be a number of latent frames between 1 and {MAX_FRAMES}, or "
                                  f"\"global\" (keep every frame); got {r.window_frames!r}.")
    if r.sink_frames is not None and (not _is_int(r.sink_frames) or not 0 <= r.sink_frames <= MAX_FRAMES):
        raise InvalidRequestError(f"sink_frames must be a number of latent frames between 0 and {MAX_FRAMES}; "
                                  f"got {r.sink_frames!r}.")
    if not _is_int(r.seed) or not 0 <= r.seed < 2**63:
        raise InvalidRequestError(f"seed must be an integer between 0 and 2**63 - 1; got {r.seed!r}.")
    if r.image is not None and not isinstance(r.image, (str, os.PathLike)):
        from PIL import Image

        if not isinstance(r.image, Image.Image):
            raise InvalidRequestError(f"image must be a file path or a PIL image; got {type(r.image).__name__}.")


def _nearest_multiples(value: int, multiple: int) -> str:
    lo = max(multiple, value // multiple * multiple)
    hi = lo + multiple
    return f"{lo} or {hi}" if lo != value else str(lo)


def spec_of(pipe) -> ModelSpec:
    """The model spec :func:`kinegen.load_pipeline` attached to ``pipe``."""
    spec = getattr(pipe, "kinegen_spec", None)
    if spec is None:
        raise InvalidRequestError("This pipeline was not loaded with kinegen.load_pipeline(); pass it through "
                                  "load_pipeline or set `pipe.kinegen_spec` to a ModelSpec for its defaults.")
    return spec


def _load_image(image):
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    path = Path(image)
    if path.is_dir():
        raise InvalidRequestError(f"Input image {path} is a folder; give an image file (PNG, JPEG or WebP).")
    if not path.is_file():
        raise InvalidRequestError(f"Input image {path} does not exist.")
    too_large = f"Input image {path} is larger than 4096x4096 pixels; resize it first."
    try:
        with Image.open(path) as im:
            if im.width * im.height > 4096 * 4096:
                raise InvalidRequestError(too_large)
            return im.convert("RGB")
    except UnidentifiedImageError:
        raise InvalidRequestError(f"{path} is not an image file Pillow can read; give a PNG, JPEG or WebP "
                                  "image.") from None
    except Image.DecompressionBombError:  # Pillow refuses to open it at all
        raise InvalidRequestError(too_large) from None
    except OSError as e:  # a header Pillow reads, then truncated or corrupt data
        raise InvalidRequestError(f"Input image {path} is damaged ({e}); give a whole PNG, JPEG or WebP "
                                  "image.") from None


def _fill_and_check(spec: ModelSpec, adapter: ModelAdapter, pipe, request: GenerationRequest) -> GenerationRequest:
    """The spec's defaults filled in and every field checked against the loaded pipeline."""
    r = dataclasses.replace(request)
    r.height = spec.height if r.height is None else r.height
    r.width = spec.width if r.width is None else r.width
    r.steps = spec.steps if r.steps is None else r.steps
    r.guidance = spec.guidance if r.guidance is None else r.guidance
    m = adapter.spatial_multiple(pipe)
    for name in ("height", "width"):
        v = getattr(r, name)
        if v < m:
            raise InvalidRequestError(f"{name} must be at least {m} for {spec.name}; got {v}.")
        if v % m:
            raise InvalidRequestError(
                f"{name} {v} is not a multiple of {m} (the VAE's downsampling times the transformer's patch size "
                f"for {spec.name}); try {_nearest_multiples(v, m)}.")
    if adapter.kind == "video":
        r.frames = spec.frames if r.frames is None else r.frames
        t = adapter.temporal_factor(pipe)
        if (r.frames - 1) % t:
            lo = (r.frames - 1) // t * t + 1
            raise InvalidRequestError(
                f"{spec.name} takes frame counts of the form {t}k + 1 (set by how its VAE compresses time); "
                f"{r.frames} is not one. Try {lo} or {lo + t}.")
    elif r.frames not in (None, 1):
        raise InvalidRequestError(f"{spec.name} generates images; drop --frames (got {r.frames}).")
    else:
        r.frames = 1
    if r.true_cfg_scale is not None and adapter.cfg_mode != "distilled":
        raise InvalidRequestError(f"true_cfg_scale applies to guidance-distilled models (FLUX, HunyuanVideo); "
                                  f"for {spec.name} use --guidance.")
    cache = [name for name in ("window_frames", "sink_frames") if getattr(r, name) is not None]
    if cache and not adapter.kv_window:
        flags = " and ".join(f"--{n.replace('_', '-')}" for n in cache)
        raise InvalidRequestError(f"{' and '.join(cache)} set{'s' if len(cache) == 1 else ''} the KV cache of a "
                                  f"chunk-by-chunk model with a rolling window (family wan_ar, e.g. "
                                  f"kinegen-shapes-ar); {spec.name} has none: drop {flags}.")
    if r.image is not None:
        if not adapter.takes_image:
            raise InvalidRequestError(f"{spec.name} does not take an input image; drop --image.")
        r.image = _load_image(r.image)
    adapter.check_request(pipe, r)
    return r


# ---------------------------------------------------------------------------- one resolved generation


@dataclasses.dataclass(frozen=True)
class GenerationJob:
    """One generation, resolved once: the pipeline, its model spec and family adapter, and the validated
    request with the model's defaults filled in. Accelerators, timing and saving all read from it."""

    pipe: Any
    spec: ModelSpec
    adapter: ModelAdapter
    request: GenerationRequest
    warnings: tuple[str, ...] = ()  # about the request, e.g. prompt words the model cannot read

    @property
    def kind(self) -> str:
        return self.adapter.kind

    @property
    def fps(self) -> int:
        return self.spec.fps

    @property
    def streams(self) -> bool:
        """Whether the model generates chunk by chunk and streams them (an autoregressive pipeline with
        ``stream()``): :func:`run_job` then reports each chunk as it is committed."""
        return self.adapter.autoregressive and callable(getattr(self.pipe, "stream", None))

    @property
    def num_chunks(self) -> int | None:
        """How many chunks an autoregressive pipeline generates this request in (None for other models)."""
        if not self.adapter.autoregressive:
            return None
        if hasattr(self.adapter, "chunk_partition"):  # the family splits the frames itself (AnyFlow-FAR)
            return len(self.adapter.chunk_partition(self.pipe, self.request.frames))
        check = getattr(self.pipe, "check_frames", None)  # Kinegen's WanAutoregressivePipeline
        return None if check is None else len(check(self.request.frames))

    def pipeline_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pipe(...)`` (with a fresh generator seeded by the request)."""
        kw = dict(self.spec.call_defaults)
        kw.update(self.adapter.call_kwargs(self.request))
        kw["generator"] = torch.Generator(device="cpu").manual_seed(int(self.request.seed))
        return kw

    def run_dense(self) -> np.ndarray:
        """Run the request once without accelerators; frames ``[F, H, W, 3]`` float32."""
        return _run_pipeline(self.pipe, self.pipeline_kwargs())

    def run_info(self) -> RunInfo:
        """What accelerators learn about this generation (the only place they read the step count from)."""
        r = self.request
        return RunInfo(num_inference_steps=r.steps, guidance_calls=self.adapter.guidance_calls(r),
                       guidance_scale=r.guidance, shape_key=(r.frames, r.height, r.width), dense_call=self.run_dense,
                       model_key=self.spec.name, adapter=self.adapter)


def prepare(pipe, prompt: str | GenerationRequest, **fields) -> GenerationJob:
    """Resolve a request against a loaded pipeline: the model's defaults filled in, every field checked
    (sizes against the VAE and patch factors, frame counts of the form k * factor + 1, ...). Raises
    :class:`~kinegen.errors.InvalidRequestError` naming the nearest valid values."""
    spec = spec_of(pipe)
    adapter = spec.adapter
    if adapter.conditioning == "class":
        raise InvalidRequestError(f"{spec.name} is a class-conditional GAN: it takes class names, not prompts. "
                                  "Use kinegen.generate_class_images(pipe, class_labels=[...]) or "
                                  "`kinegen generate --model ... --class NAME`.")
    valid = [f.name for f in dataclasses.fields(GenerationRequest)]
    unknown = sorted(set(fields) - set(valid))
    if unknown:
        raise InvalidRequestError(f"Unknown request field(s) {', '.join(unknown)}; valid fields: {', '.join(valid)}.")
    request = prompt if isinstance(prompt, GenerationRequest) else GenerationRequest(prompt=prompt, **fields)
    request = _fill_and_check(spec, adapter, pipe, request)
    notes = tuple(_vocabulary_warnings(pipe, spec, request))
    for note in notes:
        warnings.warn(note, PromptWarning, stacklevel=2)
    return GenerationJob(pipe, spec, adapter, request, notes)


def unknown_words(pipe, text: str | None) -> list[str]:
    """The words of ``text`` that the pipeline's tokenizer reads as its unknown token, in order.

    A word-level vocabulary (the bundled model's) has an unknown token for every word outside it; byte-level BPE
    (CLIP) has none and returns []; SentencePiece (T5) has one only for characters it cannot spell. Punctuation is
    left out: the bundled model reads it as unknown too, but a warning about commas would drown the words.
    """
    tok = getattr(pipe, "tokenizer", None)
    unk = getattr(tok, "unk_token_id", None)
    if tok is None or unk is None or not text:
        return []
    words = dict.fromkeys(re.findall(r"\w+", text.lower()))
    return [w for w in words if unk in tok(w, add_special_tokens=False)["input_ids"]]


def _vocabulary_warnings(pipe, spec: ModelSpec, request: GenerationRequest) -> list[str]:
    """One warning per prompt with unknown words, naming them (and, for a small vocabulary, listing it)."""
    notes = []
    for what, text in (("prompt", request.prompt), ("negative prompt", request.negative_prompt)):
        unknown = unknown_words(pipe, text)
        if not unknown:
            continue
        msg = (f"{spec.name} does not know the {what}'s words {', '.join(repr(w) for w in unknown)} (its tokenizer "
               f"reads them as {pipe.tokenizer.unk_token}); the output will not follow them.")
        vocab = pipe.tokenizer.get_vocab()
        if len(vocab) <= 200:  # a small word-level vocabulary: say what it does know
            known = sorted(w for w in vocab if w.isalpha())
            msg += f" The words it knows: {' '.join(known)}."
        notes.append(msg)
    return notes


def _run_pipeline(pipe, kwargs: dict[str, Any]) -> np.ndarray:
    """Call the pipeline and return frames ``[F, H, W, 3]`` float32 (the first output of the batch)."""
    out = pipe(**kwargs)
    frames = out.frames if hasattr(out, "frames") else out.images
    frames = np.asarray(frames[0], dtype=np.float32)
    return frames[None] if frames.ndim == 3 else frames


def _stream_pipeline(job: GenerationJob, kwargs: dict[str, Any], timer, chunk_callback=None):
    """Run an autoregressive pipeline through ``pipe.stream``: frames ``[F, H, W, 3]`` and one dict per chunk.

    Each chunk's dict: ``index``, ``latent_frames`` (its latent frame indices), ``frames`` (its video frames),
    ``transformer_s`` (the transformer's time for it, re-caching and commit included), ``denoise_s`` and
    ``commit_s`` (the pipeline's own split), ``decode_s``, ``ready_s`` (seconds from the start of the run until its
    frames were decoded: for chunk 0 the time to the first frame), ``kv_bytes`` and ``cached_frames`` (the KV cache
    after it). ``chunk_callback(done, total, frames_so_far)`` is called once before the first chunk (``done`` 0,
    no frames) and after each chunk is committed and decoded."""
    start = time.perf_counter()
    kwargs = {k: v for k, v in kwargs.items() if k != "output_type"}  # stream() gives frames in [0, 1]
    parts: list[np.ndarray] = []
    chunks: list[dict[str, Any]] = []
    total = job.num_chunks
    if chunk_callback is not None and total:
        r = job.request
        chunk_callback(0, total, np.zeros((0, r.height, r.width, 3), np.float32))
    transformer_before = 0.0
    with contextlib.closing(job.pipe.stream(**kwargs)) as stream:  # closed early: the model is restored
        for part in stream:
            parts.append(np.asarray(part.frames, dtype=np.float32))
            transformer_s = timer.seconds["transformer"] - transformer_before
            transformer_before += transformer_s
            st = part.stats
            chunks.append({"index": part.index, "latent_frames": list(st.frames), "frames": len(part.frames),
                           "transformer_s": transformer_s, "denoise_s": st.denoise_s, "commit_s": st.commit_s,
                           "decode_s": part.decode_s, "ready_s": time.perf_counter() - start,
                           "kv_bytes": int(st.kv_bytes), "cached_frames": list(st.cached_frames)})
            if chunk_callback is not None:
                chunk_callback(part.index + 1, part.num_chunks, np.concatenate(parts))
    return np.concatenate(parts), chunks


def _with_stream_decode(timings: dict[str, float], chunks: list[dict[str, Any]]) -> dict[str, float]:
    """A streamed run decodes chunk by chunk outside ``vae.decode`` (which the stage timer wraps): count it."""
    out = dict(timings)
    out["vae_decode"] += sum(c["decode_s"] for c in chunks)
    out["other"] = max(0.0, out["total"] - out["text_encoder"] - out["transformer"] - out["vae_decode"])
    return out


def run_job(job: GenerationJob, accelerators=(), step_callback=None, chunk_callback=None) -> GenerationResult:
    """Run a prepared job with accelerators applied for this call only (removed afterwards, even on error).

    An autoregressive model (``job.streams``) runs chunk by chunk through its ``stream()``: the result's
    ``chunks`` holds one dict per chunk (see :func:`_stream_pipeline`), and ``chunk_callback(done, total,
    frames_so_far)`` follows the video as it grows (``done`` 0 first, then after each chunk; ignored for other
    models). ``step_callback(step, steps, latents)`` counts the steps within each chunk.
    """
    from .timing import StageTimer

    kwargs = job.pipeline_kwargs()
    accelerators = [accelerators] if isinstance(accelerators, str) else accelerators  # one spec, not its letters
    if step_callback is not None:
        steps = job.request.steps

        def on_step_end(_pipe, i, _t, tensors):
            step_callback(i, steps, tensors.get("latents"))
            return {}

        kwargs["callback_on_step_end"] = on_step_end
    handles = accelerate(job.pipe, *accelerators, run=job.run_info())
    chunks: list[dict[str, Any]] = []
    try:
        with out_of_memory_guard(job.request), StageTimer(job.pipe) as timer:  # OOM: one message, memory freed
            if job.streams:
                frames, chunks = _stream_pipeline(job, kwargs, timer, chunk_callback)
            else:
                frames = _run_pipeline(job.pipe, kwargs)
        stats = [h.stats() for h in handles]
    finally:
        for h in reversed(handles):
            h.remove()
    timings = _with_stream_decode(timer.summary(), chunks) if chunks else timer.summary()
    return GenerationResult(frames=frames, kind=job.kind, fps=job.fps, request=job.request, timings=timings,
                            accelerators=stats, warnings=list(job.warnings), chunks=chunks)


def generate(pipe, prompt: str | GenerationRequest, *, accelerators=(), step_callback=None, chunk_callback=None,
             **fields) -> GenerationResult:
    """Generate one video or image.

    Args:
        pipe: a pipeline from :func:`kinegen.load_pipeline`.
        prompt: the prompt, or a full :class:`GenerationRequest`.
        accelerators: specs (``"first-block:threshold=0.08"``), config objects or parsed
            ``(accelerator, config)`` pairs; applied for this call only and removed afterwards.
        step_callback: ``fn(step_index, num_steps, latents)`` after each denoising step (of each chunk, for an
            autoregressive model).
        chunk_callback: autoregressive models only: ``fn(done, num_chunks, frames_so_far)`` before the first
            chunk (``done`` 0) and after each chunk is committed and decoded (frames ``[F, H, W, 3]`` so far).
        **fields: any :class:`GenerationRequest` field (height, width, frames, steps, guidance, seed, ...).
    """
    return run_job(prepare(pipe, prompt, **fields), accelerators, step_callback, chunk_callback)


# ---------------------------------------------------------------------------- class-conditional GANs

MAX_CLASS_IMAGES = 1024


@dataclasses.dataclass
class ClassImagesResult:
    """Images ``[N, H, W, 3]`` float32 in [0, 1] from a class-conditional GAN, with their classes and seeds."""

    images: np.ndarray
    class_names: list[str]
    seeds: list[int]
    truncation: float
    timings: dict[str, float]
    texture: str | None = None  # the background texture asked for (generators with texture labels); None: each seed's

    def grid(self, columns: int | None = None, upscale: int = 1) -> np.ndarray:
        """The images tiled; by default one column per requested class when several were asked for (the images
        cycle through the ``k`` requested classes, so ``k`` columns put one class in each), else a square-ish grid."""
        from .media import image_grid

        if columns is None:
            names = self.class_names
            k = next(p for p in range(1, len(names) + 1) if all(names[i] == names[i - p] for i in range(p, len(names))))
            columns = k if k > 1 else None
        return image_grid(self.images, columns=columns, upscale=upscale)

    def save(self, path: str | os.PathLike, columns: int | None = None, upscale: int = 4) -> Path:
        """Write the images as one grid (png/jpg/webp; :meth:`grid`), atomically; ``upscale`` enlarges each cell."""
        from .media import check_output_path, write_image

        path = check_output_path(path, "image")
        return write_image(path, self.grid(columns, upscale))


def generate_class_images(pipe, class_labels=None, *, num_images: int = 16, seed: int = 0,
                          truncation: float = 1.0, texture: str | None = None) -> ClassImagesResult:
    """One-step images from a class-conditional GAN (:class:`kinegen.pipelines.MPGANPipeline`).

    Args:
        class_labels: a class name or index, a list of them (cycled over the images), or None (every
            class in turn).
        num_images: images to generate; image ``i`` uses seed ``seed + i``, so an image depends on its
            seed and class only (not on how many are made at once).
        truncation: 1.0 = off; lower trades variety for fidelity (truncated-normal latents, scaled).
        texture: for a generator trained with texture labels (``pipe.texture_names``, e.g. plain, checkered,
            striped, noisy), the background texture of every image; None: each seed draws its own.
    """
    import time

    spec = spec_of(pipe)
    if spec.adapter.conditioning != "class":
        raise InvalidRequestError(f"{spec.name} generates from prompts; use kinegen.generate(pipe, prompt).")
    if not _is_int(num_images) or not 1 <= num_images <= MAX_CLASS_IMAGES:
        raise InvalidRequestError(f"num_images must be an integer between 1 and {MAX_CLASS_IMAGES}; "
                                  f"got {num_images!r}.")
    if not isinstance(truncation, (int, float)) or not 0 < truncation <= 1:
        raise InvalidRequestError(f"truncation must be in (0, 1] (1 = off); got {truncation!r}.")
    if not _is_int(seed) or not 0 <= seed < 2**63 - MAX_CLASS_IMAGES:
        raise InvalidRequestError(f"seed must be a non-negative integer below 2**63 - {MAX_CLASS_IMAGES}; "
                                  f"got {seed!r}.")
    names = pipe.class_names
    if class_labels is None or (isinstance(class_labels, (list, tuple)) and not class_labels):
        class_labels = list(range(len(names)))
    try:
        ids = pipe.get_label_ids(class_labels)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None
    ids = [ids[i % len(ids)] for i in range(num_images)]
    seeds = [int(seed) + i for i in range(num_images)]
    if texture is not None:
        try:
            texture = pipe.texture_names[pipe.get_texture_ids(texture, 1)[0]]
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
    t0 = time.perf_counter()
    images = pipe(class_labels=ids, seeds=seeds, truncation=float(truncation), textures=texture,
                  output_type="np").images
    total = time.perf_counter() - t0
    return ClassImagesResult(images=np.asarray(images, dtype=np.float32), class_names=[names[i] for i in ids],
                             seeds=seeds, truncation=float(truncation), texture=texture,
                             timings={"generator": total, "total": total, "per_image": total / num_images})
