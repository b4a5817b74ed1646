"""HyperVAttention against the SVG2-style baseline on queries, keys and values captured from the bundled model.

1. Capture: run ``kinegen-shapes-t2v`` at a benchmark size (default 57x384x384: 15 x 24 x 24 = 8,640 video
   tokens per self-attention) and keep q, k, v of some layers at a few consecutive steps (conditional branch).
2. Per captured layer, interleaved in one process: HVA (anchor call, then the following steps as hybrid
   calls) and the baseline (global k-means with as many clusters, cold then warm-started), at several
   executed densities. Reported: relative L2 error against dense attention, executed density, tile
   efficiency, clustering time as a share of the sparse-attention time, distance evaluations.

    .venv/bin/python benchmarks/sparse_attention.py [--frames 57 --size 384 --steps 20 --capture-step 8]
        [--capture-file runs/capture.pt] [--hva "k_window=1-4-8,iters=4"]

``--capture-file`` keeps the captured tensors (our own file, read back with ``weights_only=True``) so that
HVA settings can be compared without capturing again; ``--hva`` overrides HVAConfig fields (the
``--attention hva:...`` syntax).
"""

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

import kinegen
from kinegen.sparse_attn.apply import _install
from kinegen.sparse_attn.hva import HVAConfig, HVAttention, KMeansSparseAttention, KMeansSparseConfig


@dataclasses.dataclass
class _CaptureConfig:
    dense_warmup: float = 0.0
    dense_layers: int = 0
    min_tokens: int = 0


class _Recorder:
    """Stands in for a sparse attention module: stores q, k, v at the chosen steps, answers densely."""

    def __init__(self, store, layer, ctrl_ref, steps):
        self.store, self.layer, self.ctrl_ref, self.steps = store, layer, ctrl_ref, steps
        self.last_stats = {}

    def __call__(self, q, k, v, grid, scale=None, **_):
        ctrl = self.ctrl_ref[0]
        st = ctrl.branch()
        if ctrl.state._context.name == "cond" and st.step in self.steps:
            self.store[(self.layer, st.step)] = (q.clone(), k.clone(), v.clone(), tuple(grid))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


def capture(args):
    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    store = {}
    layers = [int(x) for x in args.layers.split(",")]
    steps = set(range(args.capture_step, args.capture_step + args.hybrid_steps + 1))
    ctrl_ref = []
    handle = _install(pipe, "capture", _CaptureConfig(), lambda layer: _Recorder(store, layer, ctrl_ref, steps),
                      kinegen.RunInfo(num_inference_steps=args.steps))
    ctrl_ref.append(handle.controllers[0])
    try:
        kinegen.generate(pipe, "a red circle moving to the right on a gray background", seed=0, steps=args.steps,
                         frames=args.frames, height=args.size, width=args.size)
    finally:
        handle.remove()
    return {key: val for key, val in store.items() if key[0] in layers}


