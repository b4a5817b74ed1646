"""Every feature README.md documents runs here through the command line (``kinegen.cli.main``) or the Python API,
on tiny models, and each test checks what the feature does with numbers: the `faster` cache, Wan 2.2's two experts,
`kinegen calibrate`, `kinegen eval adherence` / `eval gan`, `kinegen models`, the generate flags `--attention`,
`--heatmap`, `--negative-prompt`, `--upscale`, `--vae-tiling`, and HyperVAttention's flex and Triton backends inside
a pipeline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kinegen
from kinegen.cli import main
from kinegen.profiling import metrics

README = Path(__file__).resolve().parents[1] / "README.md"
PROMPT = "a red circle moving right"


@pytest.fixture
def saved(monkeypatch):
    """The GenerationResults the CLI saves, in order (their float frames, before the lossy mp4)."""
    from kinegen.generation import GenerationResult

    results = []
    real = GenerationResult.save

    def save(self, path):
        results.append(self)
        return real(self, path)

    monkeypatch.setattr(GenerationResult, "save", save)
    return results


def _cli(*args):
    assert main(list(args)) == 0, args


# ---------------------------------------------------------------------------- generate flags


def test_negative_prompt_reaches_the_unconditional_branch(wan, saved, tmp_path):
    common = ["generate", PROMPT, "--model", "tiny-wan", "--steps", "2", "--seed", "2"]
    _cli(*common, "--negative-prompt", "a blue square", "-o", str(tmp_path / "neg.mp4"))
    _cli(*common, "--negative-prompt", PROMPT, "-o", str(tmp_path / "same.mp4"))
    neg, same = (r.frames for r in saved)
    assert saved[0].request.negative_prompt == "a blue square"
    api = kinegen.generate(wan, PROMPT, seed=2, steps=2, negative_prompt="a blue square").frames
    np.testing.assert_array_equal(neg, api)
    plain = kinegen.generate(wan, PROMPT, seed=2, steps=2).frames
    assert not np.array_equal(plain, neg)
    # negative == prompt: uncond + g * (cond - uncond) is the conditional prediction alone, i.e. no guidance
    g1 = kinegen.generate(wan, PROMPT, seed=2, steps=2, guidance=1.0).frames
    np.testing.assert_allclose(same, g1, atol=1e-6)
    assert not np.allclose(plain, g1, atol=1e-3)


ALL_PAIRS = "density=none,top_p=1.0,min_keys=100000,dense_warmup=0,dense_layers=0,tile=16,backend=dense,min_tokens=0"
# layout=tiles: the backends compared must execute one layout (key lists merge and count work differently, so
# on a CPU `triton` would pick lists and keep other blocks than `dense`).
SPARSE = "density=0.5,dense_warmup=0,dense_layers=0,tile=16,q_window=1-2-2,k_window=1-2-2,min_tokens=0,layout=tiles"


def test_attention_flag_runs_hva_in_the_pipeline(wan, saved, tmp_path):
    common = ["generate", PROMPT, "--model", "tiny-wan", "--steps", "2", "-o", str(tmp_path / "a.mp4")]
    _cli(*common, "--attention", f"hva:{ALL_PAIRS}")
    _cli(*common, "--attention", f"hva:{SPARSE},backend=dense")
    full, sparse = saved
    dense = kinegen.generate(wan, PROMPT, seed=0, steps=2).frames
    np.testing.assert_allclose(full.frames, dense, atol=1e-4)  # every key block kept: dense attention
    st = sparse.accelerators[0]
    n_layers = len(wan.transformer.blocks)
    assert st["name"] == "hva" and st["sparse_calls"] == 2 * 2 * n_layers and st["dense_calls"] == 0
    assert st["density"] <= 0.5 + 1e-6
    assert 25 < metrics.psnr(dense, sparse.frames) < 60  # half the key blocks dropped: close, not equal
    api = kinegen.generate(wan, PROMPT, seed=0, steps=2, accelerators=[f"hva:{SPARSE},backend=dense"]).frames
    np.testing.assert_array_equal(sparse.frames, api)


def test_upscale_enlarges_each_gan_image_by_nearest_neighbour(tmp_path):
    from PIL import Image

    common = ["generate", "--model", "kinegen-shapes-gan", "--class", "red circle", "--class", "blue star",
              "--num-images", "4", "--seed", "5"]
    _cli(*common, "--upscale", "1", "-o", str(tmp_path / "x1.png"))
    _cli(*common, "--upscale", "3", "-o", str(tmp_path / "x3.png"))
    g1 = np.asarray(Image.open(tmp_path / "x1.png").convert("RGB"))
    g3 = np.asarray(Image.open(tmp_path / "x3.png").convert("RGB"))
    size, pad = 32, 2
    assert g1.shape == (pad + 2 * (size + pad),) * 2 + (3,)  # 2x2 grid
    assert g3.shape == (pad + 2 * (3 * size + pad),) * 2 + (3,)
    pipe = kinegen.load_pipeline("kinegen-shapes-gan")
    images = kinegen.generate_class_images(pipe, ["red circle", "blue star"], num_images=4, seed=5).images
    for i in range(4):
        r, c = divmod(i, 2)
        t1 = g1[pad + r * (size + pad):][:size, pad + c * (size + pad):][:, :size]
        t3 = g3[pad + r * (3 * size + pad):][:3 * size, pad + c * (3 * size + pad):][:, :3 * size]
        assert np.abs(t1.astype(int) - np.round(images[i] * 255)).max() <= 1  # image i (seed 5 + i) in cell i
        np.testing.assert_array_equal(t3, t1.repeat(3, 0).repeat(3, 1))  # each pixel became a 3x3 block


def test_vae_tiling_decodes_close_to_untiled(wan, saved, tmp_path):
    """Wan's VAE tiles above 256 pixels (stride 192): at 64x288 the width is decoded in two overlapping tiles.
    Measured: 51.6 dB against the untiled decode (another seed: 28 dB)."""
    fields = dict(height=64, width=288, frames=1, steps=1)
    _cli("generate", PROMPT, "--model", "tiny-wan", "--vae-tiling", "-o", str(tmp_path / "t.mp4"),
         *[x for k, v in fields.items() for x in (f"--{k}", str(v))])
    tiled = saved[0].frames
    untiled = kinegen.generate(wan, PROMPT, seed=0, **fields).frames
    assert not wan.vae.use_tiling and kinegen.load_pipeline("tiny-wan", device="cpu", vae_tiling=True).vae.use_tiling
    assert tiled.shape == untiled.shape == (1, 64, 288, 3)
    assert 45 < metrics.psnr(untiled, tiled) < metrics.PSNR_CAP_DB  # tiled (not identical), and close


def _plan_panel(img):
    """Bounding box (x0, y0, x1, y1) of the plan panel: the outermost long dark lines right of the middle."""
    right = img[:, img.shape[1] // 2:].mean(-1) < 100
    longest = lambda a: max((len(m) for m in re.findall("1+", "".join("1" if v else "0" for v in a))), default=0)  # noqa: E731
    cols = [x for x in range(right.shape[1]) if longest(right[:, x]) > 100]
    rows = [y for y in range(right.shape[0]) if longest(right[y]) > 100]
    off = img.shape[1] // 2
    return cols[0] + off, rows[0], cols[-1] + off, rows[-1]


def test_heatmap_png_draws_the_plan_that_ran(saved, tmp_path):
    from PIL import Image

    png = tmp_path / "plan.png"
    _cli("generate", PROMPT, "--model", "tiny-wan", "--steps", "8", "-o", str(tmp_path / "v.mp4"), "--cache",
         "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded", "--heatmap", str(png))
    st = saved[0].accelerators[0]
    plan = np.array(st["plan"], dtype=bool)  # [steps, groups]
    assert plan.shape == (8, 2) and 0 < plan.mean() < 1
    img = np.asarray(Image.open(png).convert("RGB")).astype(float)
    x0, y0, x1, y1 = _plan_panel(img)
    steps, groups = plan.shape
    drawn = np.zeros_like(plan)
    for t in range(steps):
        for g in range(groups):  # origin lower: group 0 is the bottom row
            x = int(x0 + (t + 0.5) * (x1 - x0) / steps)
            y = int(y1 - (g + 0.5) * (y1 - y0) / groups)
            drawn[t, g] = img[y, x].mean() < 128  # computed cells are black, reused ones white
    np.testing.assert_array_equal(drawn, plan)



def test_heatmap_is_written_with_json_output_too(tmp_path, capsys):
    """--json used to return before the heatmap was drawn: exit 0 and no PNG."""
    import json

    png = tmp_path / "plan.png"
    _cli("generate", PROMPT, "--model", "tiny-wan", "--steps", "8", "-o", str(tmp_path / "v.mp4"), "--cache",
         "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded", "--heatmap", str(png), "--json")
    summary = json.loads(capsys.readouterr().out)  # stdout is only the JSON
    assert summary["heatmap"] == str(png) and png.stat().st_size > 1000


# ---------------------------------------------------------------------------- caches


def _count_processor_calls(blocks, attr="attn1"):
    """Wrap each block's attention processor with a counter; returns (counter, restore)."""
    count = [0]
    originals = [getattr(b, attr).processor for b in blocks]

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *args, **kwargs):
            count[0] += 1
            return self.inner(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    for b, p in zip(blocks, originals, strict=True):
        getattr(b, attr).processor = Counting(p)

    def restore():
        for b, p in zip(blocks, originals, strict=True):
            getattr(b, attr).processor = p

    return count, restore


def test_faster_cache_skips_self_attention_where_diffusers_says_and_stays_close(wan, saved, tmp_path):
    steps = 8
    count, restore = _count_processor_calls(wan.transformer.blocks)
    try:
        dense = kinegen.generate(wan, PROMPT, seed=0, steps=steps, guidance=1.0).frames
        n_dense, count[0] = count[0], 0
        timesteps = [int(t) for t in wan.scheduler.timesteps]
        _cli("generate", PROMPT, "--model", "tiny-wan", "--steps", str(steps), "--guidance", "1", "--cache", "faster",
             "-o", str(tmp_path / "f.mp4"))
        n_faster = count[0]
    finally:
        restore()
    fast = saved[0]
    assert fast.accelerators[0]["config"] == {"spatial_skip": 2, "uncond_skip": 5, "alpha": 1.1}  # README defaults
    # FasterCache reuses self-attention on odd iterations while the timestep is below 681 (diffusers' default range)
    skipped = [i for i, t in enumerate(timesteps) if t < 681 and i % 2 == 1]
    n_blocks = len(wan.transformer.blocks)
    assert n_dense == steps * n_blocks and skipped == [5, 7]
    assert n_faster == (steps - len(skipped)) * n_blocks
    assert 40 < metrics.psnr(dense, fast.frames) < metrics.PSNR_CAP_DB  # measured 65.9 dB; another seed: 20.6 dB
    assert main(["generate", PROMPT, "--model", "tiny-wan", "--steps", "4", "--cache", "faster",
                 "-o", str(tmp_path / "g.mp4")]) == 2  # guidance 5: separate CFG calls would share its state


def _two_expert_folder(path: Path, boundary_ratio=0.875) -> Path:
    """A Wan 2.2 A14B-style pipeline (transformer for high noise, transformer_2 for low noise) at tiny-wan's size;
    the second expert is tiny-wan's transformer with every weight moved."""
    import copy

    from diffusers import WanPipeline

    from kinegen.loading import write_generation_defaults
    from kinegen.models.tiny import build_tiny_wan

    base = build_tiny_wan()
    second = copy.deepcopy(base.transformer)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer, transformer_2=second,
                       boundary_ratio=boundary_ratio)
    pipe.save_pretrained(path, safe_serialization=True)
    write_generation_defaults(path, height=64, width=64, frames=9, steps=8, guidance=5.0, fps=16)
    return path


