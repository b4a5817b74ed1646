"""Train the bundled text-to-video transformer (and its text encoder) by flow matching.

Stage 1 encodes a fixed set of procedural training clips (17 frames, 128x128, training
attribute combinations only) with the trained VAE, once, into ``run_dir/latents/`` (resumable
chunk by chunk). Stage 2 trains the WanTransformer3DModel and the UMT5 encoder jointly:

    x_t = (1 - s) x_0 + s e,   target v = e - x_0,   loss = |v_theta(x_t, 1000 s, text) - v|^2

with s drawn logit-normally and shifted like the sampler (``flow_shift``), 10% of captions
dropped to "" for classifier-free guidance, fresh synonyms for every caption at every step,
and an EMA of the weights, which is what gets exported.

``--init FOLDER`` starts a further stage from a saved pipeline's transformer and text encoder (with a
fresh optimiser and learning-rate schedule); ``--shape-weights star=2`` draws clips whose first shape is
a star twice as often as the others.

``--sizes 256x33=0.6,384x57=0.1`` trains at several sizes (multi-resolution): each step draws one size by
its share (the rest of the steps at ``--size``/``--frames``), from clips encoded at that size, with about
the tokens of one ``--size`` batch per step; positions are interpolated to the ``--size`` grid
(:mod:`kinegen.models.rope`), and the exported folder says so in ``kinegen_rope.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, load_model, save_file

from ..data.shapes import SHAPES, recaption, render_clip, render_mask, sample_clip
from ..models.rope import ROPE_FILE, install_position_interpolation, read_rope_file, write_rope_file
from ..models.shapes_t2v import (
    MAX_SEQUENCE_LENGTH,
    build_scheduler,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
)
from .common import Progress, TimeBox, cosine_lr, frame_weights, load_checkpoint, object_weights, weighted_mse
from .configs import T2VTrainConfig
from .vae import to_tensor

CHUNK = 64
SIZE_SEED_STRIDE = 50_000  # clips of the k-th --sizes entry use seeds k * SIZE_SEED_STRIDE further on


@dataclasses.dataclass(frozen=True)
class SizeBucket:
    """One training size: ``size`` x ``size`` pixels, ``frames`` frames, the share of steps drawn at it, the
    clips encoded at it and the clips per step."""

    size: int
    frames: int
    share: float
    clips: int
    batch_size: int
    index: int  # 0 for --size/--frames, k for the k-th --sizes entry

    @property
    def tokens(self) -> int:
        return latent_tokens(self.size, self.frames)

    @property
    def folder_name(self) -> str:
        return "latents" if self.index == 0 else f"latents_{self.size}x{self.frames}"


def latent_grid(size: int, frames: int) -> tuple[int, int]:
    """Transformer tokens per axis (frames, side) of a ``frames`` x ``size`` x ``size`` clip: the VAE's 4x time and
    8x space, then the transformer's (1, 2, 2) patches."""
    return (frames - 1) // 4 + 1, size // 16


def latent_tokens(size: int, frames: int) -> int:
    """Transformer tokens per forward of a ``frames`` x ``size`` x ``size`` clip."""
    grid_frames, side = latent_grid(size, frames)
    return grid_frames * side * side


