"""Summarise the Map-Guided Caching benchmark runs into Markdown tables (prints to stdout).

    python benchmarks/caching_summary.py benchmarks/results/caching
    python benchmarks/caching_summary.py benchmarks/results/caching --speedup-of mag:threshold=0.5,max_skip_steps=4

Reads, from the results folder: ``main/report.json`` (kinegen profile: mapguided at several requested
speedups and the diffusers caches at several settings), ``ablation_simple/report.json`` and
``ablation_complex/report.json`` (predicted vs average map, DP vs greedy planner), ``adherence/*.json``
(kinegen eval adherence outputs) and the predictor's ``calibration.json``. With ``--speedup-of CONFIG`` it
prints only that configuration's measured transformer speedup in ``main/`` (run_caching.sh requests
mapguided at the peers' measured speedups this way). With ``--profile DIR...`` it prints, for each
``kinegen profile`` folder (e.g. ``results/caching_bound/peers20``), the configurations with what the adherence
classifier read against dense and mapguided's plan, then the matched-speedup table.

    python benchmarks/caching_summary.py --profile benchmarks/results/caching_bound/peers{20,30,50}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _mg(run: dict) -> dict:
    return next((s for s in run.get("accelerator_stats") or [] if s.get("name") == "mapguided"), {})


def main_table(report: dict) -> list[str]:
    lines = ["| config | requested | transformer speedup | within 10% | end-to-end speedup | PSNR dB | SSIM | "
             "computed blocks | predict + plan ms | share of run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        st = _mg(r)
        req = st.get("requested_speedup")
        ts = r["transformer_speedup"]
        ok = "" if req is None or ts is None else ("yes" if abs(ts / req - 1) <= 0.10 else "no")
        cost = (st.get("predict_ms", 0) + st.get("plan_ms", 0)) if st else None
        share = f"{cost / 1e3 / r['latency_s']['median']:.2%}" if cost is not None else ""
        lines.append(
            f"| `{r['config']}` | {req or ''} | {ts:.2f}x | {ok} | {r['speedup']:.2f}x | {r['psnr_db']:.2f} | "
            f"{r['ssim']:.4f} | {st.get('achieved_compute_fraction', 1):.0%} | "
            f"{'' if cost is None else f'{cost:.1f}'} | {share} |")
    return lines


def _interp(xs: list[float], ys: list[float], x: float) -> float | None:
    """Piecewise-linear value at ``x`` of the curve through (xs, ys) sorted by xs; None outside its range."""
    pts = sorted(zip(xs, ys, strict=True))
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def matched(report: dict) -> list[str]:
    """Each peer run against mapguided at the same measured transformer speedup: PSNR and SSIM of the
    mapguided runs interpolated (piecewise linear in speedup) at the peer's speedup."""
    runs = [r for r in report["runs"] if r["config"] != "dense"]
    ours = [r for r in runs if r["config"].startswith("mapguided")]
    xs = [r["transformer_speedup"] for r in ours]
    lines = ["| peer | speedup | PSNR | SSIM | mapguided at that speedup: PSNR | SSIM | mapguided better |",
             "|---|---|---|---|---|---|---|"]
    for p in runs:
        if p["config"].startswith("mapguided"):
            continue
        s = p["transformer_speedup"]
        psnr = _interp(xs, [r["psnr_db"] for r in ours], s)
        ssim = _interp(xs, [r["ssim"] for r in ours], s)
        if psnr is None:  # outside the measured range: compare with the nearest mapguided run
            near = min(ours, key=lambda r: abs(r["transformer_speedup"] - s))
            beats = near["psnr_db"] > p["psnr_db"] and near["ssim"] > p["ssim"]
            faster = near["transformer_speedup"] >= s
            verdict = ("yes (mapguided faster and better)" if beats and faster else
                       "no (peer faster and better)" if not beats and not faster else "not comparable")
            lines.append(f"| `{p['config']}` | {s:.2f}x | {p['psnr_db']:.2f} | {p['ssim']:.4f} | "
                         f"{near['psnr_db']:.2f} at {near['transformer_speedup']:.2f}x | {near['ssim']:.4f} | "
                         f"{verdict} |")
            continue
        better = psnr > p["psnr_db"] and ssim > p["ssim"]
        lines.append(f"| `{p['config']}` | {s:.2f}x | {p['psnr_db']:.2f} | {p['ssim']:.4f} | {psnr:.2f} | "
                     f"{ssim:.4f} | {'yes' if better else 'no'} |")
    return lines


