"""The quality-speed frontier of clustered sparse attention: HVA against the faithful SVG2, one run side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_frontier.py [--capture-file runs/frontier_capture_heldout.pt]

Inputs (all at least 8,000 tokens):

* **captured**: q, k, v of layers 1, 3 and 5 of ``kinegen-shapes-t2v`` at 57x384x384 (15 x 24 x 24 = 8,640
  video tokens, 4 heads of 32), conditional branch, steps 8, 9 and 10 of 20, for two prompts that were never
  used to tune either method;
* **synthetic**: video-like fields on the same grid (queries and keys share a field that varies slowly
  over frames, rows and columns, plus independent noise; values another such field), two seeds.

Per input, every method runs its calls in order (step 8 is the anchor / cold call, 9 and 10 warm), and the
methods are interleaved call by call, so machine noise falls on all of them alike. Per call: the relative L2
error against dense SDPA, the **total** wall time of the sparse call (clustering + merging + selection +
layout + attention), and the executed density, counted the same way for every method: the token pairs the
execution computes, padding included (tiles: kept tiles x T^2; key lists: per query tile, T x its list padded
to a multiple of the block), over N^2. Dense SDPA is timed beside them.

Methods and budgets (``--quick`` runs fewer):

* ``hva``: HVA at its defaults (per-query-cluster top-p with a floor of 15% of key clusters, key lists on
  CPU, 1x4x4 key windows, queries merged) at several ``top_p``; ``hva-floor10``: the same with SVG2's floor
  (10% of key clusters), which reaches lower densities; ``hva-density``: the same with a density
  budget (``selection=coverage``); ``hva-tiles``: the defaults on the tile layout; ``hva-greedy``: the
  defaults before 2026-12-05 (a density budget spent greedily, no floor, 1x8x8 key windows) on key lists;
* ``svg2``: Sparse VideoGen 2 as published (:mod:`kinegen.sparse_attn.svg2`) at its top-p values.

The prompts are held-out combinations (``adherence_prompts(3, "held_out", seed=24/25)``) that no setting of
either method was tuned on; HVA's defaults of 2026-12-05 were chosen on the previous prompts ("a yellow star
moving down on a black background", "a blue square moving left on a white background").

Writes ``--output`` (JSON rows), ``<output stem>.png`` (error against time, anchor and warm calls, per input
kind) and prints the tables for benchmarks/sparse_attention.md.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sparse_attention import _CaptureConfig, _Recorder, rel_l2  # noqa: E402

import kinegen  # noqa: E402
from kinegen.sparse_attn.apply import _install  # noqa: E402
from kinegen.sparse_attn.hva import HVAConfig, HVAttention  # noqa: E402
from kinegen.sparse_attn.svg2 import SVG2Attention, SVG2Config  # noqa: E402

PROMPTS = ["a large white square moving downward on a brown background",
           "a large purple star slides to the left against a plain gray background"]
SPARSE_CALLS = 16  # sparse calls of one layer in a 20-step generation (dense_warmup 0.2)
LAYERS = (1, 3, 5)
STEPS = (8, 9, 10)
GRID = (15, 24, 24)


def methods(quick: bool) -> dict:
    """name -> (family, factory) for every (method, budget)."""
    tops = (0.6, 0.8) if quick else (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    dens = (0.2, 0.3) if quick else (0.15, 0.25, 0.35)
    svg_tops = (0.7, 0.9) if quick else (0.5, 0.7, 0.8, 0.9, 0.95)
    out = {}
    for p in tops:
        out[f"hva p={p}"] = ("hva", lambda p=p: HVAttention(HVAConfig(top_p=p, layout="lists", min_tokens=0)))
    for p in tops:
        out[f"hva-floor10 p={p}"] = ("hva-floor10", lambda p=p: HVAttention(HVAConfig(
            top_p=p, min_key_share=0.1, layout="lists", min_tokens=0)))
    for p in (0.6, 0.7, 0.8):
        out[f"hva-tiles p={p}"] = ("hva-tiles", lambda p=p: HVAttention(HVAConfig(top_p=p, layout="tiles",
                                                                                  min_tokens=0)))
    for d in dens:
        out[f"hva-density d={d}"] = ("hva-density", lambda d=d: HVAttention(HVAConfig(
            top_p=None, density=d, layout="lists", min_tokens=0)))
        out[f"hva-greedy d={d}"] = ("hva-greedy", lambda d=d: HVAttention(HVAConfig(
            top_p=None, density=d, selection="greedy", min_key_share=0.0, k_window=(1, 8, 8), layout="lists",
            min_tokens=0)))
    for p in svg_tops:
        out[f"svg2 p={p}"] = ("svg2", lambda p=p: SVG2Attention(SVG2Config(top_p=p, min_tokens=0)))
    return out


def capture(prompt: str) -> dict:
    """{(layer, step): (q, k, v)} at the benchmark size."""
    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    store, ctrl_ref = {}, []
    handle = _install(pipe, "capture", _CaptureConfig(), lambda layer: _Recorder(store, layer, ctrl_ref, set(STEPS)),
                      kinegen.RunInfo(num_inference_steps=20))
    ctrl_ref.append(handle.controllers[0])
    try:
        kinegen.generate(pipe, prompt, seed=0, steps=20, frames=57, height=384, width=384,
                         step_callback=_stop_after(max(STEPS)))
    except _Stop:
        pass
    finally:
        handle.remove()
    return {key: val[:3] for key, val in store.items() if key[0] in LAYERS}


class _Stop(Exception):
    pass


def _stop_after(step: int):
    def callback(i, *_):
        if i >= step:
            raise _Stop
    return callback


def synthetic(seed: int, heads: int = 4, dim: int = 32, noise: float = 0.6, sharpness: float = 2.0) -> dict:
    """Three 'steps' of a slowly drifting video-like field: {(layer 0, step): (q, k, v)}."""
    g = torch.Generator().manual_seed(seed)

    def field():
        low = torch.randn(1, heads * dim, 4, 4, 4, generator=g)
        f = torch.nn.functional.interpolate(low, size=GRID, mode="trilinear", align_corners=False)
        f = f.view(heads, dim, -1).transpose(1, 2).unsqueeze(0)
        return f / f.std()

    shared, values, drift = field(), field(), field()
    out = {}
    for i, step in enumerate(STEPS):
        base = shared + 0.05 * i * drift
        q = sharpness * (base + noise * torch.randn(base.shape, generator=g))
        k = sharpness * (base + noise * torch.randn(base.shape, generator=g))
        out[(0, step)] = (q.contiguous(), k.contiguous(), values.contiguous())
    return out


def run_input(kind: str, name: str, data: dict, table: dict, repeats: int) -> list[dict]:
    rows = []
    for layer in sorted({key[0] for key in data}):
        calls = [data[(layer, s)] for s in STEPS]
        refs = [torch.nn.functional.scaled_dot_product_attention(q, k, v) for q, k, v in calls]
        # Warm-up: compiled FlexAttention (tiles) compiles per padded length.
        for _fam, make in table.values():
            m = make()
            for q, k, v in calls[:2]:
                m(q, k, v, grid=GRID)
        for rep in range(repeats):
            modules = {label: make() for label, (_fam, make) in table.items()}
            for i, (q, k, v) in enumerate(calls):
                t = time.perf_counter()
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
                dense_s = time.perf_counter() - t
                order = list(modules) if (i + rep) % 2 == 0 else list(reversed(modules))
                for label in order:
                    m = modules[label]
                    t = time.perf_counter()
                    out = m(q, k, v, grid=GRID)
                    total = time.perf_counter() - t
                    st = m.last_stats
                    rows.append({"kind": kind, "input": name, "layer": layer, "step": STEPS[i], "repeat": rep,
                                 "anchor_every": getattr(m.config, "anchor_every", None),
                                 "call": "anchor" if i == 0 else "warm", "method": table[label][0], "label": label,
                                 "rel_l2": rel_l2(out, refs[i]), "total_s": total, "dense_s": dense_s,
                                 "density": float(st["density"]), "useful_density": float(st["useful_density"]),
                                 "clustering_s": st["clustering_s"], "merging_s": st["merging_s"],
                                 "layout_s": st["layout_s"], "attention_s": st["attention_s"]})
        print(f"{kind} {name} layer {layer}: done ({len(rows)} rows)", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per (kind, call, label): medians of error, time (as a ratio to dense) and density."""
    groups = {}
    for r in rows:
        groups.setdefault((r["kind"], r["call"], r["label"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {"method": rs[0]["method"], "anchor_every": rs[0].get("anchor_every"),
                    "rel_l2": statistics.median(r["rel_l2"] for r in rs),
                    "time_vs_dense": statistics.median(r["total_s"] / r["dense_s"] for r in rs),
                    "total_ms": 1e3 * statistics.median(r["total_s"] for r in rs),
                    "dense_ms": 1e3 * statistics.median(r["dense_s"] for r in rs),
                    "density": statistics.median(r["density"] for r in rs),
                    "useful_density": statistics.median(r["useful_density"] for r in rs), "n": len(rs)}
    return out


def per_generation(summ: dict, kind: str, label: str) -> float | None:
    """Time over dense per sparse call over one generation's :data:`SPARSE_CALLS` calls of a layer: HVA
    re-clusters fully every ``anchor_every`` calls; SVG2 clusters cold once (per layer and branch)."""
    a, w = summ.get((kind, "anchor", label)), summ.get((kind, "warm", label))
    if a is None or w is None:
        return None
    every = a["anchor_every"]
    anchors = -(-SPARSE_CALLS // every) if every else 1
    return (anchors * a["time_vs_dense"] + (SPARSE_CALLS - anchors) * w["time_vs_dense"]) / SPARSE_CALLS


def _interp(points: list[tuple[float, float]], x: float) -> float | None:
    """Linear interpolation in sorted ``(x, y)`` points; None outside their range."""
    points = sorted(points)
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return None


def matched(summ: dict, kind: str, family: str = "hva", peer: str = "svg2") -> list[dict]:
    """At each of ``peer``'s warm points: ``family``'s error at the same executed density (interpolated between
    its budgets; None outside their range), and the least time at which ``family`` reaches that error or a
    lower one, per warm call and per call over a generation (on the lines between its budgets)."""
    def points(method):
        return [(label, s, summ[(kind, "anchor", label)]) for (k, c, label), s in summ.items()
                if k == kind and c == "warm" and s["method"] == method]
    def least_time(pts, error):  # the least time at which the piecewise-linear frontier's error is <= error
        times = [t for e, t in pts if e <= error]
        at = _interp(pts, error)
        return min(times + ([at] if at is not None else []), default=None)

    fam = points(family)
    out = []
    for label, s, _a in sorted(points(peer), key=lambda t: t[1]["density"]):
        err = _interp([(f["density"], f["rel_l2"]) for _, f, _ in fam], s["density"])
        warm = least_time([(f["rel_l2"], f["time_vs_dense"]) for _, f, _ in fam], s["rel_l2"])
        gen = least_time([(f["rel_l2"], per_generation(summ, kind, lb)) for lb, f, _ in fam], s["rel_l2"])
        out.append({"peer": label, "density": s["density"], "peer_error": s["rel_l2"], "error_at_density": err,
                    "peer_warm": s["time_vs_dense"], "warm_at_error": warm,
                    "peer_generation": per_generation(summ, kind, label), "generation_at_error": gen})
    return out


def _f(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def print_tables(summ: dict) -> None:
    families = sorted({s["method"] for s in summ.values()} & {"hva", "hva-floor10"})
    for kind, family in [(k, f) for k in sorted({k[0] for k in summ}) for f in families]:
        print(f"\n{kind}: {family} (several top_p) at SVG2's points")
        print("| SVG2 | executed density | SVG2 error | HVA error at that density | ratio | SVG2 warm call / dense | "
              "HVA at SVG2's error | SVG2 per call over a generation | HVA at SVG2's error |")
        print("|---|---|---|---|---|---|---|---|---|")
        for m in matched(summ, kind, family):
            ratio = None if m["error_at_density"] is None else m["error_at_density"] / m["peer_error"]
            print(f"| {m['peer']} | {m['density']:.3f} | {m['peer_error']:.3f} | {_f(m['error_at_density'])} | "
                  f"{_f(ratio, 2)} | {m['peer_warm']:.2f} | {_f(m['warm_at_error'], 2)} | "
                  f"{m['peer_generation']:.2f} | {_f(m['generation_at_error'], 2)} |")
    for kind in sorted({k[0] for k in summ}):
        print(f"\n{kind}: median over inputs, layers (and warm steps)")
        print("| method | setting | anchor call / dense | warm call / dense | per call over a generation | "
              "rel. error (warm) | executed density (warm) |")
        print("|---|---|---|---|---|---|---|")
        for (k, c, label), s in sorted(summ.items(), key=lambda kv: (kv[1]["method"], kv[0][2])):
            if k == kind and c == "warm":
                method, _, setting = label.partition(" ")
                a = summ[(kind, "anchor", label)]
                print(f"| {method} | {setting} | {a['time_vs_dense']:.2f} | {s['time_vs_dense']:.2f} | "
                      f"{per_generation(summ, kind, label):.2f} | {s['rel_l2']:.3f} | {s['density']:.3f} |")
    for kind in sorted({k[0] for k in summ}):
        for call in ("anchor", "warm"):
            print(f"\n{kind}, {call} calls: median over inputs, layers{', steps' if call == 'warm' else ''}")
            print("| method | setting | rel. error | total time / dense | executed density | useful density |")
            print("|---|---|---|---|---|---|")
            for (k, c, label), s in sorted(summ.items(), key=lambda kv: (kv[1]["method"], kv[0][2])):
                if k == kind and c == call:
                    method, _, setting = label.partition(" ")
                    print(f"| {method} | {setting} | {s['rel_l2']:.3f} | {s['time_vs_dense']:.2f} | "
                          f"{s['density']:.3f} | {s['useful_density']:.3f} |")


def plot(summ: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({k[0] for k in summ})
    fig, axes = plt.subplots(len(kinds), 2, figsize=(10, 4 * len(kinds)), squeeze=False)
    colours = {"hva": "tab:blue", "hva-floor10": "tab:cyan", "hva-density": "tab:green", "hva-tiles": "tab:purple",
               "hva-greedy": "tab:gray", "svg2": "tab:red"}
    for row, kind in enumerate(kinds):
        for col, call in enumerate(("anchor", "warm")):
            ax = axes[row][col]
            for method, colour in colours.items():
                pts = sorted((s["time_vs_dense"], s["rel_l2"]) for (k, c, _), s in summ.items()
                             if k == kind and c == call and s["method"] == method)
                if pts:
                    ax.plot(*zip(*pts, strict=True), "o-", color=colour, label=method)
            ax.axvline(1.0, color="gray", lw=0.8, ls="--")
            ax.set(title=f"{kind}, {call} calls", xlabel="total sparse-call time / dense SDPA",
                   ylabel="relative L2 error vs dense")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture-file", default="runs/frontier_capture_heldout.pt", help="captured q/k/v are kept here")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="three budgets per method, one prompt, one seed")
    ap.add_argument("--output", default="benchmarks/results/sparse_frontier.json")
    ap.add_argument("--tables", action="store_true", help="print the tables of an earlier run's --output and stop")
    args = ap.parse_args()
    if args.tables:
        summ = summary(json.loads(Path(args.output).read_text())["rows"])
        print_tables(summ)
        return
    cache = Path(args.capture_file)
    if cache.is_file():
        captured = {p: {tuple(k): tuple(v) for k, v in d} for p, d in torch.load(cache, weights_only=True).items()}
        if set(captured) != set(PROMPTS):
            sys.exit(f"{cache} holds captures of other prompts ({sorted(captured)}); give another --capture-file")
    else:
        captured = {}
        for prompt in PROMPTS:
            t = time.time()
            captured[prompt] = capture(prompt)
            print(f"captured {prompt!r} in {time.time() - t:.0f} s", flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({p: [(list(k), list(v)) for k, v in d.items()] for p, d in captured.items()}, cache)
    table = methods(args.quick)
    rows = []
    for prompt in PROMPTS[:1] if args.quick else PROMPTS:
        rows += run_input("captured", prompt, captured[prompt], table, args.repeats)
    for seed in (0,) if args.quick else (0, 1):
        rows += run_input("synthetic", f"seed {seed}", synthetic(seed), table, args.repeats)
    summ = summary(rows)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    tmp.replace(out)
    plot(summ, out.with_suffix(".png"))
    print_tables(summ)


if __name__ == "__main__":
    main()
