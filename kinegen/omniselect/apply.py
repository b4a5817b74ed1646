"""``apply_omniselect(model, config)``: prune an omni thinker's audio and video tokens before its language model.

Three hooks on an unmodified transformers thinker (reference note section 4.3):

1. a pre-hook on ``thinker.model`` keeps the call's ``input_ids`` and audio lengths (where the media tokens are);
2. with ``audio_select=attention``, a pre-hook on the audio encoder's last self-attention recomputes the attention
   each audio token receives (section 2, step 5; the encoder's own kernels do not return it);
3. a pre-hook on ``thinker.model.language_model``: at the prefill (an empty cache and media tokens in the call) it
   cuts ``inputs_embeds``, the 3D ``position_ids``, the attention mask (and Qwen3-Omni's deepstack inputs) down to
   the kept tokens. Kept tokens keep their TMRoPE positions, so ``generate()``'s positions for new tokens (the
   unpruned last position + 1) stay right. Rows of a batch keep different counts: each is re-packed to the left
   with padding (original padding is dropped first), and on every later call the 2D mask ``generate()`` grows
   over the unpruned length is mapped onto the pruned cache. ``rope_deltas`` is shifted by the tokens removed, so
   decoding without explicit positions also continues at the right place.

The relevance of frames and audio segments to the question (``handle.set_relevance``, from an estimator in
:mod:`.relevance`) picks the regime and the group budgets; without it the regime is ``uniform``.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..accelerators.base import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters.omni import OmniAdapter, get_omni_adapter
from ..errors import ConfigError
from .budget import choose_regime, counts_from_ratios, group_keep_ratios
from .config import OmniSelectConfig
from .layout import RowLayout, row_layouts
from .relevance import RelevanceScores
from .select import distinctive, evenly_strided, most_attended, random_subset


@dataclasses.dataclass
class _Prefill:
    """What a pruned prefill leaves for the decode calls after it."""

    full_len: int  # L: the unpruned prompt length (with its padding)
    pruned_len: int  # L': the pruned, re-padded prompt length
    mask: torch.Tensor  # [B, L'] the pruned prompt's attention mask


class OmniSelectPruner:
    """The hooks' shared state: the pending relevance, the captures of the current call, the last prefill."""

    def __init__(self, model, config: OmniSelectConfig, adapter: OmniAdapter):
        self.config = config
        self.adapter = adapter
        self.thinker = adapter.thinker(model)
        self.ids = adapter.token_ids(self.thinker)
        self.ids_per_group = config.group_seconds * adapter.ids_per_second(self.thinker)
        self.relevance: RelevanceScores | None = None
        self._call: dict = {}
        self._audio_received: torch.Tensor | None = None
        self._prefill: _Prefill | None = None
        self.last: dict = {}
        self.prefills = 0
        self.select_seconds = 0.0
        self._handles = []
        self._install()

    # ------------------------------------------------------------------ hooks

    def _install(self):
        inner = self.thinker.model
        self._handles.append(inner.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        if self.config.method == "omniselect" and self.config.audio_select == "attention":
            attn = self.adapter.audio_attention(self.thinker)
            self._handles.append(attn.register_forward_pre_hook(self._on_audio_attention, with_kwargs=True))
        lm = self.adapter.language_model(self.thinker)
        self._handles.append(lm.register_forward_pre_hook(self._on_language_model, with_kwargs=True))

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_model_call(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        fmask = kwargs.get("feature_attention_mask")
        lengths = fmask.sum(-1) if fmask is not None else kwargs.get("audio_feature_lengths")
        self._call = {"input_ids": ids, "audio_lengths": lengths}
        self._audio_received = None

    def _on_audio_attention(self, module, args, kwargs):
        """Attention received per audio encoder token, averaged over heads and over the queries of its block."""
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        cu = kwargs.get("cu_seqlens", args[1] if len(args) > 1 else None)
        t0 = time.perf_counter()
        with torch.no_grad():
            n, d = hidden.shape
            heads = module.num_heads
            q = module.q_proj(hidden).view(n, heads, -1).transpose(0, 1).float()
            k = module.k_proj(hidden).view(n, heads, -1).transpose(0, 1).float()
            received = torch.zeros(n, dtype=torch.float32, device=hidden.device)
            bounds = cu.tolist() if cu is not None else [0, n]
            for s, e in zip(bounds[:-1], bounds[1:], strict=True):
                p = torch.softmax(q[:, s:e] @ k[:, s:e].transpose(1, 2) * module.scaling, dim=-1)
                received[s:e] = p.mean(dim=(0, 1))
        self._audio_received = received
        self.select_seconds += time.perf_counter() - t0

    def _on_language_model(self, module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        mask = kwargs.get("attention_mask")
        cache = kwargs.get("cache")
        past = cache.get_seq_length() if cache is not None else 0
        ids = self._call.get("input_ids")
        if embeds is None:
            return None
        is_prefill = (past == 0 and ids is not None and ids.shape == embeds.shape[:2]
                      and bool(((ids == self.ids["video"]) | (ids == self.ids["audio"])).any()))
        if is_prefill:
            return args, self._prune(kwargs, ids)
        if self._prefill is not None and past > 0 and mask is not None:
            return args, self._remap_decode_mask(kwargs, mask, past, embeds.shape[1])
        return None

    # ------------------------------------------------------------------ decode

    def _remap_decode_mask(self, kwargs, mask, past, q_len):
        """``generate()`` extends the unpruned 2D mask (L + t); the cache holds L' + t: map the prompt part."""
        pre = self._prefill
        if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
            raise ConfigError("OmniSelect needs a 2D attention mask while decoding after a pruned prefill; use the "
                              "default dynamic cache (not a static or compiled cache).")
        if mask.shape[1] == past + q_len:  # already the pruned length (a caller that knows)
            return kwargs
        if mask.shape[1] != past + q_len + pre.full_len - pre.pruned_len or mask.shape[0] != pre.mask.shape[0]:
            return kwargs  # not the continuation of the pruned prefill
        kwargs = dict(kwargs)
        kwargs["attention_mask"] = torch.cat([pre.mask.to(mask.dtype), mask[:, pre.full_len:]], dim=1)
        return kwargs

    # ------------------------------------------------------------------ prefill

    def _prune(self, kwargs, ids):
        t0 = time.perf_counter()
        embeds = kwargs["inputs_embeds"]
        pos = kwargs.get("position_ids")
        mask = kwargs.get("attention_mask")
        if pos is None:
            raise ConfigError("OmniSelect prunes after the thinker computed its 3D positions; this call had none "
                              "(call the thinker with input_ids and an attention_mask, as the processor returns).")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.ndim != 2):
            raise ConfigError("OmniSelect needs a 2D attention mask at the prefill; use the default dynamic cache.")
        rows = row_layouts(ids, pos, mask, video_token_id=self.ids["video"], audio_token_id=self.ids["audio"],
                           ids_per_group=self.ids_per_group)
        received = self._audio_tokens_received(rows) if self.config.audio_select == "attention" else None
        keeps, row_stats = [], []
        audio_offset = 0
        for b, row in enumerate(rows):
            recv = None if received is None else received[audio_offset:audio_offset + row.audio.numel()]
            audio_offset += row.audio.numel()
            kept_media, stats = self._choose(row, embeds[b], recv)
            others = row.valid.clone()
            others[row.video] = False
            others[row.audio] = False
            keep = torch.zeros_like(row.valid)
            keep[others] = True
            keep[kept_media] = True
            keeps.append(keep.nonzero().flatten())
            row_stats.append(stats)

        new = self._repack(kwargs, keeps, embeds, pos, mask)
        full_len, pruned_len = embeds.shape[1], new["inputs_embeds"].shape[1]
        self._prefill = _Prefill(full_len, pruned_len, new["attention_mask"])
        inner = self.thinker.model
        if getattr(inner, "rope_deltas", None) is not None:
            inner.rope_deltas = inner.rope_deltas + (full_len - pruned_len)
        self.prefills += 1
        self.select_seconds += time.perf_counter() - t0
        n_media = sum(r.n_media for r in rows)
        kept = sum(s["kept_video"] + s["kept_audio"] for s in row_stats)
        self.last = {"rows": row_stats, "tokens_before": int(sum(int(r.valid.sum()) for r in rows)),
                     "tokens_after": int(sum(len(k) for k in keeps)), "media_tokens": n_media, "media_kept": kept,
                     "media_keep": kept / n_media if n_media else 1.0,
                     "audio_rule": "attention" if received is not None else "distinct"}
        return new

    def _repack(self, kwargs, keeps, embeds, pos, mask):
        """Rows cut to their kept tokens, each left-padded to the longest; positions of padding are 1 (masked)."""
        B = embeds.shape[0]
        Lp = max(len(k) for k in keeps)
        new_embeds = embeds.new_zeros((B, Lp, embeds.shape[-1]))
        new_pos = pos.new_ones((pos.shape[0], B, Lp))
        new_mask = torch.zeros((B, Lp), dtype=mask.dtype if mask is not None else torch.long, device=embeds.device)
        vis = kwargs.get("visual_pos_masks") if self.adapter.deepstack else None
        new_vis = torch.zeros((B, Lp), dtype=torch.bool, device=embeds.device) if vis is not None else None
        for b, k in enumerate(keeps):
            pad = Lp - len(k)
            new_embeds[b, pad:] = embeds[b, k]
            new_pos[:, b, pad:] = pos[:, b, k]
            new_mask[b, pad:] = 1
            if vis is not None:
                new_vis[b, pad:] = vis[b, k]
        out = dict(kwargs)
        out.update(inputs_embeds=new_embeds, position_ids=new_pos, attention_mask=new_mask)
        if vis is not None:
            out["visual_pos_masks"] = new_vis
            deep = kwargs.get("deepstack_visual_embeds")
            if deep is not None:
                kept_vis = torch.zeros_like(vis)
                for b, k in enumerate(keeps):
                    kept_vis[b, k] = vis[b, k]
                rows_kept = kept_vis[vis]  # over the visual tokens, in the order the deepstack rows follow
                out["deepstack_visual_embeds"] = [d[rows_kept] for d in deep]
        return out

    def _audio_tokens_received(self, rows: list[RowLayout]) -> torch.Tensor | None:
        """Received attention per audio LLM token (every row's audio tokens in sequence order), or None."""
        r = self._audio_received
        lengths = self._call.get("audio_lengths")
        if r is None:
            return None
        pool = self.adapter.audio_pool
        n_audio = sum(row.audio.numel() for row in rows)
        if pool == 1:
            return r if r.numel() == n_audio else None
        if lengths is None:
            return None
        pieces, start = [], 0
        for n_enc in self.adapter.pooled_audio_lengths(lengths).tolist():
            seg = r[start:start + n_enc]
            start += n_enc
            n_out = (n_enc - pool) // pool + 1
            pieces.append(seg[:n_out * pool].view(n_out, pool).mean(-1))
        out = torch.cat(pieces) if pieces else r[:0]
        return out if out.numel() == n_audio else None

    # ------------------------------------------------------------------ the choice

    def _choose(self, row: RowLayout, embeds: torch.Tensor, received: torch.Tensor | None):
        """Sequence indices of the media tokens this row keeps, and what was decided."""
        cfg = self.config
        nv, na = row.video.numel(), row.audio.numel()
        total = round(cfg.keep * (nv + na))
        G = max(row.n_groups, 1)
        vsizes = torch.bincount(row.video_group.cpu(), minlength=G)[:G]
        asizes = torch.bincount(row.audio_group.cpu(), minlength=G)[:G]
        regime, scores = "uniform", None
        if cfg.method == "random":
            gen = torch.Generator().manual_seed(cfg.seed)
            media = torch.cat([row.video, row.audio])
            picked = media[random_subset(media.numel(), total, gen)]
            return picked, self._row_stats(row, picked, "-", None)
        def same_share(sizes, n):  # every group keeps the same share (the uniform peer and the uniform regime)
            return counts_from_ratios(torch.full((G,), cfg.keep), sizes, round(cfg.keep * n))

        if cfg.method == "uniform" or cfg.keep >= 1.0:
            vcounts, acounts = same_share(vsizes, nv), same_share(asizes, na)
        elif cfg.method in ("video-only", "audio-only"):
            pruned, sizes = (("video", vsizes) if cfg.method == "video-only" else ("audio", asizes))
            other = na if pruned == "video" else nv
            n_pruned = nv if pruned == "video" else na
            budget = max(total - other, 0)
            counts = counts_from_ratios(torch.full((G,), budget / max(n_pruned, 1)), sizes, budget)
            full = (asizes if pruned == "video" else vsizes).clone()
            vcounts, acounts = (counts, full) if pruned == "video" else (full, counts)
        else:
            rel = self.relevance
            if rel is not None and nv and na:
                a, v = rel.means()
                regime = choose_regime(a, v, cfg.theta, rel.has_query)
            minor_keep = cfg.minor_keep if cfg.minor_keep is not None else cfg.keep
            if regime == "uniform":
                vcounts, acounts = same_share(vsizes, nv), same_share(asizes, na)
            else:
                major_sizes, minor_sizes = (vsizes, asizes) if regime == "video" else (asizes, vsizes)
                n_major, n_minor = int(major_sizes.sum()), int(minor_sizes.sum())
                minor_total = round(minor_keep * n_minor)
                major_keep = min(max((total - minor_total) / max(n_major, 1), 0.0), 1.0)
                scores = rel.group_scores(regime, G, cfg.group_seconds)
                ratios = group_keep_ratios(scores, major_sizes, major_keep, cfg.iterations)
                major = counts_from_ratios(ratios, major_sizes, round(major_keep * n_major))
                minor = counts_from_ratios(torch.full((G,), minor_keep), minor_sizes, minor_total)
                vcounts, acounts = (major, minor) if regime == "video" else (minor, major)
        strided = cfg.method == "uniform"
        picked = []
        for g in range(G):
            vi = (row.video_group == g).nonzero().flatten()
            ai = (row.audio_group == g).nonzero().flatten()
            kv, ka = int(vcounts[g]), int(acounts[g])
            if strided:
                picked += [row.video[vi[evenly_strided(len(vi), kv)]], row.audio[ai[evenly_strided(len(ai), ka)]]]
                continue
            picked.append(row.video[vi[distinctive(embeds[row.video[vi]], kv)]])
            if received is not None and cfg.audio_select == "attention":
                picked.append(row.audio[ai[most_attended(received[ai], ka)]])
            else:
                picked.append(row.audio[ai[distinctive(embeds[row.audio[ai]], ka)]])
        picked = torch.sort(torch.cat(picked)).values if picked else row.video[:0]
        return picked, self._row_stats(row, picked, regime, scores)

    def _row_stats(self, row: RowLayout, picked: torch.Tensor, regime: str, scores) -> dict:
        kept = torch.zeros(int(row.valid.numel()), dtype=torch.bool, device=picked.device)
        kept[picked] = True
        return {"regime": regime, "video_tokens": int(row.video.numel()), "audio_tokens": int(row.audio.numel()),
                "kept_video": int(kept[row.video].sum()), "kept_audio": int(kept[row.audio].sum()),
                "video_kept_mask": kept[row.video].cpu(), "audio_kept_mask": kept[row.audio].cpu(),
                "group_scores": None if scores is None else [round(float(s), 4) for s in scores]}


# ---------------------------------------------------------------------------- the public entry point


class OmniSelectHandle(AcceleratorHandle):
    """The applied pruner: ``set_relevance`` before a call, ``stats()`` after it, ``remove()`` to undo."""

    def __init__(self, pruner: OmniSelectPruner):
        super().__init__("omniselect", pruner.config, pruner.remove, self._stats)
        self.pruner = pruner

    def set_relevance(self, scores: RelevanceScores | None) -> None:
        """The relevance of the next call's frames and audio segments to its question (None: uniform regime)."""
        self.pruner.relevance = scores

    def _stats(self) -> dict:
        p = self.pruner
        last = {k: v for k, v in p.last.items() if k != "rows"}
        rows = [{k: v for k, v in r.items() if not k.endswith("_mask")} for r in p.last.get("rows", [])]
        return {"family": p.adapter.name, "prefills": p.prefills, "select_seconds": round(p.select_seconds, 6),
                "relevance_seconds": round(p.relevance.seconds, 6) if p.relevance is not None else 0.0,
                **last, "rows": rows}


def apply_omniselect(model, config: OmniSelectConfig | None = None, run: RunInfo | None = None) -> OmniSelectHandle:
    """Prune the audio and video tokens of ``model`` (a Qwen2.5-Omni or Qwen3-Omni thinker, a full omni model, or
    anything with such a ``.thinker``) before its language model, at every prefill, until ``remove()``.

    With ``keep=1.0`` the model computes exactly what it did before.
    """
    config = config or OmniSelectConfig()
    adapter = get_omni_adapter(model)
    return OmniSelectHandle(OmniSelectPruner(model, config, adapter))


register_accelerator("omniselect", OmniSelectConfig, apply_omniselect, kind="prune",
                     summary="OmniSelect: modality-adaptive pruning of an omni thinker's audio and video tokens")
