"""The bundled text-to-video model's parts, in diffusers' Wan architecture.

``kinegen-shapes-t2v`` is a WanPipeline at toy scale, trained here on the procedural shapes
data (``kinegen.data.shapes``): a word-level tokenizer over the caption vocabulary, a small
UMT5 encoder, a narrow AutoencoderKLWan (8 latent channels, 4x time and 8x space) and a
6-layer WanTransformer3DModel. The same folder loads with ``diffusers.WanPipeline``.
"""

from __future__ import annotations

MAX_SEQUENCE_LENGTH = 512  # WanPipeline's default; training pads text embeddings the same way
Z_DIM = 8


def build_tokenizer():
    """A word-level tokenizer over the caption vocabulary (lowercased; unknown words -> ``<unk>``)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from ..data.shapes import caption_vocabulary

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for w in caption_vocabulary():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=MAX_SEQUENCE_LENGTH)


def build_text_encoder(vocab_size: int):
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(
        vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        relative_attention_num_buckets=16, relative_attention_max_distance=64, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, dropout_rate=0.0))


def build_vae(latents_mean=None, latents_std=None):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=12, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True],
        latents_mean=list(latents_mean) if latents_mean is not None else [0.0] * Z_DIM,
        latents_std=list(latents_std) if latents_std is not None else [1.0] * Z_DIM,
    )


def build_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=Z_DIM, out_channels=Z_DIM,
        text_dim=64, freq_dim=64, ffn_dim=512, num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024,
    )


def build_scheduler(flow_shift: float = 3.0):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift,
                                   num_train_timesteps=1000)
