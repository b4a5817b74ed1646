"""One model on several devices: diffusers' context parallelism under ``torchrun``.

    torchrun --nproc-per-node 2 -m kinegen generate "a red circle moving right" --parallel ulysses=2

Every process (rank) loads the whole model and runs the same pipeline call with the same seed; inside each
transformer call the token sequence is split across the ranks, so each rank computes the blocks on its share of
the tokens and the ranks meet only inside self-attention. Two layouts (diffusers' ``ContextParallelConfig``):

- **Ulysses** (``ulysses=N``; DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509): an all-to-all before
  attention gives each rank *every* token of ``heads / N`` heads, attention runs as on one device, and a second
  all-to-all gives the tokens back. N must divide the head count. It works with diffusers' ``native`` backend
  (PyTorch SDPA), so on CPU processes (gloo) too.
- **Ring** (``ring=N``; ring attention): each rank keeps its queries and the key/value blocks travel round the
  ranks, the partial results merged by their log-sum-exp. Needs an attention backend that returns it (flash,
  cuDNN, sage: CUDA GPUs); ``native`` cannot. Both degrees above 1 is diffusers' unified (Ulysses x ring) layout.

What Kinegen adds around diffusers (``ModelMixin.enable_parallelism``):

- :func:`init_distributed` reads torchrun's environment (gloo on CPU, nccl on CUDA, one GPU per rank);
- :func:`apply_parallel` checks what diffusers would otherwise fail on deep inside a run (the head count, a
  model without a plan, a chunk-by-chunk model) and moves diffusers' split and gather hooks to torch's own
  forward hooks, so that they run *outside* every diffusers hook an accelerator later adds to the same block
  (see :func:`_install_split_gather`); on a host without an accelerator it works around one line of diffusers
  (:func:`_one_device_on_cpu`);
- :func:`check_run` refuses, before a run, what would fail or hang inside it: sequence lengths the ranks cannot
  split evenly, attention backends without context parallelism (diffusers would silently attend within each
  rank's share), ring on ``native``, and accelerators whose decisions would differ between ranks;
- :func:`decide_on_rank0` (Map-Guided Caching's plan) and :func:`mean_over_heads` (HyperVAttention's shared
  re-assignment subset) keep the accelerators' decisions identical on every rank and equal to one device's;
- a meter of the time spent in collectives (:func:`comm_seconds`) for ``kinegen profile --parallel``.

Only rank 0 writes files and prints (:func:`is_main`). torch is imported inside the functions, so that
``kinegen --help`` stays instant.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import shlex
import sys
import time
from typing import Any

from .errors import ConfigError, InvalidRequestError

KEYS = ("ulysses", "ring")

PARALLEL_HELP = (
    "split every transformer call over the processes torchrun starts (diffusers' context parallelism): "
    "ulysses=N gives each rank all tokens of 1/N of the attention heads (N must divide the model's head count; "
    "works on CPU processes with gloo and on GPUs), ring=N passes key/value blocks round the ranks (needs a GPU "
    "attention backend that returns the log-sum-exp, e.g. --attention dense-attention:backend=flash), both above 1 "
    "is the unified layout. Start it as: torchrun --nproc-per-node N -m kinegen ... --parallel ulysses=N (N = "
    "ulysses x ring processes). Accelerators that work with it: mapguided (rank 0 plans, every rank follows), hva "
    "(Ulysses only: per rank on its heads) and dense-attention with a backend that supports context parallelism; "
    "the others are refused. Only rank 0 writes the output.")

# The attention accelerators and caches that keep every rank's decisions identical under context parallelism.
SUPPORTED_ACCELERATORS = {
    "mapguided": "rank 0 makes the caching plan and broadcasts it; every rank follows it",
    "hva": "Ulysses only: each rank runs HyperVAttention on the heads it holds, with the token subset re-assigned "
           "between anchors agreed over all heads",
    "dense-attention": "with a backend that supports context parallelism",
}
_REFUSED_BECAUSE = {
    "first-block": "it skips the remaining blocks when the first block's output changed little, and each rank "
                   "measures that on its own share of the tokens: ranks would decide differently and then wait "
                   "for each other forever inside attention",
    "kmeans-sparse": "its k-means draws the first centroids of every head in turn from one generator, so a rank "
                     "holding heads 3-4 would draw those of heads 1-2 and the output would differ from one device's",
    "svg2": "its cold k-means draws every head's first centroids from one generator, so a rank holding heads 3-4 "
            "would draw those of heads 1-2 and the output would differ from one device's",
    "dasa": "it drives a chunk-by-chunk pipeline, whose causal attention keeps its own KV cache outside diffusers' "
            "attention dispatcher",
}


# ---------------------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class ParallelSpec:
    """How one transformer call is split across ranks: ``ulysses`` x ``ring`` processes in all."""

    ulysses: int = 1
    ring: int = 1

    def __post_init__(self):
        for key in KEYS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--parallel: {key} must be a whole number of processes (1 or more); got {value!r}.")
        if self.degree < 2:
            raise ConfigError("--parallel: give at least one degree above 1, e.g. ulysses=2 (two processes).")

    @classmethod
    def parse(cls, text: str) -> ParallelSpec:
        """``"ulysses=2"``, ``"ring=2"`` or ``"ulysses=2,ring=2"``; errors name the valid keys."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"--parallel takes KEY=N[,KEY=N] with keys {', '.join(KEYS)}, e.g. ulysses=2.")
        values: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = (s.strip() for s in item.partition("="))
            key = key.lower()
            if not eq:
                raise ConfigError(f"--parallel: expected KEY=N, got {item!r}. Valid keys: {', '.join(KEYS)} "
                                  "(e.g. ulysses=2).")
            if key not in KEYS:
                raise ConfigError(f"--parallel: unknown key {key!r}. Valid keys: {', '.join(KEYS)} (e.g. ulysses=2; "
                                  "both for the unified layout: ulysses=2,ring=2).")
            if key in values:
                raise ConfigError(f"--parallel: {key} is given twice; give it once.")
            if not value.isdigit():
                raise ConfigError(f"--parallel: {key}={value!r} is not a whole number of processes.")
            values[key] = int(value)
        return cls(**values)

    @property
    def degree(self) -> int:
        """Processes one transformer call is split over (torchrun's ``--nproc-per-node`` on one machine)."""
        return self.ulysses * self.ring

    @property
    def layout(self) -> str:
        """``"ulysses"``, ``"ring"`` or ``"unified"``."""
        return "unified" if self.ulysses > 1 and self.ring > 1 else ("ring" if self.ring > 1 else "ulysses")

    def __str__(self) -> str:
        return ",".join(f"{k}={getattr(self, k)}" for k in KEYS if getattr(self, k) > 1)

    def diffusers_config(self):
        """diffusers' ``ContextParallelConfig`` for this spec."""
        from diffusers import ContextParallelConfig

        return ContextParallelConfig(ulysses_degree=self.ulysses, ring_degree=self.ring)


