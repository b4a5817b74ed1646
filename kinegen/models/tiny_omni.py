"""Tiny random omni thinkers (transformers' Qwen2.5-Omni and Qwen3-Omni classes at toy sizes) and inputs laid out
the way their processors lay them out, so that pruning is tested on the real classes without a download.

Token ids are small (a vocabulary of 64); a clip of ``seconds`` at 2 fps gives one video grid per second (two frames
per temporal patch) of ``grid`` x ``grid`` merged tokens. Qwen2.5-Omni: 25 audio tokens per second, interleaved in
2-second chunks as its processor does with ``use_audio_in_video=True``. Qwen3-Omni: 13 audio tokens per second,
interleaved token by token in time order (its processor's rule), with one deepstack layer.
"""

from __future__ import annotations

import torch

SPECIAL = {"audio": 10, "image": 11, "video": 12, "audio_bos": 13, "audio_eos": 14, "vision_bos": 15,
           "vision_eos": 16}
VOCAB = 64


def build_tiny_qwen2_5_omni_thinker(seed: int = 0):
    """A 2-layer Qwen2.5-Omni thinker (vision patch 4 with a 2x2 merge: 8 pixels per token; 16 mel bins)."""
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Qwen2_5OmniThinkerConfig(
        audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=32, n_window=100, max_source_positions=1500),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=16, out_hidden_size=32,
                           fullatt_block_indexes=[1]),
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}),
        position_id_per_seconds=25, seconds_per_chunk=2,
        audio_token_index=SPECIAL["audio"], image_token_index=SPECIAL["image"], video_token_index=SPECIAL["video"],
        audio_start_token_id=SPECIAL["audio_bos"], audio_end_token_id=SPECIAL["audio_eos"],
        vision_start_token_id=SPECIAL["vision_bos"], vision_end_token_id=SPECIAL["vision_eos"])
    return Qwen2_5OmniThinkerForConditionalGeneration(cfg).eval()


def build_tiny_qwen3_omni_thinker(seed: int = 0):
    """A 2-layer Qwen3-Omni (MoE, 4 experts) thinker with one deepstack layer; 13 position ids per second."""
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    torch.manual_seed(seed)
    ids = {f"{k}_token_id": v for k, v in SPECIAL.items() if k in ("audio", "image", "video")}
    ids.update(audio_start_token_id=SPECIAL["audio_bos"], audio_end_token_id=SPECIAL["audio_eos"],
               vision_start_token_id=SPECIAL["vision_bos"], vision_end_token_id=SPECIAL["vision_eos"])
    cfg = Qwen3OmniMoeThinkerConfig(
        audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=32, n_window=50, n_window_infer=800, conv_chunksize=500,
                          downsample_hidden_size=16, max_source_positions=1500),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]),
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_intermediate_size=32,
                         num_experts=4, num_experts_per_tok=2,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2],
                                          "mrope_interleaved": True}),
        position_id_per_seconds=13, **ids)
    return Qwen3OmniMoeThinkerForConditionalGeneration(cfg).eval()


def tiny_av_inputs(seconds: int = 4, grid: int = 2, prefix: tuple[int, ...] = (1, 2),
                   suffix: tuple[int, ...] = (3, 4, 5), seed: int = 0, family: str = "qwen2_5_omni") -> dict:
    """Random media and the interleaved ids of one clip with sound, for the tiny thinker of ``family``
    (``qwen2_5_omni`` or ``qwen3_omni_moe``).

    ``seconds`` must be even (whole 2-second chunks). Returns the thinker's keyword arguments (batch of one).
    """
    if seconds % 2:
        raise ValueError("seconds must be even (whole 2-second chunks)")
    if family not in ("qwen2_5_omni", "qwen3_omni_moe"):
        raise ValueError(f"unknown family {family!r}; valid: qwen2_5_omni, qwen3_omni_moe")
    g = torch.Generator().manual_seed(seed)
    t, hw = seconds, grid * 2  # one temporal grid per second; patches per side before the 2x2 merge
    pixel_values_videos = torch.randn(t * hw * hw, 3 * 2 * 4 * 4, generator=g)
    mel = seconds * 100
    input_features = torch.randn(1, 16, mel, generator=g)
    per_grid = grid * grid
    ids = list(prefix) + [SPECIAL["vision_bos"], SPECIAL["audio_bos"]]
    if family == "qwen2_5_omni":
        for _ in range(seconds // 2):
            ids += [SPECIAL["video"]] * (2 * per_grid) + [SPECIAL["audio"]] * 50
    else:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

        n_audio = int(_get_feat_extract_output_lengths(torch.tensor(mel), 50))
        video_t = [13 * s for s in range(t) for _ in range(per_grid)]
        v = a = 0
        while v < len(video_t) and a < n_audio:  # time order; video first on ties
            if video_t[v] <= a:
                ids.append(SPECIAL["video"])
                v += 1
            else:
                ids.append(SPECIAL["audio"])
                a += 1
        ids += [SPECIAL["video"]] * (len(video_t) - v) + [SPECIAL["audio"]] * (n_audio - a)
    ids += [SPECIAL["audio_eos"], SPECIAL["vision_eos"], *suffix]
    input_ids = torch.tensor([ids])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "pixel_values_videos": pixel_values_videos, "video_grid_thw": torch.tensor([[t, hw, hw]]),
            "video_second_per_grid": torch.tensor([1.0]), "input_features": input_features,
            "feature_attention_mask": torch.ones(1, mel, dtype=torch.long), "use_audio_in_video": True}


def left_pad_batch(*inputs: dict, pad_id: int = 0) -> dict:
    """Several :func:`tiny_av_inputs` as one left-padded batch (media concatenated in row order)."""
    L = max(x["input_ids"].shape[1] for x in inputs)
    ids, mask = [], []
    for x in inputs:
        n = x["input_ids"].shape[1]
        ids.append(torch.cat([torch.full((1, L - n), pad_id), x["input_ids"]], 1))
        mask.append(torch.cat([torch.zeros(1, L - n, dtype=torch.long), x["attention_mask"]], 1))
    mel = max(x["input_features"].shape[-1] for x in inputs)
    feats = torch.cat([torch.nn.functional.pad(x["input_features"], (0, mel - x["input_features"].shape[-1]))
                       for x in inputs])
    fmask = torch.cat([torch.nn.functional.pad(x["feature_attention_mask"],
                                               (0, mel - x["feature_attention_mask"].shape[-1])) for x in inputs])
    return {"input_ids": torch.cat(ids), "attention_mask": torch.cat(mask),
            "pixel_values_videos": torch.cat([x["pixel_values_videos"] for x in inputs]),
            "video_grid_thw": torch.cat([x["video_grid_thw"] for x in inputs]),
            "video_second_per_grid": torch.cat([x["video_second_per_grid"] for x in inputs]),
            "input_features": feats, "feature_attention_mask": fmask, "use_audio_in_video": True}
