"""``kinegen calibrate``: record TVMaps over a prompt set and train the Map Predictor on them.

1. For every (prompt, seed), one dense run with the recording hook
   (:func:`kinegen.caching.map_guided.record_map`) gives the true map and the predictor's input
   features. Maps are written to ``OUT/maps.jsonl`` as they come, so ``--maps`` can retrain
   without recording again.
2. Prompts are split (seeded) into calibration and held-out prompts; the predictor is fit on
   the calibration maps (regression on ``log V`` plus a correlation term, since the planner
   only needs the ordering of cells) and evaluated on the held-out ones by Spearman rank
   correlation, next to the average map's correlation.
3. ``OUT/`` receives ``model.safetensors`` + ``config.json`` (the predictor, with its metrics)
   and ``calibration.json`` (the report).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..caching.tvmap import resample, spearman
from ..errors import ConfigError

EPS = 1e-6


def read_prompts(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        what = "is a folder" if p.is_dir() else "does not exist"
        raise ConfigError(f"prompt file {p} {what}; give a text file with one prompt per line.")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"prompt file {p} is not UTF-8 text; give a text file with one prompt per line.") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(prompts) < 4:
        raise ConfigError(f"{p} has {len(prompts)} prompts; calibration needs at least 4 (50 or more is better).")
    return prompts


def record_calibration_maps(pipe, prompts: list[str], seeds: int = 1, group_size: int = 1, progress=None,
                            sink: Path | None = None, **fields) -> list[dict]:
    """One dense recording run per (prompt, seed); returns (and appends to ``sink``) one record each."""
    from ..caching.map_guided import record_map
    from ..generation import prepare

    records = []
    out = open(sink, "a") if sink else None  # noqa: SIM115 (closed below)
    try:
        total = len(prompts) * seeds
        for i, prompt in enumerate(prompts):
            for seed in range(seeds):
                job = prepare(pipe, prompt, seed=seed, **fields)
                req = job.request
                t0 = time.perf_counter()
                rec = record_map(pipe, job.run_info(), group_size=group_size)
                record = {"prompt": prompt, "prompt_index": i, "seed": seed, "steps": req.steps,
                          "guidance": req.guidance, "size": [req.frames, req.height, req.width],
                          "grid": list(rec["grid"]), "groups": rec["map"].groups,
                          "features": rec["features"].tolist(), "text_dim": rec["text_dim"],
                          "map": rec["map"].values.tolist(),
                          "seconds": time.perf_counter() - t0}
                records.append(record)
                if out:
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                if progress:
                    progress(len(records), total)
    finally:
        if out:
            out.close()
    return records


def _latents(pipe, kwargs: dict) -> np.ndarray:
    """The pipeline's final latents (``output_type="latent"``: no decoding) as a float64 array."""
    out = pipe(**{**kwargs, "output_type": "latent"})
    x = out.frames if hasattr(out, "frames") else out.images
    x = x[0] if isinstance(x, (list, tuple)) else x
    return np.asarray(x.float().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)


def measure_sensitivity(pipe, prompts: list[str], *, group_size: int = 1, progress=None, **fields) -> dict:
    """The step-sensitivity profile: how far one reuse at step ``t`` moves the final output, per unit of drift.

    For each prompt: a dense run records its map ``V`` and gives the final latents ``y``; then, for every
    step ``t`` but the first and last, a run computes every step except ``t``, where every block group
    reuses its cached contribution from ``t - 1`` (:func:`kinegen.caching.map_guided.apply_fixed_plan`:
    exactly what a plan does), giving ``y_t``. The sensitivity is
    ``a[t] = (||y_t - y|| / ||y||) / sum_g V[t, g]``: the output error per unit of the drift the map
    predicts for that reuse. Profiles are averaged over prompts in log space and scaled to mean 1;
    the first and last steps (never reused) take their neighbours' values. The planners weight each
    step's drift by it (:func:`kinegen.caching.planner.segment_costs`).
    """
    from ..caching.map_guided import apply_fixed_plan, record_map
    from ..generation import prepare

    logs = []
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        job = prepare(pipe, prompt, seed=0, **fields)
        info = job.run_info()
        v = record_map(pipe, info, group_size=group_size)["map"].values
        ref = _latents(pipe, job.pipeline_kwargs())
        steps = v.shape[0]
        ratio = np.full(steps, np.nan)
        for t in range(1, steps - 1):
            plan = np.ones(v.shape, dtype=bool)
            plan[t] = False
            with apply_fixed_plan(pipe, plan, info, group_size=group_size, note="a fixed plan (sensitivity probe)"):
                y = _latents(pipe, job.pipeline_kwargs())
            ratio[t] = (np.linalg.norm(y - ref) / max(np.linalg.norm(ref), EPS)) / max(float(v[t].sum()), EPS)
        logs.append(np.log(np.maximum(ratio, EPS)))
        if progress:
            progress(i + 1, len(prompts))
    profile = np.ones(len(logs[0]))
    profile[1:-1] = np.exp(np.stack(logs)[:, 1:-1].mean(0))
    profile[0], profile[-1] = profile[1], profile[-2]
    profile = profile / profile.mean()
    return {"profile": profile.tolist(), "prompts": len(prompts), "steps": int(len(profile)),
            "seconds": time.perf_counter() - t0}