# ---------------------------------------------------------------------------- processes


@dataclasses.dataclass(frozen=True)
class DistributedRun:
    """This process's place in the run: its rank, how many there are, the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" (CPU) or "nccl" (CUDA)
    device: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_command(spec: ParallelSpec, command: str = "generate", argv: list[str] | None = None) -> str:
    """The command that starts this run under torchrun: the current command line when it is Kinegen's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = shlex.join(argv) if argv[:1] == [command] else f"{command} ... --parallel {spec}"
    return f"torchrun --nproc-per-node {spec.degree} -m kinegen {args}"


def require_torchrun(spec: ParallelSpec, command: str = "generate") -> None:
    """Refuse a ``--parallel`` run that torchrun did not start (no ``WORLD_SIZE``), with the command to use."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise ConfigError(f"--parallel {spec} runs {spec.degree} processes that share each transformer call; start "
                          f"them with torchrun:\n  {torchrun_command(spec, command)}")


def init_distributed(spec: ParallelSpec, device: str = "auto", *, command: str = "generate") -> DistributedRun:
    """Join the process group torchrun set up (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``).

    nccl with one GPU per rank (``cuda:LOCAL_RANK``) where CUDA is available and ``device`` allows it, gloo on
    CPU processes otherwise. Without torchrun's environment it fails with the exact command to use.
    """
    import torch
    import torch.distributed as dist

    require_torchrun(spec, command)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if world != spec.degree:
        raise ConfigError(f"torchrun started {world} process(es), but --parallel {spec} needs {spec.degree} "
                          f"(ulysses x ring); use torchrun --nproc-per-node {spec.degree}.")
    want = str(device or "auto")
    if want.startswith("mps"):
        raise ConfigError("--parallel runs on CUDA GPUs (nccl, one per rank) or on CPU processes (gloo), not on mps.")
    cuda = torch.cuda.is_available() and not want.startswith("cpu")
    if want.startswith("cpu") and torch.cuda.is_available():
        raise ConfigError("--parallel with --device cpu on a machine with a GPU is not supported (diffusers builds "
                          "its device mesh on the machine's accelerator); drop --device cpu.")
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"--parallel runs one process per GPU: this machine has {torch.cuda.device_count()} "
                              f"GPU(s), and torchrun started {os.environ.get('LOCAL_WORLD_SIZE', world)} here.")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        if want.startswith("cuda"):
            raise ConfigError("--device cuda was requested but no CUDA GPU is visible to torch.")
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, **({"device_id": dev} if cuda else {}))
    if rank != 0:  # only rank 0 speaks
        from diffusers.utils import logging as diffusers_logging
        from transformers.utils import logging as transformers_logging

        for lib in (diffusers_logging, transformers_logging):
            lib.set_verbosity_error()
            lib.disable_progress_bar()
    return DistributedRun(rank, world, local_rank, backend, str(dev))


def finish_distributed() -> None:
    """Leave the process group (at the end of a command)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main() -> bool:
    """True on rank 0 and in a process without a process group."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (in rank order), ``None`` elsewhere; ``[obj]`` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


# ---------------------------------------------------------------------------- applying it to a pipeline


def apply_parallel(pipe, spec: ParallelSpec) -> None:
    """Split every transformer of ``pipe`` across the ranks (call once per process, after
    :func:`init_distributed` and before any accelerator).

    Calls diffusers' ``ModelMixin.enable_parallelism(config=ContextParallelConfig(...), cp_plan={})`` (which
    builds the device mesh and gives every attention processor the config) and installs the model's own
    ``_cp_plan`` as torch forward hooks (:func:`_install_split_gather`). Refuses, with the reason: a
    chunk-by-chunk model, a transformer diffusers has no plan for, a head count Ulysses cannot divide.
    """
    import warnings

    import transformers.utils.logging  # noqa: F401  (adds Logger.warning_once, which diffusers' CP hooks call)

    from .adapters import get_adapter, transformers_of

    adapter = get_adapter(pipe)
    name = getattr(getattr(pipe, "kinegen_spec", None), "name", type(pipe).__name__)
    if adapter.autoregressive:
        raise ConfigError(f"--parallel splits one transformer call's tokens inside diffusers' attention dispatcher; "
                          f"{name} generates chunk by chunk, and its causal attention keeps its own KV cache outside "
                          "that dispatcher, so it cannot be split. Run it in one process.")
    transformers_ = transformers_of(pipe)
    if not transformers_:
        raise ConfigError(f"--parallel splits a transformer's tokens; {name} has no transformer.")
    for t in transformers_:
        if getattr(t, "_kinegen_parallel", None) is not None:
            raise ConfigError("--parallel is already applied to this pipeline (once per process).")
        if not getattr(type(t), "_cp_plan", None):
            raise ConfigError(f"diffusers has no context-parallel plan (_cp_plan) for {type(t).__name__}, so "
                              f"--parallel cannot split {name}. Among Kinegen's model families, Wan (the bundled "
                              "models, tiny-wan, Wan 2.1/2.2 checkpoints) and FLUX have one.")
        heads = getattr(t.config, "num_attention_heads", None)
        if spec.ulysses > 1 and heads is not None and heads % spec.ulysses:
            ok = [d for d in range(2, heads + 1) if heads % d == 0]
            raise ConfigError(f"Ulysses gives each rank an equal share of the attention heads: {name}'s transformer "
                              f"has {heads} heads, which ulysses={spec.ulysses} cannot divide. Use ulysses="
                              f"{' or '.join(map(str, ok)) or '1'} (or ring={spec.ulysses} on a GPU).")
    # diffusers 0.42 gathers with funcol.all_gather_tensor, which torch 2.13 marks deprecated at every call
    warnings.filterwarnings("ignore", message=r".*all_gather_tensor` is deprecated", category=FutureWarning)
    for t in transformers_:
        with _one_device_on_cpu():
            t.enable_parallelism(config=spec.diffusers_config(), cp_plan={})
        _install_split_gather(t, t._parallel_config.context_parallel_config)
        t._kinegen_parallel = spec
    _install_meter()


def parallel_spec_of(pipe) -> ParallelSpec | None:
    """The spec :func:`apply_parallel` applied to ``pipe`` (or to this transformer), or ``None``."""
    from .adapters import transformers_of

    mods = transformers_of(pipe) if hasattr(pipe, "components") else [pipe]
    return next((s for t in mods if (s := getattr(t, "_kinegen_parallel", None)) is not None), None)


@contextlib.contextmanager
def _one_device_on_cpu():
    """Workaround for diffusers 0.42 ``ModelMixin._resolve_parallel_config``, which picks each rank's device as
    ``torch.device(device_type, rank % torch.accelerator.device_count())``: on a host without an accelerator the
    count is 0 (ZeroDivisionError). For that call only, the CPU counts as one device (``cpu:0``, which is the CPU)."""
    import torch

    real = torch.accelerator.device_count
    if real() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


class _WholeTensorNote(logging.Filter):
    """diffusers' split hook logs "Expected input tensor to have N dimensions ... split will not be applied" for
    every plan entry a model passes with other dimensions, e.g. Wan's plan splits Wan 2.2's per-token timestep
    ``[B, S]`` and Wan 2.1 passes ``[B]``: the tensor stays whole, which is right there, so the note is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "split will not be applied" not in record.getMessage()


