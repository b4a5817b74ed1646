"""Sparse attention on a GPU at Wan 2.1 sizes, random inputs: one prepared run on a lent H200.

Three parts, each timed with CUDA-synchronised medians (``triton.testing.do_bench``) and written to JSON as
it finishes (a later failure keeps the earlier rows):

1. kernels: the Triton block-sparse kernel against SDPA (FlashAttention-2, cuDNN, memory-efficient) at
   Wan 2.1 14B attention shapes (40 heads of 128, bf16): 480p (81 x 480 x 832 -> 21 x 30 x 52 = 32,760
   tokens) and 720p (81 x 720 x 1280 -> 21 x 45 x 80 = 75,600 tokens), random tile layouts with the
   same number of key tiles per query tile; first a launch sweep (tile, warps, stages) at 480p; the
   kernel's error against the fp32 reference on a few query tiles; compiled FlexAttention beside it.
2. HVA as a module at 480p (Wan 2.1 1.3B: 12 heads of 128) on smooth synthetic q/k (a low-frequency
   field on the token grid plus noise): the Triton clustering kernels against their torch references,
   then an anchor call and hybrid calls of ``HVAttention`` and of the SVG2-style baseline, with the
   share of time spent clustering and the error against dense SDPA.
3. A randomly initialised Wan 2.1 1.3B transformer (30 layers) at 480p: one forward (one denoising
   step, one guidance branch) dense against ``apply_hva`` and ``apply_kmeans_sparse``.

    python benchmarks/gpu_sparse_attention.py --out DIR          # on the GPU machine (about 4 minutes)
    TRITON_INTERPRET=1 python benchmarks/gpu_sparse_attention.py --smoke --out /tmp/x   # CPU dry run, tiny shapes

Results: benchmarks/results/gpu_sparse_attention.json, read in benchmarks/gpu_sparse_attention.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

from kinegen.sparse_attn.block_sparse import (  # noqa: E402
    BlockLayout,
    block_sparse_attention_flex,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
    layout_from_tile_mask,
)

WAN_GRIDS = {"480p": (21, 30, 52), "720p": (21, 45, 80)}
SMOKE_GRIDS = {"smoke": (2, 4, 8)}
RESULTS: dict = {"config": {}, "kernels": [], "sweep": [], "hva": [], "assign": [], "model": [], "errors": []}


def log(*a):
    print(*a, flush=True)


def save(out: Path) -> None:
    tmp = out / "gpu_sparse_attention.json.part"
    tmp.write_text(json.dumps(RESULTS, indent=1, default=str))
    tmp.replace(out / "gpu_sparse_attention.json")


def timeit(fn, smoke: bool) -> float:
    """Median milliseconds of ``fn`` (CUDA: do_bench with L2 flushes; CPU smoke: one timed call after one)."""
    if smoke:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def part(name: str, out: Path):
    """Run a part, keeping what it measured if it fails."""
    def deco(fn):
        def run(*a, **k):
            t = time.perf_counter()
            log(f"\n## {name}")
            try:
                fn(*a, **k)
            except Exception as e:  # noqa: BLE001 - one failing part must not lose the others
                traceback.print_exc()
                RESULTS["errors"].append({"part": name, "error": repr(e)})
            log(f"({name}: {time.perf_counter() - t:.1f} s)")
            save(out)
        return run
    return deco


# ---------------------------------------------------------------------------- part 1: kernels


def random_layout(n_tokens: int, heads: int, density: float, tile: int, device, seed: int = 0) -> BlockLayout:
    """Kept key tiles per query tile: the diagonal plus random others, ``round(density * tiles)`` per row;
    tokens padded to whole tiles (the padding keys marked invalid, as HVA's layouts do)."""
    n = -(-n_tokens // tile)
    g = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(1, heads, n, n, generator=g)
    scores.diagonal(dim1=-2, dim2=-1).fill_(2.0)
    keep = scores.topk(max(1, round(density * n)), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, keep, True)
    valid = (torch.arange(n * tile) < n_tokens).expand(1, heads, n * tile)
    return layout_from_tile_mask(mask, tile, valid.contiguous()).to(device)


def executed_flops(layout: BlockLayout, head_dim: int) -> float:
    """4 * tile^2 * head_dim per executed (query tile, key tile) pair (QK^T and PV)."""
    return float(layout.kv_num_blocks.sum()) * layout.tile ** 2 * head_dim * 4


def rel_l2_subset(q, k, v, layout: BlockLayout, out, n_tiles: int = 2) -> float:
    tiles = torch.linspace(0, layout.kv_indices.shape[-2] - 1, n_tiles).long().unique().to(q.device)
    rows = (tiles[:, None] * layout.tile + torch.arange(layout.tile, device=q.device)).flatten()
    sub = BlockLayout(layout.tile, layout.kv_num_blocks[..., tiles], layout.kv_indices[..., tiles, :],
                      layout.key_valid)
    ref = block_sparse_attention_reference(q[:, :, rows].float(), k.float(), v.float(), sub)
    return ((out[:, :, rows].float() - ref).norm() / ref.norm()).item()


def sdpa_backends(smoke: bool):
    from torch.nn.attention import SDPBackend

    if smoke:
        return {"sdpa math": [SDPBackend.MATH]}
    return {"sdpa flash": [SDPBackend.FLASH_ATTENTION], "sdpa cudnn": [SDPBackend.CUDNN_ATTENTION],
            "sdpa mem-efficient": [SDPBackend.EFFICIENT_ATTENTION]}


def kernels(args, device, dtype):
    from torch.nn.attention import sdpa_kernel

    grids = SMOKE_GRIDS if args.smoke else WAN_GRIDS
    heads, dim = (2, 16) if args.smoke else (40, 128)
    tiles = (16,) if args.smoke else (64, 128)
    densities = (1.0, 0.25) if args.smoke else (1.0, 0.5, 0.25, 0.125, 0.0625)
    best: dict[int, tuple[int, int]] = {}
    for name, grid in grids.items():
        n = math.prod(grid)
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, heads, n, dim, device=device, dtype=dtype, generator=g) for _ in range(3))
        dense_flops = 4.0 * n * n * dim * heads
        dense_ms = {}
        for label, backend in sdpa_backends(args.smoke).items():
            try:
                with sdpa_kernel(backend):
                    ms = timeit(partial(sdpa, q, k, v), args.smoke)
                dense_ms[label] = ms
                RESULTS["kernels"].append({"shape": name, "tokens": n, "case": label, "density": 1.0, "ms": ms,
                                           "tflops": dense_flops / ms / 1e9})
                log(f"{name} {label}: {ms:.2f} ms, {dense_flops / ms / 1e9:.0f} TFLOP/s")
            except Exception as e:  # noqa: BLE001 - a backend missing on this build
                log(f"{name} {label}: unavailable ({e!r:.120})")
        ref_ms = min(dense_ms.values())
        ref_case = min(dense_ms, key=dense_ms.get)
        if not best:  # launch sweep at the first shape, density 0.25
            for tile in tiles:
                lay = random_layout(n, heads, 0.25, tile, device)
                qp, kp, vp = (torch.nn.functional.pad(x, (0, 0, 0, lay.key_valid.shape[-1] - n)) for x in (q, k, v))
                results = []
                for warps in ((4,) if args.smoke else (4, 8)):
                    for stages in ((1,) if args.smoke else (2, 3, 4)):
                        try:
                            ms = timeit(partial(block_sparse_attention_triton, qp, kp, vp, lay, num_warps=warps,
                                                       num_stages=stages), args.smoke)
                        except Exception as e:  # noqa: BLE001 - e.g. shared memory exceeded
                            log(f"sweep tile {tile} warps {warps} stages {stages}: failed ({e!r:.100})")
                            continue
                        results.append((ms, warps, stages))
                        RESULTS["sweep"].append({"shape": name, "tile": tile, "warps": warps, "stages": stages,
                                                 "density": lay.density(), "ms": ms})
                        log(f"sweep tile {tile} warps {warps} stages {stages}: {ms:.2f} ms")
                if results:
                    best[tile] = min(results)[1:]
            RESULTS["config"]["best_launch"] = {str(t): b for t, b in best.items()}
        for tile, (warps, stages) in best.items():
            for d in densities:
                lay = random_layout(n, heads, d, tile, device, seed=1)
                qp, kp, vp = (torch.nn.functional.pad(x, (0, 0, 0, lay.key_valid.shape[-1] - n)) for x in (q, k, v))
                out = block_sparse_attention_triton(qp, kp, vp, lay, num_warps=warps, num_stages=stages)
                err = rel_l2_subset(qp, kp, vp, lay, out)
                ms = timeit(partial(block_sparse_attention_triton, qp, kp, vp, lay, num_warps=warps,
                                           num_stages=stages), args.smoke)
                row = {"shape": name, "tokens": n, "case": f"triton tile {tile}", "density": lay.density(), "ms": ms,
                       "tflops": executed_flops(lay, dim) / ms / 1e9, "speedup": ref_ms / ms, "vs": ref_case,
                       "target": 0.6 / lay.density(), "rel_l2": err, "warps": warps, "stages": stages}
                RESULTS["kernels"].append(row)
                log(f"{name} triton tile {tile} d={lay.density():.3f}: {ms:.2f} ms, {row['tflops']:.0f} TFLOP/s, "
                    f"{row['speedup']:.2f}x vs {ref_case} (target {row['target']:.2f}x), rel L2 {err:.1e}")
        if name == next(iter(grids)):  # compiled FlexAttention beside it, first shape only (compiles per shape)
            tile = 16 if args.smoke else 128
            for d in ((0.25,) if args.smoke else (0.25, 0.125)):
                lay = random_layout(n, heads, d, tile, device, seed=1)
                qp, kp, vp = (torch.nn.functional.pad(x, (0, 0, 0, lay.key_valid.shape[-1] - n)) for x in (q, k, v))
                t = time.perf_counter()
                out = block_sparse_attention_flex(qp, kp, vp, lay)
                compile_s = time.perf_counter() - t
                ms = timeit(partial(block_sparse_attention_flex, qp, kp, vp, lay), args.smoke)
                row = {"shape": name, "tokens": n, "case": f"flex tile {tile}", "density": lay.density(), "ms": ms,
                       "tflops": executed_flops(lay, dim) / ms / 1e9, "speedup": ref_ms / ms, "vs": ref_case,
                       "target": 0.6 / lay.density(), "rel_l2": rel_l2_subset(qp, kp, vp, lay, out),
                       "first_call_s": compile_s}
                RESULTS["kernels"].append(row)
                log(f"{name} flex tile {tile} d={lay.density():.3f}: {ms:.2f} ms ({row['speedup']:.2f}x; first call "
                    f"{compile_s:.1f} s), rel L2 {row['rel_l2']:.1e}")


