"""How much of a clustered sparse attention's error is block selection? (HVA and the SVG2-style baseline)

Both methods pick (query cluster, key cluster) pairs by the attention mass they expect from centroids
(``kinegen.sparse_attn.blocks.cluster_scores``). This script keeps each method's clusters (after HVA's
merging) and its density budget, and swaps only the scores the budget is spent on:

* ``centroid``: the methods' own score, ``n_j exp(c_i . c_j * scale)`` normalised per query cluster;
* ``centroid-query``: the exact mass the query centroid ``c_i`` puts on the tokens of key cluster ``j``;
* ``oracle``: the exact mass the query cluster's members put on key cluster ``j``, averaged over the
  members (read from the full attention matrix: a bound, not a method).

Every selection runs as a token-level masked dense attention and is compared with dense attention on
the anchor step's captured q, k, v (``benchmarks/sparse_attention.py --capture-file``).

    .venv/bin/python benchmarks/sparse_selection.py --capture-file runs/capture_s4.pt
"""

import argparse
import json
from pathlib import Path

import torch

from kinegen.sparse_attn import blocks as B
from kinegen.sparse_attn.hva import HVAConfig, HVAttention, KMeansSparseAttention, KMeansSparseConfig


def scores(source, q, k, lq, cq, nq, lk, ck, nk, scale):
    """``P[g, i, j]`` for one score source; q, k ``[G, N, D]``, labels ``[G, N]``, centroids ``[G, K, D]``."""
    if source == "centroid":
        return B.cluster_scores(cq, nq, ck, nk, scale)
    G, Kq, Kk = cq.shape[0], cq.shape[1], ck.shape[1]
    queries = cq.float() if source == "centroid-query" else q.float()
    attn = torch.softmax(torch.einsum("gnd,gmd->gnm", queries, k.float()) * scale, -1)
    per_key_cluster = torch.zeros(G, attn.shape[1], Kk).scatter_add_(2, lk.unsqueeze(1).expand_as(attn), attn)
    if source == "centroid-query":
        return per_key_cluster
    summed = torch.zeros(G, Kq, Kk).scatter_add_(1, lq.unsqueeze(-1).expand(-1, -1, Kk), per_key_cluster)
    return summed / nq.float().clamp(min=1).unsqueeze(-1)


def masked_attention(q, k, v, keep, lq, lk, scale):
    """Dense attention restricted to the kept cluster pairs, token by token."""
    G = keep.shape[0]
    g = torch.arange(G).view(G, 1, 1)
    mask = keep[g, lq.unsqueeze(-1), lk.unsqueeze(1)]  # [G, N, N]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture-file", default="runs/capture_s4.pt")
    ap.add_argument("--step", type=int, default=8, help="captured step to use (the anchor call)")
    ap.add_argument("--densities", default="0.1,0.2,0.3")
    ap.add_argument("--output", default="benchmarks/results/sparse_selection.json")
    args = ap.parse_args()
    data = {tuple(k): (q, k_, v, tuple(g)) for k, q, k_, v, g in torch.load(args.capture_file, weights_only=True)}
    rows = []
    for layer in sorted({key[0] for key in data}):
        q, k, v, grid = data[(layer, args.step)]
        Bb, H, N, D = q.shape
        scale = D ** -0.5
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        flat = [x.reshape(Bb * H, N, D) for x in (q, k, v)]
        for density in [float(x) for x in args.densities.split(",")]:
            hva = HVAttention(HVAConfig(density=density, backend="dense"))
            own_hva = hva(q, k, v, grid=grid)
            st = hva.last_stats
            base = KMeansSparseAttention(KMeansSparseConfig(density=density, top_p=None, q_clusters=st["q_clusters"],
                                                            k_clusters=st["k_clusters"], backend="dense"))
            own_base = base(q, k, v, grid=grid)
            for name, module, own in (("hva", hva, own_hva), ("kmeans", base, own_base)):
                (lq, cq, nq), (lk, ck, nk) = module._merge(q, module.q_state, k, module.k_state)
                for source in ("centroid", "centroid-query", "oracle"):
                    P = scores(source, flat[0], flat[1], lq, cq, nq, lk, ck, nk, scale)
                    keep = B.select_blocks(P, nq, nk, module.config.tile, density=density, min_keys=1)
                    out = masked_attention(*flat, keep, lq, lk, scale).view_as(q)
                    err = float((out - ref).norm() / ref.norm())
                    work = B.work_stats(keep, nq, nk, module.config.tile, N)
                    row = {"layer": layer, "density": density, "method": name, "scores": source, "rel_l2": err,
                           "executed_density": float(work["density"])}
                    if source == "centroid":  # the module's own output, through its layout and backend
                        row["module_rel_l2"] = float((own - ref).norm() / ref.norm())
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print("\n| density | scores | HVA error | baseline error | ratio |\n|---|---|---|---|---|")
    for d in sorted({r["density"] for r in rows}):
        for source in ("centroid", "centroid-query", "oracle"):
            mean = {}
            for m in ("hva", "kmeans"):
                errs = [r["rel_l2"] for r in rows if (r["density"], r["scores"], r["method"]) == (d, source, m)]
                mean[m] = sum(errs) / len(errs)
            print(f"| {d} | {source} | {mean['hva']:.3f} | {mean['kmeans']:.3f} | {mean['hva'] / mean['kmeans']:.2f} |")


if __name__ == "__main__":
    main()
