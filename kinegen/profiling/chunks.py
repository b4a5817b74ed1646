"""Per-chunk figures of autoregressive (chunk-by-chunk) runs, as the profiler, the CLI and the web app report them.

A run's chunks are the dicts of :attr:`kinegen.generation.GenerationResult.chunks` (``transformer_s``,
``kv_bytes``, ``ready_s``, ...). :func:`chunk_summary` reduces one or more runs of the same request to the
numbers that say whether the cost per chunk stays flat: transformer time per chunk (mean, first, last), the KV
cache's bytes after each chunk (first, last, max), the time to the first frame and frames per second.
"""

from __future__ import annotations

import statistics
from typing import Any


def chunk_summary(runs: list[list[dict[str, Any]]], latencies: list[float], frames: int) -> dict[str, Any]:
    """Summarise ``runs`` (each a list of chunk dicts) of one request.

    Args:
        runs: the chunks of each run (at least one run with at least one chunk).
        latencies: each run's end-to-end seconds (the same length as ``runs``).
        frames: video frames per run.

    Returns ``count``, ``frames_per_chunk``, ``transformer_s_per_chunk`` (``mean`` over every chunk of every
    run, ``first`` and ``last``: medians over runs), ``kv_bytes_per_chunk`` and ``kv_bytes`` (``first``,
    ``last``, ``max``; the same in every run), ``time_to_first_frame_s`` (median, min, max over runs) and
    ``frames_per_s`` (frames over the median latency).
    """
    if not runs or not all(runs) or len(latencies) != len(runs):
        raise ValueError("chunk_summary needs at least one run, each with its chunks and its latency.")
    last = runs[-1]
    kv = [int(c["kv_bytes"]) for c in last]
    ttff = [run[0]["ready_s"] for run in runs]
    latency = statistics.median(latencies)
    return {
        "count": len(last),
        "frames_per_chunk": [int(c["frames"]) for c in last],
        "transformer_s_per_chunk": {
            "mean": float(statistics.fmean(c["transformer_s"] for run in runs for c in run)),
            "first": float(statistics.median(run[0]["transformer_s"] for run in runs)),
            "last": float(statistics.median(run[-1]["transformer_s"] for run in runs)),
        },
        "kv_bytes_per_chunk": kv,
        "kv_bytes": {"first": kv[0], "last": kv[-1], "max": max(kv)},
        "time_to_first_frame_s": {"median": float(statistics.median(ttff)), "min": float(min(ttff)),
                                  "max": float(max(ttff))},
        "frames_per_s": frames / latency if latency > 0 else None,
    }


def bytes_text(n: int | float) -> str:
    """``1536`` -> ``"1.5 KB"``, ``3 * 2**20`` -> ``"3.0 MB"`` (binary units)."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def summary_line(s: dict[str, Any]) -> str:
    """One line of a :func:`chunk_summary`: chunks, time to first frame, transformer per chunk, KV cache, fps."""
    t, kv = s["transformer_s_per_chunk"], s["kv_bytes"]
    fps = "n/a" if s["frames_per_s"] is None else f"{s['frames_per_s']:.2f}"
    return (f"{s['count']} chunks; first frame after {s['time_to_first_frame_s']['median']:.2f} s; transformer "
            f"{t['mean']:.3f} s per chunk (first {t['first']:.3f}, last {t['last']:.3f}); KV cache "
            f"{bytes_text(kv['first'])} after the first chunk, {bytes_text(kv['last'])} after the last (max "
            f"{bytes_text(kv['max'])}); {fps} frames/s")
