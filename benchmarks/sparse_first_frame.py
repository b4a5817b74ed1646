"""Where HVA's error falls along the video, frame by frame, and whether ``lead_frames`` moves it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_first_frame.py capture runs/frontier_capture.pt \
        --config "" --config lead_frames=1
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_first_frame.py e2e --prompts 5 --frames 29 \
        --config "" --config lead_frames=1

``capture``: q, k, v captured by ``benchmarks/sparse_frontier.py`` (57x384x384, 15x24x24 tokens; three layers,
three steps, each layer's calls in order so the hybrid schedule runs), HVA per ``--config`` (``key=value,...`` on
top of HVA's defaults): the relative L2 error of the attention output against dense, per latent frame.
``e2e``: the bundled model at ``--frames`` x 384 x 384 on training-split prompts (``adherence_prompts(n, "train",
seed=7)``, tuning prompts, not the held-out benchmark ones), dense and HVA per ``--config``: PSNR against the dense
video over the clip, frame 0, frames 1-4 and the rest, and the adherence readings right (of 3). One JSON line per
prompt on stdout.
"""

import argparse
import json

import numpy as np
import torch

import kinegen
from kinegen.sparse_attn.hva import HVAConfig, HVAttention

GRID = (15, 24, 24)


def parse(config: str) -> dict:
    out = {}
    for item in filter(None, (c.strip() for c in config.split(","))):
        key, value = item.split("=", 1)
        out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def per_frame(path: str, configs: list[str]) -> None:
    data = torch.load(path, weights_only=True)
    for config in configs:
        err, ref_sq, dens = torch.zeros(GRID[0]), torch.zeros(GRID[0]), []
        for items in data.values():
            calls = {tuple(k): tuple(v) for k, v in items}
            for layer in sorted({k[0] for k in calls}):
                attn = HVAttention(HVAConfig(min_tokens=0, **parse(config)))
                for step in sorted(s for lay, s in calls if lay == layer):
                    q, k, v = calls[(layer, step)]
                    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
                    out = attn(q, k, v, grid=GRID)
                    dens.append(float(attn.last_stats["density"]))
                    err += (out - ref).float().square().sum(-1).view(-1, GRID[0], GRID[1] * GRID[2]).sum((0, 2))
                    ref_sq += ref.float().square().sum(-1).view(-1, GRID[0], GRID[1] * GRID[2]).sum((0, 2))
        frames = (err / ref_sq).sqrt()
        print(json.dumps({"config": config or "defaults", "density": round(sum(dens) / len(dens), 3),
                          "rel_l2": round(float((err.sum() / ref_sq.sum()).sqrt()), 4),
                          "frame_0": round(float(frames[0]), 4),
                          "frames_1_on": round(float((err[1:].sum() / ref_sq[1:].sum()).sqrt()), 4),
                          "per_frame": [round(float(x), 3) for x in frames]}), flush=True)


def end_to_end(n: int, frames: int, configs: list[str]) -> None:
    from kinegen.evaluation.adherence import ATTRIBUTES, adherence_prompts, classify, load_classifier
    from kinegen.profiling.metrics import psnr

    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    classifier = load_classifier()
    accels = {"dense": [], **{f"hva {c or 'defaults'}": [f"hva:{c}" if c else "hva"] for c in configs}}
    for i, (prompt, truth) in enumerate(adherence_prompts(n, "train", seed=7)):
        videos = {name: np.asarray(kinegen.generate(pipe, prompt, seed=i, accelerators=acc, frames=frames,
                                                    height=384, width=384).frames) for name, acc in accels.items()}
        line = {"prompt": prompt}
        for name, video in videos.items():
            reading = classify(classifier, video)
            line[name] = {"right": sum(reading[a] == truth[a] for a in ATTRIBUTES)}
            if name != "dense":
                ref = videos["dense"]
                line[name].update(psnr=round(psnr(ref, video), 2), frame_0=round(psnr(ref[:1], video[:1]), 2),
                                  frames_1_4=round(psnr(ref[1:5], video[1:5]), 2),
                                  rest=round(psnr(ref[5:], video[5:]), 2))
        print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    cap = sub.add_parser("capture", help="per-frame attention error on captured q, k, v")
    cap.add_argument("path", help="a capture file of benchmarks/sparse_frontier.py")
    e2e = sub.add_parser("e2e", help="per-frame PSNR of whole generations against dense")
    e2e.add_argument("--prompts", type=int, default=5)
    e2e.add_argument("--frames", type=int, default=29)
    for p in (cap, e2e):
        p.add_argument("--config", action="append", default=None,
                       help='HVA settings on top of its defaults, "key=value,..." ("" = the defaults); repeatable')
    args = ap.parse_args()
    configs = args.config if args.config is not None else [""]
    if args.what == "capture":
        per_frame(args.path, configs)
    else:
        end_to_end(args.prompts, args.frames, configs)


if __name__ == "__main__":
    main()