def peers_table(report: dict) -> list[str]:
    """Every configuration of a profile run: speed, fidelity, adherence against dense and mapguided's plan."""
    from kinegen.profiling.report import _adherence_cell

    lines = ["| config | transformer speedup | PSNR dB | SSIM | adherence vs dense | mapguided plan |",
             "|---|---|---|---|---|---|"]
    for r in report["runs"]:
        if r["config"] == "dense":
            continue
        st = _mg(r)
        plan = ""
        if st.get("planned_compute_fraction") is not None:
            plan = (f"{st['planned_compute_fraction']:.0%} of blocks, {st.get('predicted_error_per_step', 0):.3f} "
                    "per step" + ("; warned, served at the limit" if st.get("warning") else ""))
        lines.append(f"| `{r['config']}` | {r['transformer_speedup']:.2f}x | {r['psnr_db']:.2f} | {r['ssim']:.4f} | "
                     f"{_adherence_cell(r.get('adherence'))} | {plan} |")
    return lines


def ablation(report: dict) -> list[str]:
    lines = ["| config | computed blocks | transformer speedup | PSNR dB | SSIM | predicted error |",
             "|---|---|---|---|---|---|"]
    for r in report["runs"]:
        if r["config"] == "dense":
            continue
        st = _mg(r)
        err = st.get("predicted_error")
        lines.append(f"| `{r['config']}` | {st.get('achieved_compute_fraction', 1):.1%} | "
                     f"{r['transformer_speedup']:.2f}x | {r['psnr_db']:.2f} | {r['ssim']:.4f} | "
                     f"{'' if err is None else f'{err:.3f}'} |")
    return lines


def adherence(folder: Path) -> list[str]:
    """Accuracy against the prompt, and agreement with the dense run's classification of the same prompt
    and seed (what the cache changed), per attribute."""
    attrs = ("shape", "colour", "motion")
    dense = _load(folder / "dense.json")
    ref = {}
    if dense:
        for split, r in dense["results"].items():
            ref.update({(split, x["prompt"], x["seed"]): x["prediction"] for x in r["records"]})
    lines = ["| config | split | prompts | shape | colour | motion | same as dense: shape | colour | motion |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for split, r in data["results"].items():
            a = r["accuracy"]
            pairs = [(x["prediction"], ref.get((split, x["prompt"], x["seed"]))) for x in r.get("records", [])]
            pairs = [(p, q) for p, q in pairs if q is not None]
            agree = ([f"{sum(p[k] == q[k] for p, q in pairs) / len(pairs):.0%}" for k in attrs] if pairs
                     else ["", "", ""])
            lines.append(f"| {path.stem} | {split} | {r['n']} | {a['shape']:.0%} | {a['colour']:.0%} | "
                         f"{a['motion']:.0%} | " + " | ".join(agree) + " |")
    return lines


def main(folder: str) -> None:
    root = Path(folder)
    out = []
    main_report = _load(root / "main" / "report.json")
    if main_report:
        out += ["## Requested against achieved speedup", "", *main_table(main_report), "",
                "## Matched speedup against diffusers' caches", "", *matched(main_report), ""]
    for name in ("simple", "complex"):
        rep = _load(root / f"ablation_{name}" / "report.json")
        if rep:
            out += [f"## Ablation, {name} prompts", "", *ablation(rep), ""]
    if (root / "adherence").is_dir():
        out += ["## Prompt adherence", "", *adherence(root / "adherence"), ""]
    print("\n".join(out))


def speedup_of(folder: str, config: str) -> float:
    report = _load(Path(folder) / "main" / "report.json")
    if report is None:
        raise SystemExit(f"no {folder}/main/report.json: run the main profile first")
    for r in report["runs"]:
        if r["config"] == config:
            return r["transformer_speedup"]
    raise SystemExit(f"{config!r} is not in {folder}/main/report.json; it has: "
                     + ", ".join(r["config"] for r in report["runs"]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", default="benchmarks/results/caching")
    ap.add_argument("--speedup-of", metavar="CONFIG", help="print this configuration's measured transformer speedup")
    ap.add_argument("--profile", nargs="+", metavar="DIR", help="print the tables of these kinegen profile folders")
    args = ap.parse_args()
    if args.profile:
        for folder in args.profile:
            report = json.loads((Path(folder) / "report.json").read_text())
            steps = report.get("settings", {}).get("steps", "?")
            print(f"\n{folder} ({steps} steps)\n\n" + "\n".join(peers_table(report)) + "\n\n"
                  + "\n".join(matched(report)))
    elif args.speedup_of:
        print(f"{speedup_of(args.folder, args.speedup_of):.2f}")
    else:
        main(args.folder)
