"""Dynamics-guided distillation of a chunk-by-chunk model for DASA (reference note, section 4.3; docs/dasa.md).

DASA changes what the model sees: past chunks are in the cache by their dynamic tokens only (with the log-count
bias), and static regions get less compute. This fine-tune teaches the model to work that way. The **student** is
the model with DASA on; the **teacher** is the same model, frozen, dense. Both see the same history, the
student's own rollout (x0 regression on self-rollouts, the note's second loss choice):

1. a rollout of ``frames`` frames from a training prompt, chunk after chunk, by the student with DASA on (no
   gradients), each committed chunk also committed densely to the teacher's own cache; with overlapping VAE
   segments each later segment starts as the pipeline starts it, on the last frame so far re-encoded (not
   generated: before 2026-12-07, later, the rollouts drew it from noise, which the pipeline never does);
2. at ``loss_steps`` denoising steps of each generated chunk after the first (drawn at random), the student's
   forward runs with gradients and the teacher's on the same input, and

       loss = mean_tokens( w * |x0_student - x0_teacher|^2 ),   x0 = x_t - sigma_t v,   w = 1 + lambda * dyn

   over both guidance branches, where ``dyn`` is 1 at the chunk's dynamic places (the dynamic set DASA computes it
   with) and ``lambda`` is ``dynamic_weight``: what moves is what the compressed cache and the region compute put
   at risk, so it weighs more;
3. the gradients of the rollout's forwards are summed and one optimizer step is taken per rollout. The cache the
   student attends to was committed without gradients (as Self-Forcing trains with a detached cache).

The exported folder is the same kind of pipeline as ``--init`` (load it as any chunk-by-chunk model, with
``--attention dasa:...`` at the settings it was distilled for) with ``--init``'s generation defaults and, in
``distill.json``, the recipe (the DASA settings among it) and the steps done.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch

from ..data.shapes import recaption, sample_clip
from .common import Progress, TimeBox, cosine_lr, load_checkpoint, weighted_mse


def _forward(transformer, state, latents, t, embeds, *, frame_offset: int, commit: bool) -> torch.Tensor:
    """One forward of a causal transformer (what ``WanAutoregressivePipeline._forward`` runs, for the teacher)."""
    state.frame_offset, state.commit = frame_offset, commit
    timestep = torch.full((latents.shape[0],), float(t), device=latents.device)
    return transformer(hidden_states=latents.to(transformer.dtype), timestep=timestep,
                       encoder_hidden_states=embeds, return_dict=False)[0]


def dynamic_weight_map(dynamic: torch.Tensor | None, patch: tuple[int, int], dynamic_weight: float) -> torch.Tensor:
    """``w = 1 + lambda * dyn`` on the latent grid ``[1, 1, 1, h, w]`` from the token-grid dynamic set ``[H', W']``
    (None: no dynamic set yet, every place weighs 1)."""
    if dynamic is None:
        return torch.ones(1, 1, 1, 1, 1)
    grid = dynamic.float().repeat_interleave(patch[0], 0).repeat_interleave(patch[1], 1)
    return (1.0 + dynamic_weight * grid)[None, None, None]


def distillation_loss(student_v: torch.Tensor, teacher_v: torch.Tensor, sigma: float, weight: torch.Tensor):
    """``mean(w * |x0_s - x0_t|^2)`` with ``x0 = x_t - sigma v`` (the same x_t for both): ``sigma^2 mean(w |v_s -
    v_t|^2)``, normalised by the weights' mean so that ``dynamic_weight`` moves the balance, not the scale."""
    return sigma ** 2 * weighted_mse(student_v.float(), teacher_v.float(), weight.to(student_v.device))