def split_prompts(records: list[dict], held_out: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Record indices of calibration and held-out prompts (a prompt's seeds stay on one side)."""
    prompts = sorted({r["prompt_index"] for r in records})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(prompts))
    n_held = int(round(held_out * len(prompts)))
    held = {prompts[j] for j in order[:n_held]}
    train = [i for i, r in enumerate(records) if r["prompt_index"] not in held]
    test = [i for i, r in enumerate(records) if r["prompt_index"] in held]
    return train, test


def _targets(records: list[dict], steps_ref: int) -> torch.Tensor:
    return torch.tensor(np.stack([np.log(resample(np.asarray(r["map"]), steps_ref) + EPS) for r in records]),
                        dtype=torch.float32)


def _pearson_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p = pred.flatten(1)[:, 1:] - pred.flatten(1)[:, 1:].mean(1, keepdim=True)
    t = target.flatten(1)[:, 1:] - target.flatten(1)[:, 1:].mean(1, keepdim=True)
    r = (p * t).sum(1) / (p.norm(dim=1) * t.norm(dim=1)).clamp_min(1e-8)
    return (1 - r).mean()


def fit_predictor(records: list[dict], *, model_key: str, transformer_class: str, group_size: int,
                  steps_ref: int = 32, hidden: int = 128, rank: int = 4, train_steps: int = 2000,
                  lr: float = 2e-3, weight_decay: float = 1e-4, seed: int = 0):
    """Fit a :class:`MapPredictor` to recorded maps (full batch; seconds on a CPU)."""
    from ..models.map_predictor import NUM_SCALARS, MapPredictor, MapPredictorConfig

    torch.manual_seed(seed)
    feats = torch.tensor([r["features"] for r in records], dtype=torch.float32)
    target = _targets(records, steps_ref)
    first = records[0]
    text_dim = int(first["text_dim"])
    latent_channels = (feats.shape[1] - NUM_SCALARS - text_dim) // 2
    cfg = MapPredictorConfig(
        text_dim=text_dim, latent_channels=latent_channels, groups=target.shape[2], steps_ref=steps_ref,
        hidden=hidden, rank=rank, model_key=model_key, transformer_class=transformer_class,
        group_names=list(first["groups"]), group_size=group_size,
        trained_sizes=sorted({tuple(r["size"]) for r in records}),
        trained_steps=sorted({int(r["steps"]) for r in records}),
        trained_guidance=sorted({float(1.0 if r.get("guidance") is None else r["guidance"]) for r in records}))
    cfg.trained_sizes = [list(s) for s in cfg.trained_sizes]
    model = MapPredictor(cfg)
    model.feature_mean.copy_(feats.mean(0))
    std = feats.std(0) if len(records) > 1 else torch.zeros(feats.shape[1])
    # features constant over the calibration set (e.g. the step count) keep unit scale: another value at
    # inference then moves the input a little instead of by thousands of standard deviations
    model.feature_std.copy_(torch.where(std < 1e-3, torch.ones_like(std), std))
    with torch.no_grad():
        model.mean_log_map.copy_(target.mean(0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    for step in range(train_steps):
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1 + np.cos(np.pi * step / train_steps))
        pred = model(feats)
        loss = torch.nn.functional.mse_loss(pred, target) + 0.5 * _pearson_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def evaluate_predictor(model, records: list[dict]) -> dict:
    """Spearman rank correlation of predicted (and of the average) against true maps."""
    if not records:
        return {}
    feats = torch.tensor([r["features"] for r in records], dtype=torch.float32)
    with torch.no_grad():
        pred = np.exp(model(feats).double().numpy())
        avg = np.exp(model.mean_log_map.detach().double().numpy())
    rho_pred, rho_avg = [], []
    for r, p in zip(records, pred, strict=True):
        true = np.asarray(r["map"])
        rho_pred.append(spearman(resample(p, true.shape[0]), true))
        rho_avg.append(spearman(resample(avg, true.shape[0]), true))
    return {"prompts": len(records), "spearman_predicted_mean": float(np.mean(rho_pred)),
            "spearman_predicted_min": float(np.min(rho_pred)), "spearman_average_mean": float(np.mean(rho_avg)),
            "spearman_average_min": float(np.min(rho_avg))}


def calibrate(pipe, prompts: list[str], output: str | Path, *, seeds: int = 1, held_out: float = 0.2,
              group_size: int = 1, maps: str | Path | None = None, train_steps: int = 2000,
              sensitivity_prompts: int = 4, progress=None, sensitivity_progress=None, **fields) -> dict:
    """Record maps (or read ``maps``), fit the predictor on calibration prompts, evaluate on held-out ones,
    and measure the step-sensitivity profile on the first ``sensitivity_prompts`` calibration prompts."""
    from ..caching.tvmap import load_maps
    from ..generation import spec_of
    from ..media import atomic_write_text
    from ..models.map_predictor import weights_fingerprint

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if maps:
        records = load_maps(maps)
        if not records:
            raise ConfigError(f"{maps} holds no recorded maps.")
    else:
        sink = out / "maps.jsonl"
        if sink.exists():
            sink.unlink()
        records = record_calibration_maps(pipe, prompts, seeds=seeds, group_size=group_size, progress=progress,
                                          sink=sink, **fields)
    record_s = time.perf_counter() - t0
    train_idx, test_idx = split_prompts(records, held_out)
    if not train_idx:
        raise ConfigError("no calibration prompts left after the held-out split; lower --held-out.")
    spec = spec_of(pipe)
    t1 = time.perf_counter()
    model = fit_predictor([records[i] for i in train_idx], model_key=spec.name,
                          transformer_class=type(pipe.transformer).__name__, group_size=group_size,
                          train_steps=train_steps)
    fit_s = time.perf_counter() - t1
    metrics = {"train": evaluate_predictor(model, [records[i] for i in train_idx]),
               "held_out": evaluate_predictor(model, [records[i] for i in test_idx])}
    model.config.metrics = metrics
    model.config.transformer_fingerprint = weights_fingerprint(pipe.transformer)
    sensitivity = None
    if sensitivity_prompts > 0:
        probe = list(dict.fromkeys(records[i]["prompt"] for i in train_idx))[:sensitivity_prompts]
        r0 = records[train_idx[0]]
        frames, height, width = r0["size"]
        probe_fields = {**fields, "frames": frames, "height": height, "width": width, "steps": r0["steps"],
                        "guidance": r0["guidance"]}  # the conditions the maps were recorded under
        sensitivity = measure_sensitivity(pipe, probe, group_size=group_size, progress=sensitivity_progress,
                                          **probe_fields)
        model.config.sensitivity = sensitivity["profile"]
    model.save(out)
    report = {"model": spec.name, "records": len(records), "calibration_prompts": len(train_idx),
              "held_out_prompts": len(test_idx), "record_s": record_s, "fit_s": fit_s, "metrics": metrics,
              "sensitivity": sensitivity,
              "held_out_prompt_list": sorted({records[i]["prompt"] for i in test_idx})}
    atomic_write_text(out / "calibration.json", json.dumps(report, indent=2) + "\n")
    return report
