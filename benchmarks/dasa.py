"""DASA against the dense chunk-by-chunk pipeline and against its peers at equal KV budget, side by side in one run,
and its dynamics masks against the procedural videos' moving objects (issue 21, item 2; benchmarks/dasa.md).

    .venv/bin/python benchmarks/dasa.py rollouts --split held_out --prompts 3 --frames 241 \\
        --distilled runs/dasa/pipeline --output benchmarks/results/dasa/rollouts_held_out.json
    .venv/bin/python benchmarks/dasa.py masks --clips 8 --output benchmarks/results/dasa/masks.json
    .venv/bin/python benchmarks/dasa.py sweep --prompts 2 --setting a4=keep=0.3,anchor_every=4 \
        --output benchmarks/results/dasa/sweep.json

``rollouts``: for each prompt (``adherence_prompts(n, split, seed=1)``, never used in training or tuning) every
setting below generates the same video (seed = prompt index) by streaming (``pipe.stream``, each chunk decoded when
committed); the settings run in a rotated order from prompt to prompt, so that drift of the machine's speed spreads
over all of them. Per setting:

- transformer seconds per chunk (denoising + commit, chunks after the first two, where DASA acts) and its speedup
  over dense (the ratio of the sums); end-to-end seconds with decoding;
- KV bytes after the last chunk and at most, against dense; the process's peak RSS over the rollout;
- fidelity against the dense video of the same prompt and seed: PSNR (dB) and SSIM (kinegen.profiling.metrics);
- adherence per 17-frame window (the reader of benchmarks/autoregressive_windows.py): shape, colour, motion.

Settings: ``dense``; DASA at ``keep=0.3`` with each compute allocation (``reuse``, ``sparse``, ``steps``, ``none`` =
KV compression only) and ``reuse`` at ``keep=0.2``; the peers at the KV budget DASA's ``compute=none`` reached on the
same prompt: ``uniform`` and ``random`` token dropping (``select=``, their ``keep`` set so that the kept share is
equal), dynamic-only without the log-count bias (``bias=false``), the rolling window alone (the dense pipeline with a
window of the same bytes), and AnyFlow-FAR-style compressed history (``far-pool``: frames older than the recent ones
pooled 2x2, :mod:`kinegen.dasa.peers`, with as many recent frames kept whole as gives the same bytes); with
``--distilled``, the distilled model with DASA ``reuse``.

``sweep``: dense and any named DASA settings (``--setting NAME=SETTINGS``, repeatable) on the same prompts, the
same measures as ``rollouts`` without the peers; with ``--distilled``, each setting also on the distilled model.

``masks``: procedural long videos (held-out seeds) encoded with the model's VAE as the pipeline codes them (whole,
or each overlapping segment alone) and cut into the pipeline's chunks; DASA's dynamics tracker reads them as the
pipeline would at each commit (a re-encoded segment start kept whole and skipped). Ground truth per token and latent
frame: an object covers any pixel of the token's 16x16 cell in the video frames the latent frame and the one before
code (its motion's footprint). Reported: IoU of DASA's kept (dynamic) tokens with that footprint, with recall and
precision, next to uniform and random selections that keep the same share of tokens on the same clip.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

DASA_SETTINGS = {
    "dasa-reuse": "keep=0.3,compute=reuse",
    "dasa-sparse": "keep=0.3,compute=sparse",
    "dasa-steps": "keep=0.3,compute=steps",
    "dasa-kv-only": "keep=0.3,compute=none",
    "dasa-reuse-keep0.2": "keep=0.2,compute=reuse",
    "no-bias": "keep=0.3,compute=none,bias=false",
}
PEERS = ("uniform", "random", "window")


def rollout(pipe, prompt: str, seed: int, frames: int, steps: int, guidance: float, size: int, spec=None,
            window_frames=None, hook=None) -> dict:
    """One streamed rollout with DASA ``spec`` (None: dense) or another chunk ``hook``; frames, per-chunk
    seconds, KV bytes, peak RSS."""
    import torch
    from autoregressive_cost import PeakRSS

    from kinegen.dasa import apply_dasa
    from kinegen.dasa.config import DASAConfig
    from kinegen.training.dasa import _dasa_config

    handle = apply_dasa(pipe, _dasa_config(spec, DASAConfig)) if spec is not None else None
    if hook is not None:
        pipe.chunk_hooks = (hook,)
    mem = PeakRSS()
    try:
        parts, chunks = [], []
        t0 = time.perf_counter()
        for chunk in pipe.stream(prompt, height=size, width=size, num_frames=frames, num_inference_steps=steps,
                                 guidance_scale=guidance, window_frames=window_frames,
                                 generator=torch.Generator().manual_seed(seed)):
            st = chunk.stats
            parts.append(chunk.frames)
            chunks.append({"transformer_s": st.denoise_s + st.commit_s, "decode_s": chunk.decode_s,
                           "kv_bytes": int(st.kv_bytes), "cached_frames": len(st.cached_frames)})
        seconds = time.perf_counter() - t0
        stats = handle.stats() if handle is not None else {}
    finally:
        mem.stop()
        if handle is not None:
            handle.remove()
        if hook is not None:
            del pipe.chunk_hooks
    return {"frames": np.concatenate(parts), "chunks": chunks, "seconds": seconds, "peak_rss": mem.reset(),
            "stats": {k: v for k, v in stats.items() if k != "chunks"},
            "kept_share_per_chunk": [c["kept_share"] for c in stats.get("chunks", [])],
            "keyframe_per_chunk": [c["keyframe"] for c in stats.get("chunks", [])]}


def matched_keep(run: dict, chunk_frames: int) -> float:
    """The ``keep`` at which uniform or random dropping keeps DASA's share: a chunk keeps its anchor frame whole
    and ``keep`` of its ``chunk_frames - 1`` later frames, so kept = (1 + (cf - 1) keep) / cf."""
    shares = [s for s, key in zip(run["kept_share_per_chunk"], run["keyframe_per_chunk"], strict=True) if not key]
    kept = float(np.mean(shares)) if shares else 1.0
    return float(np.clip((chunk_frames * kept - 1) / max(chunk_frames - 1, 1), 0.01, 1.0))


def matched_window(pipe, dense_run: dict, run: dict) -> int:
    """The rolling window (latent frames) whose dense KV bytes are closest to ``run``'s at its largest."""
    last = dense_run["chunks"][-1]
    per_frame = last["kv_bytes"] / last["cached_frames"]
    target = max(c["kv_bytes"] for c in run["chunks"])
    return int(max(pipe.config.chunk_frames + pipe.config.sink_frames, round(target / per_frame)))


