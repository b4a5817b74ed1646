"""The tables of benchmarks/autoregressive.md from the raw files of run_autoregressive.sh.

    .venv/bin/python benchmarks/autoregressive_summary.py [benchmarks/results/autoregressive]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ATTRS = ("shape", "colour", "motion", "background")  # background: "-" in files made before it was read


def pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.0f}%"


def windows_table(files: list[Path]) -> str:
    rows = ["| method | split | videos x frames | windows right: shape / colour / motion / background | "
            "first quarter | last quarter | drift (first - last, points) | still / lost windows | seams | "
            "s per video |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for f in files:
        d = json.loads(f.read_text())
        method = d["model"] + (" chunk by chunk" if d["method"] == "ar" else
                               f" window by window ({d['history']} history)")
        first = {a: d["first_quarter"].get(a) for a in ATTRS}
        last = {a: d["last_quarter"].get(a) for a in ATTRS}
        drift = ["-" if first[a] is None or first[a] != first[a] else f"{round(100 * (first[a] - last[a])):+d}"
                 for a in ATTRS]
        rows.append(
            f"| {method} | {d['split']} | {d['prompts']} x {d['frames']} | "
            + " / ".join(pct(d["right"].get(a)) for a in ATTRS) + " | "
            + " / ".join(pct(first[a]) for a in ATTRS) + " | "
            + " / ".join(pct(last[a]) for a in ATTRS) + " | "
            + " / ".join(drift) + " | "
            + f"{pct(d['still_windows'])} / {pct(d['lost_windows'])} | {d['seam_ratio']:.2f} | "
            + f"{d['seconds_per_video']:.0f} |")
    return "\n".join(rows)


def cost_table(path: Path) -> str:
    import statistics

    d = json.loads(path.read_text())
    rows = [f"{d['model']}, {d['frames']} frames ({len(d['runs']['rolling']['chunks'])} chunks of "
            f"{d['chunk_frames']} latent frames), {d['size']}x{d['size']}, {d['steps']} steps per chunk; "
            f"chunk k = the median of chunks k-2..k+2.\n",
            "| cache | chunk 10: s / peak RSS MiB / KV MiB | chunk 60: s / peak RSS MiB / KV MiB | "
            "latency 60 vs 10 | time to first frame | frames per second |",
            "|---|---|---|---|---|---|"]
    for name, run in d["runs"].items():
        c = run["chunks"]
        at = lambda k, key, c=c: statistics.median(x[key] for x in c[max(0, k - 2):k + 3])  # noqa: E731

        k2 = min(60, len(c) - 3)
        label = (f"rolling (sink {d['sink_frames']}, window {d['window_frames']} latent frames)" if name == "rolling"
                 else "global (every frame kept)")
        rows.append(f"| {label} | {at(10, 'seconds'):.2f} / {at(10, 'peak_rss_bytes') / 2**20:.0f} / "
                    f"{c[10]['kv_bytes'] / 2**20:.2f} | {at(k2, 'seconds'):.2f} / "
                    f"{at(k2, 'peak_rss_bytes') / 2**20:.0f} / {c[k2]['kv_bytes'] / 2**20:.2f} | "
                    f"{at(k2, 'seconds') / at(10, 'seconds'):.2f}x | {run['time_to_first_frame_s']:.2f} s | "
                    f"{run['frames_per_second']:.2f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["benchmarks/results/autoregressive"])[0])
    files = sorted(folder.glob("windows_*.json"))
    if files:
        print(windows_table(files), "\n")
    if (folder / "cost.json").is_file():
        print(cost_table(folder / "cost.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
