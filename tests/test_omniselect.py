"""OmniSelect on tiny random Qwen2.5-Omni thinkers: exactness at keep=1, budgets, regimes, and decoding after a
pruned prefill (single rows, and batches with left padding)."""

import pytest
import torch

from kinegen.errors import ConfigError, UnsupportedModelError
from kinegen.models.tiny_omni import (
    build_tiny_qwen2_5_omni_thinker,
    build_tiny_qwen3_omni_thinker,
    left_pad_batch,
    tiny_av_inputs,
)
from kinegen.omniselect import OmniSelectConfig, RelevanceScores, apply_omniselect
from kinegen.omniselect.budget import choose_regime, counts_from_ratios, group_keep_ratios

NEW = 6


FAMILIES = ("qwen2_5_omni", "qwen3_omni_moe")


@pytest.fixture(scope="module")
def thinkers():
    return {"qwen2_5_omni": build_tiny_qwen2_5_omni_thinker(seed=0),
            "qwen3_omni_moe": build_tiny_qwen3_omni_thinker(seed=0)}


@pytest.fixture(scope="module")
def thinker(thinkers):
    return thinkers["qwen2_5_omni"]


def greedy(model, x, n=NEW):
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[:, x["input_ids"].shape[1]:]


def scores(audio, video, seconds=4, has_query=True):
    """Relevance of one clip: per-second frame and audio scores (``audio``/``video``: lists, one per second)."""
    t = torch.arange(seconds, dtype=torch.float64) + 0.5
    return RelevanceScores(t, torch.tensor(video, dtype=torch.float64), t, torch.tensor(audio, dtype=torch.float64),
                           has_query=has_query)


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_one_is_the_unpruned_model(thinkers, family):
    thinker = thinkers[family]
    x = tiny_av_inputs(seconds=4, family=family)
    with torch.no_grad():
        ref = thinker(**x).logits
        ref_gen = greedy(thinker, x)
        with apply_omniselect(thinker, OmniSelectConfig(keep=1.0)) as h:
            out = thinker(**x).logits
            gen = greedy(thinker, x)
            assert h.stats()["media_keep"] == 1.0
    assert torch.equal(out, ref)
    assert torch.equal(gen, ref_gen)
    # removed: the model is untouched
    assert torch.equal(thinker(**x).logits, ref)


def test_budget_and_invariants(thinker):
    x = tiny_av_inputs(seconds=8)
    ids = x["input_ids"][0]
    with torch.no_grad(), apply_omniselect(thinker, OmniSelectConfig(keep=0.3)) as h:
        logits = thinker(**x).logits
    s = h.stats()
    row = h.pruner.last["rows"][0]
    n_media = int(((ids == 10) | (ids == 12)).sum())
    n_text = ids.numel() - n_media
    assert s["media_tokens"] == n_media == 8 * 4 + 8 * 25
    assert s["media_kept"] == round(0.3 * n_media)
    assert s["tokens_after"] == n_text + s["media_kept"] == logits.shape[1]
    # every time group keeps some of each modality
    assert row["kept_video"] > 0 and row["kept_audio"] > 0
    assert row["video_kept_mask"].view(4, -1).any(1).all()  # four 2-second groups of 8 video tokens


def kept_mask(x, row):
    """The kept tokens of a one-row prefill, over its whole sequence."""
    ids = x["input_ids"][0]
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[(ids == 12).nonzero().flatten()] = row["video_kept_mask"]
    keep[(ids == 10).nonzero().flatten()] = row["audio_kept_mask"]
    return keep


