"""DASA's settings: one dataclass, validated when built (``--attention dasa:key=value,...``).

The reading of the method they follow is ../shared/reference/autoregressive_dasa.md, sections 4 and 5, and
docs/dasa.md.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

COMPUTE_MODES = ("reuse", "sparse", "steps", "none")
"""Region compute allocation (section 4.2): ``reuse`` static tokens' outputs between refreshes, ``sparse``
attention for static queries, fewer denoising ``steps`` for static tokens, or ``none`` (KV compression only)."""

SELECTIONS = ("dynamics", "uniform", "random")
"""Which tokens of a later frame the cache keeps: the ``dynamics`` (DASA), or the peers at the same budget, an evenly
strided (``uniform``) or a ``random`` share ``keep`` of each frame."""

SPARSE_BACKENDS = ("auto", "flex", "triton", "dense")
"""Executors of :func:`kinegen.sparse_attn.block_sparse.block_sparse_attention` for ``compute=sparse``."""


@dataclasses.dataclass
class DASAConfig:
    """Dynamics-Aware Sparse Attention for chunk-by-chunk Wan (docs/dasa.md).

    Attributes:
        keep: dynamic share of each later frame of a chunk, the budget of tokens that enter the dynamic set (the
            chunk's first frame, its anchor, is kept whole: see ``anchor_every``); 1.0 keeps everything (the dense
            pipeline).
        threshold: instead of the budget, tokens whose pooled latent difference (normalised latents, mean absolute
            difference over channels) reaches this value enter the dynamic set (None = use ``keep``).
        centre: take each latent frame's per-channel mean over the frame off before differencing, so that a shift
            every place shares (a causal VAE codes a still scene differently at each latent position) is not read
            as motion (False: the plain latent difference of the reference note, section 5).
        floor: with a budget under half the frame, measure membership from the frame's median score (its
            background level), so a background that changes a little everywhere falls out of the dynamic set
            (False: from 0; a flat score map then holds every token through the hysteresis).
        ema: weight of the past in the exponential moving average of each token's score over frames, in [0, 1).
        low: hysteresis: a dynamic token turns static again only when its smoothed score falls below ``low`` times
            the entry level, in (0, 1] (1 = no hysteresis).
        dilate: side of the max-filter on the token grid that keeps motion edges dynamic (odd; 1 = none).
        scene_jump: a frame whose mean difference exceeds this many times its running mean is a scene change: the
            chunk is kept whole and computed fully, and the dynamics restart (None = no scene detection).
        anchor_every: the first frame of every ``anchor_every``-th chunk after a keyframe is kept whole (1: every
            chunk, the reading of section 4.1); in the other chunks it is compressed like the later frames, its
            dropped places standing on the latest cached token at the same place (0: only keyframes are whole).
            With 2-frame chunks an anchor in every chunk keeps at least half of the cache; fewer anchors lean on
            older tokens for static places, which drift if the background changes slowly.
        relink_whole: with overlapping VAE segments (``segment_overlap``), each later segment's re-encoded image
            latent is kept whole (True); False keeps it only at the places the dynamics mark, its static places
            standing on the latest cached token at the same place (as a compressed anchor's do). Whole, one latent
            frame in five of a 17-frame segment is never compressed, which holds the KV above about half of dense
            at the settings that reach 2x; but the 4-frame latents that would stand for it are another kind of
            latent, and the next chunks lose colour and motion (measured at 50% KV: colour 24 and motion 53 points
            under dense, against 2 and 23 kept whole; benchmarks/dasa.md, "The last whole frames").
        select: ``dynamics`` (DASA), or a peer at the same budget for comparisons: ``uniform`` (evenly strided) or
            ``random`` token dropping, ``keep`` of each frame, no smoothing (the static set for ``compute`` is then
            the tokens not selected).
        bias: add log(1 + dropped duplicates) to the scores of kept tokens that stand for dropped ones (ToMe's
            proportional attention); False is the ablation without it.
        compute: how static regions get less work: ``reuse`` (their outputs, keys and values are reused between
            refreshes), ``sparse`` (static queries attend to local regions and the sink only), ``steps`` (they get
            fewer denoising steps), ``none`` (every token computed; the KV cache is still compressed).
        recheck: after each forward that computes every token (``reuse``'s refreshes, ``steps``' own steps, every
            ``sparse`` step), the places where the chunk's own clean-latent prediction moved from the previous
            chunk's last frame (by half the last committed frame's strongest motion) are dynamic for the rest of the
            chunk: the static places come from the chunks before, and a shape moving into one could otherwise stand
            still (False, the default: the previous chunks' dynamics only; on six held-out videos it changed no
            adherence reading beyond noise and cost 8% of the speedup at the 58%-KV setting, benchmarks/dasa.md).
        refresh: ``reuse``: static tokens are computed every ``refresh`` steps of a chunk (the first included).
        static_share: ``steps``: static tokens get ceil(static_share * steps) steps of their own; 0 = none: their
            clean latent is the previous chunk's last frame at the same place, re-noised to each step's level.
        region: ``sparse``: side, in tokens, of the square regions static queries are grouped by.
        radius: ``sparse``: static queries see keys within this many regions of their own, in every cached frame
            and the chunk (and every sink token).
        tile: ``sparse``: the executor's tile, in tokens (a power of two, 16 or more for ``triton``).
        backend: ``sparse``: executor: ``auto`` (Triton on CUDA, FlexAttention elsewhere), ``flex``, ``triton`` or
            ``dense`` (the fp32 masked reference, for tests).
    """

    keep: float = 0.3
    threshold: float | None = None
    centre: bool = True
    floor: bool = True
    ema: float = 0.5
    low: float = 0.5
    dilate: int = 3
    scene_jump: float | None = 3.0
    anchor_every: int = 1
    relink_whole: bool = True
    select: str = "dynamics"
    bias: bool = True
    compute: str = "reuse"
    recheck: bool = False
    refresh: int = 2
    static_share: float = 0.5
    region: int = 2
    radius: int = 1
    tile: int = 16
    backend: str = "auto"

    def __post_init__(self):
        checks = [
            (0 < self.keep <= 1, f"keep must be in (0, 1] (the dynamic share of a frame); got {self.keep}"),
            (self.threshold is None or self.threshold > 0,
             f"threshold must be above 0 (a mean absolute latent difference), or none; got {self.threshold}"),
            (0 <= self.ema < 1, f"ema must be in [0, 1) (the weight of the past); got {self.ema}"),
            (0 < self.low <= 1, f"low must be in (0, 1] (the hysteresis exit level, 1 = none); got {self.low}"),
            (self.dilate >= 1 and self.dilate % 2 == 1, f"dilate must be an odd size of 1 or more; got {self.dilate}"),
            (self.scene_jump is None or self.scene_jump > 1,
             f"scene_jump must be above 1 (a jump of the mean difference), or none; got {self.scene_jump}"),
            (self.anchor_every >= 0,
             f"anchor_every must be 0 (keyframes only) or more (an anchor every N chunks); got {self.anchor_every}"),
            (self.select in SELECTIONS, f"select must be one of {', '.join(SELECTIONS)}; got {self.select!r}"),
            (self.compute in COMPUTE_MODES, f"compute must be one of {', '.join(COMPUTE_MODES)}; got {self.compute!r}"),
            (self.refresh >= 1, f"refresh must be 1 or more (steps between static refreshes); got {self.refresh}"),
            (0 <= self.static_share <= 1, f"static_share must be in [0, 1]; got {self.static_share}"),
            (self.region >= 1, f"region must be 1 or more tokens; got {self.region}"),
            (self.radius >= 0, f"radius must be 0 or more regions; got {self.radius}"),
            (self.tile >= 1 and self.tile & (self.tile - 1) == 0, f"tile must be a power of two; got {self.tile}"),
            (self.backend in SPARSE_BACKENDS,
             f"backend must be one of {', '.join(SPARSE_BACKENDS)}; got {self.backend!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"{message}.")
