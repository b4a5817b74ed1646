"""Block-causal attention for a Wan transformer: a per-layer KV cache of committed chunks, or a block-causal mask.

Autoregressive video (Self-Forcing, CausVid, LongLive; ../shared/reference/autoregressive_dasa.md, section 2)
denoises a chunk of latent frames at a time. Each self-attention layer's queries of the current chunk attend to
its own keys and to the keys of every committed chunk, which are cached:

- keys are cached **after RoPE** (each frame's rotary phase is its absolute latent-frame index, so cached keys
  never need rotating again and dropping frames from the cache cannot misplace the rest);
- a chunk is **committed** by one forward of its clean latents (timestep 0, Self-Forcing's ``context_noise``),
  whose keys and values are appended; the denoising forwards before it only read the cache;
- **sink frames** (the first ones) stay in the cache for ever and a **rolling window** keeps the most recent
  frames, so memory and per-chunk cost stay flat over any length (LongLive's frame sink and short window).

The same processor runs a whole sequence at once with a **block-causal mask** (chunk ``i`` sees chunks ``<= i``),
which is what diffusion-forcing training needs and what the cached path must equal (tested). No sequence is padded:
diffusers 0.42's AnyFlow-FAR path pads to a multiple of 128 without a mask, so its queries attend to zeros.

:func:`make_causal` installs the processors and a frame-offset RoPE on a ``WanTransformer3DModel`` and returns a
:class:`CausalWanState` through which a pipeline drives them; :meth:`CausalWanState.remove` restores the model.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from ..errors import ConfigError


@dataclasses.dataclass
class KVCacheConfig:
    """How much history each layer keeps, in latent frames.

    Attributes:
        sink_frames: the first frames, kept for ever (an attention sink; 0 = none).
        window_frames: frames kept in all, sinks included (None = every committed frame: a global cache, whose
            memory grows linearly with the video).
    """

    sink_frames: int = 0
    window_frames: int | None = None

    def __post_init__(self):
        if self.sink_frames < 0:
            raise ConfigError(f"sink_frames must be 0 or more; got {self.sink_frames}.")
        if self.window_frames is not None and self.window_frames <= self.sink_frames:
            raise ConfigError(f"window_frames ({self.window_frames}) must be larger than sink_frames "
                              f"({self.sink_frames}): the window holds the sinks and at least one recent frame.")


class LayerKVCache:
    """One self-attention layer's committed keys (after RoPE) and values, ``[B, tokens, heads, head_dim]``, and the
    latent frames it holds (``frames``).

    Whole frames (the plain cache): blocks of ``tokens_per_frame`` tokens, one per frame. A compressing accelerator
    (DASA, docs/dasa.md) appends a chunk's kept tokens with per-token metadata: ``token_frames`` (each token's own
    latent frame), ``token_last`` (the last frame it stands for: a kept token also represents the dropped duplicates
    at its place in later frames of its chunk), ``token_pos`` (its place in the frame, ``h * width + w``) and, for
    pooled tokens, ``token_weight`` (the places one stands for). Such a cache keeps ``bias``, log(number of the
    frames a token stands for that are still cached, times its places) per token, the additive
    attention bias of ToMe's proportional attention (../shared/reference/autoregressive_dasa.md, section 4.1), or
    None while every token stands for itself; eviction stays by frame.
    """

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.frames: list[int] = []
        self.token_frames: torch.Tensor | None = None
        self.token_last: torch.Tensor | None = None
        self.token_pos: torch.Tensor | None = None
        self.token_weight: torch.Tensor | None = None  # places a token stands for (a pooled one: several); None = 1
        self.bias: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor, frames: list[int], token_frames: torch.Tensor | None = None,
               token_last: torch.Tensor | None = None, token_pos: torch.Tensor | None = None,
               carried_pos: torch.Tensor | None = None, carried_last: torch.Tensor | None = None) -> None:
        """Add committed keys and values: whole ``frames``, or (with per-token metadata) any tokens of them.
        ``carried_pos``: places of the new frames that no new token stands for; the latest cached token at each
        stands for them, up to frame ``carried_last`` (a compressed first frame, docs/dasa.md)."""
        if token_frames is not None or self.token_frames is not None:
            if token_frames is None:
                token_frames, token_last, token_pos = _whole_frames(k.shape[1], frames, k.device)
            if self.token_frames is None and self.k is not None:  # the whole frames before become tokens too
                self.token_frames, self.token_last, self.token_pos = _whole_frames(self.k.shape[1], self.frames,
                                                                                   k.device)
            if carried_pos is not None and len(carried_pos):
                self._extend_spans(carried_pos.to(k.device), carried_last.to(k.device))
            cat = (lambda a, b: b if a is None else torch.cat([a, b]))
            if self.token_weight is not None:  # new tokens each stand for one place
                self.token_weight = cat(self.token_weight, torch.ones(len(token_frames), device=k.device))
            self.token_frames = cat(self.token_frames, token_frames)
            self.token_last = cat(self.token_last, token_last if token_last is not None else token_frames)
            self.token_pos = cat(self.token_pos, token_pos)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        self.frames += frames
        self._rebias()

    def evict(self, config: KVCacheConfig, tokens_per_frame: int) -> None:
        """Keep the sink frames and the most recent ``window_frames - sink_frames`` frames (with per-token
        metadata: the tokens that still stand for a kept frame)."""
        if config.window_frames is None or len(self.frames) <= config.window_frames:
            return
        keep = list(range(config.sink_frames)) + list(
            range(len(self.frames) - (config.window_frames - config.sink_frames), len(self.frames)))
        if self.token_frames is None:
            idx = torch.cat([torch.arange(i * tokens_per_frame, (i + 1) * tokens_per_frame) for i in keep])
        else:
            idx = torch.nonzero(self._represented([self.frames[i] for i in keep]) > 0)[:, 0]
            self.token_frames, self.token_last, self.token_pos = (
                t.index_select(0, idx) for t in (self.token_frames, self.token_last, self.token_pos))
            if self.token_weight is not None:
                self.token_weight = self.token_weight.index_select(0, idx)
        idx = idx.to(self.k.device)
        self.k, self.v = self.k.index_select(1, idx), self.v.index_select(1, idx)
        self.frames = [self.frames[i] for i in keep]
        self._rebias()

    def _extend_spans(self, places: torch.Tensor, last: torch.Tensor) -> None:
        """The latest cached token at each of ``places`` (tokens are in frame order: the last one there) now stands
        for the frames up to ``last`` too."""
        if self.token_pos is None or self.token_weight is not None:
            raise ValueError("only a cache of whole or DASA-compressed frames can stand for a compressed first frame")
        latest = torch.full((int(self.token_pos.max()) + 1,), -1, dtype=torch.long, device=self.token_pos.device)
        latest.scatter_reduce_(0, self.token_pos, torch.arange(len(self.token_pos), device=latest.device), "amax")
        if int(places.max()) >= len(latest) or bool((latest[places] < 0).any()):
            raise ValueError("a compressed first frame drops a place that no cached token stands for")
        self.token_last[latest[places]] = torch.maximum(self.token_last[latest[places]], last)

    def _represented(self, frames: list[int]) -> torch.Tensor:
        """Per token: how many of ``frames`` (sorted) lie in the span of frames it stands for."""
        held = torch.tensor(frames, dtype=self.token_frames.dtype, device=self.token_frames.device)
        return (torch.searchsorted(held, self.token_last, right=True)
                - torch.searchsorted(held, self.token_frames, right=False))

    def _rebias(self) -> None:
        if self.token_frames is None:
            return
        counts = self._represented(self.frames).float()
        if self.token_weight is not None:
            counts = counts * self.token_weight
        self.bias = None if bool((counts == 1).all()) else counts.log()

    def clear(self) -> None:
        self.k = self.v = None
        self.frames = []
        self.token_frames = self.token_last = self.token_pos = self.token_weight = self.bias = None

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values (the per-token metadata is not counted)."""
        return 0 if self.k is None else self.k.numel() * self.k.element_size() * 2


