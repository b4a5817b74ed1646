"""The accelerator registry: spec parsing, fail-fast errors, apply/remove, composition rules."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kinegen
from kinegen.accelerators.base import RunInfo
from kinegen.accelerators.catalog import accelerate, parse_spec
from kinegen.caching.diffusers_caches import FirstBlockCacheSpec, MagCacheSpec, TaylorSeerSpec
from kinegen.errors import ConfigError


def test_parse_spec_coerces_types():
    acc, cfg = parse_spec("taylorseer:cache_interval=3,max_order=2,use_lite_mode=yes")
    assert acc.name == "taylorseer"
    assert cfg == TaylorSeerSpec(cache_interval=3, max_order=2, use_lite_mode=True)
    _, cfg = parse_spec("first-block")
    assert cfg == FirstBlockCacheSpec()
    _, cfg = parse_spec(" mag : threshold = 0.25 , max-skip-steps=2 ")
    assert cfg.threshold == 0.25 and cfg.max_skip_steps == 2


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("nosuch", "Valid names: dasa, dense-attention, faster, first-block, hva, kmeans-sparse, mag, mapguided"),
        ("first-block:thresh=0.1", "Valid keys: threshold"),
        ("first-block:threshold=abc", "is not a valid float"),
        ("first-block:threshold", "expected key=value"),
        ("first-block:threshold=-1", "threshold must be >= 0"),
        ("taylorseer:cache_interval=0", "cache_interval must be >= 1"),
        ("taylorseer:use_lite_mode=maybe", "is not a valid bool"),
        ("", "non-empty"),
    ],
)
def test_parse_spec_errors_name_the_fix(spec, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_spec(spec)


def test_two_caches_at_once_are_refused(wan):
    with pytest.raises(ConfigError, match="Only one cache accelerator"):
        accelerate(wan, "first-block", "taylorseer", run=RunInfo(num_inference_steps=4))
    assert not wan.transformer.is_cache_enabled


def test_remove_restores_the_dense_output_exactly(wan):
    dense = kinegen.generate(wan, "a red circle", seed=3, steps=6).frames
    cached = kinegen.generate(wan, "a red circle", seed=3, steps=6, accelerators=["first-block:threshold=0.5"]).frames
    assert not np.array_equal(dense, cached), "a high threshold must skip blocks and change the output"
    assert not wan.transformer.is_cache_enabled
    again = kinegen.generate(wan, "a red circle", seed=3, steps=6).frames
    np.testing.assert_array_equal(dense, again)


def test_handle_stats_and_context_manager(wan):
    (handle,) = accelerate(wan, FirstBlockCacheSpec(threshold=0.1), run=RunInfo(num_inference_steps=4))
    with handle:
        assert wan.transformer.is_cache_enabled
        assert handle.stats() == {"name": "first-block", "config": {"threshold": 0.1}}
    assert not wan.transformer.is_cache_enabled


def test_mag_calibrates_once_per_model_and_step_count(wan, monkeypatch):
    import kinegen.caching.diffusers_caches as dc

    calls = []
    real = dc.calibrate_mag_ratios
    monkeypatch.setattr(dc, "_MAG_RATIOS", {})
    monkeypatch.setattr(dc, "calibrate_mag_ratios", lambda pipe, run: calls.append(1) or real(pipe, run))
    r1 = kinegen.generate(wan, "a red circle", seed=0, steps=6, accelerators=["mag:threshold=0.2"])
    r2 = kinegen.generate(wan, "a blue square", seed=1, steps=6, accelerators=[MagCacheSpec(threshold=0.2)])
    assert len(calls) == 1
    assert r1.accelerators[0]["ratios_source"] == "calibrated with one dense run"
    assert r2.accelerators[0]["num_ratios"] == 6


def test_mag_uses_diffusers_flux_ratios(flux):
    r = kinegen.generate(flux, "a red circle", steps=4, accelerators=["mag"])
    assert r.accelerators[0]["ratios_source"] == "diffusers FLUX_MAG_RATIOS"


def test_shared_state_caches_refuse_separate_cfg_calls(wan):
    with pytest.raises(ConfigError, match="separate conditional"):
        kinegen.generate(wan, "a red circle", steps=4, guidance=5.0, accelerators=["pab"])
    # Without a second (unconditional) call the same cache is fine: it reuses self-attention on odd iterations
    # while 100 < t < 800 (steps 5 and 7 of 8 here), and the output stays close to dense.
    from kinegen.profiling.metrics import psnr

    calls, processors = [0], [b.attn1.processor for b in wan.transformer.blocks]

    def counted(processor):
        def call(*args, **kwargs):
            calls[0] += 1
            return processor(*args, **kwargs)
        return call

    try:
        for b, proc in zip(wan.transformer.blocks, processors, strict=True):
            b.attn1.processor = counted(proc)
        dense = kinegen.generate(wan, "a red circle", steps=8, guidance=1.0).frames
        n_dense, calls[0] = calls[0], 0
        r = kinegen.generate(wan, "a red circle", steps=8, guidance=1.0, accelerators=["pab"])
    finally:
        for b, proc in zip(wan.transformer.blocks, processors, strict=True):
            b.attn1.processor = proc
    skipped = [i for i, t in enumerate(wan.scheduler.timesteps.tolist()) if 100 < t < 800 and i % 2]
    assert skipped == [5, 7] and n_dense == 8 * 2 and calls[0] == (8 - len(skipped)) * 2
    assert 40 < psnr(dense, r.frames) < 100  # measured 64.6 dB; another seed is 20.6 dB away


@pytest.mark.parametrize("model", ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox", "tiny-flux"])
@pytest.mark.parametrize("spec", ["first-block:threshold=1.0",
                                  "taylorseer:cache_interval=2,disable_cache_before_step=1"])
def test_caches_change_output_on_every_family(load_tiny, model, spec):
    pipe = load_tiny(model)
    dense = kinegen.generate(pipe, "a red circle", seed=0, steps=6).frames
    fast = kinegen.generate(pipe, "a red circle", seed=0, steps=6, accelerators=[spec]).frames
    assert np.isfinite(fast).all()
    assert not np.array_equal(dense, fast), f"{spec} had no effect on {model}"


def test_dense_attention_backend_is_selectable_and_removable(wan, load_tiny):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from kinegen.errors import ConfigError as _ConfigError

    process_wide = _AttentionBackendRegistry._active_backend
    other = load_tiny("tiny-hunyuanvideo")  # another model in the same process
    other_before = kinegen.generate(other, "a red circle", seed=3, steps=2).frames
    dense = kinegen.generate(wan, "a red circle", seed=3, steps=4).frames
    math = kinegen.generate(wan, "a red circle", seed=3, steps=4,
                            accelerators=["dense-attention:backend=_native_math"])
    assert not np.array_equal(math.frames, dense)  # another kernel ran ...
    np.testing.assert_allclose(math.frames, dense, atol=2e-3)  # ... computing the same attention
    assert math.accelerators[0]["processors"] > 0
    # removal restores this model, and the choice never leaked to the process (diffusers' active backend)
    assert _AttentionBackendRegistry._active_backend == process_wide
    np.testing.assert_array_equal(kinegen.generate(wan, "a red circle", seed=3, steps=4).frames, dense)
    np.testing.assert_array_equal(kinegen.generate(other, "a red circle", seed=3, steps=2).frames, other_before)
    with pytest.raises(_ConfigError, match="backend must be one of"):
        parse_spec("dense-attention:backend=magic")


@pytest.mark.parametrize("spec, fragment", [
    ("hva:backend=cuda",
     "backend must be one of auto, dense, flex, triton, reference, gather (layout=auto); got 'cuda'"),
    ("hva:layout=tiles,backend=gather", "backend must be one of auto, dense, flex, triton (layout=tiles)"),
    ("hva:layout=lists,backend=dense", "backend must be one of auto, reference, gather, flex, triton (layout=lists)"),
    ("hva:layout=csr", "layout must be auto, tiles or lists; got 'csr'"),
    ("svg2:backend=dense", "backend must be one of auto, reference, gather, flex, triton; got 'dense'"),
    ("kmeans-sparse:backend=flash", "backend must be one of auto, dense, flex, triton"),
    ("hva:kernel=cuda", "kernel must be auto, torch or triton"),
    ("dense-attention:backend=nosuch", "backend must be one of"),
])
def test_backends_that_do_not_exist_fail_when_the_config_is_built(spec, fragment):
    """Not at the first sparse call after the dense warm-up: parsing the spec refuses them."""
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_spec(spec)


def test_step_count_reaches_accelerators_only_through_run_info(wan):
    """One channel: an accelerator that needs the step count says so when applied without it."""
    with pytest.raises(ConfigError, match="mag needs the number of denoising steps.*RunInfo"):
        accelerate(wan, "mag:ratios=1/1/1/1", run=RunInfo())
    with pytest.raises(ConfigError, match="HVAConfig needs the number of denoising steps"):
        accelerate(wan, "hva", run=RunInfo())
    handles = accelerate(wan, "hva:dense_warmup=0", run=RunInfo())  # no warm-up: no step count needed
    for h in handles:
        h.remove()


def test_step_tracker_counts_each_guidance_branch():
    from diffusers.hooks.hooks import CacheContext

    from kinegen.accelerators.base import StepTracker

    tracker = StepTracker(3)
    seen = []
    for _ in range(6):  # two runs of three steps, conditional and unconditional calls interleaved
        for name in ("cond", "uncond"):
            s = tracker.on_call(CacheContext(name=name))
            seen.append((s.branch, s.index, s.new_run))
    assert [x for x in seen if x[0] == "cond"] == [("cond", 0, True), ("cond", 1, False), ("cond", 2, False)] * 2
    assert [x[1] for x in seen if x[0] == "uncond"] == [0, 1, 2, 0, 1, 2]
    # The pipeline's own step index wins over counting (diffusers passes it in the cache context).
    assert tracker.on_call(CacheContext(name="cond", step_index=2)).index == 2
    assert tracker.on_call(None).branch == "inference"