@torch.no_grad()
def rollout_losses(pipe, student_run, teacher, prompt: str, cfg, generator, rng: np.random.Generator) -> list[float]:
    """One rollout (steps 1 and 2 of the module docstring): the student is ``pipe.transformer`` with
    ``student_run`` (a :class:`~kinegen.dasa.run.DASARun`) driving it, ``teacher`` the dense copy. Returns the
    per-forward losses, already backpropagated into the student's gradients."""
    from ..pipelines.causal_wan import KVCacheConfig, make_causal
    from ..pipelines.wan_ar import SegmentChunks

    device = pipe._execution_device
    partition = pipe.check_frames(cfg.frames)  # the pipeline's own chunks (with VAE segments, segment by segment)
    height = width = cfg.size
    h, w = height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial
    guidance = cfg.guidance
    pipe._max_sequence_length = 226  # the pipeline call's default
    embeds = pipe._embeds(prompt, None, guidance, device)
    losses: list[float] = []
    cache = KVCacheConfig(sink_frames=pipe.config.sink_frames, window_frames=pipe.config.window_frames)
    student_state = make_causal(pipe.transformer, cache)  # per rollout, as the pipeline does per call
    teacher_state = make_causal(teacher, cache)
    segments = SegmentChunks(pipe)
    student_run.begin(pipe, student_state)
    try:
        start = 0
        for c, n in enumerate(partition):
            student_run.before_chunk(c, start, n, cfg.sample_steps, False)
            x = segments.relinked(start)  # the last frame shown, re-encoded, as the pipeline starts a segment
            if x is not None:  # no loss on it
                segments.add(x)
                _commit(pipe, teacher, student_run, student_state, teacher_state, x, start, embeds, guidance,
                        generator)
                start += n
                continue
            x = torch.randn((1, pipe.transformer.config.in_channels, n, h, w), generator=generator).to(device)
            pipe.scheduler.set_timesteps(cfg.sample_steps, device=device)
            trained = set(rng.choice(cfg.sample_steps, size=min(cfg.loss_steps, cfg.sample_steps),
                                     replace=False).tolist()) if c > 0 else set()
            weight = dynamic_weight_map(student_run.tracker.dynamic, student_run.patch, cfg.dynamic_weight)
            for i, t in enumerate(pipe.scheduler.timesteps):
                inp = torch.cat([x, x]) if guidance > 1 else x
                if i in trained:
                    with torch.enable_grad():
                        pred = pipe._forward(inp, t, embeds, student_state, frame_offset=start, commit=False)
                        with torch.no_grad():
                            target = _forward(teacher, teacher_state, inp, t, embeds, frame_offset=start,
                                              commit=False)
                        loss = distillation_loss(pred, target, float(pipe.scheduler.sigmas[i]), weight)
                        loss.backward()
                    losses.append(loss.item())
                    pred = pred.detach()
                else:
                    pred = pipe._forward(inp, t, embeds, student_state, frame_offset=start, commit=False)
                pred = pred.float()
                if guidance > 1:
                    uncond, cond = pred.chunk(2)
                    pred = uncond + guidance * (cond - uncond)
                x = pipe.scheduler.step(pred, t, x, return_dict=False)[0]
            segments.add(x)
            _commit(pipe, teacher, student_run, student_state, teacher_state, x, start, embeds, guidance, generator)
            start += n
    finally:
        student_run.end()
        for state in (student_state, teacher_state):
            state.clear()
            state.remove()
    return losses


def _commit(pipe, teacher, student_run, student_state, teacher_state, x, start, embeds, guidance, generator):
    """A chunk's clean latents ``x`` into both caches, as the pipeline commits (at its ``context_noise``,
    docs/autoregressive.md), the student's after DASA has read its dynamics."""
    from ..pipelines.wan_ar import context_latents

    student_run.before_commit(x, start)
    level = pipe.config.context_noise
    x = context_latents(x, level, generator)
    committed = torch.cat([x, x]) if guidance > 1 else x
    pipe._forward(committed, 1000 * level, embeds, student_state, frame_offset=start, commit=True)
    _forward(teacher, teacher_state, committed, 1000 * level, embeds, frame_offset=start, commit=True)


