"""Dynamic-only KV: which tokens of a committed chunk the cache keeps (reference note, section 4.1).

The chunk's first latent frame (its anchor) is kept whole; in later frames only the dynamic tokens. A dropped
(static) token is represented by the latest kept token at the same place (h, w) earlier in the chunk, the anchor
at worst: that representative's span of frames grows to cover it, and the cache
(:class:`kinegen.pipelines.causal_wan.LayerKVCache`) turns spans into the additive bias log(number of frames a
token stands for that are still cached), ToMe's proportional attention: when keys and values of static tokens are
exact duplicates across frames, exp(q.k + log m) = m exp(q.k) gives the dense softmax exactly.

With ``DASAConfig.anchor_every`` above 1 (or 0) a chunk's first frame may itself be compressed: a place dropped
before any token of the chunk was kept there is represented by the latest token at that place already in the cache
(a previous chunk's), whose span the cache extends (:attr:`KeepPlan.carried_pos`, ``carried_last``): an anchor
every few chunks, as a video codec's intra frames, rather than in every chunk.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class KeepPlan:
    """The kept tokens of one committed chunk, in the cache's order (frame by frame, raster within a frame).

    Attributes:
        index: ``[kept]`` positions of the kept tokens in the chunk's token sequence.
        token_frames: ``[kept]`` each kept token's own latent frame.
        token_last: ``[kept]`` the last frame it stands for (its own, or a later one of the chunk where the token at
            its place was dropped).
        token_pos: ``[kept]`` its place in the frame (``h * width + w``).
        carried_pos: ``[carried]`` places dropped from the chunk's first frame on, before any token of the chunk was
            kept there: their representative is the latest token at that place in the cache.
        carried_last: ``[carried]`` the last frame of the chunk that representative then stands for.
    """

    index: torch.Tensor
    token_frames: torch.Tensor
    token_last: torch.Tensor
    token_pos: torch.Tensor
    carried_pos: torch.Tensor
    carried_last: torch.Tensor

    def to(self, device) -> KeepPlan:
        return KeepPlan(*(t.to(device) for t in dataclasses.astuple(self)))


def keep_plan(masks: list[torch.Tensor | None], frame_offset: int, tokens_per_frame: int,
              bias: bool = True) -> KeepPlan:
    """Per frame of a chunk, a flat ``[tokens_per_frame]`` bool mask of the tokens to keep (None: the whole frame)
    -> the :class:`KeepPlan`. A compressed first frame leans on the cache: its dropped places are ``carried``.
    ``bias=False`` gives every token a span of its own frame only (the ablation: dropped tokens are simply gone)."""
    places = torch.arange(tokens_per_frame)
    index, own, pos = [], [], []
    last = torch.empty(len(masks) * tokens_per_frame, dtype=torch.long)  # filled up to `count`
    representative = torch.full((tokens_per_frame,), -1, dtype=torch.long)  # place -> its latest kept token
    carried = torch.full((tokens_per_frame,), -1, dtype=torch.long)  # place -> last frame a cached token covers
    count = 0
    for i, mask in enumerate(masks):
        frame = frame_offset + i
        mask = None if mask is None else mask.cpu()
        kept = places if mask is None else places[mask]
        if mask is not None and bias:  # a dropped token extends its representative's span to this frame
            dropped = ~mask
            in_chunk = dropped & (representative >= 0)
            last[representative[in_chunk]] = frame
            carried[dropped & (representative < 0)] = frame
        index.append(i * tokens_per_frame + kept)
        own.append(torch.full((len(kept),), frame, dtype=torch.long))
        pos.append(kept)
        last[count:count + len(kept)] = frame
        representative[kept] = torch.arange(count, count + len(kept))
        count += len(kept)
    carried_pos = torch.nonzero(carried >= 0)[:, 0]
    return KeepPlan(torch.cat(index), torch.cat(own), last[:count].clone(), torch.cat(pos), carried_pos,
                    carried[carried_pos])
