"""Triton kernels of the 3D local-window clustering, each beside its torch reference.

* :func:`assign_local_triton` = :func:`kinegen.sparse_attn.clustering.assign_local`: one program per
  (batch x head, window) loads the window's tokens once and compares them with the window's candidate
  centroids (those of the 3x3x3 neighbouring windows) in chunks of the head dimension,
  ``||x||^2 - 2 x.c + ||c||^2`` through ``tl.dot``, keeping the best and second-best distance. A subset
  of tokens (hybrid steps) runs the same kernel on a window table that holds only those tokens.
* :func:`update_centroids_triton` = :func:`kinegen.sparse_attn.clustering.update_centroids`: one program
  per block of tokens adds each token into its centroid's running sum and count with atomics.

On CPU they run only under ``TRITON_INTERPRET=1`` (set before triton is imported): a correctness check,
not a fast path. Triton is imported lazily, so importing this module never needs it.
"""

from __future__ import annotations

import functools
import os

import torch

from .clustering import Assignment, WindowGrid, candidate_centroids, subset_table


def _require_triton(x: torch.Tensor):
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton clustering kernels need a CUDA GPU, or TRITON_INTERPRET=1 (set before "
                           "triton is imported) for a slow CPU correctness run; use kernel='torch' here.")
    import triton  # noqa: F401


def _next_pow2(n: int, at_least: int = 16) -> int:
    return max(at_least, 1 << (max(1, n) - 1).bit_length())


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def assign_kernel(x_ptr, c_ptr, order_ptr, cand_ptr, label_ptr, margin_ptr, N, K, D, T, C,
                      BT: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr):
        g = tl.program_id(0)  # batch x head
        w = tl.program_id(1)  # window
        rt = tl.arange(0, BT)
        rc = tl.arange(0, BC)
        tok = tl.load(order_ptr + w * T + rt, mask=rt < T, other=-1)
        cid = tl.load(cand_ptr + w * C + rc, mask=rc < C, other=-1)
        tok_ok = tok >= 0
        cid_ok = cid >= 0
        dots = tl.zeros((BT, BC), dtype=tl.float32)
        xn = tl.zeros((BT,), dtype=tl.float32)
        cn = tl.zeros((BC,), dtype=tl.float32)
        for d0 in range(0, D, BD):
            rd = d0 + tl.arange(0, BD)
            xt = tl.load(x_ptr + (g * N + tok[:, None]) * D + rd[None, :], mask=tok_ok[:, None] & (rd[None, :] < D),
                         other=0.0).to(tl.float32)
            ct = tl.load(c_ptr + (g * K + cid[:, None]) * D + rd[None, :], mask=cid_ok[:, None] & (rd[None, :] < D),
                         other=0.0).to(tl.float32)
            dots += tl.dot(xt, tl.trans(ct), input_precision="ieee")
            xn += tl.sum(xt * xt, axis=1)
            cn += tl.sum(ct * ct, axis=1)
        d2 = xn[:, None] - 2.0 * dots + cn[None, :]
        d2 = tl.where(cid_ok[None, :], d2, float("inf"))
        best = tl.min(d2, axis=1)
        arg = tl.argmin(d2, axis=1)
        second = tl.min(tl.where(rc[None, :] == arg[:, None], float("inf"), d2), axis=1)
        label = tl.sum(tl.where(rc[None, :] == arg[:, None], cid[None, :], 0), axis=1)
        tl.store(label_ptr + g * N + tok, label.to(tl.int64), mask=tok_ok)
        tl.store(margin_ptr + g * N + tok, second - best, mask=tok_ok)

    @triton.jit
    def update_kernel(x_ptr, label_ptr, sum_ptr, count_ptr, N, K, D, BN: tl.constexpr, BD: tl.constexpr):
        g = tl.program_id(0)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        ok = rn < N
        lab = tl.load(label_ptr + g * N + rn, mask=ok, other=0)
        tl.atomic_add(count_ptr + g * K + lab, tl.where(ok, 1.0, 0.0), mask=ok)
        for d0 in range(0, D, BD):
            rd = d0 + tl.arange(0, BD)
            m = ok[:, None] & (rd[None, :] < D)
            xt = tl.load(x_ptr + (g * N + rn[:, None]) * D + rd[None, :], mask=m, other=0.0).to(tl.float32)
            tl.atomic_add(sum_ptr + (g * K + lab[:, None]) * D + rd[None, :], xt, mask=m)

    return assign_kernel, update_kernel


def assign_local_triton(x: torch.Tensor, centroids: torch.Tensor, wg: WindowGrid, per_window: int,
                        tokens: torch.Tensor | None = None, margin: bool = True) -> Assignment:
    """Triton version of :func:`~kinegen.sparse_attn.clustering.assign_local` (same arguments and result;
    the kernel computes the margin in the same pass, so ``margin=False`` saves nothing here)."""
    _require_triton(x)
    assign_kernel, _ = _kernels()
    B, H, N, D = x.shape
    K = centroids.shape[2]
    order = (wg.on(x.device, "order") if tokens is None else subset_table(wg, tokens.to(x.device))).contiguous()
    cand = wg.on(x.device, f"cand{per_window}", lambda w: candidate_centroids(w, per_window)).contiguous()
    labels = torch.full((B, H, N), -1, dtype=torch.long, device=x.device)
    margins = torch.full((B, H, N), float("inf"), dtype=torch.float32, device=x.device)
    T, C = order.shape[1], cand.shape[1]
    assign_kernel[(B * H, wg.num_windows)](x.contiguous(), centroids.contiguous(), order, cand, labels, margins,
                                           N, K, D, T, C, BT=_next_pow2(T), BC=_next_pow2(C),
                                           BD=min(64, _next_pow2(D)))
    # Counted without reading the GPU: from the host-side window table, or as a device tensor for a subset.
    def n_cand(w):
        return (candidate_centroids(w, per_window) >= 0).sum(1)

    if tokens is None:
        evals = int(wg.on("cpu", f"evals{per_window}", lambda w: (n_cand(w) * (w.order >= 0).sum(1)).sum())) * B * H
    else:
        evals = wg.on(x.device, f"ncand{per_window}", n_cand)[
            wg.on(x.device, "window_of_token")[tokens.to(x.device)]].sum() * B * H
    return Assignment(labels, margins, evals)


def update_centroids_triton(x: torch.Tensor, labels: torch.Tensor,
                            centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`~kinegen.sparse_attn.clustering.update_centroids`."""
    _require_triton(x)
    _, update_kernel = _kernels()
    B, H, N, D = x.shape
    K = centroids.shape[2]
    sums = torch.zeros(B, H, K, D, dtype=torch.float32, device=x.device)
    counts = torch.zeros(B, H, K, dtype=torch.float32, device=x.device)
    BN = 64
    update_kernel[(B * H, (N + BN - 1) // BN)](x.contiguous(), labels.contiguous(), sums, counts, N, K, D, BN=BN,
                                              BD=min(64, _next_pow2(D)))
    new = torch.where(counts.unsqueeze(-1) > 0, sums / counts.clamp(min=1).unsqueeze(-1), centroids.float())
    return new, counts
