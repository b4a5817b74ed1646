"""Block-sparse attention speed: dense SDPA (fp32) against compiled flex over a tile layout, interleaved.

Random q, k, v (B=1, H=2, D=64) over N tokens (a multiple of the 128-token tile); per density, a random
tile mask keeping round(density * N/128) key tiles per query tile, diagonal included. Each case is timed
after a warm-up (which compiles flex once: the shapes do not change), repeats interleaved, median reported,
with the speedup over dense SDPA against the target 0.6 x (1/density) and the relative L2 error of flex
against the fp32 reference on a subset of query tiles. Usage:

    .venv/bin/python benchmarks/block_sparse_speed.py [--tokens 16384] [--repeats 5] [--densities 0.25 0.125]
        [--output benchmarks/results/block_sparse_speed.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from kinegen.sparse_attn.block_sparse import (
    BlockLayout,
    block_sparse_attention_flex,
    block_sparse_attention_reference,
    layout_from_tile_mask,
)

TILE, HEADS, HEAD_DIM = 128, 2, 64


def random_layout(tokens: int, density: float, seed: int = 0) -> BlockLayout:
    """A layout keeping the same number of key tiles in every query tile: the diagonal plus random others."""
    n = tokens // TILE
    scores = torch.rand(1, HEADS, n, n, generator=torch.Generator().manual_seed(seed))
    scores.diagonal(dim1=-2, dim2=-1).fill_(2.0)  # above any rand(): always kept
    keep = scores.topk(max(1, round(density * n)), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, keep, True)
    return layout_from_tile_mask(mask, TILE, torch.ones(1, HEADS, tokens, dtype=torch.bool))


def query_tiles(layout: BlockLayout, tiles: torch.Tensor) -> BlockLayout:
    """The layout restricted to some query tiles (keys unchanged), for a reference on a subset of rows."""
    return BlockLayout(layout.tile, layout.kv_num_blocks[..., tiles], layout.kv_indices[..., tiles, :],
                       layout.key_valid)


def rel_l2_on_subset(q, k, v, layout: BlockLayout, out: torch.Tensor, n_tiles: int = 4) -> float:
    """Relative L2 error of ``out`` against the fp32 reference on ``n_tiles`` evenly spaced query tiles."""
    tiles = torch.linspace(0, layout.kv_indices.shape[-2] - 1, n_tiles).long().unique()
    rows = (tiles[:, None] * TILE + torch.arange(TILE)).flatten()
    ref = block_sparse_attention_reference(q[:, :, rows], k, v, query_tiles(layout, tiles))
    return ((out[:, :, rows] - ref).norm() / ref.norm()).item()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384, help=f"sequence length, a multiple of {TILE}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--densities", type=float, nargs="+", default=[0.25, 0.125])
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/block_sparse_speed.json"))
    args = ap.parse_args()
    if args.tokens % TILE:
        ap.error(f"--tokens must be a multiple of {TILE}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, args.tokens, HEAD_DIM, generator=g) for _ in range(3))
    layouts = {d: random_layout(args.tokens, d) for d in args.densities}
    cases = {"sdpa dense": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    cases |= {f"flex d={d}": lambda lay=lay: block_sparse_attention_flex(q, k, v, lay) for d, lay in layouts.items()}
    with torch.inference_mode():
        warmup = {name: timed(fn) for name, fn in cases.items()}  # includes flex's one compile
        times = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():
                times[name].append(timed(fn))
        errors = {d: rel_l2_on_subset(q, k, v, lay, block_sparse_attention_flex(q, k, v, lay))
                  for d, lay in layouts.items()}
    dense = statistics.median(times["sdpa dense"])
    rows = [{"case": "sdpa dense", "density": 1.0, "median_s": dense, "speedup": 1.0, "target": None,
             "rel_l2": None, "warmup_s": warmup["sdpa dense"]}]
    for d, lay in layouts.items():
        med = statistics.median(times[f"flex d={d}"])
        rows.append({"case": f"flex d={d}", "density": lay.density(), "median_s": med, "speedup": dense / med,
                     "target": 0.6 / lay.density(), "rel_l2": errors[d], "warmup_s": warmup[f"flex d={d}"]})
    print(f"tokens {args.tokens}, B=1 H={HEADS} D={HEAD_DIM}, tile {TILE}, fp32, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}\n")
    print("| case | density | median ms | speedup vs dense | target 0.6/density | rel-L2 vs reference |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        target = f"{r['target']:.2f}x" if r["target"] else "-"
        err = f"{r['rel_l2']:.1e}" if r["rel_l2"] is not None else "-"
        print(f"| {r['case']} | {r['density']:.3f} | {r['median_s'] * 1e3:.1f} | {r['speedup']:.2f}x | {target} "
              f"| {err} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    config = {"tokens": args.tokens, "heads": HEADS, "head_dim": HEAD_DIM, "tile": TILE, "repeats": args.repeats,
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    args.output.write_text(json.dumps({"config": config, "times_s": times, "rows": rows}, indent=2))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