def matched_near(pipe, run: dict, dense_run: dict, factor: int = 2) -> int:
    """Full-resolution recent frames of the far-pooling peer whose KV bytes at most come closest to ``run``'s. Bytes
    are read after each commit: a window of W frames with S sinks then holds the C frames just committed and the N
    kept whole before it at full size, and the rest pooled: S + C + N + (W - S - C - N) / factor^2 frames' worth."""
    w, s, c = pipe.config.window_frames, pipe.config.sink_frames, pipe.config.chunk_frames
    ratio = max(ch["kv_bytes"] for ch in run["chunks"]) / max(ch["kv_bytes"] for ch in dense_run["chunks"])
    cost = {n: (s + min(w - s, c + n) + max(0, w - s - c - n) / factor**2) / w for n in range(1, w - s + 1)}
    return min(cost, key=lambda n: abs(cost[n] - ratio))


def summarise(name: str, run: dict, dense: dict, truth: dict, classifier) -> dict:
    from autoregressive_windows import window_scores

    from kinegen.profiling.metrics import psnr, ssim

    later = slice(2, None)  # the first chunk is one frame and the second has no history to compress yet
    t = sum(c["transformer_s"] for c in run["chunks"][later])
    t_dense = sum(c["transformer_s"] for c in dense["chunks"][later])
    windows = window_scores(run["frames"], truth, classifier)
    out = {"setting": name, "seconds": run["seconds"], "transformer_s_per_chunk": t / len(run["chunks"][later]),
           "transformer_speedup": t_dense / t, "end_to_end_speedup": dense["seconds"] / run["seconds"],
           "kv_bytes": run["chunks"][-1]["kv_bytes"], "kv_bytes_max": max(c["kv_bytes"] for c in run["chunks"]),
           "kv_ratio": run["chunks"][-1]["kv_bytes"] / dense["chunks"][-1]["kv_bytes"],
           "kv_ratio_max": max(c["kv_bytes"] for c in run["chunks"]) / max(c["kv_bytes"] for c in dense["chunks"]),
           "peak_rss_mib": run["peak_rss"] / 2**20,
           "psnr_db": psnr(dense["frames"], run["frames"]) if run is not dense else float("inf"),
           "ssim": ssim(dense["frames"], run["frames"]) if run is not dense else 1.0,
           "right": {a: float(np.mean([w[a] for w in windows])) for a in ("shape", "colour", "motion")},
           "windows": windows, "stats": run["stats"]}
    return out