def parse_sizes(text: str, cfg: T2VTrainConfig) -> list[SizeBucket]:
    """``"256x33=0.6,384x57=0.1"`` -> the training sizes, ``--size``/``--frames`` first with the remaining share.

    Each further size holds ``dataset_clips`` scaled by its tokens (the same latent volume; at least 64 clips, or
    ``dataset_clips`` if fewer) and ``batch_size`` scaled the same way (at least 1), so a step costs about the
    same tokens at every size.
    """
    base_tokens = latent_tokens(cfg.size, cfg.frames)
    extra, seen = [], {(cfg.size, cfg.frames)}
    for item in filter(None, (t.strip() for t in text.split(","))):
        dims, sep, share = item.partition("=")
        h, x, f = dims.strip().partition("x")
        try:
            size, frames, weight = int(h), int(f), float(share)
        except ValueError:
            raise ValueError(f"--sizes {text!r}: expected SIZExFRAMES=SHARE items, e.g. '256x33=0.6,384x57=0.1'") \
                from None
        if not x or not sep or size % 16 or size < 16 or frames % 4 != 1:
            raise ValueError(f"--sizes: {item!r} needs a size that is a multiple of 16, frames of the form 4k + 1 "
                             "and a share, e.g. '256x33=0.6'")
        if not 0 < weight <= 1:
            raise ValueError(f"--sizes: the share of {dims.strip()} must be above 0 and at most 1; got {share}")
        if (size, frames) in seen:
            raise ValueError(f"--sizes: {dims.strip()} is given twice (or is --size x --frames itself)")
        seen.add((size, frames))
        extra.append((size, frames, weight))
    if extra and cfg.dataset_clips > SIZE_SEED_STRIDE:  # each size's clips draw seeds from their own range
        raise ValueError(f"--sizes: --dataset-clips can be at most {SIZE_SEED_STRIDE} with further sizes; "
                         f"got {cfg.dataset_clips}")
    rest = 1 - sum(w for _, _, w in extra)
    if rest < -1e-9:
        raise ValueError(f"--sizes {text!r}: the shares add up to more than 1")
    buckets = [SizeBucket(cfg.size, cfg.frames, max(rest, 0.0), cfg.dataset_clips, cfg.batch_size, 0)]
    for k, (size, frames, weight) in enumerate(extra, start=1):
        ratio = base_tokens / latent_tokens(size, frames)
        clips = max(min(64, cfg.dataset_clips), round(cfg.dataset_clips * ratio))
        buckets.append(SizeBucket(size, frames, weight, clips, max(1, round(cfg.batch_size * ratio)), k))
    return buckets


def _clip_seed(cfg: T2VTrainConfig, i: int, bucket: int = 0) -> int:
    return 1_000_000 + cfg.seed * 100_000_007 + bucket * SIZE_SEED_STRIDE + i


