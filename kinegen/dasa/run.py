"""One DASA run: the chunk hook of :class:`~kinegen.pipelines.wan_ar.WanAutoregressivePipeline` that drives the
dynamics, the compressing commit and region compute allocation (reference note, sections 4.1, 4.2, 4.5 and 5).

Per pipeline call, :meth:`DASARun.begin` puts :class:`~kinegen.dasa.processor.DASASelfAttention` on every block and
three diffusers hooks on the transformer (its forward, its first block, its output projection); the causal state
undoes them when the call ends, so between calls the model is untouched. Per chunk:

1. :meth:`~DASARun.before_chunk` fixes the chunk's **static places** from what is known before denoising it: the
   dynamic set after the *previous* chunk's commit (:class:`~kinegen.dasa.dynamics.DynamicsTracker`), the same
   places in every frame of the chunk; none after a keyframe (the first chunk, a scene change, a prompt switch,
   which this chunk then is); with ``recheck``, after each forward that computed every token, the places where the
   chunk's own clean-latent prediction moves join the dynamic ones (:meth:`~DASARun.recheck`);
2. each denoising forward gets a :class:`CallPlan` by ``compute`` (section 4.2):

   - ``reuse`` (option 1): every ``refresh``-th step computes every token and remembers, per layer, the chunk's keys
     and values and the output projection; the steps between compute the dynamic tokens only (their queries, their
     rows of every block), with the static tokens' keys, values and outputs taken from that step;
   - ``sparse`` (option 2): every token is computed, static queries with block-sparse attention
     (:mod:`kinegen.dasa.sparse`);
   - ``steps`` (option 3): static tokens get the first ``ceil(static_share * steps)`` steps; afterwards their
     clean-latent prediction is held (the output becomes ``(x - x0) / sigma`` there, so the scheduler's x0 is the
     held one) and only the dynamic tokens are computed, as in ``reuse``; with no steps of their own, x0 is the
     previous chunk's last clean frame at the same place (the aligned frame, re-noised at each step's level), and
     the first step still runs every token, for their keys and values;
3. :meth:`~DASARun.before_commit` scores the chunk's clean latents (the dynamics), whose per-frame masks the
   processors' commit turns into a :class:`~kinegen.dasa.kv.KeepPlan` (the commit forward itself runs every token).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from diffusers.hooks import ModelHook

from .config import DASAConfig
from .dynamics import DynamicsTracker
from .kv import KeepPlan, keep_plan
from .sparse import SparsePlan, sparse_plan

HOOK = "kinegen_dasa"


@dataclasses.dataclass
class CallPlan:
    """What one transformer forward computes.

    Attributes:
        computed: positions (in the chunk's token sequence) of the tokens computed; None = every token.
        remember: a full forward whose keys, values and outputs later forwards of the chunk reuse.
        sparse: the block-sparse layout of static queries (``compute=sparse``), or None.
    """

    computed: torch.Tensor | None = None
    remember: bool = False
    sparse: SparsePlan | None = None


@dataclasses.dataclass
class _Chunk:
    index: int
    frames: int
    steps: int
    new_prompt: bool
    static: torch.Tensor | None = None  # [places] bool, or None: everything computed
    step: int = 0
    computed_tokens: int = 0
    total_tokens: int = 0
    densities: list = dataclasses.field(default_factory=list)
    kept_share: float = 1.0
    keyframe: bool = True
    rechecked: int = 0  # static places the chunk's own prediction showed moving (``recheck``)
    relinked: bool = False  # a later VAE segment's re-encoded image latent (segment_overlap): kept, not tracked


class DASARun:
    """The chunk hook of an applied DASA (``pipe.chunk_hooks``); its counters survive calls for the handle's stats."""

    def __init__(self, config: DASAConfig):
        self.config = config
        self.plan: CallPlan | None = None
        self.chunks: list[dict] = []  # per chunk of the last call
        self.calls = 0

    # -- the pipeline's hook ---------------------------------------------------------------------

    def begin(self, pipe, state) -> None:
        from diffusers.hooks import HookRegistry

        from .processor import DASASelfAttention  # (imports the pipelines: deferred, for a light catalogue)

        c = self.config
        self.pipe, self.state = pipe, state
        self.tracker = DynamicsTracker.from_config(c)
        self.frame_masks: dict[int, torch.Tensor | None] = {}
        self.previous: torch.Tensor | None = None
        self.chunk: _Chunk | None = None
        self.chunks = []
        self.calls += 1
        self._keep_cache: tuple | None = None
        tr = pipe.transformer
        self.patch = tuple(int(p) for p in tr.config.patch_size[1:])
        for block, cache in zip(tr.blocks, state.caches, strict=True):
            original = block.attn1.processor
            block.attn1.set_processor(DASASelfAttention(state, cache, self))
            state._restore.append(lambda b=block, p=original: b.attn1.set_processor(p))
        root = HookRegistry.check_if_exists_or_initialize(tr)
        state._restore.append(root.invalidate_child_registries_cache)  # (runs last: the undo list is reversed)
        for module, hook in ((tr, _Root(self)), (tr.blocks[0], _Gather(self)), (tr.proj_out, _Scatter(self))):
            HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, HOOK)
            state._restore.append(lambda m=module: m._diffusers_hook.remove_hook(HOOK, recurse=False))
        root.invalidate_child_registries_cache()

    def before_chunk(self, index: int, frame_offset: int, frames: int, steps: int, new_prompt: bool) -> None:
        self._close_chunk()
        chunk = _Chunk(index, frames, steps, new_prompt, relinked=self.pipe.relinks(frame_offset))
        dyn = self.tracker.dynamic
        if not (new_prompt or self.tracker.keyframe or dyn is None or self.config.compute == "none"):
            static = ~dyn.flatten()
            chunk.static = static if bool(static.any()) else None
        self.chunk = chunk
        self.held_x0 = None
        if chunk.static is not None:
            self._index_dynamic()
            if self.config.compute == "steps" and self._static_steps() == 0:
                self.held_x0 = self.previous  # the aligned frame: the previous chunk's last clean latent

    def _index_dynamic(self) -> None:
        """The positions of the dynamic places' tokens in the chunk's token sequence (what ``reuse`` computes)."""
        chunk = self.chunk
        places = torch.nonzero(~chunk.static)[:, 0]
        tpf = chunk.static.numel()
        self.dynamic_index = (torch.arange(chunk.frames, device=places.device)[:, None] * tpf + places).flatten()

    def recheck(self, latents: torch.Tensor, output: torch.Tensor) -> None:
        """``recheck``: after a forward that computed every token, the places where the chunk's own clean-latent
        prediction ``x0 = x - sigma v`` moved from the previous chunk's last frame join the dynamic places for the
        rest of the chunk (:meth:`~kinegen.dasa.dynamics.DynamicsTracker.moved`). The static places come from the
        chunks before, which cannot know where a shape is going next; without this, a shape that moves into one
        has its output there reused (``reuse``) or held (``steps``) and could stand still (measured: it changed no
        adherence reading on this project's model, so it is off by default)."""
        chunk, plan = self.chunk, self.plan
        if (not self.config.recheck or chunk is None or chunk.static is None or self.state.commit
                or plan is None or plan.computed is not None or self.previous is None):
            return
        sigma = float(self.pipe.scheduler.sigmas[chunk.step - 1])
        x0 = (latents.to(output.dtype) - sigma * output).detach()  # (a distillation's student runs with gradients)
        previous = self.previous.to(x0).repeat(x0.shape[0] // self.previous.shape[0], 1, 1, 1, 1)  # CFG branches
        moved = self.tracker.moved(x0, previous, self.patch)
        if moved is None:
            return
        static = chunk.static & ~moved.flatten()
        chunk.rechecked += int(chunk.static.sum() - static.sum())
        chunk.static = static if bool(static.any()) else None
        if chunk.static is not None:
            self._index_dynamic()

    def before_commit(self, latents: torch.Tensor, frame_offset: int) -> None:
        chunk = self.chunk
        if chunk.relinked and not chunk.new_prompt:
            # The frame just shown coded again as an image latent: another kind of latent than the 4-frame ones
            # around it, so its difference from them is not motion (it would read as a scene change every
            # segment). The dynamics go on from the previous latent frame; the latent is kept whole as the
            # segment's anchor or (relink_whole=False) at the places those dynamics mark.
            dynamic = self.tracker.dynamic
            mask = None if self.config.relink_whole or dynamic is None else dynamic.flatten().clone()
            self.frame_masks[frame_offset] = mask
            chunk.keyframe = False
            chunk.kept_share = 1.0 if mask is None else float(mask.float().mean())
            return
        masks = self.tracker.update(latents, self.previous, self.patch, force_keyframe=chunk.new_prompt)
        cached = set(self.state.cached_frames)
        self.frame_masks = {f: m for f, m in self.frame_masks.items() if f in cached}  # for re-caching only
        for i, mask in enumerate(masks):
            self.frame_masks[frame_offset + i] = mask
        self.previous = latents[:, :, -1:].detach()
        chunk.keyframe = self.tracker.keyframe
        tpf = (latents.shape[3] // self.patch[0]) * (latents.shape[4] // self.patch[1])
        chunk.kept_share = sum(tpf if m is None else int(m.sum()) for m in masks) / (tpf * len(masks))

    def end(self) -> None:
        self._close_chunk()
        self.plan = None
        self.pipe = self.state = None

    # -- what the processors and hooks ask -------------------------------------------------------

    def keep_plan(self, frames: list[int], tokens_per_frame: int, device) -> KeepPlan:
        """The commit's kept tokens, the same for every layer (built once per commit forward)."""
        key = (tuple(frames), tokens_per_frame)
        if self._keep_cache is None or self._keep_cache[0] != key:
            masks = [self.frame_masks.get(f) for f in frames]
            if not self.state.caches[0].frames:  # nothing cached can stand for its dropped places (the first
                masks[0] = None                   # chunk, or the first run re-cached after a prompt switch)
            self._keep_cache = (key, keep_plan(masks, frames[0], tokens_per_frame, self.config.bias).to(device))
        return self._keep_cache[1]

    def plan_call(self, latents: torch.Tensor) -> CallPlan:
        """The plan of a transformer forward on ``latents`` ``[B, C, F, h, w]`` (a commit runs every token)."""
        chunk, s = self.chunk, self.state
        if s.commit or s.chunk_ids is not None or chunk is None:
            return CallPlan()
        step = chunk.step
        chunk.step += 1
        n = latents.shape[2] * (latents.shape[3] // self.patch[0]) * (latents.shape[4] // self.patch[1])
        chunk.total_tokens += n
        plan = CallPlan()
        mode = self.config.compute
        if chunk.static is not None and mode == "sparse":
            grid = (latents.shape[2], latents.shape[3] // self.patch[0], latents.shape[4] // self.patch[1])
            cache = s.caches[0]
            plan.sparse = sparse_plan(grid, chunk.static, cache.token_frames, cache.token_pos,
                                      cache.frames[:s.cache_config.sink_frames], self.config.region,
                                      self.config.radius, self.config.tile)
            chunk.densities.append(plan.sparse.density())
        elif chunk.static is not None and mode in ("reuse", "steps"):
            if mode == "reuse":
                full = step % self.config.refresh == 0
            else:
                full = step < max(self._static_steps(), 1)
            if full:
                plan.remember = True
            else:
                plan.computed = self.dynamic_index
        chunk.computed_tokens += n if plan.computed is None else len(plan.computed)
        return plan

    def hold(self, latents: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """``compute=steps``: the static places' output once they have had their steps (see the module
        docstring); remembers the x0 prediction while they still get steps."""
        chunk = self.chunk
        if self.config.compute != "steps" or chunk is None or chunk.static is None or self.state.commit:
            return output
        step = chunk.step - 1
        sigma = float(self.pipe.scheduler.sigmas[step])
        x = latents.to(output.dtype)
        if step < self._static_steps():
            self.held_x0 = (x - sigma * output).detach()
            return output
        ph, pw = self.patch
        grid = chunk.static.view(x.shape[3] // ph, x.shape[4] // pw)
        static = grid.repeat_interleave(ph, 0).repeat_interleave(pw, 1)
        return torch.where(static, (x - self.held_x0.to(x)) / sigma, output)

    def _static_steps(self) -> int:
        return math.ceil(self.config.static_share * self.chunk.steps)

    def _close_chunk(self) -> None:
        chunk = self.chunk
        if chunk is None or self.state is None:
            return
        tpf = self.state.tokens_per_frame
        cache = self.state.caches[0]
        per_token = 0 if cache.k is None else cache.k[0, 0].numel() * cache.k.shape[0] * cache.k.element_size() * 2
        entry = {"index": chunk.index, "keyframe": chunk.keyframe, "kept_share": chunk.kept_share,
                 "static_share": 0.0 if chunk.static is None else float(chunk.static.float().mean()),
                 "rechecked_share": chunk.rechecked / tpf,
                 # (a re-encoded segment start is not denoised: no token-forwards, no share)
                 "computed_share": chunk.computed_tokens / chunk.total_tokens if chunk.total_tokens else None,
                 "computed_tokens": chunk.computed_tokens, "denoised_tokens": chunk.total_tokens,
                 "kv_bytes": self.state.kv_bytes,
                 "dense_kv_bytes": per_token * tpf * len(cache.frames) * len(self.state.caches)}
        if chunk.densities:
            entry["sparse_density"] = sum(chunk.densities) / len(chunk.densities)
        self.chunks.append(entry)
        self.chunk = None


class _Root(ModelHook):
    """On the transformer: plans each forward and, for ``compute=steps``, holds the static places' output."""

    def __init__(self, run: DASARun):
        super().__init__()
        self.run = run
        self.latents = None

    def pre_forward(self, module, *args, **kwargs):
        self.latents = args[0] if args else kwargs["hidden_states"]
        self.run.plan = self.run.plan_call(self.latents)
        return args, kwargs

    def post_forward(self, module, output):
        sample = output[0] if isinstance(output, tuple) else output.sample
        self.run.recheck(self.latents, sample)
        held = self.run.hold(self.latents, sample)
        self.run.plan, self.latents = None, None
        if held is sample:
            return output
        return (held, *output[1:]) if isinstance(output, tuple) else type(output)(sample=held)


class _Gather(ModelHook):
    """On the first block: only the computed tokens go through the blocks."""

    def __init__(self, run: DASARun):
        super().__init__()
        self.run = run

    def pre_forward(self, module, *args, **kwargs):
        plan = self.run.plan
        if plan is None or plan.computed is None:
            return args, kwargs
        if args:
            return (args[0].index_select(1, plan.computed), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].index_select(1, plan.computed)}


class _Scatter(ModelHook):
    """On the output projection: the skipped tokens' rows come from the chunk's last full forward."""

    def __init__(self, run: DASARun):
        super().__init__()
        self.run = run
        self.full: torch.Tensor | None = None

    def post_forward(self, module, output):
        plan = self.run.plan
        if plan is None:
            return output
        if plan.computed is not None:
            return self.full.index_copy(1, plan.computed, output)
        if plan.remember:
            self.full = output.detach()
        return output