def pooled(records: list[dict], names, keys) -> dict:
    """Per setting: the mean of each of ``keys`` over the videos, and the share of all their windows right on each
    attribute."""
    table = {}
    for name in names:
        rows = [next(r for r in rec["settings"] if r["setting"] == name) for rec in records]
        table[name] = {k: float(np.mean([r[k] for r in rows])) for k in keys}
        table[name]["right"] = {a: float(np.mean([w[a] for r in rows for w in r["windows"]]))
                                for a in ("shape", "colour", "motion")}
    return table


def paired_against_dense(records: list[dict], names) -> dict:
    """Per setting, over the videos: the mean and standard error of each video's windows right minus dense's on the
    same video (points), and the per-video speedups and KV ratios (mean, min, max)."""
    out = {}
    for name in names:
        rows = [(next(r for r in rec["settings"] if r["setting"] == name),
                 next(r for r in rec["settings"] if r["setting"] == "dense")) for rec in records]
        diff = {a: np.array([100 * (r["right"][a] - d["right"][a]) for r, d in rows]) for a in ("shape", "colour",
                                                                                             "motion")}
        se = (lambda x: float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan"))
        out[name] = {"videos": len(rows),
                     "against_dense_points": {a: {"mean": float(x.mean()), "se": se(x)} for a, x in diff.items()},
                     **{k: {"mean": float(np.mean([r[k] for r, _ in rows])), "min": float(min(r[k] for r, _ in rows)),
                            "max": float(max(r[k] for r, _ in rows))}
                        for k in ("transformer_speedup", "end_to_end_speedup", "kv_ratio", "kv_ratio_max", "psnr_db")}}
    return out


def cmd_pool(args) -> dict:
    """Several ``sweep`` files (the same settings, different prompts) pooled: the windows right per setting and each
    setting's paired difference against dense, video by video."""
    runs = [json.loads(Path(f).read_text()) for f in args.files]
    records = [v for run in runs for v in run["videos"]]
    names = [r["setting"] for r in records[0]["settings"]]
    if any([r["setting"] for r in rec["settings"]] != names for rec in records):
        raise SystemExit("the files ran different settings; pool files of the same settings")
    table = pooled(records, names, ("transformer_speedup", "end_to_end_speedup", "kv_ratio", "kv_ratio_max", "psnr_db",
                                    "ssim", "computed_share"))
    paired = paired_against_dense(records, names)
    for name in names:
        table[name]["against_dense_points"] = paired[name]["against_dense_points"]
    return {"files": list(args.files), "videos": len(records), "table": table, "per_setting": paired}


def _load(model: str, context_noise: float | None):
    """A chunk-by-chunk pipeline, committing at ``context_noise`` if given (else the model's own setting)."""
    import kinegen

    pipe = kinegen.load_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    if context_noise is not None:
        pipe.register_to_config(context_noise=context_noise)
    return pipe


def cmd_rollouts(args) -> dict:
    from kinegen.dasa.peers import FarHistoryPooling
    from kinegen.evaluation.adherence import adherence_prompts, load_classifier

    pipe = _load(args.model, args.context_noise)
    distilled = _load(args.distilled, args.context_noise) if args.distilled else None
    spec = pipe.kinegen_spec
    steps, guidance, size = args.steps or spec.steps, spec.guidance, spec.height
    cf = pipe.config.chunk_frames
    classifier = load_classifier()
    records = []
    for i, (prompt, truth) in enumerate(adherence_prompts(args.prompts, args.split, seed=1)):
        runs: dict[str, dict] = {}
        def go(p, s=None, w=None, h=None, prompt=prompt, seed=i):
            return rollout(p, prompt, seed, args.frames, steps, guidance, size, s, w, h)

        # dense and DASA's KV-only run first (the peers' budgets come from them); the rest rotated per prompt
        runs["dense"] = go(pipe)
        runs["dasa-kv-only"] = go(pipe, DASA_SETTINGS["dasa-kv-only"])
        keep = matched_keep(runs["dasa-kv-only"], cf)
        window = matched_window(pipe, runs["dense"], runs["dasa-kv-only"])
        near = matched_near(pipe, runs["dasa-kv-only"], runs["dense"])
        jobs = {name: (pipe, s) for name, s in DASA_SETTINGS.items() if name != "dasa-kv-only"}
        jobs["uniform"] = (pipe, f"select=uniform,keep={keep:.4f},compute=none")
        jobs["random"] = (pipe, f"select=random,keep={keep:.4f},compute=none")
        jobs["window"] = (pipe, None, window)
        jobs["far-pool"] = (pipe, None, None, FarHistoryPooling(near_frames=near, factor=2))
        if distilled is not None:
            jobs["distilled-reuse"] = (distilled, DASA_SETTINGS["dasa-reuse"])
        names = list(jobs)
        names = names[i % len(names):] + names[:i % len(names)]
        for name in names:
            runs[name] = go(*jobs[name])
            print(f"  {i + 1}/{args.prompts} {name}: {runs[name]['seconds']:.0f} s", flush=True)
        rows = [summarise(name, runs[name], runs["dense"], truth, classifier) for name in ["dense", "dasa-kv-only",
                                                                                           *jobs]]
        for r in rows:
            print(f"{i + 1}/{args.prompts} {prompt!r} {r['setting']:>18}: transformer x{r['transformer_speedup']:.2f}"
                  f", kv {r['kv_ratio']:.0%}, {r['psnr_db']:.1f} dB, ssim {r['ssim']:.3f}, right "
                  + ", ".join(f"{k} {v:.0%}" for k, v in r["right"].items()), flush=True)
        records.append({"prompt": prompt, "truth": truth, "seed": i, "matched_keep": keep, "matched_window": window,
                        "matched_near": near, "settings": rows})
    names = [r["setting"] for r in records[0]["settings"]]
    table = pooled(records, names, ("transformer_speedup", "end_to_end_speedup", "transformer_s_per_chunk", "seconds",
                                    "kv_ratio", "kv_ratio_max", "peak_rss_mib", "psnr_db", "ssim"))
    settings = {**DASA_SETTINGS, "uniform": "select=uniform,keep=<matched>,compute=none",
                "random": "select=random,keep=<matched>,compute=none", "window": "dense, window_frames=<matched>",
                "far-pool": "dense, frames older than <matched> recent ones pooled 2x2 (kinegen.dasa.peers)"}
    if distilled is not None:
        settings["distilled-reuse"] = f"{args.distilled} with {DASA_SETTINGS['dasa-reuse']}"
    return {"model": args.model, "distilled": args.distilled, "split": args.split, "prompts": args.prompts,
            "frames": args.frames, "steps": steps, "guidance": guidance, "size": size, **_cache_of(pipe),
            "settings": settings, "table": table, "videos": records}


def cmd_sweep(args) -> dict:
    """Dense and each ``NAME=SETTINGS`` DASA setting on the same prompts, in a rotated order per prompt."""
    from kinegen.evaluation.adherence import adherence_prompts, load_classifier

    settings = dict(s.split("=", 1) for s in args.setting)
    pipe = _load(args.model, args.context_noise)
    jobs = {"dense": (pipe, None), **{name: (pipe, spec) for name, spec in settings.items()}}
    if args.distilled:
        distilled = _load(args.distilled, args.context_noise)
        jobs.update({f"distilled-{name}": (distilled, spec) for name, spec in settings.items()})
    spec = pipe.kinegen_spec
    steps, guidance, size = args.steps or spec.steps, spec.guidance, spec.height
    classifier = load_classifier()
    records = []
    prompts = adherence_prompts(args.skip + args.prompts, args.split, seed=1)
    for i, (prompt, truth) in enumerate(prompts[args.skip:], start=args.skip):
        names = list(jobs)
        names = names[i % len(names):] + names[:i % len(names)]
        runs = {}
        for name in names:
            runs[name] = rollout(jobs[name][0], prompt, i, args.frames, steps, guidance, size, jobs[name][1])
            print(f"  prompt {i + 1} {name}: {runs[name]['seconds']:.0f} s", flush=True)
        rows = [summarise(name, runs[name], runs["dense"], truth, classifier) for name in jobs]
        for r in rows:
            r["computed_share"] = r["stats"].get("computed_share", 1.0)
            print(f"prompt {i + 1} {r['setting']:>18}: transformer x{r['transformer_speedup']:.2f}, kv "
                  f"{r['kv_ratio']:.0%} / {r['kv_ratio_max']:.0%}, {r['psnr_db']:.1f} dB, computed "
                  f"{r['computed_share']:.2f}", flush=True)
        records.append({"prompt": prompt, "truth": truth, "seed": i, "settings": rows})
    table = pooled(records, list(jobs), ("transformer_speedup", "end_to_end_speedup", "kv_ratio", "kv_ratio_max",
                                         "psnr_db", "ssim", "computed_share"))
    return {"model": args.model, "distilled": args.distilled, "split": args.split, "prompts": args.prompts,
            "skip": args.skip, "frames": args.frames, "steps": steps, "guidance": guidance, "size": size,
            **_cache_of(pipe), "settings": settings, "table": table, "videos": records}


def _cache_of(pipe) -> dict:
    """The dense KV cache every setting of a run starts from (the model's configuration)."""
    return {k: pipe.config.get(k) for k in ("sink_frames", "window_frames", "context_noise")}


def latent_footprint(mask, f: int, segment: int, cell: int):
    """Ground truth of latent frame ``f``, flat per token: an object covers some pixel of the token's ``cell`` x
    ``cell`` square in any video frame the latent frame codes or the one before (its motion's footprint). Whole
    clips: latent frame ``f >= 1`` codes video frames ``4f - 3 .. 4f``; with overlapping segments of ``segment``
    frames, position ``p`` of segment ``s`` codes those of ``p`` from video frame ``s (segment - 1)`` on."""
    import torch.nn.functional as F

    if segment:
        per = (segment - 1) // 4 + 1
        start, f = (f // per) * (segment - 1), f % per
    else:
        start = 0
    lo, hi = start + max(0, 4 * (f - 1)), start + 4 * f + 1
    foot = mask[lo:hi].any(0).float()[None, None]
    return F.max_pool2d(foot, cell, cell)[0, 0].bool().flatten()


def cmd_masks(args) -> dict:
    import torch

    import kinegen
    from kinegen.dasa.config import DASAConfig
    from kinegen.dasa.dynamics import DynamicsTracker
    from kinegen.data.shapes import render_long_clip, render_long_mask, sample_clip
    from kinegen.training.ar import encode_segmented
    from kinegen.training.dasa import _dasa_config

    pipe = kinegen.load_pipeline(args.model)
    segment = pipe.segment_frames or 0
    if segment and not pipe.segment_overlap:
        raise SystemExit(f"{args.model} codes its videos in VAE segments without overlap; the masks command maps "
                         "latent frames to video frames of one whole clip or of overlapping segments only.")
    vae, size = pipe.vae, pipe.kinegen_spec.height
    patch = tuple(int(p) for p in pipe.transformer.config.patch_size[1:])
    cell = pipe.vae_scale_factor_spatial * patch[0]
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    c = _dasa_config(args.dasa, DASAConfig)
    results = {"dynamics": [], "uniform": [], "random": []}
    for j in range(args.clips):
        spec = sample_clip(9_000_000 + j, split="held_out")
        clip = render_long_clip(spec, args.frames, size, size)
        mask = torch.from_numpy(render_long_mask(spec, args.frames, size, size) > 0.05)
        with torch.no_grad():  # coded as the pipeline codes it: whole, or in overlapping segments
            z = (encode_segmented(vae, clip[None], segment, overlap=True) - mean) / std
        latent = z.shape[2]
        truth = [latent_footprint(mask, f, segment, cell) for f in range(latent)]
        partition = pipe.check_frames(args.frames)
        keep = c.keep
        for select in results:  # dynamics first: the peers keep the share it kept on this clip
            if select != "dynamics":
                keep = float(np.mean([r["kept"] for r in results["dynamics"] if r["clip"] == j]))
            tracker = DynamicsTracker.from_config(c, keep=keep, select=select)
            start, previous = 0, None
            for n in partition:
                chunk = z[:, :, start:start + n]
                if pipe.relinks(start):  # a re-encoded segment start: kept whole, not tracked (kinegen.dasa.run)
                    start += n
                    continue
                masks = tracker.update(chunk, previous, patch)
                for i, m in enumerate(masks):
                    if m is not None and previous is not None:  # compressed frames (not anchors or keyframes)
                        t = truth[start + i]
                        inter, union = int((m & t).sum()), int((m | t).sum())
                        results[select].append({"clip": j, "frame": start + i, "iou": inter / max(union, 1),
                                                "recall": inter / max(int(t.sum()), 1),
                                                "precision": inter / max(int(m.sum()), 1),
                                                "kept": float(m.float().mean()), "truth": float(t.float().mean())})
                previous = chunk[:, :, -1:]
                start += n
        print(f"clip {j + 1}/{args.clips}: " + ", ".join(
            f"{s} IoU {np.mean([r['iou'] for r in results[s] if r['clip'] == j]):.2f}" for s in results), flush=True)
    table = {s: {k: float(np.mean([r[k] for r in rows])) for k in ("iou", "recall", "precision", "kept", "truth")}
             for s, rows in results.items()}
    return {"model": args.model, "clips": args.clips, "frames": args.frames, "dasa": args.dasa or "defaults",
            "table": table, "frames_scored": {s: len(r) for s, r in results.items()}, "per_frame": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rollouts", help="DASA, its compute options and the peers against dense, side by side")
    r.add_argument("--model", default="kinegen-shapes-ar")
    r.add_argument("--distilled", default=None, help="a `kinegen train dasa` export, run with DASA reuse")
    r.add_argument("--split", default="held_out", choices=["train", "held_out"])
    r.add_argument("--prompts", type=int, default=3)
    r.add_argument("--frames", type=int, default=241)
    r.add_argument("--steps", type=int, default=None, help="denoising steps per chunk (default: the model's)")
    r.add_argument("--output", required=True)
    r.add_argument("--context-noise", type=float, default=None,
                   help="the noise level chunks are committed at (default: the model's; runs before 2026-12-05 used 0)")
    w = sub.add_parser("sweep", help="dense and DASA settings of your choice side by side (no peers)")
    w.add_argument("--model", default="kinegen-shapes-ar")
    w.add_argument("--distilled", default=None, help="a `kinegen train dasa` export: every setting also runs on it "
                   "(rows `distilled-NAME`, fidelity against --model's dense video)")
    w.add_argument("--split", default="held_out", choices=["train", "held_out"])
    w.add_argument("--prompts", type=int, default=1)
    w.add_argument("--skip", type=int, default=0, help="start after this many prompts of the split")
    w.add_argument("--frames", type=int, default=241)
    w.add_argument("--steps", type=int, default=None, help="denoising steps per chunk (default: the model's)")
    w.add_argument("--setting", action="append", required=True, metavar="NAME=SETTINGS",
                   help="a named DASA setting, e.g. a4=keep=0.3,anchor_every=4 (repeatable)")
    w.add_argument("--output", required=True)
    w.add_argument("--context-noise", type=float, default=None,
                   help="the noise level chunks are committed at (default: the model's; runs before 2026-12-05 used 0)")
    m = sub.add_parser("masks", help="the dynamics masks against the moving objects (IoU)")
    m.add_argument("--model", default="kinegen-shapes-ar")
    m.add_argument("--clips", type=int, default=8)
    m.add_argument("--frames", type=int, default=97)
    m.add_argument("--dasa", default="", help="DASA settings of the tracker, e.g. dilate=1,low=1 (default: defaults)")
    m.add_argument("--output", required=True)
    p = sub.add_parser("pool", help="several sweep files pooled, with each setting's paired difference against dense")
    p.add_argument("files", nargs="+")
    p.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    from kinegen.media import atomic_write_text

    t0 = time.perf_counter()
    out = {"rollouts": cmd_rollouts, "sweep": cmd_sweep, "masks": cmd_masks, "pool": cmd_pool}[args.cmd](args)
    out = {"command": "python benchmarks/dasa.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.perf_counter() - t0, **out}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(out, indent=1, default=float))
    print(json.dumps(out["table"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