def _install_split_gather(transformer, cp_config) -> None:
    """The model's ``_cp_plan`` as torch forward hooks calling diffusers' own ``ContextParallelSplitHook`` and
    ``ContextParallelGatherHook`` (diffusers' ``apply_context_parallel`` registers the same objects as diffusers
    hooks instead).

    Why: diffusers' ``HookRegistry`` runs the hook registered last outermost. Registered at load, the split of
    ``blocks.0``'s input would sit *inside* any block hook an accelerator registers later (Map-Guided Caching,
    diffusers' caches), which would then see the whole sequence while the block returns one rank's share. torch's
    forward (pre-)hooks run around ``module.forward`` and so around every diffusers hook: the split happens
    before, the gather after, whatever is added later. While a split transformer runs, the Ulysses group is
    published for :func:`mean_over_heads`.
    """
    from diffusers.hooks.context_parallel import (
        ContextParallelGatherHook,
        ContextParallelSplitHook,
        _get_submodule_by_name,
    )
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    logging.getLogger("diffusers.hooks.context_parallel").addFilter(_WholeTensorNote())
    for module_id, entry in type(transformer)._cp_plan.items():
        found = _get_submodule_by_name(transformer, module_id)
        for module in found if isinstance(found, list) else [found]:
            if isinstance(entry, dict):
                hook = ContextParallelSplitHook(entry, cp_config)
                hook.initialize_hook(module)
                flat = [c for v in entry.values() for c in (v if isinstance(v, (list, tuple)) else [v])]
                if any(not (isinstance(c, ContextParallelInput) and c.split_output) for c in flat):
                    module.register_forward_pre_hook(
                        lambda m, args, kwargs, h=hook: h.pre_forward(m, *args, **kwargs), with_kwargs=True)
                if any(isinstance(c, ContextParallelInput) and c.split_output for c in flat):
                    module.register_forward_hook(lambda m, args, out, h=hook: h.post_forward(m, out))
            else:
                outputs = [entry] if isinstance(entry, ContextParallelOutput) else list(entry)
                hook = ContextParallelGatherHook(outputs, cp_config)
                module.register_forward_hook(lambda m, args, out, h=hook: h.post_forward(m, out))
    if cp_config.ulysses_degree > 1:
        group = cp_config._ulysses_mesh.get_group()
        tokens: list = []

        def publish(_m, _args):
            tokens.append(_HEADS.set((group, cp_config.ulysses_degree)))

        def withdraw(_m, _args, _out):
            if tokens:
                _HEADS.reset(tokens.pop())

        transformer.register_forward_pre_hook(publish)
        transformer.register_forward_hook(withdraw, always_call=True)