# ---------------------------------------------------------------------------- part 2: HVA as a module


def smooth_tokens(grid, heads, dim, device, dtype, seed, noise=0.5):
    """[1, heads, F*H*W, dim]: a field varying slowly over (frame, row, column), plus white noise."""
    g = torch.Generator(device=device).manual_seed(seed)
    F, H, W = grid
    low = torch.randn(1, heads * dim, max(1, F // 4), max(1, H // 6), max(1, W // 6), device=device, generator=g)
    field = torch.nn.functional.interpolate(low, size=grid, mode="trilinear", align_corners=False)
    field = field.view(heads, dim, -1).transpose(1, 2).unsqueeze(0)
    x = field / field.std() + noise * torch.randn(field.shape, device=device, generator=g)
    return x.to(dtype).contiguous()


def hva_module(args, device, dtype, size="480p"):
    from kinegen.sparse_attn import clustering as C
    from kinegen.sparse_attn.hva import HVAConfig, KMeansSparseAttention, KMeansSparseConfig

    grid = (4, 8, 8) if args.smoke else WAN_GRIDS[size]
    heads, dim = (2, 16) if args.smoke else (12, 128)
    q = smooth_tokens(grid, heads, dim, device, dtype, 1) * 2.0
    k = smooth_tokens(grid, heads, dim, device, dtype, 2) * 2.0
    v = torch.randn(q.shape, device=device, generator=torch.Generator(device=device).manual_seed(3)).to(dtype)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    dense_ms = timeit(partial(sdpa, q, k, v), args.smoke)
    RESULTS["hva"].append({"case": "sdpa dense", "size": size, "ms": dense_ms})
    log(f"dense SDPA (default backend), {heads} heads, {math.prod(grid)} tokens: {dense_ms:.2f} ms")

    # The Triton clustering kernels against their torch references (one assignment + one update).
    if (device.type == "cuda" or args.smoke) and size == "480p":
        from kinegen.sparse_attn import kernels as K

        cfg = HVAConfig()
        for side, x, window in (("q", q, cfg.q_window), ("k", k, cfg.k_window)):
            wg = C.window_grid(grid, window)
            cent = C.grid_init(x, wg, 1)
            a_ref = C.assign_local(x, cent, wg, 1)
            a_tri = K.assign_local_triton(x, cent, wg, 1)
            agree = (a_ref.labels == a_tri.labels).float().mean().item()
            row = {"side": side, "window": window,
                   "assign_torch_ms": timeit(partial(C.assign_local, x, cent, wg, 1), args.smoke),
                   "assign_triton_ms": timeit(partial(K.assign_local_triton, x, cent, wg, 1), args.smoke),
                   "update_torch_ms": timeit(partial(C.update_centroids, x, a_ref.labels, cent), args.smoke),
                   "update_triton_ms": timeit(partial(K.update_centroids_triton, x, a_ref.labels, cent), args.smoke),
                   "label_agreement": agree}
            RESULTS["assign"].append(row)
            log(f"clustering kernels ({side}, window {window}): " + ", ".join(
                f"{key} {val:.3f}" if isinstance(val, float) else f"{key} {val}" for key, val in row.items()))

    calls = []
    for density in args.densities:
        for variant in [v for v in args.variants if v != "kmeans"]:
            try:
                hva_calls(args, device, q, k, v, dense, grid, variant == "compiled", calls, density, size)
            except Exception as e:  # noqa: BLE001 - keep the other variants
                traceback.print_exc()
                RESULTS["errors"].append({"part": f"hva {variant} {size} d={density}", "error": repr(e)[:500]})
    if "kmeans" not in args.variants:
        return
    base = KMeansSparseAttention(KMeansSparseConfig(density=args.densities[0], top_p=None,
                                                    tile=16 if args.smoke else 64, q_clusters=calls[0]["q_clusters"],
                                                    k_clusters=calls[0]["k_clusters"]))
    for i in range(3):
        timed_call(base, "kmeans-sparse", size, i, q, k, v, dense, grid, device)


def timed_call(attn, label, size, i, q, k, v, dense, grid, device) -> dict:
    """One synchronised call of a sparse attention module: a result row (stored and logged); its stats."""
    t = time.perf_counter()
    out = attn(q, k, v, grid=grid)
    torch.cuda.synchronize() if device.type == "cuda" else None
    wall = (time.perf_counter() - t) * 1e3
    s = attn.last_stats
    err = ((out.float() - dense.float()).norm() / dense.float().norm()).item()
    row = {"case": label, "size": size, "call": i, "anchor": s["anchor"], "wall_ms": wall,
           "clustering_ms": s["clustering_s"] * 1e3, "merging_ms": s["merging_s"] * 1e3,
           "layout_ms": s["layout_s"] * 1e3,
           "attention_ms": s["attention_s"] * 1e3, "density": s["density"],
           "tile_efficiency": s["tile_efficiency"], "rel_l2": err, "q_clusters": s["q_clusters"],
           "k_clusters": s["k_clusters"], "distance_evals": s["distance_evals"]}
    RESULTS["hva"].append(row)
    log(f"{label} call {i} ({'anchor' if s['anchor'] else 'hybrid'}): wall {wall:.1f} ms; GPU time: clustering "
        f"{row['clustering_ms']:.1f} + merging {row['merging_ms']:.1f} + layout {row['layout_ms']:.1f} + attention "
        f"{row['attention_ms']:.1f}; "
        f"density {s['density']:.3f}, tile eff {s['tile_efficiency']:.2f}, rel L2 {err:.3f}")
    return s


def hva_calls(args, device, q, k, v, dense, grid, compiled, calls, density, size):
    """A warm-up instance, then anchor, four hybrid calls and an anchor, timed; then the diagnosis."""
    from kinegen.sparse_attn.hva import HVAConfig, HVAttention

    cfg = HVAConfig(density=density, tile=16 if args.smoke else 64, compile=compiled)
    warm = HVAttention(cfg)  # compiles kernels (and graphs) for both call kinds, outside the timing
    warm(q, k, v, grid=grid), warm(q, k, v, grid=grid)
    hva = HVAttention(cfg)
    label = f"hva{' compiled' if compiled else ''} {size} d={density}"
    for i in range(6):  # anchor, four hybrid calls, anchor (anchor_every=5)
        calls.append(timed_call(hva, label, size, i, q, k, v, dense, grid, device))
    if device.type == "cuda" and args.diagnose:
        diagnose(label, hva, q, k, v, grid)


def diagnose(label, hva, q, k, v, grid):
    """Host syncs in one hybrid call (torch's sync debug mode) and where its time goes (the profiler)."""
    import warnings

    hva.calls = 1  # a hybrid call next
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            hva(q, k, v, grid=grid)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{w.filename.split('/')[-1]}:{w.lineno} {str(w.message)[:80]}" for w in caught]
    RESULTS.setdefault("syncs", {})[label] = syncs
    log(f"{label}: {len(syncs)} host syncs in a hybrid call" + "".join(f"\n  {x}" for x in syncs[:12]))
    from torch.profiler import ProfilerActivity, profile

    hva.calls = 1
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        hva(q, k, v, grid=grid)
        torch.cuda.synchronize()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    table = events.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
    RESULTS.setdefault("profile", {})[label] = {"launches": launches, "table": table}
    log(f"{label}: {launches} kernel launches in a hybrid call\n{table}")


# ---------------------------------------------------------------------------- part 3: a real-size model


def wan_model(args, device, dtype, size="480p"):
    from diffusers import WanTransformer3DModel

    from kinegen.accelerators.base import RunInfo
    from kinegen.sparse_attn.apply import apply_hva, apply_kmeans_sparse
    from kinegen.sparse_attn.hva import HVAConfig, KMeansSparseConfig

    if args.smoke:
        cfg = dict(num_attention_heads=2, attention_head_dim=16, num_layers=2, ffn_dim=64, text_dim=32,
                   freq_dim=32, in_channels=4, out_channels=4)
        latent, text = (1, 4, 4, 16, 16), (1, 8, 32)
    else:  # Wan 2.1 T2V 1.3B; 81 frames at 480 x 832 / 720 x 1280 -> latents 21 x 60 x 104 / 21 x 90 x 160
        cfg = dict(num_attention_heads=12, attention_head_dim=128, num_layers=30, ffn_dim=8960, text_dim=4096,
                   freq_dim=256, in_channels=16, out_channels=16)
        F, H, W = WAN_GRIDS[size]
        latent, text = (1, 16, F, 2 * H, 2 * W), (1, 512, 4096)
    cfg.update(patch_size=(1, 2, 2), cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    t = time.perf_counter()
    with torch.device(device):
        model = WanTransformer3DModel(**cfg).to(dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    log(f"Wan transformer, {params / 1e9:.2f} B parameters, built in {time.perf_counter() - t:.1f} s")
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(latent, device=device, generator=g, dtype=dtype)
    ctx = torch.randn(text, device=device, generator=g, dtype=dtype)
    ts = torch.tensor([500], device=device)

    def forward():
        with torch.no_grad():
            out = model(hidden_states=x, timestep=ts, encoder_hidden_states=ctx, return_dict=False)[0]
        torch.cuda.synchronize() if device.type == "cuda" else None
        return out

    def timed_calls(n):
        ms = []
        for _ in range(n):
            t = time.perf_counter()
            forward()
            ms.append((time.perf_counter() - t) * 1e3)
        return ms

    forward()  # warm-up
    dense = timed_calls(1 if args.smoke else 3)
    dense_ms = statistics.median(dense)
    RESULTS["model"].append({"case": "dense", "size": size, "params": params, "latent": latent, "ms": dense,
                             "median_ms": dense_ms})
    log(f"dense forward: {dense_ms:.0f} ms (calls {[round(m) for m in dense]})")
    steps = 5
    variants = []
    for d in args.densities:
        if "eager" in args.variants:
            variants.append(("hva", d, apply_hva, HVAConfig(density=d, dense_warmup=0.0, dense_layers=1)))
        if "compiled" in args.variants:
            variants.append(("hva compiled", d, apply_hva, HVAConfig(density=d, dense_warmup=0.0, dense_layers=1,
                                                                     compile=True)))
        if "kmeans" in args.variants and d == args.densities[0]:  # the baseline at the first density only
            variants.append(("kmeans-sparse", d, apply_kmeans_sparse,
                             KMeansSparseConfig(density=d, top_p=None, dense_warmup=0.0, dense_layers=1)))
    for name, density, apply, config in variants:
        handle = apply(model, config, RunInfo(num_inference_steps=steps))
        try:
            ms = timed_calls(steps)  # call 1: anchor (HVA) / cold k-means; then hybrid / warm calls
            st = handle.stats()
        except Exception as e:  # noqa: BLE001 - keep the other variants
            traceback.print_exc()
            RESULTS["errors"].append({"part": f"model {name}", "error": repr(e)[:500]})
            continue
        finally:
            handle.remove()
        row = {"case": name, "size": size, "density": density, "ms": ms, "first_ms": ms[0],
               "later_median_ms": statistics.median(ms[1:]), "speedup_later": dense_ms / statistics.median(ms[1:]),
               "stats": {k: v for k, v in st.items() if k != "block_pattern"}}
        RESULTS["model"].append(row)
        log(f"{name} {size} d={density}: calls {[round(m) for m in ms]} ms; later calls {row['later_median_ms']:.0f} "
            f"ms = {row['speedup_later']:.2f}x dense; mean per layer: clustering "
            f"{st.get('clustering_s', 0) * 1e3:.1f} ms, merging {st.get('merging_s', 0) * 1e3:.1f} ms, "
            f"attention {st.get('attention_s', 0) * 1e3:.1f} ms, density {st.get('density', 0):.3f}, "
            f"tile eff {st.get('tile_efficiency', 0):.2f}")
        forward()  # removed: dense again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (with TRITON_INTERPRET=1)")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.25])
    ap.add_argument("--sizes", nargs="+", default=["480p"], choices=list(WAN_GRIDS))
    ap.add_argument("--variants", nargs="+", default=["eager", "compiled", "kmeans"],
                    choices=["eager", "compiled", "kmeans"])
    ap.add_argument("--diagnose", action="store_true", help="host syncs and a profile of one hybrid call")
    ap.add_argument("--parts", nargs="+", default=["kernels", "hva", "model"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    import triton

    RESULTS["config"].update(torch=torch.__version__, triton=triton.__version__, smoke=args.smoke,
                             device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                             dtype=str(dtype), densities=args.densities)
    log(json.dumps(RESULTS["config"]))
    torch.manual_seed(0)
    if "kernels" in args.parts:
        part("kernels", args.out)(kernels)(args, device, dtype)
    for size in args.sizes:
        if "hva" in args.parts:
            part(f"hva module {size}", args.out)(hva_module)(args, device, dtype, size)
        if "model" in args.parts:
            part(f"wan 1.3B {size}", args.out)(wan_model)(args, device, dtype, size)
    log(f"\nerrors: {RESULTS['errors']}")


if __name__ == "__main__":
    main()
