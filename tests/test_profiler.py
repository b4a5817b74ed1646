"""The profiler: dense against itself, every configuration present, files written and readable."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import kinegen
from kinegen.cli import main
from kinegen.errors import ConfigError
from kinegen.media import read_video, to_uint8
from kinegen.profiling import metrics
from kinegen.profiling.runner import parse_config

REQUIRED = {"config", "latency_s", "transformer_s", "speedup", "psnr_db", "ssim", "peak_memory_mb"}


@pytest.fixture(scope="module")
def wan_report(tmp_path_factory, wan):
    out = tmp_path_factory.mktemp("profile")
    report = kinegen.profile(wan, ["a red circle", "a blue square"], ["dense", "first-block:threshold=1.0"],
                             repeats=2, warmup=1, steps=6, output_dir=out)
    return report, out


def test_report_has_every_configuration(wan_report):
    report, out = wan_report
    data = json.loads((out / "report.json").read_text())
    assert [r["config"] for r in data["runs"]] == ["dense", "dense #2", "first-block:threshold=1.0"]
    for run in data["runs"]:
        assert REQUIRED <= set(run)
        assert set(run["latency_s"]) == {"median", "min", "max"}
        assert run["latency_s"]["min"] <= run["latency_s"]["median"] <= run["latency_s"]["max"]
        assert run["samples"] == 2 * 2  # repeats x prompts
        assert run["peak_memory_mb"] > 0
    env = data["environment"]
    assert {"torch", "diffusers", "device", "dtype", "cpu_count"} <= set(env)
    assert data["settings"]["prompts"] == ["a red circle", "a blue square"]
    assert "refused" not in data and not any("chunks" in run for run in data["runs"])  # autoregressive only


def test_dense_against_itself(wan_report):
    report, _ = wan_report
    dense, again = report.run("dense"), report.run("dense #2")
    assert dense["speedup"] == 1.0 and dense["psnr_db"] == metrics.PSNR_CAP_DB and dense["ssim"] == 1.0
    assert again["psnr_db"] == metrics.PSNR_CAP_DB and again["ssim"] == 1.0
    # The same work (timing itself is for benchmarks, not unit tests): equal transformer calls, and the
    # speedup is the ratio of the medians measured in this run.
    assert again["transformer_calls"] == dense["transformer_calls"] == 2 * 2 * 6 * 2  # repeats, prompts, steps, CFG
    assert again["speedup"] == pytest.approx(dense["latency_s"]["median"] / again["latency_s"]["median"])


def test_cached_run_differs_and_is_reported(wan_report, wan):
    report, _ = wan_report
    fb = report.run("first-block:threshold=1.0")
    assert fb["accelerator_stats"] == [{"name": "first-block", "config": {"threshold": 1.0}}]
    # the figures are the mean over the requests of each output against the dense output of the same request
    psnr, ssim = [], []
    for prompt in ("a red circle", "a blue square"):
        dense = kinegen.generate(wan, prompt, seed=0, steps=6).frames
        cached = kinegen.generate(wan, prompt, seed=0, steps=6, accelerators=["first-block:threshold=1.0"]).frames
        psnr.append(metrics.psnr(dense, cached))
        ssim.append(metrics.ssim(dense, cached))
    assert fb["psnr_db"] == pytest.approx(np.mean(psnr), rel=1e-9) and fb["psnr_db"] < metrics.PSNR_CAP_DB
    assert fb["ssim"] == pytest.approx(np.mean(ssim), rel=1e-9) and fb["ssim"] < 1


def test_files_written(wan_report):
    report, out = wan_report
    names = sorted(p.name for p in out.iterdir())
    assert names == ["latency.png", "report.json", "report.md", "side_by_side.mp4", "speedup_vs_psnr.png",
                     "stills.png"]
    md = (out / "report.md").read_text()
    assert "| dense |" in md and "| first-block:threshold=1.0 |" in md
    assert "Chunk by chunk" not in md and "Refused" not in md
    video = read_video(out / "side_by_side.mp4")
    assert video.shape[0] == 9 and video.shape[2] == 3 * 64  # three tiles side by side
    still = np.asarray(Image.open(out / "stills.png").convert("RGB"))  # a labelled row per configuration
    assert still.shape == (3 * (18 + 64), 3 * 64, 3)  # frames 0, 4 and 8 of each; 18-pixel label bars
    assert np.array_equal(still[18:82, 128:192], to_uint8(report.outputs["dense"])[8])


def test_cli_profile_image_model(tmp_path, capsys):
    out = tmp_path / "prof"
    rc = main(["profile", "--model", "tiny-flux", "--prompt", "a red circle", "--config", "taylorseer",
               "--config", "mag:threshold=0.5", "--repeats", "1", "--steps", "4", "--output", str(out)])
    assert rc == 0
    data = json.loads((out / "report.json").read_text())
    assert [r["config"] for r in data["runs"]] == ["dense", "taylorseer", "mag:threshold=0.5"]
    assert (out / "side_by_side.png").is_file()
    assert "| taylorseer |" in capsys.readouterr().out


def test_parse_config_combines_with_plus():
    cfg = parse_config("first-block:threshold=0.1 + dense-attention")
    assert cfg.specs == ("first-block:threshold=0.1", "dense-attention")
    assert [acc.name for acc, _ in cfg.parsed] == ["first-block", "dense-attention"]
    assert cfg.parsed[0][1].threshold == 0.1  # parsed once, when the configuration is built
    assert parse_config("dense").specs == ()
    with pytest.raises(ConfigError, match="Only one cache accelerator at a time; got first-block, mag"):
        parse_config("first-block + mag")  # refused before any model runs


def test_metrics_on_known_values():
    rng = np.random.default_rng(0)
    ref = rng.random((3, 16, 16, 3))
    assert metrics.psnr(ref, ref) == metrics.PSNR_CAP_DB
    noisy = np.clip(ref + 0.01, 0, 1)
    mse = np.mean((noisy - ref) ** 2)
    assert metrics.psnr(ref, noisy) == pytest.approx(10 * np.log10(1 / mse), rel=1e-6)
    assert metrics.ssim(ref, ref) == pytest.approx(1.0)
    assert metrics.ssim(ref, rng.random(ref.shape)) < 0.2
    # flat images a and b: no variance, so SSIM is its luminance term (2ab + C1) / (a^2 + b^2 + C1), C1 = 0.01^2
    flat = np.full((2, 16, 16, 3), 0.5)
    assert metrics.ssim(flat, flat + 0.1) == pytest.approx((2 * 0.5 * 0.6 + 1e-4) / (0.5**2 + 0.6**2 + 1e-4), rel=1e-9)
    # against torchmetrics' uniform 7x7 SSIM (population covariance, so a little lower than scikit-image's)
    import torch
    from torchmetrics.functional.image import structural_similarity_index_measure

    to_t = lambda a: torch.from_numpy(a).permute(0, 3, 1, 2)  # noqa: E731
    for test in (np.clip(ref + rng.normal(0, 0.1, ref.shape), 0, 1), 0.8 * ref + 0.1):
        theirs = structural_similarity_index_measure(to_t(test), to_t(ref), gaussian_kernel=False, kernel_size=7,
                                                     data_range=1.0).item()
        assert metrics.ssim(ref, test) == pytest.approx(theirs, abs=3e-3)
    # PSNR of a perturbation that clipping does not touch: +-0.05 on a checkerboard of pixels, MSE 0.0025
    sign = np.where(np.indices(ref.shape).sum(0) % 2 == 0, 1.0, -1.0)
    mid = 0.25 + 0.5 * ref
    assert metrics.psnr(mid, mid + 0.05 * sign) == pytest.approx(10 * np.log10(1 / 0.0025), rel=1e-9)
    with pytest.raises(ValueError, match="shapes"):
        metrics.psnr(ref, ref[:2])


def test_profile_flags_configurations_whose_output_the_evaluator_reads_differently(tmp_path):
    """The bundled model ships an evaluator: each output is read (shape, colour, motion) against dense."""
    from kinegen.profiling.report import _adherence_cell
    from kinegen.profiling.runner import _adherence_against_dense

    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    report = kinegen.profile(pipe, ["a red circle moving right on a gray background"], ["mapguided:speedup=1"],
                             repeats=1, warmup=0, steps=4, output_dir=tmp_path)
    same = report.run("mapguided:speedup=1")["adherence"]
    assert same == {"requests": 1, "changed": 0, "by_attribute": {"shape": 0, "colour": 0, "motion": 0}}
    md = (tmp_path / "report.md").read_text()
    assert "| adherence vs dense |" in md and "| same |" in md and "shipped adherence classifier" in md
    red = {"shape": "circle", "colour": "red", "motion": "right"}
    readings = {("dense", 0): red, ("dense", 1): red, ("x", 0): red, ("x", 1): {**red, "colour": "purple"}}
    flagged = _adherence_against_dense(readings, "x", 2)
    assert flagged == {"requests": 2, "changed": 1, "by_attribute": {"shape": 0, "colour": 1, "motion": 0}}
    assert _adherence_cell(flagged) == "CHANGED: colour 1/2" and _adherence_cell(None) == "n/a"


def test_a_bound_switched_off_is_written_as_json(wan, tmp_path):
    """``max_error=inf`` is infinite in the config and the stats; the report must still be strict JSON."""
    kinegen.profile(wan, ["a red circle"], ["mapguided:speedup=1.5,max_error=inf,map=recorded"], repeats=1,
                    warmup=0, steps=6, output_dir=tmp_path)
    run = json.loads((tmp_path / "report.json").read_text())["runs"][1]
    st = run["accelerator_stats"][0]
    assert st["config"]["max_error"] == "inf" and st["max_error"] == "inf" and st["chosen_speedup"] > 1.0


def test_profile_of_an_autoregressive_model_reports_per_chunk_fields_and_refused_accelerators(tmp_path, capsys):
    """tiny-wan-ar at 33 frames (chunks of 1, 2, 2, 2, 2 latent frames; sink 1, window 5), 2 steps: per-chunk
    transformer time, the KV cache growing until the window is full and flat after, the time to the first frame
    before the end of the run, frames per second; a step cache is refused with the reason instead of stopping the
    profile."""
    out = tmp_path / "prof"
    assert main(["profile", "--model", "tiny-wan-ar", "--prompt", "a red circle", "--config", "first-block",
                 "--repeats", "2", "--warmup", "0", "--steps", "2", "--frames", "33", "--output", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    assert [r["config"] for r in data["runs"]] == ["dense"]
    [refused] = data["refused"]
    assert refused["config"] == "first-block" and "does not apply to wan_ar models" in refused["reason"]
    run = data["runs"][0]
    c = run["chunks"]
    assert c["count"] == 5 and c["frames_per_chunk"] == [1, 8, 8, 8, 8]
    per_frame = c["kv_bytes_per_chunk"][0]
    assert c["kv_bytes_per_chunk"] == [per_frame * n for n in (1, 3, 5, 5, 5)]  # grows, then flat once full
    assert c["kv_bytes"] == {"first": per_frame, "last": 5 * per_frame, "max": 5 * per_frame}
    t = c["transformer_s_per_chunk"]
    assert min(t.values()) > 0
    chunks_total = sum(x["transformer_s"] for x in c["last_run"])  # the chunks split the run's transformer time
    assert run["transformer_s"]["min"] * 0.999 <= chunks_total <= run["transformer_s"]["max"] * 1.001
    ttff = c["time_to_first_frame_s"]
    assert 0 < ttff["min"] <= ttff["median"] <= ttff["max"]
    assert ttff["median"] < run["latency_s"]["median"] and ttff["max"] < run["latency_s"]["max"]
    assert c["last_run"][0]["ready_s"] < c["last_run"][-1]["ready_s"]
    assert c["frames_per_s"] == pytest.approx(33 / run["latency_s"]["median"])
    md = (out / "report.md").read_text()
    assert "| config | chunks | transformer s per chunk: mean (first / last) |" in md and "| dense | 5 |" in md
    assert "Refused for this model (not run):" in md and "- `first-block`: first-block does not apply" in md
    assert "| dense | 5 |" in capsys.readouterr().out
