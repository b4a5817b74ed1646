"""OmniSelect measured (issue 22): exactness, accuracy against the peers, regime accuracy, and prefill time.

    python benchmarks/omniselect.py --part identity            # tiny random Qwen2.5-Omni and Qwen3-Omni thinkers
    python benchmarks/omniselect.py --part theta [--clips 40]    # the scorer's regime margin, on training clips
    python benchmarks/omniselect.py --part accuracy [--clips 50] [--model kinegen-shapes-omni]
    python benchmarks/omniselect.py --part prefill [--clips 20] [--rounds 3]

identity: keep=1.0 against the unpruned model on 5 random inputs of each family: max |logit difference| and
whether greedy generations (8 tokens) match.

theta: the bundled relevance scorer on the questions of ``--clips`` training clips: how often the regime rule picks
the regime each question calls for (video -> video-centric, audio -> audio-centric, both -> uniform), per margin.

accuracy: every question of ``--clips`` held-out procedural clips (kinegen.evaluation.omni), unpruned and with
OmniSelect and each peer (uniform, random, video-only, audio-only) at keep 0.3 and 0.45; OmniSelect's regime
against the regime each question calls for.

prefill: the prefill (the thinker's first forward: encoders, merge, language model), unpruned and with OmniSelect at
keep 0.3 with the relevance estimator's time added, timed alternately on the same inputs; on ``--model`` over
held-out clips, and on a thinker with Qwen2.5-Omni-3B's widths and two layers per tower (random weights, 10 s of
video at 448 x 252 and 2 fps with its sound), whose per-component times are also projected to the full depths (32
vision, 32 audio and 36 language layers).

Writes ``summary_<part>.json`` under ``--out`` (default benchmarks/results/omniselect).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

KEEPS = (0.3, 0.45)
PEERS = ("omniselect", "uniform", "random", "video-only", "audio-only")


def part_identity() -> dict:
    from kinegen.models.tiny_omni import build_tiny_qwen2_5_omni_thinker, build_tiny_qwen3_omni_thinker, tiny_av_inputs
    from kinegen.omniselect import OmniSelectConfig, apply_omniselect

    out = {}
    for family, build in (("qwen2_5_omni", build_tiny_qwen2_5_omni_thinker),
                          ("qwen3_omni_moe", build_tiny_qwen3_omni_thinker)):
        model = build(seed=0)
        diffs, same = [], []
        for seed in range(5):
            x = tiny_av_inputs(seconds=4 + 2 * (seed % 2), seed=seed, family=family)
            with torch.no_grad():
                ref = model(**x).logits
                gen_ref = model.generate(**x, max_new_tokens=8, min_new_tokens=8, do_sample=False)
                with apply_omniselect(model, OmniSelectConfig(keep=1.0)):
                    got = model(**x).logits
                    gen = model.generate(**x, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            diffs.append(float((got - ref).abs().max()))
            same.append(bool(torch.equal(gen, gen_ref)))
        out[family] = {"max_abs_logit_diff": max(diffs), "generations_equal": f"{sum(same)}/{len(same)}"}
        print(f"{family}: max |dlogit| {max(diffs):.3g}, generations equal {sum(same)}/{len(same)}", flush=True)
    return out


def part_accuracy(model: str, clips: int, seed: int) -> dict:
    from kinegen.evaluation.omni import evaluate_omni
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline

    pipe = OmniUnderstandingPipeline.load(model)
    rows = {}
    configs = [("none", None)] + [(f"{m}@{k}", f"omniselect:keep={k},method={m}") for k in KEEPS for m in PEERS]
    for name, spec in configs:
        r = evaluate_omni(pipe, clips, "held_out", seed=seed, prune=spec, captions=False)
        r.pop("records")
        rows[name] = r
        need = " ".join(f"{k} {v:.1%}" for k, v in r["by_need"].items())
        reg = r["regime_accuracy"] or {}
        print(f"{name:<18} {r['accuracy']:.1%} ({need}) kept {r['mean_media_keep']:.0%}"
              + (" regime " + " ".join(f"{k} {v:.0%}" for k, v in reg.items()) if reg else ""), flush=True)
    return {"model": model, "clips": clips, "relevance": type(pipe.relevance).__name__, "rows": rows}


def part_theta(clips: int, seed: int) -> dict:
    """Regime accuracy of the bundled scorer's scores against ``theta``, on training clips' questions (the held-out
    ones stay for the accuracy part)."""
    from kinegen.evaluation.omni import EXPECTED_REGIME, question_set
    from kinegen.omniselect.budget import choose_regime
    from kinegen.omniselect.trimodal import load_bundled_scorer
    from kinegen.training.omni import clip_media

    scorer = load_bundled_scorer()
    means, cache = [], {}
    for clip, q in question_set(clips, "train", seed + 1):
        if clip.seed not in cache:
            cache[clip.seed] = clip_media(clip)
        frames, audio = cache[clip.seed]
        s = scorer.score(frames, np.linspace(0, clip.seconds * (1 - 1 / 32), len(frames)), audio, 16000, q.text)
        means.append((*s.means(), s.has_query, q.needs))
    table = {}
    for theta in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0):
        ok = {k: [] for k in EXPECTED_REGIME}
        for a, v, has_query, needs in means:
            ok[needs].append(choose_regime(a, v, theta, has_query) == EXPECTED_REGIME[needs])
        table[theta] = {k: float(np.mean(x)) for k, x in ok.items() if x}
        table[theta]["mean"] = float(np.mean(list(table[theta].values())))
        print(f"theta {theta}: " + " ".join(f"{k} {x:.0%}" for k, x in table[theta].items()), flush=True)
    return {"clips": clips, "split": "train", "by_theta": table}


def _time_prefill(model, inputs, prune_cfg, relevance_s: float = 0.0) -> float:
    from kinegen.omniselect import apply_omniselect

    handle = apply_omniselect(model, prune_cfg) if prune_cfg is not None else None
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            model(**inputs, use_cache=True)
            return time.perf_counter() - t0 + relevance_s
    finally:
        if handle is not None:
            handle.remove()


def part_prefill_small(model: str, clips: int, rounds: int) -> dict:
    from kinegen.data.av_shapes import sample_av_clip
    from kinegen.omniselect import OmniSelectConfig
    from kinegen.pipelines.omni_understand import OmniUnderstandingPipeline
    from kinegen.training.omni import clip_media

    pipe = OmniUnderstandingPipeline.load(model)
    ratios, dense_t, pruned_t, rel_t = [], [], [], []
    cfg = OmniSelectConfig(keep=0.3)
    for i in range(clips):
        clip = sample_av_clip(10_000 + i, "held_out")
        frames, audio = clip_media(clip)
        question = "which shape makes the high tone?"
        x = pipe.processor([question], [frames], [audio])
        times = np.linspace(0, clip.seconds * (1 - 1 / 32), len(frames))
        t0 = time.perf_counter()
        scores = pipe.relevance.score(frames, times, audio, 16000, question)
        rel = time.perf_counter() - t0
        from kinegen.omniselect import apply_omniselect

        _time_prefill(pipe.thinker, x, None)  # warm
        for r in range(rounds):
            order = ("dense", "pruned") if r % 2 == 0 else ("pruned", "dense")
            got = {}
            for which in order:
                if which == "dense":
                    got[which] = _time_prefill(pipe.thinker, x, None)
                else:
                    h = apply_omniselect(pipe.thinker, cfg)
                    h.set_relevance(scores)
                    try:
                        with torch.no_grad():
                            t0 = time.perf_counter()
                            pipe.thinker(**x, use_cache=True)
                            got[which] = time.perf_counter() - t0 + rel
                    finally:
                        h.remove()
            dense_t.append(got["dense"])
            pruned_t.append(got["pruned"])
            rel_t.append(rel)
            ratios.append(got["dense"] / got["pruned"])
    out = {"model": model, "clips": clips, "rounds": rounds, "median_dense_s": statistics.median(dense_t),
           "median_pruned_s": statistics.median(pruned_t), "median_relevance_s": statistics.median(rel_t),
           "median_speedup": statistics.median(ratios), "tokens": int(x["input_ids"].shape[1])}
    print(f"{model}: prefill {out['median_dense_s'] * 1000:.1f} ms dense, {out['median_pruned_s'] * 1000:.1f} ms "
          f"at keep 0.3 with the estimator ({out['median_relevance_s'] * 1000:.1f} ms): "
          f"{out['median_speedup']:.2f}x", flush=True)
    return out


def qwen25_omni_3b_shaped(layers: int = 2):
    """Qwen2.5-Omni-3B's thinker widths with ``layers`` layers per tower (random weights, ids of the tiny vocab)."""
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    from kinegen.models.tiny_omni import SPECIAL

    torch.manual_seed(0)
    cfg = Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=layers, encoder_attention_heads=20, encoder_ffn_dim=5120,
                          d_model=1280, output_dim=2048, n_window=100),
        vision_config=dict(depth=layers, hidden_size=1280, intermediate_size=5120, num_heads=16, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=2048,
                           fullatt_block_indexes=[layers - 1]),
        text_config=dict(vocab_size=1024, hidden_size=2048, intermediate_size=11008, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
        audio_token_index=SPECIAL["audio"], image_token_index=SPECIAL["image"], video_token_index=SPECIAL["video"],
        audio_start_token_id=SPECIAL["audio_bos"], audio_end_token_id=SPECIAL["audio_eos"],
        vision_start_token_id=SPECIAL["vision_bos"], vision_end_token_id=SPECIAL["vision_eos"])
    return Qwen2_5OmniThinkerForConditionalGeneration(cfg).eval()


