"""DASA's self-attention processor: the causal Wan processor with a compressing commit and region compute.

It changes three steps of :class:`kinegen.pipelines.causal_wan.CausalWanSelfAttention` and keeps the rest
(projections, RoPE, the cache's bias mask, the output projection):

- **commit**: the cache keeps only the chunk's :class:`~kinegen.dasa.kv.KeepPlan` (the anchor frame whole, then
  the dynamic tokens; a compressed first frame extends the spans of cached tokens) with per-token frames and spans,
  from which it derives the bias (section 4.1);
- **skipped tokens** (``compute=reuse`` or ``steps``): when a forward computes only the dynamic tokens, this layer's
  queries are theirs, and the chunk's keys and values are those this layer computed for every token at its last full
  forward with the dynamic tokens' fresh ones written in (section 4.2, option 1);
- **sparse** (``compute=sparse``): static queries attend to their neighbourhood and the sink only, through
  :func:`kinegen.dasa.sparse.sparse_attention` (section 4.2, option 2).

What a forward does is the run's current :class:`~kinegen.dasa.run.CallPlan`; with no plan (or nothing static) the
processor computes exactly what the causal one does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..pipelines.causal_wan import CausalWanSelfAttention
from .sparse import sparse_attention


class DASASelfAttention(CausalWanSelfAttention):
    """One block's ``attn1`` under DASA; ``run`` is the :class:`~kinegen.dasa.run.DASARun` driving the pipeline."""

    def __init__(self, state, cache, run):
        super().__init__(state, cache)
        self.run = run
        self.chunk_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # every chunk token's, from the last full call

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        plan = self.run.plan
        if plan is None or self.state.chunk_ids is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        computed = plan.computed
        if computed is not None and rotary_emb is not None:
            rotary_emb = tuple(r.index_select(1, computed) for r in rotary_emb)
        q, k, v = self.project(attn, hidden_states, rotary_emb)
        if computed is None:
            if plan.remember:
                self.chunk_kv = (k.detach(), v.detach())  # reused as constants (distillation backprops a step)
        else:
            k = self.chunk_kv[0].index_copy(1, computed, k)
            v = self.chunk_kv[1].index_copy(1, computed, v)
        keys, values, mask = self.history(k, v)
        if self.state.commit:
            self.commit(k, v)
        if plan.sparse is not None:
            bias = None if mask is None else mask.view(-1).float()
            out = sparse_attention(q, keys, values, bias, plan.sparse, self.run.config.backend)
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                 attn_mask=mask)
        return self.output(attn, out, q)

    def commit(self, k, v) -> None:
        s = self.state
        frames = list(range(s.frame_offset, s.frame_offset + k.shape[1] // s.tokens_per_frame))
        keep = self.run.keep_plan(frames, s.tokens_per_frame, k.device)
        self.cache.append(k.index_select(1, keep.index).detach(), v.index_select(1, keep.index).detach(), frames,
                          keep.token_frames, keep.token_last, keep.token_pos, keep.carried_pos, keep.carried_last)
        self.cache.evict(s.cache_config, s.tokens_per_frame)