# ---------------------------------------------------------------------------- checks before a run


def _backend_in_use(pipe, accelerators) -> str:
    """The attention backend the run will use: a ``dense-attention`` accelerator's, else the processors'."""
    for acc, config in accelerators:
        if acc.name == "dense-attention":
            return config.backend
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from .adapters import transformers_of

    for t in transformers_of(pipe):
        for module in t.modules():
            backend = getattr(getattr(module, "processor", None), "_attention_backend", None)
            if backend is not None:
                return getattr(backend, "value", str(backend))
    return _AttentionBackendRegistry.get_active_backend()[0].value


def context_parallel_backends() -> list[str]:
    """diffusers' attention backends that support context parallelism (``_AttentionBackendRegistry``)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return sorted(_AttentionBackendRegistry._supports_context_parallel)


def ring_backends() -> list[str]:
    """Those that also return the log-sum-exp ring attention merges with: diffusers' ``native`` and
    ``_native_npu`` forward ops raise on ``return_lse=True`` (``attention_dispatch._native_attention_forward_op``,
    ``_npu_attention_forward_op``); the others (flash, cuDNN, sage) need a CUDA GPU."""
    return [b for b in context_parallel_backends() if b not in ("native", "_native_npu")]


def video_tokens(pipe, request) -> tuple[int, ...]:
    """The token grid ``(frames, rows, columns)`` of one transformer call for ``request`` (defaults filled in)."""
    from .adapters import get_adapter

    adapter = get_adapter(pipe)
    m = adapter.spatial_multiple(pipe)
    rows, cols = request.height // m, request.width // m
    if adapter.kind != "video":
        return (1, rows, cols)
    pt = adapter.patch_size(pipe.transformer)[0]
    latent = (request.frames - 1) // adapter.temporal_factor(pipe) + 1
    return (-(-latent // pt), rows, cols)


def check_accelerators(spec: ParallelSpec, accelerators=()) -> None:
    """The accelerators (parsed ``(Accelerator, config)`` pairs) that keep every rank's decisions the same under
    ``spec``; the others are refused with the reason and what works (a check that needs no model)."""
    for acc, _ in accelerators:
        if acc.name in SUPPORTED_ACCELERATORS:
            continue
        why = _REFUSED_BECAUSE.get(acc.name, "it has not been validated under context parallelism (its skip or "
                                             "sparsity decisions would have to be the same on every rank)")
        raise ConfigError(f"{acc.name} does not work with --parallel: {why}. With --parallel use "
                          + "; ".join(f"{k} ({v})" for k, v in SUPPORTED_ACCELERATORS.items()) + ".")
    if spec.ring > 1 and any(acc.name == "hva" for acc, _ in accelerators):
        raise ConfigError("hva needs every token of a head on one rank, which Ulysses gives and ring attention does "
                          f"not (each rank keeps 1/{spec.ring} of the queries); use --parallel ulysses=N with hva.")


def check_run(pipe, accelerators=(), request=None) -> None:
    """Refuse, before anything runs, what would fail, hang or silently go wrong under the pipeline's
    parallelism (nothing to check when :func:`apply_parallel` was not applied).

    ``accelerators`` are parsed ``(Accelerator, config)`` pairs; ``request`` a request with the model's defaults
    filled in (``GenerationJob.request``), for the sequence-length check.
    """
    spec = parallel_spec_of(pipe)
    if spec is None:
        return
    name = getattr(getattr(pipe, "kinegen_spec", None), "name", type(pipe).__name__)
    check_accelerators(spec, accelerators)
    backend = _backend_in_use(pipe, accelerators)
    if backend not in context_parallel_backends():
        raise ConfigError(f"The attention backend {backend!r} does not support context parallelism: with it, diffusers "
                          "would attend within each rank's share of the tokens only. Backends that do: "
                          f"{', '.join(context_parallel_backends())} (native, PyTorch's SDPA, is the default).")
    if spec.ring > 1 and backend not in ring_backends():
        where = " (none of them runs on a CPU)" if pipe.transformer.device.type == "cpu" else ""
        raise ConfigError(f"--parallel {spec} uses ring attention, which merges partial results by their log-sum-exp; "
                          f"the {backend!r} attention backend does not return it (native supports Ulysses only). Ring "
                          f"needs one of {', '.join(ring_backends())}{where}, e.g. --attention "
                          f"dense-attention:backend=flash on a GPU, or use --parallel ulysses={spec.degree}.")
    if request is not None:
        _check_tokens(pipe, request, spec, name)


def _check_tokens(pipe, request, spec: ParallelSpec, name: str) -> None:
    """The tokens of one call must split into equal shares (diffusers' ``EquipartitionSharder`` asserts it deep
    inside the first call otherwise); the error names the nearest frame counts that split."""
    import math

    grid = video_tokens(pipe, request)
    n = math.prod(grid)
    if n % spec.degree == 0:
        return
    video = request.frames not in (None, 1)
    what = f"{request.frames} frames at {request.width}x{request.height}" if video else \
        f"{request.width}x{request.height}"
    tip = f"Pick a size whose token count is a multiple of {spec.degree}."
    if video:
        from .adapters import get_adapter

        t = get_adapter(pipe).temporal_factor(pipe) or 1
        fits = [f for f in range(1, request.frames + 8 * t * spec.degree + 1, t)
                if math.prod(video_tokens(pipe, dataclasses.replace(request, frames=f))) % spec.degree == 0]
        near = sorted(sorted(fits, key=lambda f: (abs(f - request.frames), f))[:2])
        if near:
            tip = f"Try --frames {' or '.join(map(str, near))}, or a height or width with more patches."
    raise InvalidRequestError(
        f"{name} at {what} makes {' x '.join(map(str, grid))} = {n} tokens per transformer call, which the "
        f"{spec.degree} ranks of --parallel {spec} cannot split into equal shares. {tip}")


# ---------------------------------------------------------------------------- keeping ranks in step


_HEADS: contextvars.ContextVar = contextvars.ContextVar("kinegen_ulysses_heads", default=None)


def decide_on_rank0(module, decide):
    """``decide()`` on rank 0 of ``module``'s context-parallel group, its result broadcast to the other ranks
    (``torch.distributed.broadcast_object_list``); just ``decide()`` when ``module`` is not split.

    For decisions that steer the computation (which blocks run): ranks that disagreed would wait for each other
    forever in the next all-to-all. An exception on rank 0 is raised on every rank.
    """
    pc = getattr(module, "_parallel_config", None)
    cp = getattr(pc, "context_parallel_config", None)
    if cp is None:
        return decide()
    import torch.distributed as dist

    group = cp._flattened_mesh.get_group()
    box: list = [None]
    if dist.get_rank(group) == 0:
        try:
            box[0] = ("ok", decide())
        except Exception as e:  # the others must not wait forever for a decision that will not come
            box[0] = ("error", e)
    t0 = time.perf_counter()
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    _METER.add(time.perf_counter() - t0)
    status, value = box[0]
    if status == "error":
        raise value
    return value


def mean_over_heads(x):
    """The mean of ``x`` ``[batch, heads, tokens]`` over batch and heads, ``[tokens]`` float64, over *all* heads of
    the layer: inside a Ulysses-split transformer each rank holds ``heads / N`` of them, and the sums are added
    over the Ulysses group (``all_reduce``). In float64, a sum of float32 values is exact, so one device and N
    ranks get the same bits (HyperVAttention picks its re-assigned tokens by this mean)."""
    total = x.double().sum(dim=(0, 1))
    count = x.shape[0] * x.shape[1]
    heads = _HEADS.get()
    if heads is not None:
        import torch.distributed as dist

        group, degree = heads
        t0 = time.perf_counter()
        dist.all_reduce(total, group=group)
        _METER.add(time.perf_counter() - t0)
        count *= degree
    return total / count


# ---------------------------------------------------------------------------- the communication meter


class _Meter:
    """Seconds spent inside collectives (from the call until the result is there, waiting for the slower rank
    included) and how many, since the process started. On CUDA the profiler turns ``sync`` on, which
    synchronises the device around each collective (otherwise only the launch would be timed)."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.sync = False

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1


