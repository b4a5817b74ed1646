"""Model-family adapters: blocks, self-attention modules and token layouts against real forwards."""

from __future__ import annotations

import pytest
import torch

import kinegen
from kinegen.adapters import ADAPTERS, TokenLayout, get_adapter
from kinegen.errors import UnsupportedModelError

# model -> (request, expected grid (F, H, W) after patchify, text position)
CASES = {
    # 9 frames -> 3 latent frames; 64 px / 8 (VAE) / 2 (patch) = 4
    "tiny-wan": (dict(frames=9, height=64, width=64), (3, 4, 4), "none"),
    # 5 frames -> 2 latent frames; 32 / 8 / patch 1 = 4 (the tiny HunyuanVideo uses patch size 1)
    "tiny-hunyuanvideo": (dict(frames=5, height=32, width=48), (2, 4, 6), "last"),
    # 9 frames -> 3 latent frames; 32 / 8 / 2 = 2, 48 / 8 / 2 = 3
    "tiny-cogvideox": (dict(frames=9, height=32, width=48), (3, 2, 3), "first"),
    # 32 / 8 / 2 (packing) = 2, 64 / 8 / 2 = 4
    "tiny-flux": (dict(height=32, width=64), (1, 2, 4), "first"),
}


def test_registry_covers_every_family():
    assert set(ADAPTERS) == {"wan", "wan_ar", "hunyuan_video", "cogvideox", "flux", "flux_kontext", "mpgan",
                             "anyflow_far"}
    assert {a.transformer_class for a in ADAPTERS.values()} == {
        "WanTransformer3DModel", "HunyuanVideoTransformer3DModel", "CogVideoXTransformer3DModel",
        "FluxTransformer2DModel", "AnyFlowFARTransformer3DModel", None}


def test_unknown_pipeline_and_family_list_the_choices():
    from kinegen.adapters import adapter_for_family

    with pytest.raises(UnsupportedModelError, match="Supported pipelines: AnyFlowFARPipeline, CogVideoXPipeline"):
        get_adapter(object())
    with pytest.raises(UnsupportedModelError, match="known: wan, wan_ar, hunyuan_video"):
        adapter_for_family("sora")


@pytest.mark.parametrize("model, multiple, factor, calls", [
    ("tiny-wan", 16, 4, "separate"),        # VAE 8 x patch 2; CFG as two calls
    ("tiny-hunyuanvideo", 8, 4, "none"),    # the tiny HunyuanVideo uses patch size 1; guidance is distilled
    ("tiny-cogvideox", 16, 8, "batched"),   # latent frames decoded in pairs: 8k + 1 frames; CFG in one batch
    ("tiny-flux", 16, None, "none"),        # 2x2 packing; images
])
def test_family_rules_come_from_the_adapter(load_tiny, model, multiple, factor, calls):
    pipe = load_tiny(model)
    adapter = get_adapter(pipe)
    assert adapter.spatial_multiple(pipe) == multiple
    assert adapter.temporal_factor(pipe) == factor
    job = kinegen.prepare(pipe, "a red circle", guidance=5.0)
    assert job.run_info().guidance_calls == calls
    assert job.run_info().num_inference_steps == job.request.steps == pipe.kinegen_spec.steps


def test_accelerators_that_do_not_apply_fail_with_the_families_they_support(load_tiny):
    from kinegen.errors import ConfigError

    with pytest.raises(ConfigError, match="hva does not apply to flux models.*families wan, hunyuan_video, cogvideox"):
        kinegen.generate(load_tiny("tiny-flux"), "a red circle", steps=2, accelerators=["hva"])


def test_unknown_model_lists_supported():
    with pytest.raises(UnsupportedModelError, match="Supported transformers: AnyFlowFARTransformer3DModel, "
                                                   "CogVideoXTransformer3DModel, FluxTransformer2DModel"):
        get_adapter(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("model", list(CASES))
def test_blocks_and_attention_modules(load_tiny, model):
    pipe = load_tiny(model)
    t = pipe.transformer
    adapter = get_adapter(pipe)
    blocks = adapter.blocks(t)
    cfg = t.config
    expected = cfg.num_layers + cfg.get("num_single_layers", 0)
    assert len(blocks) == expected
    names = dict(t.named_modules())
    for name, block in blocks:
        assert names[name] is block
    attn = adapter.self_attention_modules(t)
    assert len(attn) == len(blocks)
    for name, module in attn:
        assert names[name] is module
        assert type(module).__name__.endswith("Attention")
        assert not getattr(module, "is_cross_attention", False)
    cross = adapter.cross_attention_modules(t)
    if adapter.text_mode == "cross":
        assert len(cross) == len(blocks) and all(m.is_cross_attention for _, m in cross)
    else:
        assert cross == []


@pytest.mark.parametrize("model", list(CASES))
def test_token_layout_matches_the_attention_sequence(load_tiny, model):
    """The layout computed from the forward's kwargs must equal what self-attention really sees."""
    pipe = load_tiny(model)
    request, grid, text_position = CASES[model]
    adapter = get_adapter(pipe)
    layouts: list[TokenLayout] = []
    seen: list[int] = []

    def on_forward(module, args, kwargs):
        layouts.append(adapter.token_layout(module, kwargs))

    def on_attention(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        enc = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        seen.append(hidden.shape[1] + (enc.shape[1] if enc is not None else 0))

    handles = [pipe.transformer.register_forward_pre_hook(on_forward, with_kwargs=True)]
    handles += [m.register_forward_pre_hook(on_attention, with_kwargs=True)
                for _, m in adapter.self_attention_modules(pipe.transformer)]
    try:
        kinegen.generate(pipe, "a red circle", steps=2, guidance=1.0, **request)
    finally:
        for h in handles:
            h.remove()
    layout = layouts[0]
    assert layout.grid == grid
    assert layout.text_position == text_position
    assert set(seen) == {layout.seq_len}, (seen, layout)
    f, h, w = grid
    assert layout.num_video_tokens == f * h * w
    sl = layout.video_slice
    assert sl.stop - sl.start == layout.num_video_tokens
    if text_position == "first":
        assert layout.text_slice == slice(0, layout.num_text_tokens) and sl.start == layout.num_text_tokens
    elif text_position == "last":
        assert sl.start == 0 and layout.text_slice == slice(layout.num_video_tokens, layout.seq_len)


def test_flux_kontext_reference_tokens_are_extra(load_tiny):
    from PIL import Image

    pipe = load_tiny("tiny-flux-kontext")
    adapter = get_adapter(pipe)
    layouts = []
    h = pipe.transformer.register_forward_pre_hook(
        lambda m, a, kw: layouts.append(adapter.token_layout(m, kw)), with_kwargs=True)
    try:
        kinegen.generate(pipe, "make it blue", steps=2, image=Image.new("RGB", (32, 32), (200, 20, 20)))
    finally:
        h.remove()
    layout = layouts[0]
    assert layout.grid == (1, 2, 2)
    assert layout.num_extra_tokens > 0
    assert layout.seq_len == layout.num_text_tokens + 4 + layout.num_extra_tokens
