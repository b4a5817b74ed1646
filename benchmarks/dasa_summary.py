"""Markdown tables of benchmarks/dasa.py's results (what benchmarks/dasa.md shows).

    .venv/bin/python benchmarks/dasa_summary.py benchmarks/results/dasa
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROLLOUT_COLUMNS = ("| setting | transformer speedup | end to end | KV vs dense (end / max) | peak RSS MiB | PSNR dB "
                   "| SSIM | shape | colour | motion |")


def rollout_table(result: dict) -> str:
    lines = [f"`{result['command']}` ({result['date']}; {result['prompts']} {result['split']} prompts, "
             f"{result['frames']} frames, {result['steps']} steps, guidance {result['guidance']})", "",
             ROLLOUT_COLUMNS, "|" + "---|" * (ROLLOUT_COLUMNS.count("|") - 1)]
    for name, row in result["table"].items():
        right = row["right"]
        psnr = "ref" if name == "dense" else f"{row['psnr_db']:.1f}"
        lines.append(f"| {name} (`{result['settings'].get(name, 'dense')}`) | {row['transformer_speedup']:.2f}x | "
                     f"{row['end_to_end_speedup']:.2f}x | {row['kv_ratio']:.0%} / {row['kv_ratio_max']:.0%} | "
                     f"{row['peak_rss_mib']:.0f} | {psnr} | {row['ssim']:.3f} | {right['shape']:.0%} | "
                     f"{right['colour']:.0%} | {right['motion']:.0%} |")
    return "\n".join(lines)


def masks_table(result: dict) -> str:
    lines = [f"`{result['command']}` ({result['date']}; {result['clips']} clips of {result['frames']} frames)", "",
             "| selection | IoU | recall | precision | tokens kept | tokens moving (truth) |",
             "|---|---|---|---|---|---|"]
    for name, row in result["table"].items():
        lines.append(f"| {name} | {row['iou']:.2f} | {row['recall']:.2f} | {row['precision']:.2f} | "
                     f"{row['kept']:.0%} | {row['truth']:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:] or ["benchmarks/results/dasa"])[0])
    for path in sorted(folder.glob("rollouts_*.json")):
        print(rollout_table(json.loads(path.read_text())), end="\n\n")
    if (folder / "masks.json").is_file():
        print(masks_table(json.loads((folder / "masks.json").read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