_METER = _Meter()


def comm_seconds() -> float:
    """Seconds this process has spent in collectives so far (0 when nothing is split)."""
    return _METER.seconds


def comm_calls() -> int:
    """Collectives this process has run so far."""
    return _METER.calls


@contextlib.contextmanager
def synchronized_meter(on: bool = True):
    """Time collectives with the device synchronised around them (CUDA; the profiler uses it)."""
    before, _METER.sync = _METER.sync, on
    try:
        yield
    finally:
        _METER.sync = before


def _metered(fn):
    import torch
    import torch.distributed._functional_collectives as funcol

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        sync = _METER.sync and torch.cuda.is_available()
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if isinstance(out, funcol.AsyncCollectiveTensor):  # wait here, so that the wait is counted
            out = out.wait()
        if sync:
            torch.cuda.synchronize()
        _METER.add(time.perf_counter() - t0)
        return out

    wrapper._kinegen_metered = True
    return wrapper


def _install_meter() -> None:
    """Wrap the collectives diffusers' context parallelism calls (``funcol.all_to_all_single`` for Ulysses,
    ``funcol.all_gather_tensor`` for the output gather and ring's key/value blocks, ``dist.all_gather`` for masks;
    diffusers looks them up on the modules at each call). Once per process."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    for owner, name in ((funcol, "all_to_all_single"), (funcol, "all_gather_tensor"), (dist, "all_gather")):
        fn = getattr(owner, name)
        if not getattr(fn, "_kinegen_metered", False):
            setattr(owner, name, _metered(fn))