def _whole_frames(tokens: int, frames: list[int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token metadata (own frame, last frame, place) of whole frames of ``tokens // len(frames)`` tokens."""
    per = tokens // len(frames)
    own = torch.tensor(frames, device=device).repeat_interleave(per)
    return own, own.clone(), torch.arange(per, device=device).repeat(len(frames))


@dataclasses.dataclass
class CausalWanState:
    """What one forward of the transformer does, set by the pipeline before each call.

    Attributes:
        tokens_per_frame: tokens of one latent frame after patching (set by each forward from its input).
        frame_offset: the absolute latent-frame index of the input's first frame (its RoPE phase).
        commit: append this forward's keys and values to the cache (a committed chunk's clean pass).
        chunk_ids: for a whole-sequence forward, the chunk of each latent frame; queries then see keys of their
            own chunk and of the earlier frames a cache of ``cache_config`` would hold (the block-causal mask), and
            the cache is neither read nor written.
        teacher_forcing: with ``chunk_ids``, the input is a clean sequence followed by its noisy copy, masked by
            :func:`teacher_forcing_mask` (``chunk_ids`` covers one copy).
        frame_positions: for a whole-sequence forward, ``[batch, frames]`` absolute latent-frame index of each
            input frame (its RoPE phase) where the frames are not consecutive: training in the cache's layout, a
            sink frame at 0 followed by a window from later in the video (None = ``frame_offset`` onwards).
    """

    transformer: nn.Module
    cache_config: KVCacheConfig
    caches: list[LayerKVCache]
    tokens_per_frame: int = 0
    frame_offset: int = 0
    commit: bool = False
    chunk_ids: torch.Tensor | None = None
    teacher_forcing: bool = False
    frame_positions: torch.Tensor | None = None
    _restore: list = dataclasses.field(default_factory=list)

    @property
    def cached_frames(self) -> list[int]:
        return list(self.caches[0].frames) if self.caches else []

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    def clear(self) -> None:
        for c in self.caches:
            c.clear()

    def remove(self) -> None:
        """Put the model's own processors and RoPE back."""
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()


def rope_at(rope: nn.Module, num_frames: int, height: int, width: int, frame_offset: int):
    """Wan's 3D RoPE (cos, sin) ``[1, tokens, 1, head_dim]`` for a latent of ``num_frames`` frames starting at
    absolute frame ``frame_offset`` (``WanRotaryPosEmbed`` always starts at 0). ``height``/``width`` are latent
    sizes, before patching."""
    p_t, p_h, p_w = rope.patch_size
    ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
    first = frame_offset // p_t
    if first + ppf > rope.max_seq_len:
        raise ConfigError(f"latent frame {first + ppf} is past the model's RoPE table ({rope.max_seq_len} positions); "
                          "generate fewer frames.")
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    parts = []
    for table in (rope.freqs_cos, rope.freqs_sin):
        t, h, w = table.split(sizes, dim=1)
        grid = torch.cat([t[first:first + ppf].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1),
                          h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1),
                          w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)], dim=-1)
        parts.append(grid.reshape(1, ppf * pph * ppw, 1, -1))
    return parts[0], parts[1]


