"""``apply_dasa``: DASA on a chunk-by-chunk pipeline, registered as the attention accelerator ``dasa``.

Applying puts one :class:`~kinegen.dasa.run.DASARun` in the pipeline's ``chunk_hooks`` (the extension point of
:class:`~kinegen.pipelines.wan_ar.WanAutoregressivePipeline`); every call of the pipeline then runs with dynamic-only
KV and region compute allocation, and restores the model when it ends. ``handle.remove()`` takes the hook away, so
the pipeline is exactly as before. ``handle.stats()`` reports the last call: KV bytes against the dense cache of
the same frames, per chunk and in all, keyframes, shares of kept and computed tokens.
"""

from __future__ import annotations

from ..accelerators.base import AcceleratorHandle, RunInfo, register_accelerator
from ..adapters import get_adapter
from ..errors import ConfigError
from .config import DASAConfig
from .run import DASARun


def apply_dasa(pipe, config: DASAConfig | None = None, run: RunInfo | None = None) -> AcceleratorHandle:
    """Install DASA on ``pipe`` (a chunk-by-chunk pipeline; others are refused with the reason)."""
    config = config or DASAConfig()
    adapter = (run.adapter if run is not None and run.adapter is not None else None) or get_adapter(pipe)
    if not adapter.autoregressive:
        raise ConfigError(f"dasa needs a chunk-by-chunk pipeline with a KV cache (such as kinegen-shapes-ar or "
                          f"tiny-wan-ar); {type(pipe).__name__} ({adapter.name}) generates the whole video at once.")
    if not hasattr(type(pipe), "chunk_hooks"):
        raise ConfigError(f"dasa drives Kinegen's chunk-by-chunk Wan pipeline (WanAutoregressivePipeline, e.g. "
                          f"kinegen-shapes-ar); {type(pipe).__name__} ({adapter.name}) keeps its own KV cache, which "
                          "dasa does not compress.")
    if pipe.chunk_hooks:
        raise ConfigError("dasa (or another chunk accelerator) is already applied to this pipeline; remove it first.")
    dasa = DASARun(config)
    pipe.chunk_hooks = (dasa,)

    def remove():
        if "chunk_hooks" in pipe.__dict__:
            del pipe.chunk_hooks

    return AcceleratorHandle("dasa", config, remove, lambda: dasa_stats(dasa))


def dasa_stats(dasa: DASARun) -> dict:
    """The last call's numbers: KV bytes after the last chunk and at most (compressed and dense), their ratio, kept
    and computed shares (of the token-forwards of all denoising steps), keyframes; ``chunks`` per chunk."""
    chunks = dasa.chunks
    if not chunks:
        return {"calls": dasa.calls}
    kv, dense = chunks[-1]["kv_bytes"], chunks[-1]["dense_kv_bytes"]
    kv_max, dense_max = max(c["kv_bytes"] for c in chunks), max(c["dense_kv_bytes"] for c in chunks)
    denoised = sum(c["denoised_tokens"] for c in chunks)
    out = {"calls": dasa.calls, "kv_bytes": kv, "dense_kv_bytes": dense, "kv_ratio": kv / max(dense, 1),
           "kv_bytes_max": kv_max, "dense_kv_bytes_max": dense_max, "kv_ratio_max": kv_max / max(dense_max, 1),
           "keyframes": sum(c["keyframe"] for c in chunks), "scene_changes": dasa.tracker.scene_changes,
           "kept_share": sum(c["kept_share"] for c in chunks) / len(chunks),
           "computed_share": sum(c["computed_tokens"] for c in chunks) / denoised if denoised else 1.0,
           "chunks": chunks}
    densities = [c["sparse_density"] for c in chunks if "sparse_density" in c]
    if densities:
        out["sparse_density"] = sum(densities) / len(densities)
    return out


register_accelerator("dasa", DASAConfig, apply_dasa, kind="attention", requires="autoregressive",
                     summary="DASA: dynamic-only KV cache with log-count bias and region compute for chunk-by-chunk "
                             "video")
