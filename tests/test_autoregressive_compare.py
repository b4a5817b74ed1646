"""benchmarks/autoregressive_compare.py: long-video readings compared video by video."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "autoregressive_compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("autoregressive_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path, name, split, videos):
    """A readings file as autoregressive_windows.py writes it: ``videos`` are (prompt, seed, [motion per window])."""
    data = {"split": split, "videos": [
        {"prompt": p, "seed": s, "windows": [{"shape": True, "colour": True, "motion": m, "background": None}
                                             for m in motion]} for p, s, motion in videos]}
    path = tmp_path / f"{name}_{split}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_paired_differences_per_video(compare, tmp_path):
    base = [_run(tmp_path, "base", "train", [("a", 0, [1, 1, 0, 0]), ("b", 1, [1, 0, 0, 0])]),
            _run(tmp_path, "base", "held_out", [("a", 0, [1, 1, 1, 1])])]
    new = [_run(tmp_path, "new", "held_out", [("a", 0, [1, 1, 1, 0])]),  # the same video of another split
           _run(tmp_path, "new", "train", [("b", 1, [1, 1, 1, 0]), ("a", 0, [1, 1, 1, 1])])]
    out = tmp_path / "cmp.json"
    assert compare.main(["--base", *base, "--new", *new, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    # motion per video: +50, +50 and -25 points: mean 25, s.e. 25 (sd 43.3 over three videos)
    assert result["videos"] == 3
    assert result["motion"]["mean"] == pytest.approx(25.0)
    assert result["motion"]["se"] == pytest.approx(25.0)
    assert (result["motion"]["up"], result["motion"]["down"], result["motion"]["same"]) == (2, 1, 0)
    assert result["shape"]["mean"] == 0 and result["shape"]["same"] == 3
    assert "background" not in result  # no prompt named one


def test_sets_with_other_videos_are_refused(compare, tmp_path):
    base = _run(tmp_path, "base", "train", [("a", 0, [1]), ("b", 1, [1])])
    new = _run(tmp_path, "new", "train", [("a", 0, [1]), ("c", 1, [1])])
    with pytest.raises(SystemExit, match="same --split, --prompts and --prompt-seed"):
        compare.main(["--base", base, "--new", new])
    with pytest.raises(SystemExit, match="appears twice"):
        compare.main(["--base", base, base, "--new", new])
