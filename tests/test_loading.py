"""Model resolution, folder checks, offline errors, device and dtype selection."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import kinegen
from kinegen.errors import IncompleteModelFolderError, KinegenError, ModelNotFoundError
from kinegen.loading import check_model_folder, load_pipeline, pick_device, pick_dtype, resolve_model
from kinegen.registry import MODELS

REQUIRED_NAMES = ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "hunyuanvideo", "cogvideox-2b",
                  "cogvideox-5b", "flux.1-dev", "flux.1-kontext-dev"]


def test_registry_has_the_real_checkpoints():
    for name in REQUIRED_NAMES:
        spec = MODELS[name]
        assert spec.repo_id and "/" in spec.repo_id
        assert spec.height % 16 == 0 and spec.width % 16 == 0 and spec.steps > 0


def test_bundled_models_registry_defaults_match_their_folders():
    """A bundled model named in the registry and the same folder passed as a path generate with the same defaults."""
    from kinegen.loading import ASSETS_DIR, read_generation_defaults

    checked = []
    for spec in (s for s in MODELS.values() if s.bundled):
        declared = read_generation_defaults(ASSETS_DIR / "models" / spec.bundled)  # (the GAN declares none)
        assert {k: getattr(spec, k) for k in declared} == declared, spec.name
        checked += [spec.name] if declared else []
    assert {"kinegen-shapes-t2v", "kinegen-shapes-ar"} <= set(checked)


@pytest.fixture(scope="module")
def saved_wan(tmp_path_factory, wan):
    folder = tmp_path_factory.mktemp("models") / "my-wan"
    wan.save_pretrained(folder, safe_serialization=True)
    return folder


def test_saved_folder_is_complete_and_loads(saved_wan, wan):
    assert check_model_folder(saved_wan) == []
    pipe = load_pipeline(str(saved_wan), device="cpu", cache=False)
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe).__name__ == "WanPipeline"
    assert pipe.kinegen_spec.family == "wan"
    a = kinegen.generate(pipe, "a red circle", seed=2, steps=3, height=64, width=64, frames=9).frames
    b = kinegen.generate(wan, "a red circle", seed=2, steps=3, height=64, width=64, frames=9).frames
    np.testing.assert_allclose(a, b, atol=1e-5)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_component_is_named(saved_wan, tmp_path):
    folder = _copy(saved_wan, tmp_path / "broken")
    shutil.rmtree(folder / "vae")
    for f in (folder / "transformer").glob("*.safetensors"):
        f.unlink()
    (folder / "scheduler" / "scheduler_config.json").unlink()
    with pytest.raises(IncompleteModelFolderError) as err:
        load_pipeline(str(folder))
    msg = str(err.value)
    assert "vae/ (diffusers.AutoencoderKLWan)" in msg
    assert "transformer/ weights (*.safetensors)" in msg
    assert "scheduler/scheduler_config.json" in msg
    assert "hf download" in msg


def test_pickle_only_weights_are_refused(saved_wan, tmp_path):
    folder = _copy(saved_wan, tmp_path / "pickled")
    for f in (folder / "vae").glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    assert any("only pickle" in m for m in check_model_folder(folder))


def test_folder_without_model_index(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IncompleteModelFolderError, match="model_index.json"):
        load_pipeline(str(tmp_path / "empty"))


def test_unsupported_pipeline_class(saved_wan, tmp_path):
    folder = _copy(saved_wan, tmp_path / "sd")
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelNotFoundError, match="does not drive.*WanPipeline"):
        load_pipeline(str(folder))


def test_unknown_name_and_missing_path():
    with pytest.raises(ModelNotFoundError, match="Registered models: .*tiny-wan"):
        resolve_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("./no/such/folder")


def test_registry_model_not_downloaded_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("KINEGEN_MODELS_DIR", str(tmp_path / "models"))
    with pytest.raises(ModelNotFoundError) as err:
        load_pipeline("cogvideox-2b")
    msg = str(err.value)
    assert "THUDM/CogVideoX-2b" in msg and "offline" in msg
    assert "hf download THUDM/CogVideoX-2b --local-dir ./models/cogvideox-2b" in msg


def test_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError, match="Could not get someone/some-model"):
        load_pipeline("someone/some-model")


def test_models_dir_is_searched(monkeypatch, saved_wan, tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    _copy(saved_wan, root / "wan2.1-t2v-1.3b")
    monkeypatch.setenv("KINEGEN_MODELS_DIR", str(root))
    resolved = resolve_model("wan2.1-t2v-1.3b")
    assert resolved.folder == root / "wan2.1-t2v-1.3b"
    assert resolved.spec.height == 480  # the registry's defaults, not a folder's guess
    rows = {r["name"]: r for r in kinegen.describe_models()}
    assert rows["wan2.1-t2v-1.3b"]["available"] is True
    assert rows["hunyuanvideo"]["available"] is False


def test_device_and_dtype_defaults():
    assert pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert pick_device(None).type in ("cpu", "mps")
        with pytest.raises(KinegenError, match="no CUDA GPU"):
            pick_device("cuda")
    assert pick_dtype(torch.device("cpu")) == torch.float32
    assert pick_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    with pytest.raises(KinegenError, match="Unknown dtype"):
        pick_dtype(torch.device("cpu"), "int3")


def test_dtype_override_and_offload_errors():
    pipe = load_pipeline("tiny-flux", device="cpu", dtype="bf16", cache=False)
    assert pipe.transformer.dtype == torch.bfloat16
    with pytest.raises(KinegenError, match="no GPU"):
        load_pipeline("tiny-flux", device="cpu", cpu_offload="model", cache=False)
    pipe = load_pipeline("tiny-wan", device="cpu", vae_tiling=True, cache=False)
    assert pipe.vae.use_tiling


def test_pipeline_cache_reuses(wan):
    assert load_pipeline("tiny-wan", device="cpu") is wan


def test_hub_id_of_a_registered_model_uses_its_spec(monkeypatch, tmp_path):
    monkeypatch.setenv("KINEGEN_MODELS_DIR", str(tmp_path))
    assert resolve_model("THUDM/CogVideoX-2b").spec.name == "cogvideox-2b"
    unknown = resolve_model("someone/some-model")
    assert unknown.spec is None and unknown.repo_id == "someone/some-model"


def test_bundled_models_load_from_assets(monkeypatch, saved_wan, tmp_path):
    import kinegen.loading as loading
    from kinegen.registry import ModelSpec

    _copy(saved_wan, tmp_path / "models" / "my-bundled")
    monkeypatch.setattr(loading, "ASSETS_DIR", tmp_path)
    monkeypatch.setitem(MODELS, "my-bundled", ModelSpec("my-bundled", "wan", "test", 64, 64, 2, 1.0, frames=5,
                                                        bundled="my-bundled"))
    pipe = load_pipeline("my-bundled", device="cpu", cache=False)
    assert pipe.kinegen_spec.name == "my-bundled"
    assert {r["name"]: r for r in kinegen.describe_models()}["my-bundled"]["available"] is True
    shutil.rmtree(tmp_path / "models" / "my-bundled" / "vae")
    with pytest.raises(IncompleteModelFolderError, match="vae/"):
        load_pipeline("my-bundled", cache=False)


def test_folder_declares_its_generation_defaults(saved_wan, tmp_path):
    from kinegen.errors import ConfigError
    from kinegen.loading import ASSETS_DIR, read_generation_defaults, write_generation_defaults

    folder = _copy(saved_wan, tmp_path / "copy")
    assert resolve_model(folder).spec.height == MODELS["wan2.1-t2v-1.3b"].height  # no file: the family's defaults
    write_generation_defaults(folder, height=64, width=96, frames=9, steps=3, guidance=2.5, fps=8)
    spec = resolve_model(folder).spec
    assert (spec.height, spec.width, spec.frames, spec.steps, spec.guidance, spec.fps) == (64, 96, 9, 3, 2.5, 8)
    (folder / "kinegen_defaults.json").write_text('{"height": 64, "sampler": "euler"}')
    with pytest.raises(ConfigError, match="unknown keys.*valid keys: height"):
        resolve_model(folder)
    (folder / "kinegen_defaults.json").write_text('[64]')
    with pytest.raises(ConfigError, match="JSON object"):
        resolve_model(folder)
    # The bundled model's file agrees with its registry entry, so a copy of it generates like it.
    bundled = MODELS["kinegen-shapes-t2v"]
    assert read_generation_defaults(ASSETS_DIR / "models" / bundled.bundled) == {
        "height": bundled.height, "width": bundled.width, "frames": bundled.frames, "steps": bundled.steps,
        "guidance": bundled.guidance, "fps": bundled.fps}


def test_kinegen_models_answers_without_importing_torch():
    """`kinegen models` lists the registry without loading torch (it took 5-11 s when it did)."""
    import subprocess
    import sys

    code = ("import sys; from kinegen.cli import main; rc = main(['models']); "
            "print('torch' in sys.modules, 'diffusers' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "kinegen-shapes-t2v" in out.stdout and out.stdout.strip().splitlines()[-1] == "False False"
