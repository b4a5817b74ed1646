"""diffusers' ``AnyFlowFARPipeline`` with exact cached attention, and frame counts turned into chunk partitions.

diffusers 0.42's ``AnyFlowCausalAttnProcessor`` (``models/transformers/transformer_anyflow_far.py``) pads queries, keys
and values with zeros to a multiple of 128 tokens for flex_attention's 128-token blocks (lines 171-181). The
cache-prefill and training forwards pass a ``BlockMask`` whose ``mask_mod`` masks that padding (``is_padding``, lines
898-948), but the denoising forward of each chunk (``_forward_inference``) passes ``attention_mask = None`` (line 1329),
and the flex backend then attends to every key (``models/attention_dispatch.py``, ``_native_flex_attention``, lines
3629-3630): each query also attends to the zero keys, each of score 0 and value 0, which takes softmax mass from the
real keys. A chunk of ``n`` tokens gets ``-n mod 128`` of them: none when ``n`` is a multiple of 128, 56 for a
three-frame chunk at 480x832 (4,680 tokens), 120 for a two-frame chunk of a 32x32 video (8 tokens).

:class:`ExactFARSelfAttention` runs that denoising forward on the exact sequence instead: the chunk's queries against
the cached keys of the earlier chunks (compressed tier, then full tier) followed by its own, all of which it may see,
in one SDPA call without padding or mask. The cache-prefill and training forwards, whose masks are right, go to
diffusers' processor unchanged. ``tests/test_anyflow.py`` checks the result against the whole sequence run with
diffusers' block-causal mask.
"""

from __future__ import annotations

import contextlib
import json

import torch
import torch.nn.functional as F
from diffusers import AnyFlowFARPipeline
from diffusers.models.transformers.transformer_anyflow_far import apply_rotary_emb

from ..errors import InvalidRequestError


def far_chunk_partition(latent_frames: int, configured, full_chunk_limit: int, temporal_factor: int = 4) -> list[int]:
    """Latent frames per chunk for a video of ``latent_frames`` latent frames.

    The model's ``configured`` partition when the counts match (what diffusers uses by default); otherwise its first
    chunk, then chunks of its second chunk's size, and a shorter last chunk for what is left (the released
    ``(1, 3, ..., 3, 2)`` is this rule for 21 frames). diffusers allocates the compressed tier for
    ``chunks - full_chunk_limit + 1`` chunks (``pipeline_anyflow_far.py``, ``__call__`` step 6: a negative size
    fails), so a video needs at least ``full_chunk_limit - 1`` chunks; fewer is refused with the smallest video
    frame count (``temporal_factor * (latent - 1) + 1``) that works.
    """
    configured = [int(c) for c in configured]
    first = configured[0]
    size = configured[1] if len(configured) > 1 else first
    need = max(1, full_chunk_limit - 1)
    parts: list[int] = []
    if latent_frames == sum(configured):
        parts = configured
    elif latent_frames >= first:
        rest = latent_frames - first
        parts = [first] + [size] * (rest // size) + ([rest % size] if rest % size else [])
    if len(parts) < need:
        smallest = max(first, first + (need - 2) * size + 1)  # a first chunk, full chunks, then one frame
        got = f"{len(parts)} chunk{'s' if len(parts) > 1 else ''}" if parts else "less than the first chunk"
        raise InvalidRequestError(
            f"AnyFlow-FAR generates chunk by chunk (a first chunk of {first} latent frames, then chunks of {size}) "
            f"and its KV cache needs at least {need} chunks; num_frames {temporal_factor * (latent_frames - 1) + 1} "
            f"gives {got}. Try num_frames {temporal_factor * (smallest - 1) + 1} or more.")
    return parts


class ExactFARSelfAttention:
    """Self-attention (``attn1``) of one AnyFlow-FAR block: the cache-reading forward on exact sequences, every other
    forward by ``stock`` (diffusers' ``AnyFlowCausalAttnProcessor``).

    Keys are cached before RoPE, as diffusers writes them (its cache layout is kept, so the prefill stays its own):
    the rotary phases of the cached and current keys are applied to the concatenation, as diffusers does.
    """

    def __init__(self, stock):
        self.stock = stock

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None,
                 kv_cache=None, kv_cache_flag=None):
        if kv_cache is None or kv_cache_flag["is_cache_step"]:
            return self.stock(attn, hidden_states, encoder_hidden_states=encoder_hidden_states,
                              attention_mask=attention_mask, rotary_emb=rotary_emb, kv_cache=kv_cache,
                              kv_cache_flag=kv_cache_flag)
        dtype = hidden_states.dtype
        q = attn.norm_q(attn.to_q(hidden_states)).to(dtype)  # diffusers' RMSNorm may return float32
        k = attn.norm_k(attn.to_k(hidden_states)).to(dtype)
        v = attn.to_v(hidden_states)
        q, k, v = (t.unflatten(2, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))  # [B, heads, tokens, dim]
        n_comp, n_full = kv_cache_flag["num_cached_compressed_tokens"], kv_cache_flag["num_cached_full_tokens"]
        comp, full = kv_cache["compressed_cache"], kv_cache["full_cache"]
        k = torch.cat([comp[0, :, :, :n_comp], full[0, :, :, :n_full], k], dim=2)
        v = torch.cat([comp[1, :, :, :n_comp], full[1, :, :, :n_full], v], dim=2)
        if rotary_emb is not None:
            q, k = apply_rotary_emb(q, rotary_emb["query"]), apply_rotary_emb(k, rotary_emb["key"])
        out = F.scaled_dot_product_attention(q, k, v)  # the last chunk sees all its history and itself: no mask
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