def test_kept_tokens_keep_their_embeddings_and_positions(thinker):
    x = tiny_av_inputs(seconds=4)
    seen = []

    def grab(module, args, kwargs):  # registered after the pruner's hook, so it sees what the language model gets
        seen.append({k: kwargs[k] for k in ("inputs_embeds", "position_ids", "attention_mask")})

    lm = thinker.model.language_model
    with torch.no_grad():
        hook = lm.register_forward_pre_hook(grab, with_kwargs=True)
        thinker(**x)
        hook.remove()
        with apply_omniselect(thinker, OmniSelectConfig(keep=0.4)) as h:
            hook = lm.register_forward_pre_hook(grab, with_kwargs=True)
            thinker(**x)
            hook.remove()
    full, pruned = seen
    keep = kept_mask(x, h.pruner.last["rows"][0])
    assert int(keep.sum()) == h.stats()["tokens_after"] == pruned["inputs_embeds"].shape[1]
    assert torch.equal(pruned["inputs_embeds"], full["inputs_embeds"][:, keep])
    assert torch.equal(pruned["position_ids"], full["position_ids"][..., keep])
    assert pruned["attention_mask"].all()
    ids = x["input_ids"][0]
    assert keep[(ids != 10) & (ids != 12)].all()  # text and special tokens are never pruned


def test_pruned_generation_matches_a_manual_decode(thinker):
    """generate() after a pruned prefill equals a hand-written decode over the pruned sequence, with new tokens at
    the unpruned last position + 1 + t (reference note, section 4.3)."""
    x = tiny_av_inputs(seconds=4)
    captured = {}

    def grab(module, args, kwargs):
        captured.update(embeds=kwargs["inputs_embeds"], pos=kwargs["position_ids"])

    with torch.no_grad():
        hook = thinker.model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
        thinker(**x)
        hook.remove()
        with apply_omniselect(thinker, OmniSelectConfig(keep=0.3)) as h:
            gen = greedy(thinker, x)
            row = h.pruner.last["rows"][0]
        keep = kept_mask(x, row)
        embeds, pos = captured["embeds"][:, keep], captured["pos"][..., keep]
        last = int(captured["pos"].max())
        lm, head = thinker.model.language_model, thinker.lm_head
        ones = torch.ones(1, embeds.shape[1], dtype=torch.long)
        out = lm(inputs_embeds=embeds, position_ids=pos, attention_mask=ones, use_cache=True)
        cache, tokens = out.cache, []
        nxt = head(out.last_hidden_state[:, -1]).argmax(-1)
        for t in range(NEW):
            tokens.append(int(nxt))
            if t == NEW - 1:
                break
            p = torch.full((3, 1, 1), last + 1 + t)
            e = lm.embed_tokens(nxt[:, None])
            mask = torch.ones(1, embeds.shape[1] + t + 1, dtype=torch.long)
            out = lm(inputs_embeds=e, position_ids=p, attention_mask=mask, cache=cache, use_cache=True)
            cache = out.cache
            nxt = head(out.last_hidden_state[:, -1]).argmax(-1)
    assert gen[0].tolist() == tokens


@pytest.mark.parametrize("family,method", [(f, m) for f in FAMILIES for m in ("omniselect", "random", "uniform")])
def test_batches_with_left_padding_decode_like_single_rows(thinkers, family, method):
    """Rows of different lengths, pruned by different amounts, re-packed: each row generates what it does alone."""
    thinker = thinkers[family]
    a = tiny_av_inputs(seconds=4, seed=1, family=family)
    b = tiny_av_inputs(seconds=2, seed=2, prefix=(1, 2, 5, 6, 7), family=family)
    cfg = OmniSelectConfig(keep=0.35, method=method)
    with apply_omniselect(thinker, cfg):
        alone = [greedy(thinker, a)[0].tolist(), greedy(thinker, b)[0].tolist()]
        batch = greedy(thinker, left_pad_batch(a, b)).tolist()
    assert batch == alone


def test_audio_tokens_ranked_by_the_attention_they_receive(thinkers):
    for family, thinker in thinkers.items():
        with torch.no_grad(), apply_omniselect(thinker, OmniSelectConfig(keep=0.3)) as h:
            thinker(**tiny_av_inputs(seconds=4, family=family))
        assert h.stats()["audio_rule"] == "attention", family