def test_wan22_two_experts_switch_at_the_boundary_and_both_take_caches(wan, saved, tmp_path, monkeypatch):
    from diffusers import WanTransformer3DModel

    folder = str(_two_expert_folder(tmp_path / "wan22"))
    calls = []
    forward = WanTransformer3DModel.forward

    def counted(self, *args, **kwargs):
        calls.append((id(self), float(kwargs["timestep"][0])))
        return forward(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(WanTransformer3DModel, "forward", counted)
        _cli("generate", PROMPT, "--model", folder, "--seed", "1", "-o", str(tmp_path / "a.mp4"))
    pipe = kinegen.load_pipeline(folder)  # the one the CLI loaded (cached)
    first, second = id(pipe.transformer), id(pipe.transformer_2)
    timesteps = [float(t) for t in pipe.scheduler.timesteps]
    boundary = 0.875 * pipe.scheduler.config.num_train_timesteps
    high = [t for t in timesteps if t >= boundary]
    assert len(timesteps) == 8 and 0 < len(high) < 8
    # cond and uncond call per step; the high-noise expert until the boundary, the low-noise one after it
    assert calls == [(first if t >= boundary else second, t) for t in timesteps for _ in range(2)]
    two = saved[0].frames
    one = kinegen.generate(wan, PROMPT, seed=1, steps=8).frames  # tiny-wan: the first expert alone
    assert not np.allclose(two, one, atol=1e-3)
    # a cache is applied to both experts: with first-block at a high threshold each skips its later blocks
    ffn_calls = {first: 0, second: 0}
    hooks = [t.blocks[-1].ffn.register_forward_pre_hook(lambda *_, k=id(t): ffn_calls.__setitem__(k, ffn_calls[k] + 1))
             for t in (pipe.transformer, pipe.transformer_2)]
    try:
        _cli("generate", PROMPT, "--model", folder, "--seed", "1", "--cache", "first-block:threshold=1.0",
             "-o", str(tmp_path / "b.mp4"))
    finally:
        for h in hooks:
            h.remove()
    assert 0 < ffn_calls[first] < 2 * len(high) and 0 < ffn_calls[second] < 2 * (8 - len(high)), ffn_calls
    assert not pipe.transformer.is_cache_enabled and not pipe.transformer_2.is_cache_enabled  # removed


# ---------------------------------------------------------------------------- HVA backends in a pipeline

HVA_BACKENDS_SCRIPT = """
import json, numpy as np, kinegen
pipe = kinegen.load_pipeline("tiny-wan", device="cpu")
pipe.set_progress_bar_config(disable=True)
spec = "hva:{sparse},backend="
ref = kinegen.generate(pipe, "a red circle", seed=0, steps=2, accelerators=[spec + "dense"])
out = kinegen.generate(pipe, "a red circle", seed=0, steps=2, accelerators=[spec + "{backend}"])
st, ref_st = out.accelerators[0], ref.accelerators[0]
print(json.dumps(dict(diff=float(np.abs(out.frames - ref.frames).max()), backend=st["config"]["backend"],
                      sparse_calls=st["sparse_calls"], density=st["density"], ref_density=ref_st["density"])))
"""


def _run_backend(backend: str, env: dict | None = None) -> dict:
    code = HVA_BACKENDS_SCRIPT.format(sparse=SPARSE, backend=backend)
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_backend(r: dict, backend: str):
    assert r["backend"] == backend and r["sparse_calls"] == 2 * 2 * 2  # steps x branches x layers
    assert r["density"] == pytest.approx(r["ref_density"])  # same blocks kept: only the kernel differs
    assert r["diff"] < 1e-4


def test_hva_triton_backend_in_a_pipeline_matches_the_dense_backend():
    """The Triton kernel runs under its interpreter on a CPU; TRITON_INTERPRET is read when triton is imported."""
    _check_backend(_run_backend("triton", {"TRITON_INTERPRET": "1"}), "triton")


@pytest.mark.slow
def test_hva_flex_backend_in_a_pipeline_matches_the_dense_backend(wan):
    """Compiled FlexAttention (about 19 s to compile on 2 cores, 6 s with a warm inductor cache)."""
    spec = f"hva:{SPARSE},backend="
    ref = kinegen.generate(wan, PROMPT, seed=0, steps=2, accelerators=[spec + "dense"])
    out = kinegen.generate(wan, PROMPT, seed=0, steps=2, accelerators=[spec + "flex"])
    st = out.accelerators[0]
    _check_backend(dict(diff=float(np.abs(out.frames - ref.frames).max()), backend=st["config"]["backend"],
                        sparse_calls=st["sparse_calls"], density=st["density"],
                        ref_density=ref.accelerators[0]["density"]), "flex")


# ---------------------------------------------------------------------------- other commands


def test_models_lists_the_registry_and_the_accelerator_catalogue(capsys):
    from kinegen.accelerators.catalog import list_accelerators
    from kinegen.loading import describe_models
    from kinegen.registry import DEFAULT_MODEL, MODELS

    _cli("models")
    lines = capsys.readouterr().out.splitlines()
    table = {line.split()[0]: line.split() for line in lines[1:] if line.strip() and not line.startswith("Real")}
    assert list(table) == list(MODELS)
    for name, spec in MODELS.items():
        local = table[name][3]
        assert table[name][1:3] == [spec.kind, spec.family]
        if spec.builder is not None or spec.bundled is not None:
            assert local == "yes", name  # built in code or shipped in assets/
    assert "(default)" in next(line for line in lines if line.startswith(DEFAULT_MODEL + " "))
    _cli("models", "--json")
    assert json.loads(capsys.readouterr().out) == describe_models()
    readme = README.read_text()
    section = readme[readme.index("\n## Models\n"):readme.index("\n### Real checkpoints")]
    listed = [n for row in re.findall(r"^\| (`[^|]+)\|", section, re.M) for n in re.findall(r"`([^`]+)`", row)]
    assert sorted(listed) == sorted(MODELS)  # README's table names every registered model, once

    _cli("models", "--accelerators", "--json")
    rows = json.loads(capsys.readouterr().out)
    catalogue = list_accelerators()
    assert [(r["name"], r["kind"], r["summary"]) for r in rows] == [(a.name, a.kind, a.summary) for a in catalogue]
    assert all(r["keys"] == json.loads(json.dumps(a.keys(), default=str)) for r, a in zip(rows, catalogue, strict=True))
    # README's table of diffusers' caches states the same keys and defaults
    by_name = {r["name"]: r["keys"] for r in rows}
    peers = re.findall(r"^\| `([a-z-]+)` \| [^|]+ \| `([^`]+)`", readme, re.M)
    assert {n for n, _ in peers} == {"first-block", "taylorseer", "mag", "pab", "faster"}
    for name, keys in peers:
        stated = dict(kv.split("=") for kv in keys.split(", "))
        assert {k: str(v).lower() for k, v in by_name[name].items()} == stated, name


def test_calibrate_writes_a_predictor_that_loads_and_predicts(wan, tmp_path, capsys):
    from kinegen.caching.tvmap import resample, spearman
    from kinegen.models.map_predictor import MapPredictor

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moving right\na blue square moving left\na green star growing\n"
                       "a yellow triangle bouncing\n")
    out = tmp_path / "pred"
    _cli("calibrate", "--model", "tiny-wan", "--prompts", str(prompts), "--output", str(out), "--steps", "8",
         "--train-steps", "60", "--sensitivity-prompts", "0", "--held-out", "0.25")
    printed = capsys.readouterr().out
    assert "4 maps (3 calibration / 1 held-out)" in printed and f"predictor written to {out}/" in printed
    report = json.loads((out / "calibration.json").read_text())
    records = [json.loads(line) for line in (out / "maps.jsonl").read_text().splitlines()]
    assert report["records"] == len(records) == 4 and [r["prompt_index"] for r in records] == [0, 1, 2, 3]
    assert report["sensitivity"] is None  # --sensitivity-prompts 0: not measured, the planner weights steps 1
    model = MapPredictor.load(out)
    c = model.config
    assert (c.groups, c.trained_steps, c.trained_sizes, c.trained_guidance) == (2, [8], [[9, 64, 64]], [5.0])
    assert c.sensitivity == []
    held = set(report["held_out_prompt_list"])
    rho = []
    for r in records:
        with torch.no_grad():
            pred = resample(np.exp(model(torch.tensor([r["features"]]))[0].double().numpy()), 8)
        assert pred.shape == (8, 2) and np.isfinite(pred).all() and (pred > 0).all()
        if r["prompt"] not in held:
            rho.append(spearman(pred, np.asarray(r["map"])))
    # the report's figure is this very correlation, and the fitted predictor ranks its training maps well
    assert np.mean(rho) == pytest.approx(report["metrics"]["train"]["spearman_predicted_mean"], abs=1e-9)
    assert np.mean(rho) > 0.8
    res = kinegen.generate(wan, PROMPT, seed=0, steps=8, accelerators=[
        f"mapguided:speedup=2,max_error=inf,overhead=0,map=predicted,predictor={out}"])
    st = res.accelerators[0]
    assert st["map_source"] == "predicted by the Map Predictor" and np.array(st["map"]).shape == (8, 2)