def synthetic_av_inputs(seconds: int = 10, height: int = 252, width: int = 448) -> dict:
    """A clip's thinker inputs at Qwen2.5-Omni's real patching (14-pixel patches, 2x2 merge, 2 fps), random media."""
    from kinegen.models.tiny_omni import SPECIAL

    g = torch.Generator().manual_seed(0)
    gh, gw = height // 14, width // 14
    per_grid = gh * gw // 4
    pixel = torch.randn(seconds * gh * gw, 3 * 2 * 14 * 14, generator=g)
    mel = seconds * 100
    ids = [1, 2, SPECIAL["vision_bos"], SPECIAL["audio_bos"]]
    for _ in range(seconds // 2):
        ids += [SPECIAL["video"]] * (2 * per_grid) + [SPECIAL["audio"]] * 50
    ids += [SPECIAL["audio_eos"], SPECIAL["vision_eos"], 3, 4, 5, 6, 7, 8]
    input_ids = torch.tensor([ids])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "pixel_values_videos": pixel,
            "video_grid_thw": torch.tensor([[seconds, gh, gw]]), "video_second_per_grid": torch.tensor([1.0]),
            "input_features": torch.randn(1, 128, mel, generator=g),
            "feature_attention_mask": torch.ones(1, mel, dtype=torch.long), "use_audio_in_video": True}


