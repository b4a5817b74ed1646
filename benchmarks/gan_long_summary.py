"""Curves and tables from benchmarks/run_gan_long.sh (and any other run under runs/gan-long).

Reads each run's ``eval.jsonl`` (class accuracy, FD, KID, precision, recall of its EMA every 250 steps, 600
images; the backgrounds' total variation to the data's in lines from 2026-12-03 18:00 on, the share of each
texture from 2026-12-04 on) and ``log.jsonl`` (how often D prefers an image's true class to another class, or
to another shape of the same colour; logged every 50 steps as moving averages; lines before 2026-12-03 12:45
have the margins only), from ``runs/gan-long/NAME/`` when the run is here, else from the copies in
``benchmarks/results/gan_long/``. A resumed run may log a step twice; the last line of a step counts.

Two outputs:

- the 3-seed comparison of issue 26 (runs ``mp-sN`` and ``r3gan-sN``): curves per seed, one colour per variant,
  in ``results/gan_long/mp_vs_r3gan.png``, and a table of the final ``kinegen eval gan --images 1200``
  results (``NAME.json``) with each variant's mean and range over its seeds;
- every run (ablations and fine-tunes too): the last training eval of each, and ``results/gan_long/curves.png``.

    .venv/bin/python benchmarks/gan_long_summary.py            # prints markdown, writes both PNGs
"""

import json
import re
from pathlib import Path

RUNS = Path("runs/gan-long")
RESULTS = Path("benchmarks/results/gan_long")
EVAL_KEYS = [("class_accuracy", "class accuracy"), ("modes_covered", "modes (of 12)"), ("fd", "FD"),
             ("kid", "KID"), ("precision", "precision"), ("recall", "recall"),
             ("background_pair_tv", "backgrounds: TV to the data (lower is better)")]  # logged from 2026-12-03 18:00
MARGINS = [("d_win_class", "D prefers the true class (vs another)"),
           ("d_win_shape", "D prefers the true shape (same colour)")]
COMPARISON = re.compile(r"^(mp|r3gan)-s(\d+)$")  # the 3-seed comparison's run names (run_gan_long.sh)
VARIANT_STYLE = {"mp": ("tab:blue", "MP-GAN"), "r3gan": ("tab:red", "R3GAN")}
SEED_STYLE = ["-", "--", ":", "-."]
FINAL_KEYS = [("class_accuracy", "class accuracy", "{:.1%}"), ("modes_covered", "modes", "{:.0f}"),
              ("fd", "FD", "{:.2f}"), ("kid", "KID x1000", "{:.2f}"), ("precision", "precision", "{:.2f}"),
              ("recall", "recall", "{:.2f}"), ("class_spread", "class spread", "{:.2f}")]


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


def plot_curves(plt, runs: dict, path: Path, style=None, log_fd: bool = False) -> None:
    """One panel per metric (EVAL_KEYS, then D's margins), x in thousands of training images; ``style(name)``
    gives a run's line style and label (default: matplotlib's cycle, the run's name)."""
    fig, axes = plt.subplots(3, 3, figsize=(13, 10))
    for ax, (key, title) in zip(axes.flat, EVAL_KEYS + MARGINS, strict=True):
        for n, (ev, log) in runs.items():
            rows = [r for r in (ev if key in dict(EVAL_KEYS) else log) if key in r]
            if rows:
                ax.plot([r["step"] * 32 / 1000 for r in rows], [r[key] for r in rows],
                        **(style(n) if style else {"label": n}))
        if key in ("fd", "kid") and log_fd:
            ax.set_yscale("symlog", linthresh=1.0)  # from ~250 down to ~0.3: the end matters as much as the start
        ax.set_title(title)
        ax.set_xlabel("thousand images")
        ax.grid(alpha=0.3)
    if style:
        axes.flat[0].legend(fontsize=8)
    else:  # dozens of runs: the legend goes beside the figure
        fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    print(f"\nwrote {path}")


def comparison_table(names_: list[str]) -> None:
    """Final 1,200-image evaluations of the comparison runs, per seed and as mean [min, max] per variant."""
    finals = {}
    for n in names_:
        f = RESULTS / f"{n}.json"
        if f.is_file():
            finals[n] = json.loads(f.read_text())
    print("| run | " + " | ".join(t for _, t, _ in FINAL_KEYS) + " |")
    print("|---" * (len(FINAL_KEYS) + 1) + "|")
    for n, r in finals.items():
        print(f"| {n} | " + " | ".join(fmt.format(r[k]) for k, _, fmt in FINAL_KEYS) + " |")
    for variant, (_, label) in VARIANT_STYLE.items():
        rs = [r for n, r in finals.items() if COMPARISON.match(n)[1] == variant]
        if not rs:
            continue
        cells = []
        for k, _, fmt in FINAL_KEYS:
            v = [r[k] for r in rs]
            cells.append(f"{fmt.format(sum(v) / len(v))} [{fmt.format(min(v))}, {fmt.format(max(v))}]")
        print(f"| **{label}, {len(rs)} seeds: mean [min, max]** | " + " | ".join(cells) + " |")
    missing = [n for n in names_ if n not in finals]
    if missing:
        print(f"\nno final evaluation yet (still training?): {', '.join(missing)}")


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {n: (read(n, "eval"), read(n, "log")) for n in names()}
    compared = {n: r for n, r in runs.items() if COMPARISON.match(n)}
    print("## MP-GAN against R3GAN: 5,000 steps, batch 32, final evaluation on 1,200 images\n")
    comparison_table(sorted(compared))

    def style(n: str) -> dict:
        variant, seed = COMPARISON.match(n).groups()
        colour, label = VARIANT_STYLE[variant]
        return {"color": colour, "linestyle": SEED_STYLE[int(seed) % len(SEED_STYLE)], "label": f"{label}, seed {seed}"}

    plot_curves(plt, compared, RESULTS / "mp_vs_r3gan.png", style, log_fd=True)

    print("\n## Every run: its last training evaluation (600 images)\n")
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
    plot_curves(plt, runs, RESULTS / "curves.png")


if __name__ == "__main__":
    main()
