"""Words a model cannot read are named before it runs (issue 28: "a dog running on a beach" used to return noise
without a word)."""

from __future__ import annotations

import pytest

import kinegen
from kinegen.cli import main
from kinegen.errors import PromptWarning
from kinegen.generation import unknown_words


@pytest.fixture(scope="module")
def bundled():
    return kinegen.load_pipeline("kinegen-shapes-t2v")


def test_unknown_words_are_the_ones_outside_the_bundled_vocabulary(bundled):
    assert unknown_words(bundled, "A Dog running on a beach, a RED circle!") == ["dog", "running", "beach"]
    assert unknown_words(bundled, "a red circle moving right on a gray background") == []
    assert unknown_words(kinegen.load_pipeline("tiny-wan"), "a dog on a beach") == []  # SentencePiece spells it


def test_prepare_warns_and_the_result_carries_the_warning(bundled):
    with pytest.warns(PromptWarning, match="does not know the") as caught:
        job = kinegen.prepare(bundled, "a dog on a beach", negative_prompt="a blurry star", steps=1)
    assert len(caught) == 2 and len(job.warnings) == 2
    assert "prompt's words 'dog', 'beach'" in job.warnings[0] and "negative prompt's words 'blurry'" in job.warnings[1]
    assert " star " in job.warnings[0]  # a small vocabulary is listed, so the user can rephrase
    result = kinegen.run_job(job)
    assert result.warnings == list(job.warnings)
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("error", PromptWarning)  # a prompt it knows: no warning at all
        assert kinegen.prepare(bundled, "a blue star moving up").warnings == ()


def test_cli_says_it_once_before_the_run(tmp_path, capsys):
    out = tmp_path / "dog.mp4"
    assert main(["generate", "a dog running on a beach", "--steps", "1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    line = "warning: kinegen-shapes-t2v does not know the prompt's words 'dog', 'running', 'beach'"
    assert err.count(line) == 1 and out.is_file()