def test_eval_adherence_writes_the_per_attribute_accuracy(wan, tmp_path):
    """Each number is the share of generations in which the shipped classifier reads what the prompt asked for
    (tiny-wan draws noise, so the readings, not the level, are what is checked)."""
    from kinegen.data.shapes import is_held_out
    from kinegen.evaluation.adherence import classify, load_classifier

    out = tmp_path / "adh.json"
    _cli("eval", "adherence", "--model", "tiny-wan", "--prompts", "2", "--split", "both", "--steps", "2",
         "-o", str(out))
    data = json.loads(out.read_text())
    assert data["model"] == "tiny-wan" and list(data["results"]) == ["train", "held_out"]
    classifier = load_classifier()
    for split, r in data["results"].items():
        assert r["n"] == len(r["records"]) == 2
        for attr in ("shape", "colour", "motion"):
            hits = [rec["prediction"][attr] == rec["truth"][attr] for rec in r["records"]]
            assert r["accuracy"][attr] == pytest.approx(np.mean(hits))
        for rec in r["records"]:
            t = rec["truth"]
            assert t["colour"] in rec["prompt"] and is_held_out(t["shape"], t["colour"], t["motion"]) == (
                split == "held_out")
        rec = r["records"][1]  # the reading is the classifier's on that very generation
        frames = kinegen.generate(wan, rec["prompt"], seed=rec["seed"], steps=2).frames
        assert classify(classifier, frames) == rec["prediction"]