def train_dasa(run_dir: str | Path, cfg) -> Path:
    """Distil (or resume distilling) in ``run_dir``; returns the exported pipeline folder (``run_dir/pipeline``)."""
    from ..dasa.config import DASAConfig
    from ..dasa.run import DASARun
    from ..loading import ASSETS_DIR
    from ..pipelines import WanAutoregressivePipeline

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    init = cfg.init or str(ASSETS_DIR / "models" / "kinegen-shapes-ar")
    dasa_config = _dasa_config(cfg.dasa, DASAConfig)
    pipe = WanAutoregressivePipeline.from_pretrained(init, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    if cfg.guidance is None:
        cfg.guidance = _init_defaults(init).get("guidance", 1.0)
    pipe.transformer.requires_grad_(False)
    teacher = copy.deepcopy(pipe.transformer).eval()
    student = pipe.transformer
    params = [p for name, p in student.named_parameters() if _trained(name, cfg.train)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    modules = {"transformer": student}
    step, _ = load_checkpoint(run_dir, modules, opt)
    run = DASARun(dasa_config)
    print(f"DASA distillation: {sum(p.numel() for p in params) / 1e6:.2f}M of "
          f"{sum(p.numel() for p in student.parameters()) / 1e6:.2f}M parameters trained ({cfg.train}), "
          f"rollouts of {cfg.frames} frames at {cfg.size}x{cfg.size}, {cfg.sample_steps} steps, guidance "
          f"{cfg.guidance}, dasa:{cfg.dasa}; starting at step {step}", flush=True)
    progress = Progress(run_dir, cfg.steps, step, every=5)
    box = TimeBox(cfg.steps, cfg.checkpoint_every, cfg.max_minutes)
    try:
        while step < cfg.steps:
            rng = np.random.default_rng(cfg.seed * 1_000_003 + step)
            generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
            spec = sample_clip(5_000_000 + cfg.seed * 100_003 + step, split="train")
            prompt = recaption(spec, seed=step)
            for g in opt.param_groups:
                g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, warmup=10)
            opt.zero_grad(set_to_none=True)
            student.train()
            losses = rollout_losses(pipe, run, teacher, prompt, cfg, generator, rng)
            n = max(len(losses), 1)
            for p in params:
                if p.grad is not None:
                    p.grad /= n
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            progress.update(step, loss=float(np.mean(losses)) if losses else 0.0)
            if box.after_step(run_dir, modules, opt, step):
                break
    finally:
        progress.close()
    student.eval().requires_grad_(False)
    return export_distilled(run_dir / "pipeline", pipe, init, cfg, step)


def _trained(name: str, which: str) -> bool:
    """Which parameters the distillation trains: ``attention`` (self-attention projections and norms, the part DASA
    changes the inputs of) or ``all``."""
    return which == "all" or ".attn1." in name or ".norm1" in name


def _dasa_config(spec: str, config_cls):
    from ..accelerators.catalog import parse_spec

    _, config = parse_spec(f"dasa:{spec}" if spec else "dasa", kind="attention")
    if not isinstance(config, config_cls):
        raise TypeError(f"--dasa {spec!r} did not give DASA settings")
    return config


def _init_defaults(folder: str) -> dict:
    from ..loading import read_generation_defaults

    return read_generation_defaults(folder)


def export_distilled(folder: Path, pipe, init: str, cfg, step: int) -> Path:
    """Save the distilled pipeline (safetensors), ``--init``'s generation defaults and ``distill.json`` (the recipe,
    the DASA settings among it, and the steps done)."""
    import dataclasses

    from ..loading import write_generation_defaults
    from ..media import atomic_write_text

    pipe.save_pretrained(folder, safe_serialization=True)
    write_generation_defaults(folder, **_init_defaults(init))
    recipe = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("max_minutes", "checkpoint_every")}
    recipe.update(init=cfg.init or "kinegen-shapes-ar (bundled)", trained_steps=step)
    atomic_write_text(folder / "distill.json", json.dumps(recipe, indent=2) + "\n")
    print(f"saved pipeline to {folder}", flush=True)
    return folder
