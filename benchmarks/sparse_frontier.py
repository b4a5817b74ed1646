"""The quality-speed frontier of clustered sparse attention: HVA against the faithful SVG2, one run side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_frontier.py [--capture-file runs/frontier_capture.pt]

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

* ``hva`` (tiles, density budget), ``hva-lists`` (key lists, density budget), ``hva-topp`` (key lists,
  per-query-cluster top-p with SVG2's floor of 10% of key clusters);
* ``svg2``: Sparse VideoGen 2 as published (:mod:`kinegen.sparse_attn.svg2`) at its top-p values.

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

PROMPTS = ["a yellow star moving down on a black background", "a blue square moving left on a white background"]
LAYERS = (1, 3, 5)
STEPS = (8, 9, 10)
GRID = (15, 24, 24)


def methods(quick: bool) -> dict:
    """name -> (family, factory) for every (method, budget)."""
    dens = (0.15, 0.25, 0.4) if quick else (0.1, 0.15, 0.2, 0.25, 0.3, 0.4)
    tops = (0.7, 0.9) if quick else (0.5, 0.7, 0.8, 0.9, 0.95)
    out = {}
    for d in dens:
        out[f"hva d={d}"] = ("hva", lambda d=d: HVAttention(HVAConfig(density=d, min_tokens=0)))
        out[f"hva-lists d={d}"] = ("hva-lists", lambda d=d: HVAttention(HVAConfig(density=d, layout="lists",
                                                                                    min_tokens=0)))
    for p in tops:
        out[f"hva-topp p={p}"] = ("hva-topp", lambda p=p: HVAttention(HVAConfig(
            density=None, top_p=p, min_keys=1, min_key_share=0.1, layout="lists", min_tokens=0)))
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
        out[key] = {"method": rs[0]["method"], "rel_l2": statistics.median(r["rel_l2"] for r in rs),
                    "time_vs_dense": statistics.median(r["total_s"] / r["dense_s"] for r in rs),
                    "total_ms": 1e3 * statistics.median(r["total_s"] for r in rs),
                    "dense_ms": 1e3 * statistics.median(r["dense_s"] for r in rs),
                    "density": statistics.median(r["density"] for r in rs),
                    "useful_density": statistics.median(r["useful_density"] for r in rs), "n": len(rs)}
    return out


def print_tables(summ: dict) -> None:
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
    colours = {"hva": "tab:blue", "hva-lists": "tab:green", "hva-topp": "tab:olive", "svg2": "tab:red"}
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
    ap.add_argument("--capture-file", default="runs/frontier_capture.pt", help="captured q/k/v are kept here")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="three budgets per method, one prompt, one seed")
    ap.add_argument("--output", default="benchmarks/results/sparse_frontier.json")
    args = ap.parse_args()
    cache = Path(args.capture_file)
    if cache.is_file():
        captured = {p: {tuple(k): tuple(v) for k, v in d} for p, d in torch.load(cache, weights_only=True).items()}
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
