"""The profiler: every configuration against the dense baseline, side by side, in one run.

For each prompt and seed, the dense baseline and every configuration generate the same
request. Runs are interleaved: each repeat visits the configurations in a rotated order, so
slow drifts of a noisy machine (thermal state, other processes) spread over all of them
instead of biasing one. Warm-up runs (untimed) come first, one per configuration, which
also absorbs one-off costs such as MagCache's calibration run or compilation.

Per configuration it records end-to-end latency and transformer-only latency (median, min,
max over every timed run), speedup over dense from the same run, peak memory, the
accelerators' own stats, and the fidelity of each output against the dense output of the
same request (PSNR, SSIM; LPIPS where its weights exist locally).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..accelerators.catalog import parse_specs
from ..errors import ConfigError, InvalidRequestError
from ..generation import GenerationRequest, prepare, run_job
from ..parallel import check_run, comm_seconds, gather_to_main, is_main, parallel_spec_of, synchronized_meter
from . import metrics as M

DENSE = "dense"


# ---------------------------------------------------------------------------- configurations


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """One column of the comparison: a label, the accelerator specs applied together, and those specs
    parsed once (``(accelerator, config)`` pairs) when the configuration is built."""

    label: str
    specs: tuple[str, ...] = ()
    parsed: tuple = dataclasses.field(default=(), compare=False, repr=False)


def parse_config(text: str) -> ProfileConfig:
    """``"dense"``, one spec ``"mag:threshold=0.1"``, or several joined by ``+`` (at most one per kind)."""
    if not isinstance(text, str):
        raise ConfigError(f"A configuration is text such as 'dense' or 'first-block:threshold=0.08+hva'; got "
                          f"{type(text).__name__}.")
    text = text.strip()
    if text in (DENSE, "none"):
        return ProfileConfig(DENSE)
    specs = tuple(p.strip() for p in text.split("+") if p.strip())
    if not specs:
        raise ConfigError(f"Empty configuration {text!r}.")
    return ProfileConfig(text, specs, tuple(parse_specs(specs)))  # fails fast, before any model runs


def _unique_labels(configs: list[ProfileConfig]) -> list[ProfileConfig]:
    seen: dict[str, int] = {}
    out = []
    for c in configs:
        n = seen.get(c.label, 0)
        seen[c.label] = n + 1
        out.append(c if n == 0 else dataclasses.replace(c, label=f"{c.label} #{n + 1}"))
    return out


# ---------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of the code inside the block, in MB: CUDA max allocated on a GPU, and the
    process's peak resident set size (sampled every 5 ms) on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        import psutil

        proc = psutil.Process()
        self._stop = threading.Event()
        self._peak = proc.memory_info().rss

        def sample():
            while not self._stop.wait(0.005):
                self._peak = max(self._peak, proc.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        import psutil

        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, psutil.Process().memory_info().rss)
        self.peak_mb = self._peak / 2**20


# ---------------------------------------------------------------------------- report data


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values))}


@dataclasses.dataclass
class ProfileReport:
    """What ``profile`` measured. ``runs`` holds one dict per configuration, dense first."""

    runs: list[dict[str, Any]]
    settings: dict[str, Any]
    environment: dict[str, Any]
    # label -> frames of the first request, for the side-by-side video
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    kind: str = "video"
    fps: int = 16
    # configurations the model's family refuses, not run: [{"config": label, "reason": message}]
    refused: list[dict[str, str]] = dataclasses.field(default_factory=list)
    # under `--parallel`: the spec and every rank's times and communication (:func:`_per_rank`); None otherwise
    parallel: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"runs": self.runs, "settings": self.settings, "environment": self.environment}
        if self.refused:
            d["refused"] = self.refused
        if self.parallel:
            d["parallel"] = self.parallel
        return d

    def run(self, label: str) -> dict[str, Any]:
        for r in self.runs:
            if r["config"] == label:
                return r
        raise KeyError(f"no configuration {label!r}; have {[r['config'] for r in self.runs]}")

    def save(self, output_dir: str | os.PathLike) -> dict[str, Path]:
        """Write report.json, report.md, the plots and the side-by-side video (or image)."""
        from .report import write_report

        return write_report(self, Path(output_dir))


def _chunk_fields(samples: list[tuple[int, float, list[dict]]], frames: int) -> dict[str, Any]:
    """A configuration's per-chunk figures (:func:`kinegen.profiling.chunks.chunk_summary`) over the timed runs of
    the first request (every request has the same chunks; its runs are the same work), with the chunks of its
    last run as they were."""
    from .chunks import chunk_summary

    first = [(latency, chunks) for ri, latency, chunks in samples if ri == 0]
    out = chunk_summary([c for _, c in first], [lat for lat, _ in first], frames)
    out["last_run"] = first[-1][1]
    return out


def _adherence_readings(spec, frames: dict) -> dict | None:
    """What the model's evaluator reads in each output, ``{(label, request): {shape, colour, motion}}``; ``None``
    when no evaluator ships for the model (only the bundled text-to-video model has one)."""
    if spec.evaluator != "adherence":
        return None
    from ..evaluation.adherence import classify, load_classifier

    classifier = load_classifier()
    return {key: classify(classifier, f) for key, f in frames.items()}


def _adherence_against_dense(readings: dict | None, label: str, n: int) -> dict | None:
    """For one configuration: on how many requests the evaluator read another shape, colour or motion than in
    the dense output of the same request, per attribute (``None`` without an evaluator)."""
    if readings is None:
        return None
    changed = {a: sum(readings[(label, i)][a] != readings[(DENSE, i)][a] for i in range(n))
               for a in ("shape", "colour", "motion")}
    flagged = sum(any(readings[(label, i)][a] != readings[(DENSE, i)][a] for a in changed) for i in range(n))
    return {"requests": n, "changed": flagged, "by_attribute": changed}


def environment(pipe) -> dict[str, Any]:
    import platform

    import diffusers
    import transformers

    from .. import __version__

    dev = pipe._execution_device
    env = {
        "kinegen": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "diffusers": diffusers.__version__, "transformers": transformers.__version__,
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(dev), "dtype": str(pipe.transformer.dtype).replace("torch.", ""),
    }
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def _split_refused(configs: list[ProfileConfig], adapter,
                   pipe=None) -> tuple[list[ProfileConfig], list[dict[str, str]]]:
    """The configurations whose accelerators apply to the model's family, and the others with the reason (an
    autoregressive model refuses step caches and whole-sequence sparse attention; under ``--parallel``, accelerators
    whose decisions would differ between ranks): reported, not run."""
    from ..adapters import check_supports

    kept, refused = [], []
    for c in configs:
        try:
            for acc, _ in c.parsed:
                check_supports(adapter, acc)
            if pipe is not None:
                check_run(pipe, c.parsed)
        except ConfigError as e:
            refused.append({"config": c.label, "reason": str(e)})
        else:
            kept.append(c)
    return kept, refused


# ---------------------------------------------------------------------------- the profiler


def profile(pipe, prompts: list[str] | str, configs: list[str | ProfileConfig], *, seeds: int = 1,
            repeats: int = 3, warmup: int = 1, output_dir: str | os.PathLike | None = None, progress=None,
            **request_fields) -> ProfileReport:
    """Run the dense baseline and every configuration on the same prompts and seeds.

    Args:
        pipe: a pipeline from :func:`kinegen.load_pipeline` (or a model name, loaded here).
        prompts: one prompt or several.
        configs: accelerator configurations (``"mag:threshold=0.1"``, ``"a+b"`` to combine, ``"dense"``
            to time the baseline against itself). The dense baseline is always added first.
        seeds: seeds 0..seeds-1 for every prompt.
        repeats: timed runs per configuration and request (interleaved).
        warmup: untimed runs per configuration before timing.
        output_dir: where to write report.json, report.md, plots and the side-by-side video.
        progress: ``fn(done, total, label)`` called after each run.
        **request_fields: generation settings shared by all runs (height, width, frames, steps, guidance, ...).

    Under ``--parallel`` (:func:`kinegen.parallel.apply_parallel` applied to ``pipe``) every rank calls this with
    the same arguments and runs every configuration in the same order; each timed run also measures the time this
    rank spent in collectives; the report gets every rank's figures (``report.parallel``) and only rank 0 writes it.
    """
    if isinstance(pipe, (str, os.PathLike)):
        from ..loading import load_pipeline

        pipe = load_pipeline(pipe)
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise InvalidRequestError("Give at least one prompt to profile.")
    if seeds < 1 or repeats < 1 or warmup < 0:
        raise InvalidRequestError("seeds and repeats must be >= 1 and warmup >= 0.")
    parsed = [c if isinstance(c, ProfileConfig) else parse_config(c) for c in configs]
    jobs = [prepare(pipe, GenerationRequest(prompt=p, seed=s, **request_fields))
            for p in prompts for s in range(seeds)]
    split = parallel_spec_of(pipe)
    if split is not None:
        check_run(pipe, (), jobs[0].request)  # a token count the ranks cannot split fails every configuration
    all_configs, refused = _split_refused(_unique_labels([ProfileConfig(DENSE)] + parsed), jobs[0].adapter,
                                          pipe if split is not None else None)
    main = is_main()
    if output_dir is not None and main:  # fail on an unwritable folder before hours of work
        out = Path(output_dir)
        if out.exists() and not out.is_dir():
            raise InvalidRequestError(f"The output folder {out} is a file; give a folder for the report.")
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise InvalidRequestError(f"The output folder {out} is not writable.")
    device = pipe._execution_device
    total = len(all_configs) * (warmup + repeats * len(jobs))
    done = 0

    def tick(label):
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    samples = {c.label: {"latency": [], "transformer": [], "memory": [], "calls": [], "stats": None, "chunks": [],
                         "comm": []} for c in all_configs}
    frames: dict[tuple[str, int], np.ndarray] = {}

    # under --parallel on a GPU, synchronise around collectives: their time, not their launch
    with synchronized_meter(split is not None and device.type == "cuda"):
        for c in all_configs:
            for _ in range(warmup):
                run_job(jobs[0], c.parsed)
                tick(c.label)
        for rep in range(repeats):
            for ri, job in enumerate(jobs):
                shift = (rep + ri) % len(all_configs)
                for c in all_configs[shift:] + all_configs[:shift]:
                    with PeakMemory(device) as mem:
                        t0, c0 = time.perf_counter(), comm_seconds()
                        result = run_job(job, c.parsed)
                        latency, comm = time.perf_counter() - t0, comm_seconds() - c0
                    s = samples[c.label]
                    s["comm"].append(comm)
                    s["latency"].append(latency)
                    s["transformer"].append(result.timings["transformer"])
                    s["memory"].append(mem.peak_mb)
                    s["calls"].append(result.timings["transformer_calls"])
                    s["stats"] = result.accelerators
                    if result.chunks:  # an autoregressive model: what each chunk cost
                        s["chunks"].append((ri, latency, result.chunks))
                    frames.setdefault((c.label, ri), result.frames)
                    tick(c.label)

    readings = _adherence_readings(jobs[0].spec, frames)
    dense_latency = statistics.median(samples[DENSE]["latency"])
    dense_transformer = statistics.median(samples[DENSE]["transformer"])
    runs = []
    for c in all_configs:
        s = samples[c.label]
        fid = {name: [] for name in M.METRICS}
        for ri in range(len(jobs)):
            for name, fn in M.METRICS.items():
                fid[name].append(fn(frames[(DENSE, ri)], frames[(c.label, ri)]))
        lat, tr = _summary(s["latency"]), _summary(s["transformer"])
        lp = [v for v in fid["lpips"] if v is not None]
        runs.append({
            "config": c.label,
            "accelerators": list(c.specs),
            "latency_s": lat,
            "transformer_s": tr,
            "speedup": dense_latency / lat["median"],
            "transformer_speedup": dense_transformer / tr["median"] if tr["median"] > 0 else None,
            "psnr_db": float(np.mean(fid["psnr_db"])),
            "adherence": _adherence_against_dense(readings, c.label, len(jobs)),
            "ssim": float(np.mean(fid["ssim"])),
            "lpips": float(np.mean(lp)) if len(lp) == len(jobs) else None,
            "peak_memory_mb": float(max(s["memory"])),
            "samples": len(s["latency"]),
            "transformer_calls": int(sum(s["calls"])),
            "accelerator_stats": s["stats"] or [],
        })
        if s["chunks"]:
            runs[-1]["chunks"] = _chunk_fields(s["chunks"], frames[(c.label, 0)].shape[0])
    spec = jobs[0].spec
    first = jobs[0].request
    settings = {
        "model": spec.name, "prompts": prompts, "seeds": seeds, "repeats": repeats, "warmup": warmup,
        "height": first.height, "width": first.width, "frames": first.frames, "steps": first.steps,
        "guidance": first.guidance, "negative_prompt": first.negative_prompt,
        "psnr_cap_db": M.PSNR_CAP_DB, "order": "interleaved, rotated each repeat",
        "lpips": "computed" if M.lpips_weights_path() else "skipped: AlexNet weights not found under $TORCH_HOME",
        "adherence": ("the shipped adherence classifier reads shape, colour and motion of every output; a "
                      "configuration whose reading differs from dense on any request is flagged" if readings else
                      f"not checked: no evaluator ships for {spec.name}"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    per_rank = None if split is None else _per_rank(split, samples, first.steps)
    report = ProfileReport(runs=runs, settings=settings, environment=environment(pipe),
                           outputs={c.label: frames[(c.label, 0)] for c in all_configs},
                           kind=spec.kind, fps=spec.fps, refused=refused, parallel=per_rank)
    if output_dir is not None and main:
        report.save(output_dir)
    return report


def _per_rank(split, samples: dict[str, dict], steps: int) -> dict[str, Any] | None:
    """Every rank's medians per configuration (gathered on rank 0; ``None`` on the others): latency, transformer
    time and its share per denoising step, and the time in collectives during the run (all-to-all, all-gather,
    broadcast; waiting for the slower rank included) as a share of the transformer's time (the collectives all run
    inside transformer calls; a warm-up-less run of ``mapguided:map=recorded`` also counts its recording run's)
    and of the latency."""
    import torch.distributed as dist

    mine = {}
    for label, s in samples.items():
        tr, comm = statistics.median(s["transformer"]), statistics.median(s["comm"])
        latency = statistics.median(s["latency"])
        mine[label] = {"latency_s": latency, "transformer_s": tr, "transformer_s_per_step": tr / steps,
                       "communication_s": comm, "communication_share": comm / tr if tr > 0 else None,
                       "communication_share_of_latency": comm / latency if latency > 0 else None}
    ranks = gather_to_main({"rank": dist.get_rank(), "configs": mine})
    if ranks is None:
        return None
    return {"spec": str(split), "processes": split.degree, "layout": split.layout, "backend": dist.get_backend(),
            "communication": "seconds inside collectives (all-to-all, all-gather, broadcast, all-reduce), from the "
                             "call until the result is there: waiting for the slower rank is included",
            "ranks": ranks}
