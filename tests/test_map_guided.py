"""Map-Guided Caching: planners against brute force, the hooks on every family, maps, predictor, errors."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

import kinegen
from kinegen.accelerators.base import RunInfo
from kinegen.accelerators.catalog import accelerate
from kinegen.caching import planner as P
from kinegen.caching.map_guided import MapGuidedCacheConfig, apply_map_guided_cache
from kinegen.caching.tvmap import TVMap, resample, spearman
from kinegen.errors import ConfigError, FidelityWarning

# ---------------------------------------------------------------------------- planners


def _random_map(steps, groups, seed=0):
    rng = np.random.default_rng(seed)
    return np.exp(rng.normal(size=(steps, groups))) * np.linspace(2.0, 0.5, steps)[:, None]


def _respects(compute, guards):
    steps = compute.shape[0]
    assert compute[: guards.warmup].all() and compute[steps - guards.cooldown:].all()
    for g in range(compute.shape[1]):
        run = 0
        for t in range(steps):
            run = 0 if compute[t, g] else run + 1
            assert run <= guards.max_reuse


def test_orientation_planner_is_optimal_against_brute_force():
    steps, guards = 9, P.Guards(warmup=1, cooldown=1, max_reuse=3)
    v = _random_map(steps, 2)
    best, choice = P.orientation_plan(v, guards)
    for g in range(2):
        for k in range(1, steps + 1):
            brute = np.inf
            for mid in itertools.combinations(range(1, steps - 1), max(k - 2, 0)):
                m = np.zeros(steps, bool)
                m[[0, steps - 1, *mid]] = True
                if m.sum() != k:
                    continue
                try:
                    _respects(m[:, None], guards)
                except AssertionError:
                    continue
                brute = min(brute, P.plan_error(v[:, g:g + 1], m[:, None]))
            if np.isinf(brute):
                assert np.isinf(best[g, k])
            else:
                assert best[g, k] == pytest.approx(brute)
                assert choice[g, k].sum() == k
                assert P.plan_error(v[:, g:g + 1], choice[g, k][:, None]) == pytest.approx(brute)


def test_weighted_costs_are_optimal_against_brute_force():
    steps, guards = 8, P.Guards(warmup=1, cooldown=1, max_reuse=3)
    v = _random_map(steps, 1, seed=4)
    w = np.exp(np.random.default_rng(5).normal(size=steps))
    best, _ = P.orientation_plan(v, guards, w)
    for k in range(3, steps + 1):
        brute = min((P.plan_error(v, m[:, None], w) for m in _masks(steps, k, guards)), default=np.inf)
        assert best[0, k] == pytest.approx(brute)
    assert P.plan_error(v, np.ones((steps, 1), bool), w) == 0


def _masks(steps, k, guards):
    for mid in itertools.combinations(range(1, steps - 1), k - 2):
        m = np.zeros(steps, bool)
        m[[0, steps - 1, *mid]] = True
        try:
            _respects(m[:, None], guards)
        except AssertionError:
            continue
        yield m


@pytest.mark.parametrize("speedup", [1.5, 2.0, 3.0])
def test_nested_plan_keeps_computed_groups_a_prefix_and_fits_the_budget(speedup):
    guards = P.Guards(warmup=1, cooldown=1, max_reuse=4)
    v = _random_map(24, 5, seed=2)
    plan = P.nested_plan(v, speedup, guards, overhead=0.0)
    _respects(plan.compute, guards)
    assert (plan.compute[:, 1:] <= plan.compute[:, :-1]).all()  # group g computed => group g-1 computed
    budget = P.compute_budget(speedup, 0.0)
    assert budget - 0.1 <= plan.compute_fraction <= budget + 1e-9
    assert plan.predicted_error == pytest.approx(P.plan_error(v, plan.compute))
    free = P.quantity_plan(v, speedup, guards)
    assert free.predicted_error <= plan.predicted_error + 1e-9  # nesting is a constraint: never lower drift
    same = P.nested_plan(np.repeat(v[:, :1], 5, axis=1), speedup, guards)  # equal groups: whole steps
    assert all(row.all() or not row.any() for row in same.compute)


def test_sensitivity_weights_move_compute_to_the_sensitive_steps():
    v = np.full((20, 1), 0.1)
    w = np.ones(20)
    w[:6] = 10.0  # errors in the first steps cost ten times more
    plain = P.nested_plan(v, 2.0, P.Guards(1, 1, 4))
    weighted = P.nested_plan(v, 2.0, P.Guards(1, 1, 4), weights=w)
    assert weighted.compute[:6].sum() > plain.compute[:6].sum()
    assert weighted.compute_fraction <= 0.5 + 1e-9


@pytest.mark.parametrize("speedup", [1.5, 2.0, 3.0, 3.3])
def test_quantity_planner_hits_the_budget_and_keeps_the_guards(speedup):
    guards = P.Guards(warmup=2, cooldown=1, max_reuse=5)
    v = _random_map(30, 6, seed=1)
    overhead = 0.05
    plan = P.quantity_plan(v, speedup, guards, overhead=overhead)
    _respects(plan.compute, guards)
    budget = P.compute_budget(speedup, overhead)
    assert budget - 1 / 30 <= plan.compute_fraction <= budget + 1e-9
    greedy = P.threshold_plan(v, speedup, guards, overhead=overhead)
    assert greedy.compute_fraction <= budget + 1e-9
    assert plan.predicted_error <= P.plan_error(v, greedy.compute) + 1e-9  # the DP is never worse than greedy


def test_quantity_planner_gives_more_compute_where_the_map_varies_more():
    v = np.full((20, 2), 0.01)
    v[:, 1] = 1.0  # group 1 changes a lot at every step
    plan = P.quantity_plan(v, 1.6, P.Guards(1, 1, 4))
    assert plan.compute[:, 1].sum() > plan.compute[:, 0].sum()


def test_impossible_speedups_are_refused_with_the_reachable_maximum():
    v = _random_map(10, 3)
    with pytest.raises(ConfigError, match="below 1"):
        P.quantity_plan(v, 0.5, P.Guards())
    with pytest.raises(ConfigError, match=r"the most is 2\.50x"):
        P.quantity_plan(v, 3.0, P.Guards(1, 1, 3))  # 10 steps, <=3 reuses: 4 computed of 10
    assert P.max_speedup(10, P.Guards(1, 1, 3)) == pytest.approx(2.5)


def test_tvmap_resample_and_spearman():
    v = _random_map(20, 4)
    np.testing.assert_allclose(resample(v, 20), v)
    r = resample(v, 39)
    assert r.shape == (39, 4)
    np.testing.assert_allclose(r[::2] * 38 / 19, v, rtol=1e-9)  # same points, rescaled by the step size
    assert spearman(v, v) == pytest.approx(1.0)
    assert spearman(v, -v) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        TVMap(v, ["a"])


# ---------------------------------------------------------------------------- hooks


def _gen(pipe, *accelerators, steps=8, seed=3, **kw):
    return kinegen.generate(pipe, "a red circle moving right", seed=seed, steps=steps, accelerators=accelerators,
                            **kw)


def test_speedup_one_is_bit_identical_and_removal_restores_dense(wan):
    dense = _gen(wan).frames
    same = _gen(wan, "mapguided:speedup=1,map=recorded").frames
    np.testing.assert_array_equal(dense, same)
    cached = _gen(wan, "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded")
    assert not np.array_equal(dense, cached.frames)
    assert np.isfinite(cached.frames).all()
    np.testing.assert_array_equal(dense, _gen(wan).frames)
    assert getattr(wan.transformer, "_kinegen_mapguided", None) is None


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox", "tiny-flux", "tiny-flux-kontext"])
def test_executed_blocks_equal_the_plan_on_every_family(load_tiny, name):
    pipe = load_tiny(name)
    dense = _gen(pipe).frames
    res = _gen(pipe, "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded,max_reuse=3")
    st = res.accelerators[0]
    plan = np.array(st["plan"])
    calls = res.timings["transformer_calls"]
    branches = calls // st["steps"]
    blocks_per_group = np.ones(plan.shape[1])
    assert st["block_evaluations"] == branches * st["steps"] * blocks_per_group.sum()
    assert st["block_evaluations_executed"] == branches * int(plan.sum())
    assert st["achieved_compute_fraction"] == pytest.approx(st["planned_compute_fraction"])
    assert st["planned_compute_fraction"] == pytest.approx(0.5, abs=1 / 8)
    assert plan[0].all() and plan[-1].all()
    assert not np.array_equal(dense, res.frames) and np.isfinite(res.frames).all()


def test_state_is_kept_per_guidance_branch(wan):
    config = MapGuidedCacheConfig(speedup=2, max_error=float("inf"), overhead=0, map="recorded")
    handle = apply_map_guided_cache(wan, config,
                                    RunInfo(num_inference_steps=6, model_key="tiny-wan", shape_key=(9, 64, 64),
                                            dense_call=lambda: _gen(wan, steps=6)))
    ctrl = handle.controllers[0]
    seen = []
    orig = ctrl.begin_call

    def spy(args, kwargs):
        orig(args, kwargs)
        seen.append((ctrl.state._context.name, ctrl.state.get_state().step))

    ctrl.begin_call = spy
    try:
        wan(prompt="a red circle", num_inference_steps=6, guidance_scale=4.0, height=64, width=64, num_frames=9,
            output_type="np")
    finally:
        handle.remove()
    assert [s for n, s in seen if n == "cond"] == list(range(6))
    assert [s for n, s in seen if n == "uncond"] == list(range(6))


@pytest.mark.parametrize("reuse", ["output", "residual", "extrapolate"])
def test_reuse_modes_differ_and_stay_finite(wan, reuse):
    base = _gen(wan, "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded,reuse=residual").frames
    out = _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=recorded,reuse={reuse}").frames
    assert np.isfinite(out).all()
    assert np.array_equal(out, base) == (reuse == "residual")


def test_batch_of_two_and_block_groups(wan):
    spec = "mapguided:speedup=1.6,max_error=inf,overhead=0,map=recorded,group_size=2"
    kinegen.generate(wan, "a red circle", seed=1, steps=8, accelerators=[spec])  # records the map (once per size)
    ran = [0]
    hook = wan.transformer.blocks[1].ffn.register_forward_pre_hook(lambda *_: ran.__setitem__(0, ran[0] + 1))
    try:
        res = kinegen.generate(wan, "a red circle", seed=1, steps=8, accelerators=[spec])
    finally:
        hook.remove()
    st = res.accelerators[0]
    plan = np.array(st["plan"], dtype=bool)
    assert st["groups"] == ["blocks.0-1"] and plan.shape == (8, 1) and 0 < plan.sum() < 8
    # both blocks of the group are computed or reused together: per step and guidance branch, 2 blocks or none
    assert st["block_evaluations"] == 2 * 8 * 2 and st["block_evaluations_executed"] == 2 * 2 * int(plan.sum())
    assert ran[0] == 2 * int(plan.sum())  # the second block ran exactly at the computed steps (x 2 branches)
    def batch():
        return wan(prompt=["a red circle", "a blue square"], num_inference_steps=4, height=64, width=64, num_frames=9,
                   guidance_scale=1.0, output_type="np", generator=torch.Generator().manual_seed(0)).frames

    out = batch()
    assert out.shape[0] == 2
    with pytest.raises(ConfigError, match="no transformer calls"):
        accelerate(wan, "mapguided:speedup=1.5,max_error=inf,overhead=0,map=recorded",
                   run=RunInfo(num_inference_steps=4, dense_call=lambda: None, model_key="batch"))
    assert getattr(wan.transformer, "_kinegen_mapguided", None) is None
    np.testing.assert_array_equal(out, batch())
    (handle,) = accelerate(wan, "mapguided:speedup=1.5,max_error=inf,overhead=0,map=recorded",
                           run=RunInfo(num_inference_steps=4, dense_call=batch, model_key="batch"))
    with handle:
        cached = batch()
        st = handle.stats()
    assert cached.shape == out.shape and not np.array_equal(cached, out) and np.isfinite(cached).all()
    assert st["achieved_compute_fraction"] < 1


def test_heatmap_and_stats_from_python(wan, tmp_path):
    config = MapGuidedCacheConfig(speedup=2, max_error=float("inf"), overhead=0, map="recorded")
    handle = apply_map_guided_cache(wan, config,
                                    RunInfo(num_inference_steps=8, model_key="tiny-wan", shape_key=(9, 64, 64),
                                            dense_call=lambda: _gen(wan)))
    try:
        wan(prompt="a red circle", num_inference_steps=8, guidance_scale=4.0, height=64, width=64, num_frames=9,
            output_type="np")
        st = handle.stats()
        path = handle.save_heatmap(tmp_path / "map.png")
    finally:
        handle.remove()
    assert st["requested_speedup"] == 2 and st["map_source"].startswith("recorded")
    assert np.array(st["map"]).shape == (8, 2) and (np.array(st["map"]) > 0).all()
    assert (tmp_path / "map.png").stat().st_size > 1000 and str(path).endswith("map.png")


# ---------------------------------------------------------------------------- predictor and errors


@pytest.fixture(scope="module")
def tiny_predictor(wan, tmp_path_factory):
    from kinegen.training.calibrate import calibrate

    out = tmp_path_factory.mktemp("pred")
    prompts = ["a red circle moving right", "a blue square moving left", "a green star growing",
               "a yellow triangle bouncing", "a white circle moving up"]
    report = calibrate(wan, prompts, out, steps=8, held_out=0.2, train_steps=100)
    return out, report


def test_calibrate_writes_a_predictor_that_the_cache_uses(wan, tiny_predictor):
    folder, report = tiny_predictor
    assert report["records"] == 5 and report["held_out_prompts"] == 1
    assert (folder / "model.safetensors").is_file() and (folder / "maps.jsonl").is_file()
    from kinegen.caching.tvmap import load_maps
    from kinegen.models.map_predictor import MapPredictor

    predictor = MapPredictor.load(folder)
    held = [r for r in load_maps(folder / "maps.jsonl") if r["prompt"] in report["held_out_prompt_list"]]
    assert len(held) == 1
    with torch.no_grad():
        predicted = np.exp(predictor(torch.tensor([held[0]["features"]]))[0].double().numpy())
    truth = np.asarray(held[0]["map"])
    rho = spearman(resample(predicted, truth.shape[0]), truth)  # the held-out figure is this prompt's rank correlation
    assert report["metrics"]["held_out"]["spearman_predicted_mean"] == pytest.approx(rho, abs=1e-9)
    profile = np.array(report["sensitivity"]["profile"])  # one probe run per inner step and prompt
    assert profile.shape == (8,) and (profile > 0).all() and profile.mean() == pytest.approx(1.0)
    res = _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=predicted,predictor={folder}")
    assert res.accelerators[0]["map_source"] == "predicted by the Map Predictor"
    assert res.accelerators[0]["sensitivity"] == "the predictor's step-sensitivity profile"
    off = _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=predicted,predictor={folder},sensitivity=false")
    assert off.accelerators[0]["sensitivity"].startswith("none")
    avg = _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=average,predictor={folder}")
    assert "average" in avg.accelerators[0]["map_source"]


def test_predictor_for_another_model_is_refused(load_tiny, tiny_predictor):
    folder, _ = tiny_predictor
    cog = load_tiny("tiny-cogvideox")
    with pytest.raises(ConfigError, match="trained for WanTransformer3DModel"):
        _gen(cog, f"mapguided:speedup=2,predictor={folder}")


def test_predictor_for_another_size_is_refused_or_stated(wan, tiny_predictor):
    folder, _ = tiny_predictor
    with pytest.raises(ConfigError, match="calibrated at"):
        _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=predicted,predictor={folder}", height=32, width=32)


def test_outside_its_calibrated_guidance_the_predictor_is_not_trusted(wan, tiny_predictor):
    """Outside the guidance scales it was calibrated at, the predicted map is not trusted: with max_error given,
    map=auto records the map (and says why) and map=predicted is refused; without, the bound is off and the cache
    computes everything with a warning. Inside, the predictor is used."""
    from kinegen.models.map_predictor import MapPredictor

    folder, _ = tiny_predictor
    calibrated = MapPredictor.load(folder).config.trained_guidance
    assert len(calibrated) == 1
    other = calibrated[0] + 2.0
    spec = f"mapguided:speedup=2,max_error=inf,overhead=0,predictor={folder}"
    res = _gen(wan, spec, guidance=other)
    assert res.accelerators[0]["map_source"].startswith("recorded")
    assert f"calibrated at guidance {calibrated[0]:g}" in res.accelerators[0]["map_source"]
    with pytest.raises(ConfigError, match="outside that range"):
        _gen(wan, spec + ",map=predicted", guidance=other)
    same = _gen(wan, spec, guidance=calibrated[0])
    assert same.accelerators[0]["map_source"] == "predicted by the Map Predictor"
    # without max_error the bound would rest on that unmeasured setting: caching is off, nothing is recorded
    dense = _gen(wan, guidance=other, steps=20)
    with pytest.warns(FidelityWarning, match="caching is off"):
        off = _gen(wan, f"mapguided:overhead=0,predictor={folder}", guidance=other, steps=20)
    st = off.accelerators[0]
    assert st["map_source"].startswith("none:") and "caching is off" in st["warning"] and st["max_error"] == 0
    assert st["block_evaluations_executed"] == st["block_evaluations"]
    np.testing.assert_array_equal(dense.frames, off.frames)


def test_without_a_predictor_auto_falls_back_and_says_so(wan):
    res = _gen(wan, "mapguided:speedup=2,max_error=inf,overhead=0")
    assert "no trained Map Predictor ships for tiny-wan" in res.accelerators[0]["map_source"]
    with pytest.raises(ConfigError, match="needs a trained Map Predictor"):
        _gen(wan, "mapguided:speedup=2,map=predicted")


@pytest.mark.parametrize("spec, fragment", [
    ("mapguided:speedup=0.5", "speedup must be >= 1"),
    ("mapguided:speedup=9,max_reuse=2", r"not reachable with 8 steps.*at most 2\.00x"),
    ("mapguided:reuse=teleport", "reuse must be one of output, residual, extrapolate"),
    ("mapguided:map=magic", "map must be one of"),
])
def test_bad_settings_fail_before_the_run(wan, spec, fragment):
    with pytest.raises(ConfigError, match=fragment):
        _gen(wan, spec)


def test_no_adapter_is_a_clear_error():
    with pytest.raises(Exception, match="adapter|Adapter|supported"):
        apply_map_guided_cache(torch.nn.Linear(2, 2), MapGuidedCacheConfig(), RunInfo(num_inference_steps=4))


def test_composes_with_an_attention_accelerator(wan):
    alone = _gen(wan, "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded").frames
    both = _gen(wan, "mapguided:speedup=2,max_error=inf,overhead=0,map=recorded",
                "dense-attention:backend=_native_math")
    assert [a["name"] for a in both.accelerators] == ["mapguided", "dense-attention"]
    np.testing.assert_allclose(both.frames, alone, atol=2e-3)  # same plan; math vs fused SDPA kernel rounding
    assert all(getattr(m.processor, "_attention_backend", None) is None
               for m in wan.transformer.modules() if hasattr(m, "processor") and m.processor is not None)


def test_sensitivity_probes_follow_the_group_size(wan, monkeypatch):
    import kinegen.caching.map_guided as mg
    from kinegen.training.calibrate import measure_sensitivity

    probes, real = [], mg.apply_fixed_plan

    def spy(pipe, plan, run, group_size=1, **kw):
        probes.append((plan.copy(), group_size))
        return real(pipe, plan, run, group_size=group_size, **kw)

    monkeypatch.setattr(mg, "apply_fixed_plan", spy)
    out = measure_sensitivity(wan, ["a red circle moving right"], group_size=2, steps=4, height=64, width=64,
                              frames=9)
    # tiny-wan's two blocks form one group: one probe per inner step, reusing that group at that step only
    expected = [np.array([[t != s] for t in range(4)]) for s in (1, 2)]
    assert [g for _, g in probes] == [2, 2]
    assert all(np.array_equal(p, e) for (p, _), e in zip(probes, expected, strict=True))
    profile = np.array(out["profile"])
    assert profile.shape == (4,) and np.isfinite(profile).all() and (profile > 0).all()
    assert profile[0] == profile[1] and profile[-1] == profile[-2] and profile.mean() == pytest.approx(1.0)


def test_a_fixed_plan_is_executed_and_a_wrong_shape_is_refused(wan):
    from kinegen.caching.map_guided import apply_fixed_plan

    run = RunInfo(num_inference_steps=4)
    with pytest.raises(ConfigError, match=r"\[steps, groups\] = \(4, 2\)"):  # tiny-wan has 2 groups
        apply_fixed_plan(wan, np.ones((4, 1), dtype=bool), run)
    assert getattr(wan.transformer, "_kinegen_mapguided", None) is None
    plan = np.ones((4, 2), dtype=bool)
    plan[2] = False
    with apply_fixed_plan(wan, plan, run, note="probe") as handle:
        wan(prompt="a red circle", num_inference_steps=4, guidance_scale=4.0, height=64, width=64, num_frames=9,
            output_type="np")
        st = handle.stats()
    assert st["plan"] == plan.astype(int).tolist() and st["map_source"] == "probe"
    assert st["block_evaluations_executed"] == 2 * int(plan.sum())  # cond and uncond branches
    assert getattr(wan.transformer, "_kinegen_mapguided", None) is None


def test_the_step_count_comes_from_the_run_only(wan):
    with pytest.raises(ConfigError, match="mapguided needs the number of denoising steps"):
        apply_map_guided_cache(wan, MapGuidedCacheConfig(map="recorded"), RunInfo(dense_call=lambda: None))
    with pytest.raises(ConfigError, match="unknown key 'num_inference_steps'"):
        accelerate(wan, "mapguided:num_inference_steps=8")


def test_map_sources_are_a_registry_of_the_config_names():
    from kinegen.caching.map_guided import MAP_SOURCES
    from kinegen.caching.map_guided_sources import SOURCES, SourceContext, make_source

    assert tuple(SOURCES) == MAP_SOURCES
    bad = SourceContext(MapGuidedCacheConfig(), RunInfo(num_inference_steps=4), None, [])
    bad.config.map = "magic"
    with pytest.raises(ConfigError, match="valid: auto, predicted, average, recorded, oracle"):
        make_source(bad)


def test_predictor_from_other_weights_is_refused(wan, tiny_predictor):
    from kinegen.models.map_predictor import MapPredictor, fingerprints_match, weights_fingerprint

    folder, _ = tiny_predictor
    recorded = MapPredictor.load(folder).config.transformer_fingerprint
    assert fingerprints_match(recorded, weights_fingerprint(wan.transformer))
    assert fingerprints_match(recorded, weights_fingerprint(copy.deepcopy(wan.transformer).to(torch.bfloat16)))
    saved = copy.deepcopy(wan.transformer.state_dict())
    try:
        with torch.no_grad():
            for p in wan.transformer.parameters():  # "retrained": every weight moved
                p.add_(0.05 * torch.randn_like(p))
        with pytest.raises(ConfigError, match="calibrated on other weights"):
            _gen(wan, f"mapguided:speedup=2,max_error=inf,overhead=0,map=predicted,predictor={folder}")
    finally:
        wan.transformer.load_state_dict(saved)


# ---------------------------------------------------------------------------- the fidelity bound


@pytest.mark.parametrize("bound", [0.05, 0.2, 1.0])
def test_fastest_within_is_the_fastest_plan_under_the_bound(bound):
    guards = P.Guards(warmup=1, cooldown=1, max_reuse=4)
    v = _random_map(20, 6, seed=4) / 10
    plan, speedup = P.fastest_within(P.nested_plan, v, bound, guards)
    assert P.error_per_step(plan) <= bound
    assert plan.compute_fraction == pytest.approx(P.nested_plan(v, speedup, guards).compute_fraction)
    top = P.max_speedup(20, guards)
    if speedup < top:  # a little faster passes the bound: the search stopped at the edge
        assert P.error_per_step(P.nested_plan(v, min(top, speedup + 0.02), guards)) > bound
    assert P.fastest_within(P.nested_plan, v, 0.0, guards)[0].compute.all()  # no error allowed: compute all
    assert P.fastest_within(P.nested_plan, v, float("inf"), guards)[1] == top


def test_fastest_within_searches_the_nested_frontier_by_price():
    """The nested planner is searched along its price frontier (one bisection): the plan is within the bound and
    at least as fast as bisecting on the requested speedup (the generic search every planner gets)."""
    guards = P.Guards(warmup=1, cooldown=1, max_reuse=4)
    v = _random_map(20, 6, seed=7) / 10

    def no_frontier(*a):
        return P.nested_plan(*a)

    calls = []

    def counted(*a):
        calls.append(1)
        return P.nested_plan(*a)

    for bound in (0.03, 0.1, 0.3):
        plan, speedup = P.fastest_within(P.nested_plan, v, bound, guards)
        generic, _ = P.fastest_within(no_frontier, v, bound, guards)
        assert P.error_per_step(plan) <= bound
        assert plan.compute_fraction <= generic.compute_fraction + 1e-9
        assert speedup == pytest.approx(P.transformer_speedup(plan, 0.0))
    P.fastest_within(counted, v, 0.1, guards)
    assert len(calls) > 5  # the generic search plans once per halving of the speedup range


def _bounded(wan, spec, steps=8):
    import warnings

    from kinegen.errors import FidelityWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FidelityWarning)
        r = kinegen.generate(wan, "a red circle", seed=0, steps=steps, accelerators=[spec])
    return r.accelerators[0], [w for w in caught if issubclass(w.category, FidelityWarning)]


def test_a_speed_request_past_the_bound_is_served_at_the_bound_with_a_warning(wan):
    free, warned = _bounded(wan, "mapguided:speedup=2.5,max_error=inf,map=recorded,overhead=0")
    assert not warned and "warning" not in free and 2.5 <= free["chosen_speedup"] <= 2.5 * 1.1  # whole steps
    bound = free["predicted_error_per_step"] / 3  # a third of what 2.5x costs on this model
    st, warned = _bounded(wan, f"mapguided:speedup=2.5,max_error={bound},map=recorded,overhead=0")
    assert st["predicted_error_per_step"] <= bound < free["predicted_error_per_step"]
    assert 1.0 <= st["chosen_speedup"] < 2.5 and st["max_error"] == bound
    assert len(warned) == 1 and st["warning"] == str(warned[0].message)
    assert "speedup=2.5 would reach a predicted error" in st["warning"] and "max_error=inf forces" in st["warning"]


def test_the_default_request_is_the_bound(wan):
    from kinegen.caching.map_guided_config import DEFAULT_MAX_ERROR, HARD_MAX_ERROR

    assert 0 < DEFAULT_MAX_ERROR <= HARD_MAX_ERROR
    config = MapGuidedCacheConfig()
    assert config.speedup is None and config.error_bound(20) == DEFAULT_MAX_ERROR
    assert MapGuidedCacheConfig(speedup=2).error_bound(50) == HARD_MAX_ERROR
    st, warned = _bounded(wan, "mapguided:map=recorded,overhead=0", steps=20)
    assert not warned and st["requested_speedup"] is None and st["max_error"] == DEFAULT_MAX_ERROR
    assert st["predicted_error_per_step"] <= DEFAULT_MAX_ERROR and st["chosen_speedup"] >= 1.0


def test_below_the_calibrated_step_counts_caching_is_off_and_says_so(wan):
    from kinegen.caching.map_guided_config import MIN_BOUND_STEPS

    assert MIN_BOUND_STEPS == 20
    for spec in ("mapguided:map=recorded,overhead=0", "mapguided:speedup=2,map=recorded,overhead=0"):
        st, warned = _bounded(wan, spec, steps=8)
        assert st["chosen_speedup"] == 1.0 and st["achieved_compute_fraction"] == 1.0 and st["max_error"] == 0.0
        assert len(warned) == 1 and "at 8 steps (fewer than 20)" in st["warning"]
    st, warned = _bounded(wan, "mapguided:speedup=2,max_error=1e6,map=recorded,overhead=0", steps=8)
    assert not warned and st["chosen_speedup"] > 1.0  # an explicit bound applies at any step count
    with pytest.raises(ConfigError, match="max_error must be >= 0"):
        kinegen.parse_spec("mapguided:max_error=-1")
