"""Fuzzing the spec parsers and the request validators with hypothesis: for any text or value they either return a
well-formed result or raise Kinegen's own error (a KinegenError subclass) with a message. A bare ValueError,
TypeError, KeyError, IndexError or AttributeError is a bug, and so is a hang (each example has a deadline).

Deterministic (derandomize=True, no example database) and bounded (200 examples per property), so CI sees the same
examples every run; tests/test_bad_input.py pins the messages of the mistakes people actually make.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinegen.accelerators.base import ACCELERATORS, KINDS
from kinegen.accelerators.catalog import parse_spec
from kinegen.apps.service import AppConfig, Service
from kinegen.errors import InvalidRequestError, KinegenError
from kinegen.generation import MAX_FRAMES, MAX_PROMPT_CHARS, MAX_SIDE, MAX_STEPS, GenerationRequest
from kinegen.profiling.runner import DENSE, ProfileConfig, parse_config

FUZZ = settings(max_examples=200, deadline=timedelta(seconds=2), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def own_error(fn, *args, **kwargs):
    """``fn(...)``'s result, or None when it raised a KinegenError with a message; anything else propagates."""
    try:
        return fn(*args, **kwargs)
    except KinegenError as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        return None


# ---------------------------------------------------------------------------- strategies

NAMES = sorted(ACCELERATORS)
TRICKY = st.sampled_from(["0", "1", "-1", "0.5", "2", "nan", "-nan", "inf", "-inf", "1e999", "1e3", "none", "null",
                          "true", "maybe", "", " ", "2-8-8", "1/2/3", "auto", "dp", "residual", "9" * 40, "0x10",
                          "1_000"])
VALUES = st.one_of(
    TRICKY, TRICKY,
    st.integers(min_value=-10**30, max_value=10**30).map(str),
    st.floats().map(repr),
    st.text(max_size=8),
)
# Values aimed at each setting's type: nan passes every bound check, 1e999 is inf, "1e3" is no int...
TYPED = {
    float: st.sampled_from(["nan", "-nan", "NaN", "inf", "-inf", "1e999", "-1", "0", "0.5", "1", "1e-320", ""]),
    int: st.sampled_from(["0", "-1", "1", "3", "1e3", "2.5", "9" * 40, "", "nan", "0x10"]),
    bool: st.sampled_from(["true", "false", "maybe", "1", "yes", "", "none"]),
}


def setting_values(cls, key: str):
    """Values for one setting of a config class: aimed at its type, or anything."""
    typ = typing.get_type_hints(cls)[key]
    inner = [a for a in typing.get_args(typ) if a is not type(None)]
    base = inner[0] if inner and typing.get_origin(typ) is not tuple else typ
    typed = TYPED.get(base, st.sampled_from(["", "none", "2-8-8", "0-8-8", "1/2", "auto", "x"]))
    return st.one_of(typed, typed, VALUES)


def options(name: str):
    """``key=value,...`` for accelerator ``name``: mostly its own keys with values aimed at their types."""
    cls = ACCELERATORS[name].config_cls
    keys = [f.name for f in dataclasses.fields(cls)]
    own = st.sampled_from(keys).flatmap(lambda k: setting_values(cls, k).map(lambda v: f"{k}={v}"))
    junk = st.one_of(st.builds(lambda k, v: f"{k}={v}", st.text(max_size=6), VALUES), st.text(max_size=6),
                     st.sampled_from(keys).map(lambda k: f"{k.replace('_', '-')}=1"))
    return st.lists(st.one_of(own, own, own, junk), max_size=3).map(",".join)


OPTIONS = st.sampled_from(NAMES).flatmap(options)
NAMED_SPEC = st.sampled_from(NAMES).flatmap(lambda name: options(name).map(lambda o: f"{name}:{o}" if o else name))
SPEC = st.one_of(NAMED_SPEC, NAMED_SPEC, NAMED_SPEC, st.builds(lambda n, o: f"{n}:{o}", st.text(max_size=8), OPTIONS),
                 st.text(max_size=40))

ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.integers(0, 5000),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=4),
    st.lists(st.integers(), max_size=2), st.just(math.pi), st.just(10**400),
)
REQUEST_FIELDS = [f.name for f in dataclasses.fields(GenerationRequest) if f.name != "prompt"]
PROMPT = st.one_of(st.text(max_size=40), st.sampled_from(["", "   ", "a red circle moving right"]), ANYTHING)
REQUEST_KWARGS = st.fixed_dictionaries({"prompt": PROMPT},
                                       optional={name: ANYTHING for name in REQUEST_FIELDS})


# ---------------------------------------------------------------------------- what a good result looks like


def check_parsed(pair, kind=None) -> None:
    acc, config = pair
    assert ACCELERATORS[acc.name] is acc
    assert kind is None or acc.kind == kind
    assert isinstance(config, acc.config_cls)
    for f in dataclasses.fields(config):  # nan passes every bound check, so none may get through
        value = getattr(config, f.name)
        assert not (isinstance(value, float) and math.isnan(value)), f"{acc.name}: {f.name} is nan"