def rope_at_positions(rope: nn.Module, positions: torch.Tensor, height: int, width: int):
    """Wan's 3D RoPE (cos, sin) ``[B, tokens, 1, head_dim]`` for latents whose frames sit at the absolute latent-frame
    indices ``positions`` ``[B, frames]`` (any order or gaps; one temporal patch per latent frame)."""
    p_t, p_h, p_w = rope.patch_size
    if p_t != 1:
        raise ConfigError(f"frame positions need a temporal patch size of 1; this model's is {p_t}.")
    if int(positions.max()) >= rope.max_seq_len:
        raise ConfigError(f"latent frame {int(positions.max())} is past the model's RoPE table "
                          f"({rope.max_seq_len} positions).")
    b, f = positions.shape
    pph, ppw = height // p_h, width // p_w
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    parts = []
    for table in (rope.freqs_cos, rope.freqs_sin):
        t, h, w = table.split(sizes, dim=1)
        t = t[positions.to(t.device)]  # [B, F, t_dim]
        grid = torch.cat([t.view(b, f, 1, 1, -1).expand(b, f, pph, ppw, -1),
                          h[:pph].view(1, 1, pph, 1, -1).expand(b, f, pph, ppw, -1),
                          w[:ppw].view(1, 1, 1, ppw, -1).expand(b, f, pph, ppw, -1)], dim=-1)
        parts.append(grid.reshape(b, f * pph * ppw, 1, -1))
    return parts[0], parts[1]


