"""Tables and the discriminator-magnitude plot from benchmarks/run_gan.sh's results.

    .venv/bin/python benchmarks/gan_summary.py   # prints markdown; writes benchmarks/gan_magnitudes.png
"""

import json
import statistics
from pathlib import Path

RESULTS = Path("benchmarks/results/gan")
METRICS = [("fd", "FD (classifier features)", ".1f"), ("kid", "KID", ".2f"), ("precision", "precision", ".2f"),
           ("recall", "recall", ".2f"), ("class_accuracy", "class accuracy", ".1%")]


def cpu_seconds(name):
    """User CPU seconds of the training run (from /usr/bin/time)."""
    return float((RESULTS / f"{name}.time").read_text().split(",")[1].split()[0])


def load(name):
    m = json.loads((RESULTS / f"{name}.json").read_text())
    log = [json.loads(x) for x in (RESULTS / f"{name}.log.jsonl").read_text().splitlines()]
    wall = float((RESULTS / f"{name}.time").read_text().split()[0])
    return m, log, wall


def fmt(vals, spec):
    if len(vals) == 1:
        return format(vals[0], spec)
    return f"{format(statistics.mean(vals), spec)} ({', '.join(format(v, spec) for v in vals)})"


def row(label, names):
    ms = [load(n) for n in names]
    cells = [fmt([m[k] for m, _, _ in ms], spec) for k, _, spec in METRICS]
    cells.append(fmt([float(m["modes_covered"]) for m, _, _ in ms], ".1f") + f" of {ms[0][0]['modes']}")
    cells.append(f"{ms[0][1][-1]['step']}")
    cells.append(fmt([w / 60 for _, _, w in ms], ".1f"))
    cells.append(fmt([u / 60 for u in (cpu_seconds(n) for n in names)], ".1f"))
    return f"| {label} | " + " | ".join(cells) + " |"


def main():
    head = ("| run | " + " | ".join(t for _, t, _ in METRICS)
            + " | modes | steps | wall min | CPU min |")
    sep = "|" + "---|" * (len(METRICS) + 5)
    print("## MP-GAN against R3GAN (mean over seeds, each seed in brackets)\n")
    print(head + "\n" + sep)
    def seeds(prefix):
        return [f"{prefix}-s{i}" for i in range(10) if (RESULTS / f"{prefix}-s{i}.json").is_file()]

    if seeds("mpf"):
        print(row("MP-GAN, R3GAN2 transitions, extraction and class embeddings (the default)", seeds("mpf")))
    for prefix, lr in (("mpf2", "2e-3"), ("mpf6", "6e-3")):
        if seeds(prefix):
            print(row(f"the same at lr {lr}", seeds(prefix)))
    if seeds("mp2"):
        print(row("the same, transitions without the low-pass filter", seeds("mp2")))
    if seeds("mpg"):
        print(row("MP-GAN (lr 3e-3), learned transitions", seeds("mpg")))
    print(row("MP-GAN (lr 3e-3), G output gain from 0", seeds("mp3")))
    print(row("R3GAN baseline (lr 2e-4)", seeds("r3gan")))
    if seeds("r3gan6"):
        print(row("R3GAN baseline (lr 6e-4)", seeds("r3gan6")))
    print("\n## Ablation (seed 0)\n")
    print(head + "\n" + sep)
    for label, name in [("MP-GAN, R3GAN2 form (all changes, lr 3e-3)", "mpf-s0"),
                        ("R3GAN2 form, transitions without the low-pass filter", "mp2-s0"),
                        ("MP-GAN, learned transitions (lr 3e-3)", "mpg-s0"),
                        ("MP-GAN, G output gain from 0 (EDM2)", "mp3-s0"), ("- MP residuals", "mp3-no-mp_residual"),
                        ("- weight normalisation and centering", "mp3-no-weight_norm"),
                        ("MP-GAN at lr 1e-2 (EDM2's rate)", "mp-s0"), ("MP-GAN at lr 1.5e-3", "mp15-s0"),
                        ("R3GAN baseline (all off, lr 2e-4)", "r3gan-s0"),
                        ("R3GAN baseline (all off, lr 6e-4)", "r3gan6-s0")]:
        if (RESULTS / f"{name}.json").is_file():
            print(row(label, [name]))
    plot()


def raw_magnitudes(log, key):
    """The per-measurement values behind the training log's running average (0.9 old + 0.1 new).

    D's magnitudes are measured at step 1 and every 50 steps and the log, written every 20 steps,
    holds their running average; each change between consecutive log lines is one new measurement,
    recovered exactly by inverting the average.
    """
    steps, values, prev = [], [], None
    for r in log:
        a = r.get(key)
        if a is None or a == prev:
            continue
        values.append(a if prev is None else (a - 0.9 * prev) / 0.1)
        steps.append(r["step"])
        prev = a
    return steps, values


def plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [("MP-GAN, R3GAN2 form", ["mpf-s0", "mpf-s1"]), ("MP-GAN, learned transitions", ["mpg-s0", "mpg-s1"]),
                ("R3GAN baseline", ["r3gan-s0", "r3gan-s1"]), ("MP-GAN without MP residuals", ["mp3-no-mp_residual"])]
    variants = [(t, [n for n in names if (RESULTS / f"{n}.json").is_file()]) for t, names in variants]
    variants = [(t, names) for t, names in variants if names]
    fig, axes = plt.subplots(1, len(variants), figsize=(4.6 * len(variants), 3.8), sharey=True)
    for ax, (title, names) in zip(axes, variants, strict=True):
        for name, style in zip(names, ["-", "--"], strict=False):
            _, log, _ = load(name)
            stages = sorted(k for k in log[-1] if k.startswith("mag_"))
            total = log[-1]["step"]
            for i, k in enumerate(stages):
                steps, values = raw_magnitudes(log, k)
                ax.plot([s / total for s in steps], values, style, color=f"C{i}",
                        label=f"{['32x32', '16x16', '8x8', '4x4'][i]} ({name.split('-')[-1]})")
        ax.set_title(title)
        ax.set_xlabel("fraction of training")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("D activation RMS on real images")
    for ax in axes:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig("benchmarks/gan_magnitudes.png", dpi=110)
    print("\nwrote benchmarks/gan_magnitudes.png")


if __name__ == "__main__":
    main()
