"""Autoregressive Wan: a video generated chunk by chunk of latent frames, each attending to a KV cache of the
committed ones (block-causal attention from :mod:`kinegen.pipelines.causal_wan`).

Per chunk (Self-Forcing's inference loop; ../shared/reference/autoregressive_dasa.md, section 2):

1. fresh noise for the chunk's latent frames, denoised in ``num_inference_steps`` steps (the scheduler restarts
   for every chunk), each forward reading the cache (classifier-free guidance runs both branches as one batch of
   two, so the cache holds both);
2. one more forward of the clean chunk at timestep 0 **commits** it: its keys and values join the cache, which
   keeps ``sink_frames`` and a rolling ``window_frames`` (memory and cost per chunk stay flat) or every frame.
   With ``context_noise`` s > 0 the chunk is committed noised to level s, ``(1 - s) x_0 + s e`` at timestep
   ``1000 s`` (Self-Forcing's ``context_noise``; diffusion forcing's conditioning on slightly noisy history):
   the model then leans less on details of its own past chunks, whose errors otherwise compound;
3. a new prompt from the schedule at this chunk **re-caches** (LongLive): the cache is emptied and the latents of
   the frames it held are committed again, as they were first committed, under the new prompt at their own
   positions.

Chunks: the first holds ``first_chunk_frames`` latent frames (1: the VAE encodes the first video frame alone),
every later one ``chunk_frames``, so a video of ``num_frames = 4k + 1`` frames (k + 1 latent frames) needs
``k + 1 - first_chunk_frames`` divisible by ``chunk_frames``; anything else is refused with the valid counts.

VAE segments (``segment_frames``): the video is coded as clips of that many frames, each alone, as short as the
clips the VAE was trained on (:func:`segment_partition`); each segment's first latent frame is an image latent.
With ``segment_overlap`` a later segment's image latent is not generated: it is the previous segment's last frame,
decoded and encoded again (:meth:`WanAutoregressivePipeline._relink`), and that frame is shown once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from diffusers import WanPipeline
from diffusers.utils import BaseOutput

from ..errors import ConfigError, InvalidRequestError
from .causal_wan import KVCacheConfig, make_causal


@dataclasses.dataclass
class ChunkStats:
    """What one chunk cost: its latent frames, seconds (denoising, commit), the cache's frames and bytes after it."""

    index: int
    frames: list[int]
    denoise_s: float
    commit_s: float
    cached_frames: list[int]
    kv_bytes: int


@dataclasses.dataclass
class WanAutoregressiveOutput(BaseOutput):
    """``frames``: the videos (as ``output_type`` asks); ``chunk_stats``: one :class:`ChunkStats` per chunk."""

    frames: Any
    chunk_stats: list


@dataclasses.dataclass
class StreamedChunk:
    """One committed chunk from :meth:`WanAutoregressivePipeline.stream`: its video frames ``[F, H, W, 3]`` in
    [0, 1] (a first chunk of one latent frame is one video frame; later latent frames are four each; with
    ``segment_overlap`` a later segment's first chunk has none: its frame was the previous chunk's last)."""

    index: int
    num_chunks: int
    frames: np.ndarray
    stats: ChunkStats
    decode_s: float


def _latent_stats(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latent mean and std ``[1, C, 1, 1, 1]``, on ``like``'s device and dtype."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    return (torch.tensor(vae.config.latents_mean).view(shape).to(like),
            torch.tensor(vae.config.latents_std).view(shape).to(like))


def denormalize_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents ``[B, C, f, h, w]`` (as Wan's transformer makes them) -> the VAE's own latent scale, on its
    device and dtype (what ``WanPipeline`` does before ``vae.decode``)."""
    z = latents.to(vae.device, vae.dtype)
    mean, std = _latent_stats(vae, z)
    return z * std + mean


def normalize_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """The VAE's own latents ``[B, C, f, h, w]`` -> normalised ones, as the transformer makes them (the inverse of
    :func:`denormalize_latents`)."""
    mean, std = _latent_stats(vae, latents)
    return (latents - mean) / std


def decode_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents ``[B, C, f, h, w]`` through diffusers' own ``vae.decode``: frames in [-1, 1]."""
    return vae.decode(denormalize_latents(vae, latents), return_dict=False)[0]


