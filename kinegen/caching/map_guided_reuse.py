"""What a block group does at one step of Map-Guided Caching: compute and remember, or reuse.

A group ``g`` computed at step ``t`` turns its input ``x^t`` into its output ``h^t``; its residual is
``r^t = h^t - x^t``. The group's cache remembers what the reuse mode needs. At a reused step ``t``
whose last computed step (anchor) is ``s``, and the one before it ``s'``:

- ``output``:      ``h^t = h^s``
- ``residual``:    ``h^t = x^t + r^s`` (the default)
- ``extrapolate``: ``h^t = x^t + r^s + (t-s)/(s-s') (r^s - r^{s'})`` (first order; ``residual`` until
  two anchors exist)

While recording, each computed step also gives the group's TVMap entry
``V[t, g] = ||r^t - r^{t-1}||_1 / ||h^t||_1`` (:mod:`kinegen.caching.tvmap`).

Blocks of joint-attention models (FLUX, HunyuanVideo, CogVideoX) update two streams, video and text
tokens; every state here is therefore a pair ``(hidden, encoder)`` with ``encoder`` ``None`` for
single-stream blocks, and both streams are reused and measured alike. Which argument and output
index holds which stream comes from diffusers' ``TransformerBlockRegistry`` metadata (``meta``).
"""

from __future__ import annotations

import torch

Pair = tuple[torch.Tensor, torch.Tensor | None]


class GroupCache:
    """One group's cache in one guidance branch."""

    __slots__ = ("out", "res", "res_step", "prev", "prev_step")

    def __init__(self):
        self.out: Pair | None = None  # the last computed output (reuse=output)
        self.res: Pair | None = None  # the last residual and its anchor step
        self.res_step = -1
        self.prev: Pair | None = None  # the residual before it (reuse=extrapolate)
        self.prev_step = -1


# ---------------------------------------------------------------------------- a block's streams


def block_inputs(meta, args, kwargs) -> Pair:
    """The streams a block is called with."""
    hidden = meta._get_parameter_from_args_kwargs(meta.hidden_states_argument_name, args, kwargs)
    if meta.return_encoder_hidden_states_index is None:
        return hidden, None
    return hidden, meta._get_parameter_from_args_kwargs(meta.encoder_hidden_states_argument_name, args, kwargs)


def block_outputs(meta, out) -> Pair:
    """The streams a block returned."""
    if meta.return_encoder_hidden_states_index is None:
        return (out[0] if isinstance(out, tuple) else out), None
    return out[meta.return_hidden_states_index], out[meta.return_encoder_hidden_states_index]


def pack_outputs(meta, hidden, enc):
    """Streams in the form the block returns them."""
    if meta.return_encoder_hidden_states_index is None:
        return hidden
    ret = [None] * (max(meta.return_hidden_states_index, meta.return_encoder_hidden_states_index) + 1)
    ret[meta.return_hidden_states_index] = hidden
    ret[meta.return_encoder_hidden_states_index] = enc
    return tuple(ret)


# ---------------------------------------------------------------------------- computed steps


def remember_output(cache: GroupCache, t: int, out: Pair) -> None:
    """``reuse=output``: keep the output itself."""
    cache.out = out
    cache.res_step = t


def remember_residual(cache: GroupCache, t: int, inp: Pair, out: Pair) -> Pair:
    """``reuse=residual``/``extrapolate`` (and recording): keep ``r^t = h^t - x^t``, and the previous one."""
    res = (out[0] - inp[0], None if out[1] is None else out[1] - inp[1])
    cache.prev, cache.prev_step = cache.res, cache.res_step
    cache.res, cache.res_step = res, t
    return res


def variation(res: Pair, prev_res: Pair, out: Pair) -> torch.Tensor:
    """The TVMap entry of a step: ``||r^t - r^{t-1}||_1 / ||h^t||_1`` over both streams (a float scalar)."""
    num = (res[0] - prev_res[0]).abs().sum()
    den = out[0].abs().sum()
    if res[1] is not None:
        num = num + (res[1] - prev_res[1]).abs().sum()
        den = den + out[1].abs().sum()
    return (num / den.clamp_min(1e-12)).detach().float()


# ---------------------------------------------------------------------------- reused steps


def reuse_output(cache: GroupCache, t: int, inp: Pair) -> Pair:
    """``h^t = h^s``."""
    return cache.out


def reuse_residual(cache: GroupCache, t: int, inp: Pair) -> Pair:
    """``h^t = x^t + r^s``."""
    return _add(inp, cache.res)


def reuse_extrapolate(cache: GroupCache, t: int, inp: Pair) -> Pair:
    """``h^t = x^t + r^s + (t-s)/(s-s') (r^s - r^{s'})``."""
    rh, re_ = cache.res
    if cache.prev is not None:
        a = (t - cache.res_step) / (cache.res_step - cache.prev_step)
        ph, pe = cache.prev
        rh = rh + a * (rh - ph)
        re_ = None if re_ is None else re_ + a * (re_ - pe)
    return _add(inp, (rh, re_))


REUSE = {"output": reuse_output, "residual": reuse_residual, "extrapolate": reuse_extrapolate}
"""``reuse=`` -> the function that stands in for a reused group: ``fn(cache, t, group_input) -> output``."""


def _add(inp: Pair, res: Pair) -> Pair:
    (h_in, e_in), (rh, re_) = inp, res
    if rh.shape != h_in.shape:
        raise RuntimeError(f"mapguided: cached residual {tuple(rh.shape)} does not fit the block input "
                           f"{tuple(h_in.shape)}; did the sequence length change within a run?")
    return h_in + rh, (None if e_in is None else e_in + re_)
