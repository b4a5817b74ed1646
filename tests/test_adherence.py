"""The adherence classifier shipped in assets/ and the adherence evaluation built on it."""

from __future__ import annotations

import pytest

import kinegen
from kinegen.data.shapes import is_held_out, render_clip, sample_clip
from kinegen.evaluation.adherence import adherence_prompts, classify, evaluate_adherence, load_classifier


@pytest.fixture(scope="module")
def classifier():
    return load_classifier()


def test_classifier_reads_procedural_clips(classifier):
    hits = {"shape": 0, "colour": 0, "motion": 0}
    seeds = list(range(900, 924))
    for s in seeds:
        spec = sample_clip(s, split="held_out", num_objects=1)
        pred = classify(classifier, render_clip(spec, 17, 128, 128))
        o = spec.primary
        hits["shape"] += pred["shape"] == o.shape
        hits["colour"] += pred["colour"] == o.colour
        hits["motion"] += pred["motion"] == o.motion
    assert all(v >= len(seeds) - 1 for v in hits.values()), hits


def test_classifier_reads_any_size_and_length(classifier):
    spec = sample_clip(5, num_objects=1)
    for frames, size in [(9, 64), (33, 256)]:
        pred = classify(classifier, render_clip(spec, frames, size, size))
        assert pred == {"shape": spec.primary.shape, "colour": spec.primary.colour, "motion": spec.primary.motion}


def test_adherence_prompts_follow_the_split():
    for split in ("train", "held_out"):
        for prompt, truth in adherence_prompts(30, split):
            assert truth["colour"] in prompt
            assert is_held_out(truth["shape"], truth["colour"], truth["motion"]) == (split == "held_out")


def test_evaluate_adherence_reports_per_attribute(classifier, wan):
    r = evaluate_adherence(wan, 2, "train", classifier=classifier, steps=2)
    assert set(r["accuracy"]) == {"shape", "colour", "motion"} and r["n"] == 2
    assert len(r["records"]) == 2 and set(r["records"][0]) == {"prompt", "truth", "prediction", "seed"}
    assert [(rec["prompt"], rec["truth"]) for rec in r["records"]] == adherence_prompts(2, "train")
    for attr, accuracy in r["accuracy"].items():  # the share of records whose reading is what was asked
        assert accuracy == pytest.approx(sum(rec["prediction"][attr] == rec["truth"][attr] for rec in r["records"]) / 2)
    for rec in r["records"]:  # each reading is the classifier's on that request's generation
        frames = kinegen.generate(wan, rec["prompt"], seed=rec["seed"], steps=2).frames
        assert classify(classifier, frames) == rec["prediction"]

def test_classifier_missing_is_a_clear_error(tmp_path):
    with pytest.raises(kinegen.KinegenError, match="kinegen train adherence"):
        load_classifier(tmp_path)