def decode_video(pipe, latents: torch.Tensor, output_type: str = "np") -> Any:
    """A whole normalised latent video through diffusers' own ``vae.decode`` and the pipeline's video processor."""
    video = decode_latents(pipe.vae, latents)
    return pipe.video_processor.postprocess_video(video, output_type=output_type)


def encode_shown_frame(vae, frame: torch.Tensor) -> torch.Tensor:
    """A decoded frame ``[B, 3, 1, H, W]`` in [-1, 1] as the video file shows it (rounded to 8 bits), encoded alone
    by ``vae``: the normalised image latent ``[B, C, 1, h, w]`` a later VAE segment starts on (``segment_overlap``)."""
    shown = ((frame.clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1
    return normalize_latents(vae, vae.encode(shown).latent_dist.mode()).float()


class StreamingWanDecoder:
    """Wan's causal VAE decoder run chunk by chunk with its own feature cache, so decoding chunk after chunk gives
    exactly the frames one decode of the whole latent video gives (``AutoencoderKLWan._decode`` does the same loop
    frame by frame, but empties the cache on every call)."""

    def __init__(self, vae):
        self.vae = vae
        self.cache = [None] * vae._cached_conv_counts["decoder"]
        self.first = True

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[B, C, f, h, w]`` (as the transformer makes them) -> frames in [-1, 1]."""
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae = self.vae
        x = vae.post_quant_conv(denormalize_latents(vae, latents))
        outs = []
        for i in range(x.shape[2]):
            outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=self.cache, feat_idx=[0], first_chunk=self.first))
            self.first = False
        out = torch.cat(outs, dim=2)
        if vae.config.patch_size is not None:
            out = unpatchify(out, patch_size=vae.config.patch_size)
        return out.clamp(-1.0, 1.0)


GLOBAL_CACHE = "global"
"""``window_frames=GLOBAL_CACHE`` in a call: keep every committed frame (None there means the configured window)."""


def _check_context_noise(level: float) -> None:
    if not 0 <= level < 1:
        raise ConfigError(f"context_noise is a noise level in [0, 1) (0: commit clean chunks); got {level}.")


def context_latents(x: torch.Tensor, level: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A chunk's clean latents as they are committed: ``(1 - s) x_0 + s e`` at ``context_noise`` s (itself at 0);
    the commit forward runs them at timestep ``1000 s``."""
    if level <= 0:
        return x
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device)
    return (1 - level) * x + level * noise


def chunk_partition(latent_frames: int, chunk_frames: int, first_chunk_frames: int = 1) -> list[int]:
    """Latent frames per chunk: ``[first_chunk_frames, chunk_frames, chunk_frames, ...]``; a clear error naming the
    nearest valid video frame counts when they do not add up."""
    if chunk_frames < 1 or first_chunk_frames < 1:
        raise ConfigError(f"chunk_frames and first_chunk_frames must be at least 1; got {chunk_frames} and "
                          f"{first_chunk_frames}.")
    rest = latent_frames - first_chunk_frames
    if rest < 0 or rest % chunk_frames:
        lo = max(0, rest // chunk_frames) * chunk_frames + first_chunk_frames
        valid = [4 * (n - 1) + 1 for n in (lo, lo + chunk_frames) if n >= 1]
        raise InvalidRequestError(
            f"{latent_frames} latent frames do not split into a first chunk of {first_chunk_frames} and chunks of "
            f"{chunk_frames}; try num_frames {' or '.join(map(str, valid))}.")
    return [first_chunk_frames] + [chunk_frames] * (rest // chunk_frames)


def segment_latent_frames(segment_frames: int) -> int:
    """Latent frames of a VAE segment of ``segment_frames`` video frames (4k + 1: its first frame coded alone)."""
    if segment_frames < 5 or segment_frames % 4 != 1:
        raise ConfigError(f"segment_frames must be 4k + 1 and at least 5 (the VAE codes a segment's first frame "
                          f"alone, then 4 frames per latent frame); got {segment_frames}.")
    return (segment_frames - 1) // 4 + 1


def segment_chunks(latent_frames: int, chunk_frames: int, segment_latents: int,
                   first_chunk_frames: int = 1) -> list[int]:
    """Latent frames per chunk when the video is coded in VAE segments of ``segment_latents`` latent frames: each
    segment split as :func:`chunk_partition` splits a video (its first frame, an image latent, is a chunk of its
    own with ``first_chunk_frames`` 1), segment after segment."""
    sizes = []
    for lo in range(0, latent_frames, segment_latents):
        sizes += chunk_partition(min(segment_latents, latent_frames - lo), chunk_frames, first_chunk_frames)
    return sizes


def segment_partition(num_frames: int, segment_frames: int, chunk_frames: int,
                      first_chunk_frames: int = 1, overlap: bool = False) -> list[int]:
    """Latent frames per chunk of a video coded in VAE segments of ``segment_frames`` video frames: whole segments,
    then one shorter segment of whole chunks that covers the rest (its extra frames are cut after decoding).

    ``overlap``: each later segment starts with the previous one's last frame (re-encoded, not generated), so it
    adds ``segment_frames - 1`` new frames (241 frames: 15 segments of 17)."""
    seg = segment_latent_frames(segment_frames)
    if overlap and num_frames > segment_frames:
        later, rest = divmod(num_frames - segment_frames, segment_frames - 1)
        full, rest = 1 + later, rest + 1 if rest else 0  # a partial segment holds the shared frame too
    else:
        full, rest = divmod(num_frames, segment_frames)
    sizes = segment_chunks(full * seg, chunk_frames, seg, first_chunk_frames) if full else []
    if rest:
        need = (rest + 2) // 4 + 1  # latent frames that cover ``rest`` video frames: one, then 4 frames each
        more = -(-max(0, need - first_chunk_frames) // chunk_frames)  # whole chunks after the segment's first
        sizes += chunk_partition(first_chunk_frames + more * chunk_frames, chunk_frames, first_chunk_frames)
    return sizes


class SegmentChunks:
    """The latents of the VAE segment under way, chunk by chunk, so that the next segment can start on its last
    frame re-encoded (``segment_overlap``; :meth:`WanAutoregressivePipeline._relink`). A no-op without segments."""

    def __init__(self, pipe: WanAutoregressivePipeline):
        self.pipe = pipe
        self.seg = segment_latent_frames(pipe.segment_frames) if pipe.segment_frames else 0
        self.current: list[torch.Tensor] = []

    def relinked(self, start: int, last_frame: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> torch.Tensor | None:
        """At the chunk starting at latent frame ``start``: where a new segment starts, the segment so far is done;
        where the chunk is the new one's re-encoded image latent, that latent (else None: the chunk is denoised)."""
        if not (self.seg and start % self.seg == 0):
            return None
        previous, self.current = self.current, []
        if not self.pipe.relinks(start):
            return None
        return self.pipe._relink(torch.cat(previous, dim=2), last_frame)

    def add(self, x: torch.Tensor) -> None:
        """A finished chunk's clean latents."""
        if self.seg:
            self.current.append(x)


def _prompt_schedule(prompt: str | list[tuple[int, str]], chunks: int) -> dict[int, str]:
    """``"..."`` or ``[(chunk, prompt), ...]`` starting at chunk 0 -> {chunk: prompt}."""
    if isinstance(prompt, str):
        return {0: prompt}
    try:
        schedule = {int(c): str(p) for c, p in prompt}
    except (TypeError, ValueError):
        raise InvalidRequestError("A prompt schedule is a list of (chunk index, prompt) pairs, e.g. "
                                  "[(0, 'a red circle moving right'), (5, 'a red circle moving left')].") from None
    if 0 not in schedule or min(schedule) < 0 or max(schedule) >= chunks:
        raise InvalidRequestError(f"A prompt schedule starts at chunk 0 and names chunks 0 to {chunks - 1}; got "
                                  f"{sorted(schedule)}.")
    return schedule


class WanAutoregressivePipeline(WanPipeline):
    """Chunk-by-chunk Wan generation with a KV cache (components as ``WanPipeline``: tokenizer, text encoder,
    transformer, VAE, scheduler). A bidirectional checkpoint runs too, but only a causally trained one (a
    diffusion-forcing fine-tune) keeps long videos coherent.

    The chunking and cache settings are the pipeline's configuration (saved in ``model_index.json`` with
    ``save_pretrained`` and read back by ``from_pretrained``); a call may override each of them.

    ``chunk_hooks``: the extension point of accelerators of this pipeline (DASA, :mod:`kinegen.dasa`), objects with
    ``begin(pipe, state)`` (after the causal processors are installed), ``before_chunk(index, frame_offset,
    num_frames, num_steps, new_prompt)``, ``before_commit(latents, frame_offset)`` (the chunk's clean latents, before
    the commit forward) and ``end()`` (before the model is restored). An accelerator sets it on the instance and
    deletes it when removed.
    """

    chunk_hooks: tuple = ()

    def __init__(self, tokenizer, text_encoder, vae, scheduler, transformer, transformer_2=None,
                 boundary_ratio=None, expand_timesteps: bool = False, chunk_frames: int = 3,
                 first_chunk_frames: int = 1, sink_frames: int = 0, window_frames: int | None = None,
                 context_noise: float = 0.0, segment_frames: int | None = None, segment_overlap: bool = False):
        if transformer_2 is not None or boundary_ratio is not None or expand_timesteps:
            raise ConfigError("WanAutoregressivePipeline drives one Wan 2.1-style transformer; Wan 2.2's two experts "
                              "and per-token timesteps are not supported.")
        KVCacheConfig(sink_frames=sink_frames, window_frames=window_frames)  # bad settings fail when built
        _check_context_noise(context_noise)
        if segment_frames is not None:
            seg = segment_latent_frames(segment_frames)
            if seg < first_chunk_frames or (seg - first_chunk_frames) % chunk_frames:
                raise ConfigError(f"segment_frames {segment_frames} ({seg} latent frames) does not split into a first "
                                  f"chunk of {first_chunk_frames} and chunks of {chunk_frames}; segments of "
                                  f"4 * ({first_chunk_frames} + {chunk_frames} n - 1) + 1 frames do.")
        if segment_overlap and (segment_frames is None or first_chunk_frames != 1):
            raise ConfigError("segment_overlap re-encodes the previous segment's last frame as a segment's image "
                              "latent: it needs segment_frames and first_chunk_frames 1; got segment_frames "
                              f"{segment_frames}, first_chunk_frames {first_chunk_frames}.")
        super().__init__(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                         transformer=transformer)
        self.register_to_config(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames,
                                sink_frames=sink_frames, window_frames=window_frames, context_noise=context_noise,
                                segment_frames=segment_frames, segment_overlap=bool(segment_overlap))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, allow_bidirectional: bool = False, **kwargs):
        """Load a saved ``WanAutoregressivePipeline`` folder. A folder saved as another pipeline (a bidirectional
        ``WanPipeline`` such as kinegen-shapes-t2v) is refused unless ``allow_bidirectional=True``: its model never
        saw a block-causal mask, so chunk-by-chunk output loses the prompt within a few chunks."""
        import json
        from pathlib import Path

        index = Path(pretrained_model_name_or_path) / "model_index.json"
        if index.is_file() and not allow_bidirectional:
            saved_as = json.loads(index.read_text()).get("_class_name")
            if saved_as != cls.__name__:
                raise ConfigError(
                    f"{pretrained_model_name_or_path} holds a {saved_as} checkpoint, not a causal one: chunk-by-chunk "
                    "generation needs a model trained with a block-causal mask. Use kinegen-shapes-ar, make one with "
                    f"`kinegen train ar --init {pretrained_model_name_or_path}`, or pass allow_bidirectional=True "
                    "to run this one anyway.")
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def _settings(self, **given) -> dict[str, Any]:
        """A call's chunk and cache settings: each given one, else the pipeline's configuration."""
        return {k: self.config[k] if v is None else v for k, v in given.items()}

    @property
    def segment_frames(self) -> int | None:
        """Video frames per VAE segment (None: the video is one VAE clip); see :func:`segment_partition`."""
        return self.config.get("segment_frames")

    @property
    def segment_overlap(self) -> bool:
        """Whether each later VAE segment starts from the previous one's last frame, re-encoded (see
        :func:`segment_partition`); False for folders saved before the setting existed."""
        return bool(self.config.get("segment_overlap"))

    def relinks(self, frame_offset: int) -> bool:
        """Whether the chunk at latent frame ``frame_offset`` is a later segment's image latent that is re-encoded
        from the last frame shown, not generated (``segment_overlap``; see :meth:`_relink`)."""
        seg = segment_latent_frames(self.segment_frames) if self.segment_frames else 0
        return bool(seg and self.segment_overlap and frame_offset > 0 and frame_offset % seg == 0)

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames generated for ``num_frames`` video frames (with VAE segments, whole chunks of them)."""
        if self.segment_frames:
            return sum(self.check_frames(num_frames))
        return (num_frames - 1) // self.vae_scale_factor_temporal + 1

    def cache_config(self, sink_frames: int | None = None, window_frames: int | str | None = None,
                     chunk_frames: int | None = None) -> KVCacheConfig:
        """The KV cache a call with these settings keeps (None = the configuration; ``window_frames="global"``: every
        frame); a clear error when the sink does not fit the window or the window holds no whole chunk."""
        st = self._settings(sink_frames=sink_frames, window_frames=window_frames, chunk_frames=chunk_frames)
        window = st["window_frames"]
        if window == GLOBAL_CACHE:
            window = None
        elif window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(f"window_frames is a number of latent frames (1 or more) or {GLOBAL_CACHE!r} (keep every "
                              f"frame); got {window!r}.")
        if isinstance(st["sink_frames"], bool) or not isinstance(st["sink_frames"], int):
            raise ConfigError(f"sink_frames is a number of latent frames (0 or more); got {st['sink_frames']!r}.")
        config = KVCacheConfig(sink_frames=st["sink_frames"], window_frames=window)  # the sink must fit the window
        if window is not None and window < st["chunk_frames"]:
            raise ConfigError(f"window_frames ({window}) is smaller than a chunk ({st['chunk_frames']} frames); the "
                              f"window must hold at least one whole chunk: try {st['chunk_frames']} or more.")
        return config

    def check_frames(self, num_frames: int, chunk_frames: int | None = None,
                     first_chunk_frames: int | None = None) -> list[int]:
        """The chunk partition of ``num_frames`` video frames; a clear error when they do not split into chunks."""
        st = self._settings(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
        if num_frames % self.vae_scale_factor_temporal != 1:
            raise InvalidRequestError(f"num_frames must be 4k + 1; got {num_frames}.")
        if self.segment_frames:
            if self.segment_overlap and st["first_chunk_frames"] != 1:
                raise ConfigError("with segment_overlap a segment's first chunk is its image latent alone: "
                                  f"first_chunk_frames must be 1; got {st['first_chunk_frames']}.")
            return segment_partition(num_frames, self.segment_frames, st["chunk_frames"], st["first_chunk_frames"],
                                     self.segment_overlap)
        return chunk_partition(self.latent_frames(num_frames), st["chunk_frames"], st["first_chunk_frames"])

    def _decode_segment(self, latents: torch.Tensor) -> torch.Tensor:
        """One VAE segment's normalised latents through ``vae.decode`` alone: frames in [-1, 1]."""
        return decode_latents(self.vae, latents)

    def _decode_segments(self, latents: torch.Tensor, num_frames: int, output_type: str,
                         decoded: Sequence[torch.Tensor] = ()) -> Any:
        """With VAE segments: each segment's latent frames through ``vae.decode`` alone (the first ones from
        ``decoded`` where the run already decoded them), the frames end to end (with ``segment_overlap`` a later
        segment's first frame, the previous one's last, once), the video cut to ``num_frames``."""
        seg = segment_latent_frames(self.segment_frames)
        parts = list(decoded) + [self._decode_segment(latents[:, :, lo:lo + seg])
                                 for lo in range(len(decoded) * seg, latents.shape[2], seg)]
        if self.segment_overlap:
            parts = parts[:1] + [p[:, :, 1:] for p in parts[1:]]
        video = torch.cat(parts, dim=2)
        return self.video_processor.postprocess_video(video[:, :, :num_frames], output_type=output_type)

    def _relink(self, segment: torch.Tensor, last_frame: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> torch.Tensor:
        """With ``segment_overlap``: the image latent that starts the next segment, the last frame of ``segment``
        (a whole segment's normalised latents) decoded as the video shows it and encoded again, alone.
        ``last_frame(segment)`` gives that decoded frame where the caller has it already (default: decode it)."""
        frame = last_frame(segment) if last_frame is not None else self._decode_segment(segment)[:, :, -1:]
        return encode_shown_frame(self.vae, frame).to(segment.device)

    def _forward(self, latents, t, embeds, state, *, frame_offset: int, commit: bool):
        state.frame_offset, state.commit = frame_offset, commit
        timestep = torch.full((latents.shape[0],), float(t), device=latents.device)
        return self.transformer(hidden_states=latents.to(self.transformer.dtype), timestep=timestep,
                                encoder_hidden_states=embeds, return_dict=False)[0]

    def _embeds(self, prompt: str, negative_prompt: str | None, guidance_scale: float, device):
        cond, uncond = self.encode_prompt(prompt, negative_prompt, do_classifier_free_guidance=guidance_scale > 1,
                                          max_sequence_length=self._max_sequence_length, device=device)
        return cond if guidance_scale <= 1 else torch.cat([uncond, cond])

    def _recache(self, state, committed: dict[int, torch.Tensor], chunk_of: dict[int, int], embeds,
                 context_noise: float = 0.0) -> None:
        """Empty the cache and commit the frames it held again under ``embeds``, chunk by chunk as they were first
        committed (within a chunk frames see each other; a chunk never sees a later one). ``committed`` holds each
        frame's latents as they were committed (clean, or noised to ``context_noise``)."""
        frames = state.cached_frames
        state.clear()
        runs: list[list[int]] = []  # frames of one chunk at adjacent positions (a sink can split a chunk)
        for f in frames:
            if runs and chunk_of[f] == chunk_of[runs[-1][-1]] and f == runs[-1][-1] + 1:
                runs[-1].append(f)
            else:
                runs.append([f])
        for run in runs:
            x = torch.cat([committed[f] for f in run], dim=2)
            x = torch.cat([x] * (embeds.shape[0] // x.shape[0]))  # both guidance branches, as the commit pass
            self._forward(x, 1000 * context_noise, embeds, state, frame_offset=run[0], commit=True)

    def _chunks(self, prompt, negative_prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                chunk_frames, first_chunk_frames, sink_frames, window_frames, generator, max_sequence_length,
                callback_on_step_end=None, context_noise=None, last_frame=None):
        """Denoise and commit chunk after chunk, yielding ``(chunk_latents, ChunkStats)``; the model is restored when
        the generator finishes or is closed. ``last_frame``: see :meth:`_relink` (the caller decodes each segment
        once and hands its last frame over, rather than it being decoded twice)."""
        device = self._execution_device
        self._max_sequence_length = max_sequence_length
        st = self._settings(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames,
                            sink_frames=sink_frames, window_frames=window_frames, context_noise=context_noise)
        _check_context_noise(st["context_noise"])
        cache_config = self.cache_config(st["sink_frames"], st["window_frames"], st["chunk_frames"])
        st["window_frames"] = cache_config.window_frames
        partition = self.check_frames(num_frames, st["chunk_frames"], st["first_chunk_frames"])
        schedule = _prompt_schedule(prompt, len(partition))
        h, w = height // self.vae_scale_factor_spatial, width // self.vae_scale_factor_spatial
        channels = self.transformer.config.in_channels

        segments = SegmentChunks(self)
        state = make_causal(self.transformer, cache_config)
        hooks = tuple(self.chunk_hooks)
        committed: dict[int, torch.Tensor] = {}  # latents of the frames in the cache as committed, for re-caching
        chunk_of: dict[int, int] = {}  # latent frame -> its chunk
        try:
            for hook in hooks:
                hook.begin(self, state)
            start = 0
            embeds = None
            for c, n in enumerate(partition):
                for hook in hooks:
                    hook.before_chunk(c, start, n, num_inference_steps, c > 0 and c in schedule)
                if c in schedule:
                    embeds = self._embeds(schedule[c], negative_prompt, guidance_scale, device)
                    if c > 0:
                        self._recache(state, committed, chunk_of, embeds, st["context_noise"])
                t0 = time.perf_counter()
                x = segments.relinked(start, last_frame)  # a later segment's image latent: the last frame so far
                if x is None:
                    x = self._denoise(n, h, w, channels, device, generator, num_inference_steps, guidance_scale,
                                      embeds, state, start, callback_on_step_end)
                segments.add(x)
                t1 = time.perf_counter()
                for hook in hooks:
                    hook.before_commit(x, start)
                level = st["context_noise"]
                xc = context_latents(x, level, generator)
                self._forward(torch.cat([xc, xc]) if guidance_scale > 1 else xc, 1000 * level, embeds, state,
                              frame_offset=start, commit=True)
                for i in range(n):
                    committed[start + i], chunk_of[start + i] = xc[:, :, i:i + 1], c
                for f in [f for f in committed if f not in state.cached_frames]:
                    del committed[f]
                yield x, ChunkStats(c, list(range(start, start + n)), t1 - t0, time.perf_counter() - t1,
                                    state.cached_frames, state.kv_bytes), len(partition)
                start += n
        finally:
            for hook in hooks:
                hook.end()
            state.clear()
            state.remove()

    def _denoise(self, n, h, w, channels, device, generator, num_inference_steps, guidance_scale, embeds, state,
                 start, callback_on_step_end) -> torch.Tensor:
        """One chunk of ``n`` latent frames from fresh noise, its scheduler restarted, each step reading the cache."""
        x = torch.randn((1, channels, n, h, w), generator=generator, dtype=torch.float32).to(device)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        for i, t in enumerate(self.scheduler.timesteps):
            inp = torch.cat([x, x]) if guidance_scale > 1 else x
            pred = self._forward(inp, t, embeds, state, frame_offset=start, commit=False).float()
            if guidance_scale > 1:
                uncond, cond = pred.chunk(2)
                pred = uncond + guidance_scale * (cond - uncond)
            x = self.scheduler.step(pred, t, x, return_dict=False)[0]
            if callback_on_step_end is not None:  # diffusers' convention; the step counts within the chunk
                callback_on_step_end(self, i, t, {"latents": x})
        return x

    @torch.no_grad()
    def __call__(self, prompt: str | list[tuple[int, str]], negative_prompt: str | None = None, height: int = 480,
                 width: int = 832, num_frames: int = 81, num_inference_steps: int = 4, guidance_scale: float = 1.0,
                 chunk_frames: int | None = None, first_chunk_frames: int | None = None,
                 sink_frames: int | None = None, window_frames: int | str | None = None,
                 context_noise: float | None = None, generator: torch.Generator | None = None,
                 output_type: str = "np", max_sequence_length: int = 226,
                 callback_on_chunk_end: Callable[[int, int, torch.Tensor], None] | None = None,
                 callback_on_step_end: Callable | None = None, return_dict: bool = True):
        """Generate ``num_frames`` frames chunk by chunk, decoded at the end (:meth:`stream` decodes as it goes).

        Args:
            prompt: the prompt, or a schedule ``[(chunk index, prompt), ...]`` starting at chunk 0 (the cache is
                rebuilt under the new prompt where it changes).
            chunk_frames / first_chunk_frames: latent frames per chunk (see the module docstring); None = the
                pipeline's configuration.
            sink_frames / window_frames: the KV cache's frame sink and rolling window, in latent frames (None = the
                configuration; ``window_frames="global"``, or a configured None, keeps every frame: memory grows
                with the video).
            context_noise: the noise level ``s`` in ``[0, 1)`` at which chunks are committed (None = the
                configuration; 0: clean, timestep 0).
            callback_on_chunk_end: ``fn(chunk_index, num_chunks, chunk_latents)`` after each commit.
            callback_on_step_end: ``fn(pipe, step, t, {"latents": ...})`` after each denoising step of each chunk
                (diffusers' convention, ``step`` counted within the chunk; what Kinegen's step progress and the
                app's Stop hook into).

        Returns a :class:`WanAutoregressiveOutput` (``return_dict=False``: ``(frames, chunk_stats)``).
        """
        chunks, stats = [], []
        decoded: list[torch.Tensor] = []  # with segment_overlap, the segments decoded so far (for the next one)

        def last_frame(segment: torch.Tensor) -> torch.Tensor:
            decoded.append(self._decode_segment(segment))
            return decoded[-1][:, :, -1:]

        run = self._chunks(prompt, negative_prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                           chunk_frames, first_chunk_frames, sink_frames, window_frames, generator,
                           max_sequence_length, callback_on_step_end, context_noise,
                           last_frame if output_type != "latent" else None)
        bar = None
        for x, st, total in run:
            if bar is None:
                bar = self.progress_bar(total=total)  # one tick per chunk
            chunks.append(x)
            stats.append(st)
            bar.update()
            if callback_on_chunk_end is not None:
                callback_on_chunk_end(st.index, total, x)
        if bar is not None:
            bar.close()
        latents = torch.cat(chunks, dim=2)
        if output_type == "latent":
            video = latents
        elif self.segment_frames:
            video = self._decode_segments(latents, num_frames, output_type, decoded)
        else:
            video = self._decode(latents, output_type)
        return WanAutoregressiveOutput(frames=video, chunk_stats=stats) if return_dict else (video, stats)

    @torch.no_grad()
    def stream(self, prompt: str | list[tuple[int, str]], **kwargs):
        """Like calling the pipeline, but a generator of :class:`StreamedChunk`: each chunk's video frames, decoded
        as soon as it is committed (the causal VAE carries its cache from chunk to chunk, so the frames are the
        ones a decode of the whole video gives). Closing the generator stops the run and restores the model;
        ``callback_on_step_end`` is called after each denoising step of each chunk, as by the call."""
        decoder = StreamingWanDecoder(self.vae)
        keys = ("negative_prompt", "height", "width", "num_frames", "num_inference_steps", "guidance_scale",
                "chunk_frames", "first_chunk_frames", "sink_frames", "window_frames", "generator",
                "max_sequence_length", "callback_on_step_end", "context_noise")
        unknown = sorted(set(kwargs) - set(keys))
        if unknown:
            raise ConfigError(f"stream() takes {', '.join(keys)}; not {', '.join(unknown)}.")
        args = dict(negative_prompt=None, height=480, width=832, num_frames=81, num_inference_steps=4,
                    guidance_scale=1.0, chunk_frames=None, first_chunk_frames=None, sink_frames=None,
                    window_frames=None, generator=None, max_sequence_length=226, callback_on_step_end=None,
                    context_noise=None)
        args.update(kwargs)
        seg = segment_latent_frames(self.segment_frames) if self.segment_frames else None
        left = args["num_frames"]  # frames still to give (with segments the last chunk may hold more)
        shown: list[torch.Tensor] = []  # the last chunk's decoded frames: a new segment starts on its last one
        for x, st, total in self._chunks(prompt, **args, last_frame=lambda segment: shown[-1][:, :, -1:]):
            t0 = time.perf_counter()
            # With segment_overlap a later segment's first frame is the previous one's last: not shown again.
            shared = int(self.relinks(st.frames[0]))
            if seg and st.frames[0] % seg == 0:  # a new VAE segment: decoded alone, from a fresh cache
                decoder = StreamingWanDecoder(self.vae)
            video = decoder.decode(x)
            shown[:] = [video]
            frames = np.asarray(self.video_processor.postprocess_video(video, output_type="np")[0], dtype=np.float32)
            frames = frames[shared:shared + left]
            left -= len(frames)
            yield StreamedChunk(st.index, total, frames, st, time.perf_counter() - t0)

    def _decode(self, latents: torch.Tensor, output_type: str) -> Any:
        """The whole latent video at once, through diffusers' own ``vae.decode`` (what :meth:`stream` gives chunk
        by chunk, up to the order of float operations)."""
        return decode_video(self, latents, output_type)