def check_request(r: GenerationRequest) -> None:
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    assert isinstance(r.prompt, str) and r.prompt.strip() and len(r.prompt) <= MAX_PROMPT_CHARS
    assert r.negative_prompt is None or isinstance(r.negative_prompt, str)
    assert r.steps is None or is_int(r.steps) and 1 <= r.steps <= MAX_STEPS
    assert r.frames is None or is_int(r.frames) and 1 <= r.frames <= MAX_FRAMES
    for side in (r.height, r.width):
        assert side is None or is_int(side) and 1 <= side <= MAX_SIDE
    for scale in (r.guidance, r.true_cfg_scale):
        assert scale is None or isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 <= scale <= 100
    assert is_int(r.seed) and 0 <= r.seed < 2**63
    assert r.image is None or isinstance(r.image, (str, os.PathLike)) or hasattr(r.image, "convert")
    json.dumps(r.to_dict())  # what the app's history stores


# ---------------------------------------------------------------------------- the properties


@FUZZ
@given(spec=SPEC, kind=st.sampled_from([None, *KINDS]))
def test_parse_spec(spec, kind):
    """parse_spec: an (accelerator, config) pair of the asked kind with no nan setting, or a ConfigError."""
    result = own_error(parse_spec, spec, kind=kind)
    if result is not None:
        check_parsed(result, kind)


@FUZZ
@given(text=st.one_of(st.lists(SPEC, max_size=3).map("+".join), st.sampled_from([DENSE, " none ", "+", "dense+"]),
                      st.text(max_size=40)))
def test_parse_config(text):
    """parse_config: dense, or specs with one parsed pair each and at most one accelerator per kind."""
    config = own_error(parse_config, text)
    if config is None:
        return
    assert isinstance(config, ProfileConfig) and config.label.strip()
    assert len(config.specs) == len(config.parsed)
    for pair in config.parsed:
        check_parsed(pair)
    kinds = [acc.kind for acc, _ in config.parsed]
    assert len(kinds) == len(set(kinds))
    assert config.specs or config.label == DENSE


@FUZZ
@given(kwargs=REQUEST_KWARGS)
def test_generation_request(kwargs):
    """GenerationRequest: every field in range and of its type once built, or an InvalidRequestError."""
    request = own_error(GenerationRequest, **kwargs)
    if request is not None:
        check_request(request)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A web service with small limits (no model is loaded: validation only)."""
    return Service(AppConfig(models=["tiny-wan"], gan_models=[], output_dir=tmp_path_factory.mktemp("fuzz-app"),
                             max_side=256, max_frames=33, max_steps=50, max_prompt_chars=100))


@FUZZ
@given(kwargs=REQUEST_KWARGS)
def test_service_check_request(service, kwargs):
    """Service.check_request on any request that builds: within the server's limits, or an InvalidRequestError."""
    request = own_error(GenerationRequest, **kwargs)
    if request is None:
        return
    try:
        service.check_request(request)
    except InvalidRequestError as e:
        assert "this server" in str(e)
        return
    c = service.config
    assert len(request.prompt) <= c.max_prompt_chars and len(request.negative_prompt or "") <= c.max_prompt_chars
    assert all(v is None or v <= c.max_side for v in (request.height, request.width))
    assert request.frames is None or request.frames <= c.max_frames
    assert request.steps is None or request.steps <= c.max_steps


NAME_OR_NONE = st.one_of(st.none(), st.just("none"), st.sampled_from(NAMES), st.text(max_size=12))


@FUZZ
@given(cache=NAME_OR_NONE, cache_options=st.one_of(st.none(), OPTIONS, st.text(max_size=30)),
       attention=NAME_OR_NONE, attention_options=st.one_of(st.none(), OPTIONS, st.text(max_size=30)))
def test_service_accelerator_specs(cache, cache_options, attention, attention_options):
    """Service.accelerator_specs (the app's accelerator menus): specs that parse as their kind, or a ConfigError."""
    specs = own_error(Service.accelerator_specs, cache, cache_options, attention, attention_options)
    if specs is None:
        return
    assert len(specs) <= 2
    kinds = [k for name, k in ((cache, "cache"), (attention, "attention")) if name and name != "none"]
    assert len(specs) == len(kinds)
    for spec, kind in zip(specs, kinds, strict=True):
        assert isinstance(spec, str)
        check_parsed(parse_spec(spec, kind=kind), kind)


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=6)),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)
DEFAULTS = st.one_of(JSON, st.dictionaries(st.sampled_from(["height", "width", "frames", "steps", "guidance", "fps"]),
                                           JSON, max_size=6))


@FUZZ
@given(data=DEFAULTS)
def test_generation_defaults_file(tmp_path_factory, data):
    """read_generation_defaults (a model folder's kinegen_defaults.json): positive ints and a finite guidance, or
    a ConfigError."""
    from kinegen.loading import GENERATION_DEFAULTS_FILE, read_generation_defaults

    folder = tmp_path_factory.getbasetemp() / "fuzz-defaults"
    folder.mkdir(exist_ok=True)
    (folder / GENERATION_DEFAULTS_FILE).write_text(json.dumps(data))  # NaN and Infinity too, as Python writes them
    defaults = own_error(read_generation_defaults, folder)
    if defaults is None:
        return
    for key, value in defaults.items():
        if key == "guidance":
            assert isinstance(value, float) and 0 <= value < math.inf
        else:
            assert type(value) is int and value >= 1
