"""Flat cost of chunk-by-chunk generation: per-chunk latency, peak memory and KV bytes along one long rollout, with
the rolling window and with a global cache; time to first frame and frames per second.

    .venv/bin/python benchmarks/autoregressive_cost.py --model kinegen-shapes-ar --chunks 61 \
        --output benchmarks/results/autoregressive/cost.json

One rollout per cache setting, streamed (``pipe.stream``: each chunk decoded as soon as it is committed), at the
model's default size and steps. Per chunk: denoising, commit and decoding seconds, the cache's bytes, and the
process's peak resident memory while the chunk ran (sampled every 5 ms by a thread; the transformer's share is
what changes from chunk to chunk). Chunk ``k`` is compared by the median of chunks ``k - 2 .. k + 2`` (this
machine is noisy; the raw per-chunk numbers are in the output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path


class PeakRSS:
    """The largest resident set size seen between :meth:`reset` calls, sampled by a daemon thread."""

    def __init__(self, every_s: float = 0.005):
        import psutil

        self.proc, self.every, self.peak = psutil.Process(), every_s, 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.every)

    def reset(self) -> int:
        """The peak since the last reset (bytes), then start again from now."""
        peak, self.peak = max(self.peak, self.proc.memory_info().rss), 0
        return peak

    def stop(self):
        self._stop.set()


def _frames_for_chunks(pipe, chunks: int) -> int:
    """The fewest video frames (4k + 1) the pipeline generates in ``chunks`` chunks (with VAE segments, a chunk
    of one image latent starts each segment)."""
    from kinegen.errors import InvalidRequestError

    for frames in range(1, 64 * chunks + 2, 4):
        try:
            if len(pipe.check_frames(frames)) >= chunks:
                return frames
        except InvalidRequestError:  # does not split into whole chunks
            continue
    raise SystemExit(f"no frame count gives {chunks} chunks")


def rollout(pipe, prompt: str, frames: int, window_frames, steps: int, guidance: float, size: int) -> dict:
    import torch

    mem = PeakRSS()
    per_chunk = []
    t_start = time.perf_counter()
    mem.reset()
    ttff = None
    for chunk in pipe.stream(prompt, height=size, width=size, num_frames=frames, num_inference_steps=steps,
                             guidance_scale=guidance, window_frames=window_frames,
                             generator=torch.Generator().manual_seed(0)):
        now = time.perf_counter()
        ttff = ttff if ttff is not None else now - t_start
        st = chunk.stats
        per_chunk.append({"chunk": chunk.index, "denoise_s": st.denoise_s, "commit_s": st.commit_s,
                          "decode_s": chunk.decode_s, "seconds": st.denoise_s + st.commit_s + chunk.decode_s,
                          "kv_bytes": st.kv_bytes, "cached_frames": len(st.cached_frames),
                          "peak_rss_bytes": mem.reset(), "video_frames": int(chunk.frames.shape[0])})
    total = time.perf_counter() - t_start
    mem.stop()
    return {"window_frames": window_frames, "seconds": total, "time_to_first_frame_s": ttff,
            "frames_per_second": frames / total, "chunks": per_chunk}


def around(chunks: list[dict], k: int, key: str, half: int = 2) -> float:
    return statistics.median(c[key] for c in chunks[max(0, k - half):k + half + 1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kinegen-shapes-ar")
    ap.add_argument("--chunks", type=int, default=61, help="chunks in the rollout (at least 63 reads chunk 60 with "
                                                           "its neighbours)")
    ap.add_argument("--prompt", default="a small purple star moving down on a navy background")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps per chunk (default: the model's)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)

    import kinegen
    from kinegen.media import atomic_write_text

    pipe = kinegen.load_pipeline(args.model)
    pipe.set_progress_bar_config(disable=True)
    spec = pipe.kinegen_spec  # the model's defaults
    steps = args.steps or spec.steps
    cf = pipe.config.chunk_frames
    frames = _frames_for_chunks(pipe, args.chunks)
    runs = {}
    for name, window in (("rolling", pipe.config.window_frames), ("global", "global")):
        print(f"{name} cache: {args.chunks} chunks, {frames} frames ...", flush=True)
        runs[name] = rollout(pipe, args.prompt, frames, window, steps, spec.guidance, spec.height)
        c = runs[name]["chunks"]
        early = min(10, len(c) - 1)
        print(f"  {runs[name]['seconds']:.0f} s, first frame after {runs[name]['time_to_first_frame_s']:.2f} s, "
              f"chunk {early} {around(c, early, 'seconds'):.2f} s, last {around(c, len(c) - 3, 'seconds'):.2f} s, "
              f"kv {c[early]['kv_bytes'] / 2**20:.2f} -> {c[-1]['kv_bytes'] / 2**20:.2f} MiB", flush=True)
    summary = {"command": "python benchmarks/autoregressive_cost.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv),
               "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "prompt": args.prompt, "steps": steps,
               "size": spec.height, "frames": frames, "chunk_frames": cf, "window_frames": pipe.config.window_frames,
               "sink_frames": pipe.config.sink_frames, "runs": runs}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
