"""Curves and a table from benchmarks/run_gan_long.sh (and any other run under runs/gan-long).

Reads each run's ``eval.jsonl`` (class accuracy, FD, KID, precision, recall of its EMA every 250 steps, 600
images; the backgrounds' total variation to the data's in lines from 2026-12-03 18:00 on, the share of each texture from
2026-12-04 on) and ``log.jsonl`` (how
often D prefers an image's true class to another class, or to another shape of the same colour; logged every 50
steps as moving averages; lines before 2026-12-03 12:45 have the margins only), from ``runs/gan-long/NAME/``
when the run is here, else from the copies in ``benchmarks/results/gan_long/``. A resumed run may log a step
twice; the last line of a step counts.

    .venv/bin/python benchmarks/gan_long_summary.py            # prints markdown, writes results/gan_long/curves.png
"""

import json
from pathlib import Path

RUNS = Path("runs/gan-long")
RESULTS = Path("benchmarks/results/gan_long")
EVAL_KEYS = [("class_accuracy", "class accuracy"), ("modes_covered", "modes (of 12)"), ("fd", "FD"),
             ("kid", "KID"), ("precision", "precision"), ("recall", "recall"),
             ("background_pair_tv", "backgrounds: TV to the data (lower is better)")]  # logged from 2026-12-03 18:00
MARGINS = [("d_win_class", "D prefers the true class (vs another)"),
           ("d_win_shape", "D prefers the true shape (same colour)")]


def by_step(lines: list[str]) -> list[dict]:
    rows = {}
    for line in lines:
        r = json.loads(line)
        rows[r["step"]] = r
    return [rows[s] for s in sorted(rows)]


def read(name: str, kind: str) -> list[dict]:
    live = RUNS / name / f"{kind}.jsonl"
    saved = RESULTS / f"{name}.{kind}.jsonl"
    path = live if live.is_file() else saved
    return by_step(path.read_text().splitlines()) if path.is_file() else []


def names() -> list[str]:
    found = {p.name for p in RUNS.iterdir() if (p / "eval.jsonl").is_file()} if RUNS.is_dir() else set()
    found |= {p.name.split(".")[0] for p in RESULTS.glob("*.eval.jsonl")}
    return sorted(found)


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {n: (read(n, "eval"), read(n, "log")) for n in names()}
    print("| run | step | images | class accuracy | modes | FD | KID | precision | recall | backgrounds TV "
          "| textures: plain / checkered / striped / noisy | D prefers true: class / shape (training batch) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, (ev, log) in runs.items():
        if not ev:
            continue
        e = ev[-1]
        near = min(log, key=lambda r: abs(r["step"] - e["step"])) if log else {}
        bg = f"{e['background_pair_tv']:.2f}" if "background_pair_tv" in e else "-"
        tex = e.get("fake_textures")  # logged from 2026-12-04 on
        tex = " / ".join(f"{tex.get(t, 0):.0%}" for t in ("plain", "checkered", "striped", "noisy")) if tex else "-"
        print(f"| {n} | {e['step']} | {e['step'] * 32 / 1000:.0f}k | {e['class_accuracy']:.1%} | {e['modes_covered']} "
              f"| {e['fd']:.1f} | {e['kid']:.2f} | {e['precision']:.2f} | {e['recall']:.2f} "
              f"| {bg} | {tex} "
              f"| {near.get('d_win_class', float('nan')):.2f} / {near.get('d_win_shape', float('nan')):.2f} |")
    fig, axes = plt.subplots(3, 3, figsize=(13, 10))
    panels = EVAL_KEYS + MARGINS
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for n, (ev, log) in runs.items():
            rows = [r for r in (ev if key in dict(EVAL_KEYS) else log) if key in r]
            if rows:
                ax.plot([r["step"] * 32 / 1000 for r in rows], [r[key] for r in rows], label=n)
        ax.set_title(title)
        ax.set_xlabel("thousand images")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / "curves.png", dpi=90)
    print(f"\nwrote {RESULTS / 'curves.png'}")


if __name__ == "__main__":
    main()