def part_prefill_3b(rounds: int, layers: int = 2) -> dict:
    from kinegen.omniselect import OmniSelectConfig, apply_omniselect

    model = qwen25_omni_3b_shaped(layers)
    x = synthetic_av_inputs()
    n = int(x["input_ids"].shape[1])
    parts: dict[str, list[float]] = {k: [] for k in ("vision", "audio", "lm_dense", "lm_pruned", "dense", "pruned")}
    seen = {}

    def grab(module, args, kwargs):
        seen["embeds"], seen["pos"], seen["mask"] = kwargs["inputs_embeds"], kwargs["position_ids"], kwargs[
            "attention_mask"]

    lm = model.model.language_model
    with torch.no_grad():
        _time_prefill(model, x, None)  # warm
        for r in range(rounds):
            for which in (("dense", "pruned") if r % 2 == 0 else ("pruned", "dense")):
                parts[which].append(_time_prefill(model, x, OmniSelectConfig(keep=0.3) if which == "pruned" else None))
            t0 = time.perf_counter()
            model.model.visual(x["pixel_values_videos"], grid_thw=x["video_grid_thw"])
            parts["vision"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.model.get_audio_features(x["input_features"], x["feature_attention_mask"])
            parts["audio"].append(time.perf_counter() - t0)
            for which in ("dense", "pruned"):
                h = apply_omniselect(model, OmniSelectConfig(keep=0.3)) if which == "pruned" else None
                hook = lm.register_forward_pre_hook(grab, with_kwargs=True)
                try:
                    model(**x, use_cache=True)
                finally:
                    hook.remove()
                    if h is not None:
                        h.remove()
                t0 = time.perf_counter()
                lm(inputs_embeds=seen["embeds"], position_ids=seen["pos"], attention_mask=seen["mask"], use_cache=True)
                parts[f"lm_{which}"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in parts.items()}
    scale = {"vision": 32 / layers, "audio": 32 / layers, "lm": 36 / layers}
    full_dense = med["vision"] * scale["vision"] + med["audio"] * scale["audio"] + med["lm_dense"] * scale["lm"]
    full_pruned = med["vision"] * scale["vision"] + med["audio"] * scale["audio"] + med["lm_pruned"] * scale["lm"]
    out = {"layers_per_tower": layers, "tokens": n, "rounds": rounds, "median_s": med,
           "measured_speedup": med["dense"] / med["pruned"], "lm_speedup": med["lm_dense"] / med["lm_pruned"],
           "projected_full_depth_speedup": full_dense / full_pruned,
           "projected_full_depth_s": {"dense": full_dense, "pruned": full_pruned}}
    print(f"3B-shaped, {layers} layers per tower, {n} tokens: prefill {med['dense']:.2f} s dense, "
          f"{med['pruned']:.2f} s at keep 0.3 ({out['measured_speedup']:.2f}x; language model "
          f"{out['lm_speedup']:.2f}x); projected to full depth {full_dense:.1f} s -> {full_pruned:.1f} s "
          f"({out['projected_full_depth_speedup']:.2f}x)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["identity", "theta", "accuracy", "prefill"], required=True)
    ap.add_argument("--model", default="kinegen-shapes-omni")
    ap.add_argument("--clips", type=int, default=None, help="clips (accuracy: 50, prefill: 20)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/omniselect")
    args = ap.parse_args()
    from kinegen.media import atomic_write_text

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "identity":
        result = part_identity()
    elif args.part == "theta":
        result = part_theta(args.clips or 40, args.seed)
    elif args.part == "accuracy":
        result = part_accuracy(args.model, args.clips or 50, args.seed)
    else:
        result = {"small": part_prefill_small(args.model, args.clips or 20, args.rounds),
                  "qwen2_5_omni_3b_shaped": part_prefill_3b(args.rounds)}
    result["command"] = "python benchmarks/omniselect.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if v is not None and k != "out")
    atomic_write_text(out / f"summary_{args.part}.json", json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / f'summary_{args.part}.json'}")


if __name__ == "__main__":
    main()