def test_qwen3_deepstack_inputs_are_cut_with_the_sequence(thinkers):
    thinker = thinkers["qwen3_omni_moe"]
    x = tiny_av_inputs(seconds=4, family="qwen3_omni_moe")
    seen = []

    def grab(module, args, kwargs):
        seen.append({k: kwargs[k] for k in ("inputs_embeds", "visual_pos_masks", "deepstack_visual_embeds")})

    lm = thinker.model.language_model
    with torch.no_grad():
        hook = lm.register_forward_pre_hook(grab, with_kwargs=True)
        thinker(**x)
        hook.remove()
        with apply_omniselect(thinker, OmniSelectConfig(keep=0.3)) as h:
            hook = lm.register_forward_pre_hook(grab, with_kwargs=True)
            thinker(**x)
            hook.remove()
    full, pruned = seen
    keep = kept_mask(x, h.pruner.last["rows"][0])
    assert torch.equal(pruned["visual_pos_masks"], full["visual_pos_masks"][:, keep])
    vis_kept = keep[full["visual_pos_masks"][0]]
    assert int(vis_kept.sum()) == h.pruner.last["rows"][0]["kept_video"]
    for d_full, d_pruned in zip(full["deepstack_visual_embeds"], pruned["deepstack_visual_embeds"], strict=True):
        assert torch.equal(d_pruned, d_full[vis_kept])


def test_regime_steers_the_budget(thinker):
    x = tiny_av_inputs(seconds=4)
    with torch.no_grad(), apply_omniselect(thinker, OmniSelectConfig(keep=0.3, theta=1.0)) as h:
        h.set_relevance(scores(audio=[9, 9, 9, 9], video=[1, 1, 8, 8]))  # audio-centric
        thinker(**x)
        audio_row = h.pruner.last["rows"][0]
        h.set_relevance(scores(audio=[1, 1, 1, 1], video=[2, 2, 9, 9]))  # video-centric, relevance in group 1
        thinker(**x)
        video_row = h.pruner.last["rows"][0]
        h.set_relevance(scores(audio=[5, 5, 5, 5], video=[5.5, 5.5, 5.5, 5.5]))
        thinker(**x)
        uniform_row = h.pruner.last["rows"][0]
    assert (audio_row["regime"], video_row["regime"], uniform_row["regime"]) == ("audio", "video", "uniform")
    vmask = video_row["video_kept_mask"].view(2, -1)  # two 2-second groups of 8 video tokens
    assert vmask[1].sum() > vmask[0].sum()  # the relevant group keeps more
    umask = uniform_row["video_kept_mask"].view(2, -1)
    assert abs(int(umask[1].sum()) - int(umask[0].sum())) <= 1  # equal shares, up to rounding


def test_regime_rule_and_its_boundary():
    assert choose_regime(3.0, 5.0, theta=2.0) == "uniform"
    assert choose_regime(3.0, 5.01, theta=2.0) == "video"
    assert choose_regime(7.5, 5.0, theta=2.0) == "audio"
    assert choose_regime(0.0, 9.0, theta=2.0, has_query=False) == "uniform"


def test_group_budgets_average_to_the_target_and_follow_relevance():
    sizes = torch.tensor([50, 50, 50, 20])
    s = torch.tensor([0.0, 3.0, 1.0, 2.0])
    r = group_keep_ratios(s, sizes, keep=0.3)
    assert abs(float((r * sizes).sum() / sizes.sum()) - 0.3) < 0.005  # five refinement rounds, as the paper
    order = torch.argsort(s)
    assert torch.all(r[order][1:] >= r[order][:-1])  # monotone in relevance
    counts = counts_from_ratios(r, sizes, round(0.3 * 170))
    assert int(counts.sum()) == 51 and torch.all(counts <= sizes) and torch.all(counts >= 1)
    assert torch.equal(group_keep_ratios(torch.ones(4), sizes, keep=0.5), torch.full((4,), 0.5, dtype=torch.float64))


def test_bad_settings_and_models_are_refused():
    with pytest.raises(ConfigError, match=r"keep must be in \(0, 1\]"):
        OmniSelectConfig(keep=0.0)
    with pytest.raises(ConfigError, match="keep must be in"):
        OmniSelectConfig(keep=1.5)
    with pytest.raises(ConfigError, match="valid: omniselect, uniform"):
        OmniSelectConfig(method="fastv")
    with pytest.raises(UnsupportedModelError, match="Supported thinkers: Qwen2_5Omni"):
        apply_omniselect(torch.nn.Linear(2, 2))