def rel_l2(a, b):
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=57)
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--capture-step", type=int, default=8)
    ap.add_argument("--hybrid-steps", type=int, default=4, help="steps after the anchor run as hybrid calls")
    ap.add_argument("--layers", default="1,3")
    ap.add_argument("--densities", default="0.1,0.2,0.3")
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--output", default="benchmarks/results/sparse_attention.json")
    ap.add_argument("--capture-file", default="", help="load captured q/k/v from here, or save them here")
    ap.add_argument("--hva", default="", help="HVAConfig overrides, e.g. k_window=1-4-8,iters=4")
    args = ap.parse_args()
    from kinegen.accelerators.catalog import parse_spec

    overrides = {f: getattr(parse_spec("hva:" + args.hva)[1], f) for f in
                 (item.split("=")[0].strip().replace("-", "_") for item in args.hva.split(",") if item.strip())}
    t0 = time.time()
    cache = Path(args.capture_file) if args.capture_file else None
    if cache is not None and cache.is_file():
        data = {tuple(k): (q, k_, v, tuple(g)) for k, q, k_, v, g in torch.load(cache, weights_only=True)}
    else:
        data = capture(args)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save([(list(k), q, k_, v, list(g)) for k, (q, k_, v, g) in data.items()], cache)
    print(f"captured {len(data)} (layer, step) q/k/v in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for layer in sorted({key[0] for key in data}):
        seq = [data[(layer, s)] for s in sorted(s for (l_, s) in data if l_ == layer)]
        q0, k0, v0, grid = seq[0]
        print(f"layer {layer}: q {tuple(q0.shape)}, grid {grid}", flush=True)
        for density in [float(x) for x in args.densities.split(",")]:
            # Warm-up (FlexAttention compiles for each new shape): untimed calls on a copy of the first entry.
            for warm in (HVAttention(HVAConfig(density=density, tile=args.tile, backend="flex", **overrides)),
                         KMeansSparseAttention(KMeansSparseConfig(density=density, top_p=None, tile=args.tile,
                                                                  backend="flex"))):
                warm(q0, k0, v0, grid=grid)
            hva = HVAttention(HVAConfig(**{"density": density, "tile": args.tile, "anchor_every": 10**6,
                                           "backend": "flex", **overrides}))
            base = None
            for i, (q, k, v, g) in enumerate(seq):
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
                out = hva(q, k, v, grid=g)
                s = dict(hva.last_stats)
                if base is None:
                    base = KMeansSparseAttention(KMeansSparseConfig(
                        density=density, top_p=None, q_clusters=s["q_clusters"], k_clusters=s["k_clusters"],
                        tile=args.tile, backend="flex"))
                bout = base(q, k, v, grid=g)
                b = dict(base.last_stats)
                for name, o, st in (("hva", out, s), ("kmeans", bout, b)):
                    sparse_s = st["clustering_s"] + st["merging_s"] + st["layout_s"] + st["attention_s"]
                    rows.append({"layer": layer, "call": i, "method": name, "target_density": density,
                                 "anchor": bool(st["anchor"]), "rel_l2": rel_l2(o, ref), "density": st["density"],
                                 "tile_efficiency": st["tile_efficiency"],
                                 "clustering_share": st["clustering_s"] / sparse_s,
                                 "merging_share": st["merging_s"] / sparse_s, "sparse_s": sparse_s,
                                 "clustering_s": st["clustering_s"], "merging_s": st["merging_s"],
                                 "layout_s": st["layout_s"], "attention_s": st["attention_s"],
                                 "distance_evals": st["distance_evals"], "q_clusters": st["q_clusters"],
                                 "k_clusters": st["k_clusters"]})
                h_, b_ = rows[-2], rows[-1]
                print(f"  d={density} call {i}: hva err {h_['rel_l2']:.4f} dens {s['density']:.3f} eff "
                      f"{s['tile_efficiency']:.2f} clu {h_['clustering_share']:.1%} merge {h_['merging_share']:.1%} "
                      f"evals {s['distance_evals']:.3g}"
                      f" | kmeans err {b_['rel_l2']:.4f} dens {b['density']:.3f} eff {b['tile_efficiency']:.2f}"
                      f" clu {b_['clustering_share']:.1%} evals {b['distance_evals']:.3g}", flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    summarise(rows)


def summarise(rows):
    print("\n| target density | method | rel L2 (anchor) | executed density | tile efficiency | clustering share "
          "anchor / hybrid | merging share anchor / hybrid | distance evals (anchor) |")
    print("|---|---|---|---|---|---|---|---|")
    for d in sorted({r["target_density"] for r in rows}):
        for m in ("hva", "kmeans"):
            a = [r for r in rows if r["target_density"] == d and r["method"] == m and r["call"] == 0]
            h = [r for r in rows if r["target_density"] == d and r["method"] == m and r["call"] > 0]
            mean = lambda rs, k: statistics.mean(r[k] for r in rs) if rs else float("nan")  # noqa: E731
            print(f"| {d} | {m} | {mean(a, 'rel_l2'):.4f} | {mean(a, 'density'):.3f} | "
                  f"{mean(a, 'tile_efficiency'):.2f} | {mean(a, 'clustering_share'):.1%} / "
                  f"{mean(h, 'clustering_share'):.1%} | {mean(a, 'merging_share'):.1%} / "
                  f"{mean(h, 'merging_share'):.1%} | {mean(a, 'distance_evals'):.3g} |")


if __name__ == "__main__":
    main()