@torch.no_grad()
def encode_dataset(run_dir: Path, cfg: T2VTrainConfig, vae, bucket: SizeBucket | None = None
                   ) -> tuple[torch.Tensor, list[int]]:
    """Normalised VAE latents of the training clips at one size (default ``--size``/``--frames``), encoded once
    and cached in chunks."""
    bucket = bucket or parse_sizes("", cfg)[0]
    folder = run_dir / bucket.folder_name
    folder.mkdir(parents=True, exist_ok=True)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    # clips per VAE call: batching makes the Wan VAE's encoder 4x faster per clip on CPU (batch 1 at 256x33:
    # 7.7 s a clip, batch 4: 1.8 s); at most 8 clips of 256x33's pixels, and never fewer than 4
    per_call = min(8, max(4, 8 * 256 * 256 * 33 // (bucket.size ** 2 * bucket.frames)))
    chunks = []
    t0 = time.perf_counter()
    n_chunks = (bucket.clips + CHUNK - 1) // CHUNK
    for c in range(n_chunks):
        path = folder / f"chunk_{c:04d}.safetensors"
        if not path.is_file():
            seeds = [_clip_seed(cfg, i, bucket.index) for i in range(c * CHUNK, min((c + 1) * CHUNK, bucket.clips))]
            parts = []
            for j in range(0, len(seeds), per_call):
                clips = np.stack([render_clip(sample_clip(s, split="train"), bucket.frames, bucket.size, bucket.size)
                                  for s in seeds[j:j + per_call]])
                parts.append(vae.encode(to_tensor(clips)).latent_dist.mode())
            lat = (torch.cat(parts) - mean) / std
            save_file({"latents": lat.half().contiguous()}, str(path))
            rate = (c + 1) / (time.perf_counter() - t0)
            print(f"encoded {bucket.size}x{bucket.frames} chunk {c + 1}/{n_chunks} ({rate * CHUNK:.1f} clips/s)",
                  flush=True)
        chunks.append(load_file(str(path))["latents"])
    seeds = [_clip_seed(cfg, i, bucket.index) for i in range(bucket.clips)]
    return torch.cat(chunks).float(), seeds


class PaddedTextCrossAttention:
    """Wan cross-attention over ``[real tokens, one padding token]`` that equals attention over the
    full zero-padded 512-token context.

    WanPipeline zero-pads text embeddings to 512 tokens. Every padding token becomes the same key and
    value (the projections and the per-token key norm act on each token alone), so attending to ``n``
    copies of it is attending to one copy with ``log(n)`` added to its logit. Training with this
    processor costs ~L+1 keys per query instead of 512 and gives the same numbers as the pipeline's
    512-token inference.
    """

    def __init__(self):
        self.pad_copies = 1

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = attn.to_v(encoder_hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        bias = torch.zeros(k.shape[2], dtype=q.dtype, device=q.device)
        bias[-1] = float(np.log(self.pad_copies))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.view(1, 1, 1, -1))
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def encode_text_compact(tokenizer, text_encoder, prompts: list[str], total: int = MAX_SEQUENCE_LENGTH):
    """Text embeddings for the real tokens plus one zero row, and how many padding rows that row stands for."""
    enc = tokenizer(prompts, padding="longest", truncation=True, max_length=total, add_special_tokens=True,
                    return_attention_mask=True, return_tensors="pt")
    states = text_encoder(enc.input_ids, enc.attention_mask).last_hidden_state
    states = states * enc.attention_mask[..., None].to(states.dtype)
    states = torch.cat([states, states.new_zeros(states.shape[0], 1, states.shape[2])], dim=1)
    return states, total - (states.shape[1] - 1)


def latent_object_masks(specs, frames: int, size: int, temporal: int = 4, spatial: int = 8) -> torch.Tensor:
    """Where the objects are, on the VAE's latent grid: ``[N, 1, 1 + (frames - 1) / temporal, size / spatial,
    size / spatial]`` in {0, 1}.

    Latent frame 0 covers video frame 0 and latent frame ``k`` frames ``temporal * (k - 1) + 1 ..
    temporal * k`` (the Wan VAE's causal chunks); a latent pixel counts as object if, in any of its
    frames, any of its pixels is at least half covered.
    """
    return torch.stack([latent_coverage(torch.from_numpy(render_mask(spec, frames, size, size)), temporal, spatial)
                        for spec in specs])[:, None].float()


def latent_coverage(mask: torch.Tensor, temporal: int = 4, spatial: int = 8) -> torch.Tensor:
    """One clip's object coverage ``[T, H, W]`` (``T = 1 + temporal k``) on the latent grid as the causal VAE codes
    it, bool ``[1 + k, H / spatial, W / spatial]``: latent frame 0 from video frame 0, each later one from its
    ``temporal`` frames; a latent pixel is object if any of its pixels in any of its frames is half covered."""
    m = torch.cat([mask[:1], mask[1:].unflatten(0, (-1, temporal)).amax(1)])
    return F.max_pool2d(m[:, None], spatial)[:, 0] > 0.5


def batch_captions(specs, idx: torch.Tensor, step: int, cfg_dropout: float, gen: torch.Generator) -> list[str]:
    """Fresh synonyms for the batch's clips (seeded by step and position), each dropped to "" with probability
    ``cfg_dropout`` (classifier-free guidance's unconditional branch)."""
    captions = [recaption(specs[i], seed=step * len(idx) + j) for j, i in enumerate(idx.tolist())]
    drop = torch.rand(len(idx), generator=gen) < cfg_dropout
    return ["" if d else c for c, d in zip(captions, drop.tolist(), strict=True)]


def _sigmas(n: int, shift: float, gen: torch.Generator) -> torch.Tensor:
    u = torch.sigmoid(torch.randn(n, generator=gen))
    return shift * u / (1 + (shift - 1) * u)


def _flow_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None, object_weight: float,
               first_frame_weight: float = 1.0):
    """The flow loss under :func:`~kinegen.training.common.object_weights` and latent frame 0 weighted
    ``first_frame_weight``. Latent frame 0 is the one the causal VAE codes from the first frame alone, and its
    decode is 3.5-4x more sensitive to latent errors than the others' (docs/bundled_model.md)."""
    frame = None
    if first_frame_weight != 1:
        frame = torch.ones(pred.shape[2])
        frame[0] = first_frame_weight
    return weighted_mse(pred, target, object_weights(mask, object_weight), frame_weights(frame, pred))


def _rope_to_float32(transformer) -> None:
    """Wan's RoPE tables are float64 on CPU; float32 is ~15% faster to train and loses nothing here."""
    rope = transformer.rope
    rope.freqs_cos = rope.freqs_cos.float()
    rope.freqs_sin = rope.freqs_sin.float()


@torch.no_grad()
def _ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
        pe.lerp_(pm, 1 - decay)


def parse_shape_weights(text: str) -> dict[str, float]:
    """``"star=2,circle=0.5"`` -> ``{"star": 2.0, "circle": 0.5}`` (shapes not named keep weight 1)."""
    table = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in SHAPES:
            raise ValueError(f"--shape-weights {text!r}: expected SHAPE=WEIGHT pairs with SHAPE one of "
                             f"{', '.join(SHAPES)}, e.g. 'star=2'")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--shape-weights: {value!r} is not a number") from None
        if not weight >= 0:
            raise ValueError(f"--shape-weights: the weight of {name.strip()} must be >= 0")
        table[name.strip()] = weight
    if table and all(table.get(s, 1.0) == 0 for s in SHAPES):
        raise ValueError(f"--shape-weights {text!r} leaves no clip to train on")
    return table


def clip_sampling_weights(specs, table: dict[str, float]) -> torch.Tensor:
    """Per-clip sampling weights: the weight of each clip's first shape (:func:`parse_shape_weights`)."""
    return torch.tensor([table.get(spec.primary.shape, 1.0) for spec in specs], dtype=torch.float64)


def _init_files(folder: Path) -> dict[str, Path]:
    """The transformer and text-encoder weights of a saved pipeline folder (checked before any work)."""
    files = {"transformer": folder / "transformer" / "diffusion_pytorch_model.safetensors",
             "text_encoder": folder / "text_encoder" / "model.safetensors"}
    for file in files.values():
        if not file.is_file():
            raise FileNotFoundError(f"--init {folder}: {file} is missing; pass a folder written by kinegen train t2v")
    return files


def _load_init(folder: Path, modules: dict[str, torch.nn.Module]) -> None:
    """Start from a saved pipeline's transformer and text encoder (a further training stage)."""
    for name, file in _init_files(folder).items():
        missing, unexpected = load_model(modules[name], str(file), strict=False)
        if missing or unexpected:
            raise ValueError(f"--init {folder}: its {name} differs from the bundled architecture "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def train_t2v(run_dir: str | Path, cfg: T2VTrainConfig) -> Path:
    """Encode the dataset (once), then train or resume; exports ``run_dir/pipeline``."""
    from diffusers import AutoencoderKLWan

    shape_table = parse_shape_weights(cfg.shape_weights)  # bad settings fail before the dataset is encoded
    buckets = parse_sizes(cfg.sizes, cfg)
    if cfg.init:
        _init_files(Path(cfg.init))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    vae = AutoencoderKLWan.from_pretrained(cfg.vae, use_safetensors=True).eval()
    data = []  # per bucket: latents, specs, masks, sampling weights
    for bucket in buckets:
        latents, seeds = encode_dataset(run_dir, cfg, vae, bucket)
        specs = [sample_clip(s, split="train") for s in seeds]
        masks = latent_object_masks(specs, bucket.frames, bucket.size) if cfg.object_weight else None
        data.append((latents, specs, masks, clip_sampling_weights(specs, shape_table)))
    frames_grid, side = latent_grid(cfg.size, cfg.frames)
    reference_grid = (frames_grid, side, side) if (
        len(buckets) > 1 or (cfg.init and read_rope_file(cfg.init))) else None

    torch.manual_seed(cfg.seed)
    tokenizer = build_tokenizer()
    text_encoder = build_text_encoder(vocab_size=128)
    transformer = build_transformer()
    _rope_to_float32(transformer)
    if reference_grid is not None:
        install_position_interpolation(transformer, reference_grid)
    cross = PaddedTextCrossAttention()
    for block in transformer.blocks:
        block.attn2.set_processor(cross)
    modules = {"transformer": transformer, "text_encoder": text_encoder}
    if cfg.init:
        _load_init(Path(cfg.init), modules)
    ema = {k: copy.deepcopy(m).requires_grad_(False) for k, m in modules.items()}
    params = [p for m in modules.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ckpt_modules = {**modules, **{f"ema_{k}": m for k, m in ema.items()}}
    step, _ = load_checkpoint(run_dir, ckpt_modules, opt)
    n_params = sum(p.numel() for p in params) / 1e6
    sizes = ", ".join(f"{len(d[1])} at {b.size}x{b.frames} ({b.share:.0%} of steps, {b.batch_size} per step)"
                      for b, d in zip(buckets, data, strict=True))
    print(f"T2V: {n_params:.2f}M trainable parameters, clips: {sizes}; starting at step {step}", flush=True)
    shares = torch.tensor([b.share for b in buckets], dtype=torch.float64)
    progress = Progress(run_dir, cfg.steps, step)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    for m in modules.values():
        m.train()
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        # one size per step (a single-size run draws nothing here, so its batches are what they always were)
        b = 0 if len(buckets) == 1 else int(torch.multinomial(shares, 1, generator=gen))
        latents, specs, masks, weights = data[b]
        batch_size = buckets[b].batch_size
        if shape_table:
            idx = torch.multinomial(weights, batch_size, replacement=True, generator=gen)
        else:  # uniform, drawn as stages 1 and 2 of the bundled model were
            idx = torch.randint(len(specs), (batch_size,), generator=gen)
        x0 = latents[idx]
        captions = batch_captions(specs, idx, step, cfg.cfg_dropout, gen)
        noise = torch.randn(x0.shape, generator=gen)
        s = _sigmas(batch_size, cfg.flow_shift, gen).view(-1, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=200)
        text, cross.pad_copies = encode_text_compact(tokenizer, text_encoder, captions)
        pred = transformer(xt, timestep=s.flatten() * 1000, encoder_hidden_states=text, return_dict=False)[0]
        loss = _flow_loss(pred, noise - x0, None if masks is None else masks[idx], cfg.object_weight,
                          cfg.first_frame_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(cfg.ema, (1 + step) / (10 + step))
        for k in modules:
            _ema_update(ema[k], modules[k], decay)
        step += 1
        progress.update(step, loss=loss.item())
        if box.after_step(run_dir, ckpt_modules, opt, step):
            break
    progress.close()
    return export_pipeline(run_dir / "pipeline", tokenizer, ema["text_encoder"], vae, ema["transformer"],
                           cfg.flow_shift, defaults=dict(height=cfg.size, width=cfg.size, frames=cfg.frames),
                           reference_grid=reference_grid)


def export_pipeline(folder: Path, tokenizer, text_encoder, vae, transformer, flow_shift: float,
                    defaults: dict | None = None, reference_grid=None) -> Path:
    """Save a standard diffusers WanPipeline folder (safetensors only) with ``kinegen_defaults.json``:
    ``defaults`` (the training size) over the bundled model's registry entry; with ``reference_grid``, also
    ``kinegen_rope.json`` (positions interpolated to that grid at other sizes)."""
    from diffusers import WanPipeline
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from ..loading import write_generation_defaults
    from ..registry import get_model_spec

    transformer = copy.deepcopy(transformer)
    for block in transformer.blocks:
        block.attn2.set_processor(WanAttnProcessor())
    transformer.rope.freqs_cos = transformer.rope.freqs_cos.double()
    transformer.rope.freqs_sin = transformer.rope.freqs_sin.double()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder.eval(), vae=vae.eval(),
                       scheduler=build_scheduler(flow_shift), transformer=transformer.eval())
    pipe.save_pretrained(folder, safe_serialization=True)
    if reference_grid is not None:
        write_rope_file(folder, reference_grid)
    elif (Path(folder) / ROPE_FILE).exists():
        (Path(folder) / ROPE_FILE).unlink()
    bundled = get_model_spec("kinegen-shapes-t2v")
    write_generation_defaults(folder, **{"height": bundled.height, "width": bundled.width, "frames": bundled.frames,
                                         "steps": bundled.steps, "guidance": bundled.guidance, "fps": bundled.fps,
                                         **(defaults or {})})
    print(f"saved pipeline to {folder}", flush=True)
    return folder
