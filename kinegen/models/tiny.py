"""Tiny random-weight pipelines built in code, one per supported family.

They have the real diffusers classes and the real data flow (tokenizer -> text encoder ->
transformer -> VAE) at toy sizes, so tests and a first run need no download. Weights are
random but deterministic (seeded), so two builds give the same outputs. Their output is
noise: they check plumbing, not quality.

The tokenizers are character-level ``tokenizers`` objects wrapped as
``PreTrainedTokenizerFast``; they save and load with ``AutoTokenizer``.
"""

from __future__ import annotations

import string

import torch


def char_tokenizer(model_max_length: int = 512):
    """A character-level tokenizer over printable ASCII, ending sequences with ``</s>``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "<s>": 3}
    for ch in string.printable:
        if ch not in "\x0b\x0c\r":
            vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>",
        model_max_length=model_max_length,
    )


VOCAB = 128  # covers the character vocabulary above (104 entries)


def _t5_encoder(d_model: int = 32, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    cfg = dict(vocab_size=VOCAB, d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=32, pad_token_id=0,
               eos_token_id=1, decoder_start_token_id=0)
    if umt5:
        return UMT5EncoderModel(UMT5Config(**cfg))
    return T5EncoderModel(T5Config(**cfg))


def _clip_text(hidden: int = 32):
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                                        projection_dim=hidden, pad_token_id=0, bos_token_id=3, eos_token_id=1))


def build_tiny_wan():
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=32, ffn_dim=48, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=char_tokenizer(512), text_encoder=_t5_encoder(umt5=True), vae=vae,
                       scheduler=scheduler, transformer=transformer)


def build_tiny_wan_ar():
    """tiny-wan's components in the chunk-by-chunk pipeline: chunks of 2 latent frames after a first of 1, a frame
    sink of 1 and a window of 5 latent frames."""
    from ..pipelines import WanAutoregressivePipeline

    wan = build_tiny_wan()
    return WanAutoregressivePipeline(tokenizer=wan.tokenizer, text_encoder=wan.text_encoder, vae=wan.vae,
                                     scheduler=wan.scheduler, transformer=wan.transformer, chunk_frames=2,
                                     sink_frames=1, window_frames=5)


def build_tiny_anyflow_far():
    """A tiny AnyFlow-FAR (diffusers' AnyFlowFARTransformer3DModel, FlowMapEulerDiscreteScheduler, tiny-wan's text
    encoder and VAE sizes) in Kinegen's AnyFlowFARPipeline: chunks of 2 latent frames after a first of 1, the 2 most
    recent committed chunks at full resolution and older ones compressed (1, 4, 4), as the released checkpoints."""
    from diffusers import AnyFlowFARTransformer3DModel, AutoencoderKLWan, FlowMapEulerDiscreteScheduler

    from ..pipelines.anyflow_far import KinegenAnyFlowFARPipeline

    transformer = AnyFlowFARTransformer3DModel(
        patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3, num_attention_heads=2,
        attention_head_dim=12, in_channels=16, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=48, num_layers=2,
        rope_max_seq_len=32, chunk_partition=(1, 2, 2, 2),
    )
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    return KinegenAnyFlowFARPipeline(tokenizer=char_tokenizer(512), text_encoder=_t5_encoder(umt5=True),
                                     transformer=transformer, vae=vae, scheduler=FlowMapEulerDiscreteScheduler())


def build_tiny_hunyuanvideo():
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import LlamaConfig, LlamaModel

    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=16,
        pooled_projection_dim=32, rope_axes_dim=(2, 4, 4), guidance_embeds=True,
    )
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True,
    )
    llama = LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                   pad_token_id=0, bos_token_id=3, eos_token_id=1))
    return HunyuanVideoPipeline(
        text_encoder=llama, tokenizer=char_tokenizer(512), transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=_clip_text(32),
        tokenizer_2=char_tokenizer(77),
    )


def build_tiny_cogvideox():
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel

    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
        text_embed_dim=32, num_layers=2, sample_width=4, sample_height=4, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=32, use_rotary_positional_embeddings=True,
    )
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=2,
        temporal_compression_ratio=4,
    )
    return CogVideoXPipeline(tokenizer=char_tokenizer(512), text_encoder=_t5_encoder(), vae=vae,
                             transformer=transformer, scheduler=CogVideoXDDIMScheduler(timestep_spacing="trailing"))


def _tiny_flux_components():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(4, 4, 8),
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5035,
    )
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_clip_text(32),
                tokenizer=char_tokenizer(77), text_encoder_2=_t5_encoder(), tokenizer_2=char_tokenizer(512),
                transformer=transformer)


def build_tiny_flux():
    from diffusers import FluxPipeline

    return FluxPipeline(**_tiny_flux_components())


def build_tiny_flux_kontext():
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**_tiny_flux_components())


BUILDERS = {
    "tiny-wan": build_tiny_wan,
    "tiny-wan-ar": build_tiny_wan_ar,
    "tiny-anyflow-far": build_tiny_anyflow_far,
    "tiny-hunyuanvideo": build_tiny_hunyuanvideo,
    "tiny-cogvideox": build_tiny_cogvideox,
    "tiny-flux": build_tiny_flux,
    "tiny-flux-kontext": build_tiny_flux_kontext,
}


def build_tiny_pipeline(name: str, seed: int = 0):
    """Build the tiny pipeline ``name`` with weights drawn from ``seed`` (global RNG left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = BUILDERS[name]()
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval()
    return pipe
