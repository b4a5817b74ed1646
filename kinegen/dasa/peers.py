"""A peer of DASA's dynamic-only KV at equal budget: far history compressed by pooling (AnyFlow-FAR style).

AnyFlow-FAR (reference note, section 2) keeps the near chunks at full resolution and re-patchifies older ones with
a coarser patch, so far history costs a quarter of the tokens. Its coarse patch embedding is learned with the model;
kinegen-shapes-ar has none, so this training-free reading pools the cached keys (after RoPE) and values of every
frame older than the ``near_frames`` most recent ones (the sink frames stay whole) over ``factor`` x ``factor``
places, each pooled token carrying the attention bias log(factor^2) (the places it stands for, the same
proportional attention DASA's kept tokens use). It is a chunk hook of
:class:`~kinegen.pipelines.wan_ar.WanAutoregressivePipeline`, like DASA, and composes with nothing else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..pipelines.causal_wan import LayerKVCache, _whole_frames


def pool_frame(cache: LayerKVCache, frame: int, grid: tuple[int, int], factor: int) -> None:
    """Replace ``frame``'s tokens in ``cache`` (a whole frame, raster order) by ``factor`` x ``factor`` means."""
    if cache.token_frames is None:  # whole frames so far: give every token its metadata
        tokens = cache.k.shape[1] // len(cache.frames)
        cache.token_frames, cache.token_last, cache.token_pos = _whole_frames(tokens * len(cache.frames),
                                                                               cache.frames, cache.k.device)
    if cache.token_weight is None:
        cache.token_weight = torch.ones(cache.k.shape[1], device=cache.k.device)
    where = torch.nonzero(cache.token_frames == frame)[:, 0]
    h, w = grid
    if len(where) != h * w:
        raise ValueError(f"frame {frame} holds {len(where)} tokens, not a whole {h}x{w} frame")

    def pool(x: torch.Tensor) -> torch.Tensor:  # [B, h*w, heads, d] -> [B, h*w / factor^2, heads, d]
        b, _, heads, d = x.shape
        grid_x = x.view(b, h, w, heads * d).permute(0, 3, 1, 2)
        pooled = F.avg_pool2d(grid_x.float(), factor, factor).to(x.dtype)
        return pooled.permute(0, 2, 3, 1).reshape(b, -1, heads, d)

    k, v = pool(cache.k[:, where]), pool(cache.v[:, where])
    ph, pw = h // factor, w // factor
    places = (torch.arange(ph)[:, None] * factor * w + torch.arange(pw)[None] * factor).flatten().to(cache.k.device)
    before, after = where[0], where[-1] + 1
    n = k.shape[1]
    cat = (lambda a, mid: torch.cat([a[:before], mid, a[after:]]))
    cache.k = torch.cat([cache.k[:, :before], k, cache.k[:, after:]], dim=1)
    cache.v = torch.cat([cache.v[:, :before], v, cache.v[:, after:]], dim=1)
    same = torch.full((n,), frame, dtype=cache.token_frames.dtype, device=cache.k.device)
    cache.token_frames, cache.token_last = cat(cache.token_frames, same), cat(cache.token_last, same)
    cache.token_pos = cat(cache.token_pos, places.to(cache.token_pos.dtype))
    cache.token_weight = cat(cache.token_weight, torch.full((n,), float(factor * factor), device=cache.k.device))
    cache._rebias()


class FarHistoryPooling:
    """The chunk hook: before each chunk, pool the frames that have left the ``near_frames`` most recent (but not
    those the chunk's commit is about to evict)."""

    def __init__(self, near_frames: int = 4, factor: int = 2):
        if near_frames < 1 or factor < 2:
            raise ValueError("near_frames must be 1 or more and factor 2 or more")
        self.near_frames, self.factor = near_frames, factor

    def begin(self, pipe, state) -> None:
        self.state, self.sinks = state, state.cache_config.sink_frames
        self.patch = tuple(int(p) for p in pipe.transformer.config.patch_size[1:])
        self.grid: tuple[int, int] | None = None
        self.pooled: set[int] = set()

    def before_chunk(self, index: int, frame_offset: int, frames: int, steps: int, new_prompt: bool) -> None:
        if new_prompt:  # the pipeline re-caches whole frames under the new prompt
            self.pooled.clear()
        cached = self.state.cached_frames
        window = self.state.cache_config.window_frames
        # frames this chunk's commit will evict are not worth pooling (their bytes go anyway)
        leaving = 0 if window is None else max(0, len(cached) + frames - window)
        far = cached[self.sinks + leaving:max(self.sinks, len(cached) - self.near_frames)]
        h, w = self.grid or (0, 0)
        if not far or h % self.factor or w % self.factor:
            return
        for f in far:
            if f not in self.pooled:
                for cache in self.state.caches:
                    pool_frame(cache, f, self.grid, self.factor)
                self.pooled.add(f)

    def before_commit(self, latents: torch.Tensor, frame_offset: int) -> None:
        self.grid = (latents.shape[3] // self.patch[0], latents.shape[4] // self.patch[1])

    def end(self) -> None:
        self.state = None
