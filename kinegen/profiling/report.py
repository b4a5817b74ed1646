"""Writing a profile: report.json, report.md, two plots, a side-by-side video and its stills.

Every file is written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..media import atomic_path, to_uint8, write_image, write_video
from ..plotting import plot_latency, plot_speedup_vs_psnr, save_heatmap
from ..text import json_safe, slug, stat_items
from .chunks import bytes_text

if TYPE_CHECKING:
    from .runner import ProfileReport


def _fmt(v, spec: str = ".2f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def _adherence_cell(a: dict | None) -> str:
    """``same`` / ``CHANGED: colour 2/3, shape 1/3`` (what the evaluator read against dense) or ``n/a``."""
    if a is None:
        return "n/a"
    if not a["changed"]:
        return "same"
    parts = [f"{attr} {k}/{a['requests']}" for attr, k in a["by_attribute"].items() if k]
    return "CHANGED: " + ", ".join(parts)


def markdown_table(report: ProfileReport) -> str:
    """The comparison as a Markdown table, dense first."""
    s = report.settings
    size = f"{s['width']}x{s['height']}" + (f", {s['frames']} frames" if report.kind == "video" else "")
    lines = [
        f"# Profile: {s['model']}",
        "",
        f"{size}, {s['steps']} steps, guidance {s['guidance']}; {len(s['prompts'])} prompt(s) x {s['seeds']} seed(s), "
        f"{s['repeats']} interleaved repeat(s) after {s['warmup']} warm-up run(s) per configuration. "
        f"Device {report.environment['device']} ({report.environment['dtype']}), torch {report.environment['torch']}, "
        f"diffusers {report.environment['diffusers']}.",
        "",
        "| config | latency s (median [min-max]) | transformer s | speedup | transformer speedup "
        "| PSNR dB | SSIM | LPIPS | adherence vs dense | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.runs:
        lat, tr = r["latency_s"], r["transformer_s"]
        lines.append(
            f"| {r['config']} | {lat['median']:.3f} [{lat['min']:.3f}-{lat['max']:.3f}] | {tr['median']:.3f} | "
            f"{r['speedup']:.2f}x | {_fmt(r['transformer_speedup'])}x | {r['psnr_db']:.2f} | {r['ssim']:.4f} | "
            f"{_fmt(r['lpips'], '.4f')} | {_adherence_cell(r.get('adherence'))} | {r['peak_memory_mb']:.0f} |")
    lines += ["", f"PSNR and SSIM are against the dense output of the same prompt and seed; identical outputs "
              f"report {s['psnr_cap_db']:.0f} dB. Speedups are ratios of medians from this run. LPIPS: {s['lpips']}. "
              f"Adherence: {s.get('adherence', 'not checked')}.",
              ""]
    lines += _chunk_lines(report) + _parallel_lines(report) + _refused_lines(report)
    notes = [(r["config"], st) for r in report.runs for st in r.get("accelerator_stats") or []]
    if notes:
        lines += ["Accelerator stats (last timed run of each configuration):", ""]
        for label, st in notes:
            scalars = ", ".join(f"{k} {v}" for k, v in stat_items(st))
            warning = f" **Warning:** {st['warning']}" if st.get("warning") else ""
            lines.append(f"- `{label}`: {scalars}{warning}")
        lines.append("")
    return "\n".join(lines)


def _chunk_lines(report: ProfileReport) -> list[str]:
    """An autoregressive model's per-chunk table (none for other models)."""
    runs = [r for r in report.runs if r.get("chunks")]
    if not runs:
        return []
    lines = ["Chunk by chunk (the first request's timed runs): transformer seconds per chunk, the KV cache after "
             "the first and last chunk and its largest, the time until the first chunk's frames were decoded, and "
             "video frames per second of the whole run.", "",
             "| config | chunks | transformer s per chunk: mean (first / last) | KV cache: first / last / max "
             "| time to first frame s | frames/s |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        c = r["chunks"]
        t, kv, ttff = c["transformer_s_per_chunk"], c["kv_bytes"], c["time_to_first_frame_s"]
        lines.append(f"| {r['config']} | {c['count']} | {t['mean']:.3f} ({t['first']:.3f} / {t['last']:.3f}) | "
                     f"{bytes_text(kv['first'])} / {bytes_text(kv['last'])} / {bytes_text(kv['max'])} | "
                     f"{ttff['median']:.3f} | {_fmt(c['frames_per_s'])} |")
    return lines + [""]


def _parallel_lines(report: ProfileReport) -> list[str]:
    """Under ``--parallel``: every rank's medians and its share of time in communication (none otherwise)."""
    p = report.parallel
    if not p:
        return []
    lines = [f"Per rank (--parallel {p['spec']}: {p['processes']} processes, {p['layout']}, {p['backend']}); "
             f"communication: {p['communication']}.", "",
             "| config | rank | latency s | transformer s | transformer s per step | communication s "
             "| communication share of transformer time | of latency |", "|---|---|---|---|---|---|---|---|"]
    for r in report.runs:
        for rank in p["ranks"]:
            c = rank["configs"][r["config"]]
            lines.append(f"| {r['config']} | {rank['rank']} | {c['latency_s']:.3f} | {c['transformer_s']:.3f} | "
                         f"{c['transformer_s_per_step']:.4f} | {c['communication_s']:.3f} | "
                         f"{_fmt(c['communication_share'], '.1%')} | "
                         f"{_fmt(c.get('communication_share_of_latency'), '.1%')} |")
    return lines + [""]


def _refused_lines(report: ProfileReport) -> list[str]:
    """Configurations the model's family refused (not run), each with the reason."""
    if not report.refused:
        return []
    return ["Refused for this model (not run):", ""] + [f"- `{r['config']}`: {r['reason']}" for r in report.refused] \
        + [""]


def _plot_speedup_psnr(report: ProfileReport, path: Path) -> None:
    runs = report.runs
    plot_speedup_vs_psnr(path, [r["config"] for r in runs], [r["speedup"] for r in runs],
                         [r["psnr_db"] for r in runs], psnr_cap_db=report.settings["psnr_cap_db"],
                         title=f"{report.settings['model']}: speed against fidelity")


def _plot_latency(report: ProfileReport, path: Path) -> None:
    runs = report.runs
    plot_latency(path, [r["config"] for r in runs], [r["latency_s"]["median"] for r in runs],
                 [r["latency_s"]["min"] for r in runs], [r["latency_s"]["max"] for r in runs],
                 [r["transformer_s"]["median"] for r in runs],
                 title=f"{report.settings['model']}: latency per configuration")


def _label(frame: np.ndarray, text: str) -> np.ndarray:
    """Put ``text`` on a dark bar above a uint8 frame (or a stack of frames)."""
    import cv2

    frames = frame if frame.ndim == 4 else frame[None]
    f, h, w, _ = frames.shape
    bar_h = 18 if w >= 96 else 12
    scale = 0.4 if w >= 96 else 0.28
    bar = np.full((bar_h, w, 3), 24, np.uint8)
    cv2.putText(bar, text[: max(4, w // 7)], (3, bar_h - 5), cv2.FONT_HERSHEY_SIMPLEX, scale, (235, 235, 235), 1,
                cv2.LINE_AA)
    out = np.concatenate([np.broadcast_to(bar, (f, bar_h, w, 3)), frames], axis=1)
    return out if frame.ndim == 4 else out[0]


def side_by_side(report: ProfileReport) -> np.ndarray:
    """Outputs of the first request, labelled and tiled (up to 4 per row): ``[F, H', W', 3]`` uint8."""
    tiles = [_label(to_uint8(report.outputs[r["config"]]), r["config"]) for r in report.runs]
    per_row = min(4, len(tiles))
    while len(tiles) % per_row:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.concatenate(tiles[i:i + per_row], axis=2) for i in range(0, len(tiles), per_row)]
    return np.concatenate(rows, axis=1)


def stills(outputs: dict[str, np.ndarray], max_side: int = 160) -> np.ndarray:
    """One labelled row per configuration: the first, middle and last frame of its output, each at most
    ``max_side`` pixels on its longer side: ``[H', W', 3]`` uint8 (a still of a video comparison, for documents)."""
    import cv2

    rows = []
    for label, video in outputs.items():
        frames = to_uint8(video)
        f, h, w, _ = frames.shape
        scale = min(1.0, max_side / max(h, w))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        picks = [frames[i] for i in sorted({0, f // 2, f - 1})]
        row = np.concatenate([cv2.resize(x, size, interpolation=cv2.INTER_AREA) for x in picks], axis=1)
        rows.append(_label(row, label))
    return np.concatenate(rows, axis=0)


def write_report(report: ProfileReport, output_dir: Path) -> dict[str, Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": output_dir / "report.json",
        "markdown": output_dir / "report.md",
        "speedup_vs_psnr": output_dir / "speedup_vs_psnr.png",
        "latency": output_dir / "latency.png",
        "side_by_side": output_dir / ("side_by_side.mp4" if report.kind == "video" else "side_by_side.png"),
    }
    if report.kind == "video":
        paths["stills"] = output_dir / "stills.png"
    with atomic_path(paths["json"]) as tmp:
        tmp.write_text(json.dumps(json_safe(report.to_dict()), indent=2, allow_nan=False) + "\n")
    with atomic_path(paths["markdown"]) as tmp:
        tmp.write_text(markdown_table(report))
    _plot_speedup_psnr(report, paths["speedup_vs_psnr"])
    _plot_latency(report, paths["latency"])
    for r in report.runs:
        for st in r.get("accelerator_stats") or []:
            if st.get("map") and st.get("plan"):  # Map-Guided Caching: its map and plan
                name = slug(r["config"], 80)
                paths[f"plan_{name}"] = Path(save_heatmap(output_dir / f"plan_{name}.png", st["map"], st["plan"],
                                                          st.get("groups"), r["config"]))
    grid = side_by_side(report)
    if report.kind == "video":
        write_video(paths["side_by_side"], grid, fps=report.fps)
        write_image(paths["stills"], stills({r["config"]: report.outputs[r["config"]] for r in report.runs}))
    else:
        write_image(paths["side_by_side"], grid[0])
    return paths