@contextlib.contextmanager
def exact_far_attention(transformer):
    """Run an ``AnyFlowFARTransformer3DModel``'s self-attention through :class:`ExactFARSelfAttention` inside the
    block; the processors it had are put back on exit (nested uses install nothing more)."""
    installed = []
    for block in transformer.blocks:
        stock = block.attn1.processor
        if not isinstance(stock, ExactFARSelfAttention):
            block.attn1.set_processor(ExactFARSelfAttention(stock))
            installed.append((block.attn1, stock))
    try:
        yield transformer
    finally:
        for attn, stock in installed:
            attn.set_processor(stock)


class KinegenAnyFlowFARPipeline(AnyFlowFARPipeline):
    """``AnyFlowFARPipeline`` (same components, same folder) whose calls take any frame count that splits into chunks
    (``chunk_partition`` from :func:`far_chunk_partition` when not given) and run the cached
    attention on exact sequences (:class:`ExactFARSelfAttention`, installed for the call only).

    It adds no configuration, so :meth:`save_pretrained` writes a stock ``AnyFlowFARPipeline`` folder that diffusers
    loads as it is and Kinegen loads as this class.
    """

    def chunk_partition(self, num_frames: int) -> list[int]:
        """Latent frames per chunk for ``num_frames`` video frames; a clear error when they do not split."""
        latent = (num_frames - 1) // self.vae_scale_factor_temporal + 1
        cfg = self.transformer.config
        return far_chunk_partition(latent, cfg.chunk_partition, cfg.full_chunk_limit, self.vae_scale_factor_temporal)

    @torch.no_grad()
    def __call__(self, *args, num_frames: int = 81, chunk_partition: list[int] | None = None, **kwargs):
        """As ``AnyFlowFARPipeline.__call__``; ``chunk_partition`` defaults to the partition of ``num_frames``."""
        if chunk_partition is None and kwargs.get("latents") is None:  # given latents set their own frame count
            chunk_partition = self.chunk_partition(num_frames)
        with exact_far_attention(self.transformer):
            return super().__call__(*args, num_frames=num_frames, chunk_partition=chunk_partition, **kwargs)

    def to_json_string(self) -> str:
        """The pipeline's ``model_index.json``, naming the stock class."""
        config = json.loads(super().to_json_string())
        config["_class_name"] = AnyFlowFARPipeline.__name__
        return json.dumps(config, indent=2, sort_keys=True) + "\n"