class _OffsetRope(nn.Module):
    """Stands in for ``transformer.rope``: the same tables, from ``state.frame_offset`` (or at
    ``state.frame_positions``)."""

    def __init__(self, rope: nn.Module, state: CausalWanState):
        super().__init__()
        self.inner, self.state = rope, state

    def forward(self, hidden_states: torch.Tensor):
        _, _, f, h, w = hidden_states.shape
        _, p_h, p_w = self.inner.patch_size
        self.state.tokens_per_frame = (h // p_h) * (w // p_w)  # read by the processors of this forward
        reference = getattr(self.inner, "reference_grid", None)  # InterpolatedWanRoPE (kinegen.models.rope)
        if reference is not None and (h // p_h, w // p_w) != tuple(reference[1:]):
            raise ConfigError(f"this transformer was trained with position interpolation (kinegen_rope.json) at "
                              f"{reference[1]}x{reference[2]} latent tokens per frame; chunk-by-chunk generation uses "
                              f"Wan's integer positions, which equal the interpolated ones only at that size, and "
                              f"this input is {h // p_h}x{w // p_w}. Generate at the size the model was trained at.")
        if self.state.frame_positions is not None:
            if tuple(self.state.frame_positions.shape) != (hidden_states.shape[0], f):
                raise ConfigError(f"frame_positions has shape {tuple(self.state.frame_positions.shape)}; the input "
                                  f"has {hidden_states.shape[0]} samples of {f} latent frames.")
            return rope_at_positions(self.inner, self.state.frame_positions, h, w)
        return rope_at(self.inner, f, h, w, self.state.frame_offset)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on ``[B, tokens, heads, dim]`` (interleaved pairs), as diffusers applies it."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def history_window(chunk_ids: torch.Tensor, cache_config: KVCacheConfig | None = None) -> torch.Tensor:
    """Boolean ``[frames, frames]``: latent frame i may see frame j of an earlier chunk, as the sampler's cache holds
    history when i's chunk is denoised or committed: every earlier frame with a global cache; with a rolling window
    the first ``sink_frames`` frames and the ``window_frames - sink_frames`` frames just before i's chunk
    (:meth:`LayerKVCache.evict` after each commit)."""
    f = len(chunk_ids)
    idx = torch.arange(f, device=chunk_ids.device)
    first = torch.searchsorted(chunk_ids, chunk_ids)  # where each frame's chunk starts (chunk ids never decrease)
    earlier = chunk_ids[None, :] < chunk_ids[:, None]
    if cache_config is None or cache_config.window_frames is None:
        return earlier
    recent = idx[None, :] >= (first - (cache_config.window_frames - cache_config.sink_frames))[:, None]
    return earlier & ((idx[None, :] < cache_config.sink_frames) | recent)


def block_causal_mask(chunk_ids: torch.Tensor, tokens_per_frame: int,
                      cache_config: KVCacheConfig | None = None) -> torch.Tensor:
    """Boolean ``[tokens, tokens]``: query token i may see key token j of its own chunk and of the earlier frames
    the cache would hold (:func:`history_window`; all earlier chunks by default)."""
    same = chunk_ids[None, :] == chunk_ids[:, None]
    frames = history_window(chunk_ids, cache_config) | same
    return frames.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


def teacher_forcing_mask(chunk_ids: torch.Tensor, tokens_per_frame: int,
                         cache_config: KVCacheConfig | None = None) -> torch.Tensor:
    """Boolean ``[2 tokens, 2 tokens]`` over a clean sequence followed by its noisy copy (teacher forcing): a clean
    token sees the clean history its chunk's commit pass sees and clean tokens of its own chunk, a noisy token sees
    the same clean history and noisy tokens of its own chunk (what a denoising forward sees: the cache, then
    itself). The history is every earlier chunk, or with a rolling window what the cache keeps
    (:func:`history_window`)."""
    same = chunk_ids[None, :] == chunk_ids[:, None]
    before = history_window(chunk_ids, cache_config)
    frames = torch.cat([torch.cat([before | same, torch.zeros_like(same)], dim=1),
                        torch.cat([before, same], dim=1)], dim=0)
    return frames.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


class CausalWanSelfAttention:
    """Self-attention processor of one Wan block (``attn1``): the cache path or the block-causal mask path.

    Its steps are methods (:meth:`project`, :meth:`history`, :meth:`commit`, :meth:`output`) so that an
    accelerator's processor (DASA's, :mod:`kinegen.dasa.processor`) can change one and keep the others."""

    def __init__(self, state: CausalWanState, cache: LayerKVCache):
        self.state, self.cache = state, cache

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None:
            raise ConfigError("CausalWanSelfAttention belongs on self-attention (attn1), not cross-attention.")
        q, k, v = self.project(attn, hidden_states, rotary_emb)
        s = self.state
        if s.chunk_ids is not None:  # one forward over the whole sequence, block-causal
            masking = teacher_forcing_mask if s.teacher_forcing else block_causal_mask
            mask = masking(s.chunk_ids.to(q.device), s.tokens_per_frame, s.cache_config)
            keys, values = k, v
        else:
            keys, values, mask = self.history(k, v)
            if s.commit:
                self.commit(k, v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask)
        return self.output(attn, out, q)

    def project(self, attn, hidden_states, rotary_emb):
        """q, k, v ``[B, tokens, heads, head_dim]`` as diffusers computes them (norms, then RoPE on q and k)."""
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k = attn.norm_q(q), attn.norm_k(k)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
        if rotary_emb is not None:
            q, k = _apply_rope(q, *rotary_emb), _apply_rope(k, *rotary_emb)
        return q, k, v

    def history(self, k, v):
        """The cached keys and values followed by this chunk's own, and the float mask adding the cache's per-token
        bias to the scores (None when there is none)."""
        c = self.cache
        if c.k is None:
            return k, v, None
        mask = None if c.bias is None else F.pad(c.bias, (0, k.shape[1])).to(k.dtype).view(1, 1, 1, -1)
        return torch.cat([c.k, k], dim=1), torch.cat([c.v, v], dim=1), mask

    def commit(self, k, v) -> None:
        """Append this chunk's keys and values (a committed chunk's clean pass) and evict by the cache policy."""
        s = self.state
        frames = k.shape[1] // s.tokens_per_frame
        self.cache.append(k.detach(), v.detach(), list(range(s.frame_offset, s.frame_offset + frames)))
        self.cache.evict(s.cache_config, s.tokens_per_frame)

    def output(self, attn, out, q):
        """SDPA's ``[B, heads, tokens, head_dim]`` -> the block's ``[B, tokens, dim]`` through the out projection."""
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


class _SameInput(ModelHook):
    """Answers a call on the very tensor of the previous call with the previous output, while neither that tensor
    nor the module's weights have changed since (their version counters).

    A rollout calls the transformer dozens of times per chunk with one prompt's embeddings (the same tensor until
    the prompt changes), and each call projects them again: the text embedder, then every block's cross-attention
    keys and values and the keys' norm. Self-Forcing's causal Wan keeps these in a cross-attention cache; this hook
    does the same on the modules that compute them. It steps aside while gradients are on (a training forward must
    reach the weights) and for tensors made under ``torch.inference_mode`` (they keep no version counter, so a change
    in place could not be seen); the input is held, so its id cannot be reused by another tensor."""

    def __init__(self):
        super().__init__()
        self.input: torch.Tensor | None = None
        self.versions: tuple[int, ...] = ()
        self.output = None
        self.hits = 0

    def new_forward(self, module, x, *args, **kwargs):
        forward = self.fn_ref.original_forward
        if torch.is_grad_enabled() or args or kwargs or not isinstance(x, torch.Tensor) or x.is_inference():
            return forward(x, *args, **kwargs)  # (a tensor made under inference_mode has no version counter)
        versions = (x._version, *(p._version for p in module.parameters()))
        if x is self.input and versions == self.versions:
            self.hits += 1
            return self.output
        self.output = forward(x)
        self.input, self.versions = x, versions
        return self.output


TEXT_MEMO = "kinegen_text_memo"


def _memoise_text(transformer: nn.Module, state: CausalWanState) -> None:
    """:class:`_SameInput` on the text embedder and on every block's cross-attention key and value projections
    (and the norm of the keys)."""
    modules = [getattr(getattr(transformer, "condition_embedder", None), "text_embedder", None)]
    for block in transformer.blocks:
        attn2 = getattr(block, "attn2", None)
        modules += [getattr(attn2, name, None) for name in ("to_k", "to_v", "to_kv", "norm_k")]
    for module in [m for m in modules if isinstance(m, nn.Module)]:
        HookRegistry.check_if_exists_or_initialize(module).register_hook(_SameInput(), TEXT_MEMO)
        state._restore.append(lambda m=module: m._diffusers_hook.remove_hook(TEXT_MEMO, recurse=False))


def make_causal(transformer: nn.Module, cache_config: KVCacheConfig | None = None) -> CausalWanState:
    """Install block-causal self-attention with a KV cache on every block of a ``WanTransformer3DModel``, and
    compute the prompt's text projections once per prompt rather than once per forward (:class:`_SameInput`).

    Returns the state the pipeline sets before each forward (``frame_offset``, ``commit``, ``chunk_ids``;
    ``tokens_per_frame`` follows the input's size). ``state.remove()`` restores the model.
    """
    if not hasattr(transformer, "blocks") or not hasattr(transformer, "rope"):
        raise ConfigError(f"{type(transformer).__name__} is not a Wan transformer (it needs .blocks and .rope).")
    state = CausalWanState(transformer=transformer, cache_config=cache_config or KVCacheConfig(), caches=[])
    for block in transformer.blocks:
        cache = LayerKVCache()
        state.caches.append(cache)
        original = block.attn1.processor
        block.attn1.set_processor(CausalWanSelfAttention(state, cache))
        state._restore.append(lambda b=block, p=original: b.attn1.set_processor(p))
    rope = transformer.rope
    transformer.rope = _OffsetRope(rope, state)
    state._restore.append(lambda: setattr(transformer, "rope", rope))
    _memoise_text(transformer, state)
    return state
