"""Dynamic-only KV: which tokens of a committed chunk the cache keeps (reference note, section 4.1).

The chunk's first latent frame (its anchor) is kept whole; in later frames only the dynamic tokens. A dropped
(static) token is represented by the latest kept token at the same place (h, w) earlier in the chunk, the anchor
at worst: that representative's span of frames grows to cover it, and the cache
(:class:`kinegen.pipelines.causal_wan.LayerKVCache`) turns spans into the additive bias log(number of frames a
token stands for that are still cached), ToMe's proportional attention: when keys and values of static tokens are
exact duplicates across frames, exp(q.k + log m) = m exp(q.k) gives the dense softmax exactly.
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
    """

    index: torch.Tensor
    token_frames: torch.Tensor
    token_last: torch.Tensor
    token_pos: torch.Tensor

    def to(self, device) -> KeepPlan:
        return KeepPlan(*(t.to(device) for t in dataclasses.astuple(self)))


def keep_plan(masks: list[torch.Tensor | None], frame_offset: int, tokens_per_frame: int,
              bias: bool = True) -> KeepPlan:
    """Per frame of a chunk, a flat ``[tokens_per_frame]`` bool mask of the tokens to keep (None: the whole frame;
    the first frame must be whole) -> the :class:`KeepPlan`. ``bias=False`` gives every token a span of its own
    frame only (the ablation: dropped tokens are simply gone)."""
    if masks and masks[0] is not None:
        raise ValueError("the first frame of a chunk (its anchor) is kept whole")
    places = torch.arange(tokens_per_frame)
    index, own, pos = [], [], []
    last = torch.empty(len(masks) * tokens_per_frame, dtype=torch.long)  # filled up to `count`
    representative = torch.zeros(tokens_per_frame, dtype=torch.long)  # place -> its latest kept token
    count = 0
    for i, mask in enumerate(masks):
        frame = frame_offset + i
        mask = None if mask is None else mask.cpu()
        kept = places if mask is None else places[mask]
        if mask is not None and bias:  # a dropped token extends its representative's span to this frame
            last[representative[~mask]] = frame
        index.append(i * tokens_per_frame + kept)
        own.append(torch.full((len(kept),), frame, dtype=torch.long))
        pos.append(kept)
        last[count:count + len(kept)] = frame
        representative[kept] = torch.arange(count, count + len(kept))
        count += len(kept)
    return KeepPlan(torch.cat(index), torch.cat(own), last[:count].clone(), torch.cat(pos))