def test_eval_gan_writes_the_documented_metrics(tmp_path):
    from kinegen.evaluation.gan_metrics import load_classifier
    from kinegen.loading import ASSETS_DIR
    from kinegen.pipelines import MPGANPipeline

    out = tmp_path / "gan.json"
    folder = str(Path(ASSETS_DIR) / "models" / "kinegen-shapes-gan")
    _cli("eval", "gan", "--model", folder, "--images", "48", "-o", str(out))
    m = json.loads(out.read_text())
    assert {"fd", "kid", "kid_std", "precision", "recall", "class_accuracy", "modes_covered", "modes"} <= set(m)
    assert m["n_real"] == m["n_fake"] == 48 and m["modes"] == 12
    per_class = np.array(m["per_class_accuracy"])
    assert m["class_accuracy"] == pytest.approx(per_class.mean())  # 4 images of each of the 12 classes
    assert m["modes_covered"] == int((per_class >= 0.5).sum())
    # the class accuracy is the bundled classifier's reading of the images the GAN makes from seeds 0..47
    pipe = MPGANPipeline.from_pretrained(folder)
    labels = np.arange(48) % 12
    images = pipe(class_labels=labels.tolist(), seeds=list(range(48)), output_type="np").images
    x = torch.from_numpy(np.round(images * 255) / 127.5 - 1).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        pred = load_classifier()(x).argmax(1).numpy()
    assert m["class_accuracy"] == pytest.approx((pred == labels).mean())
    # the bundled model draws its classes (its card: 98.6% at 1,200 images)
    assert m["class_accuracy"] >= 0.9 and m["modes_covered"] == 12
