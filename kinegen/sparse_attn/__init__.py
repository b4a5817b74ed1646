"""Attention accelerators.

* :mod:`.backends`: dense attention through a diffusers backend, selectable by name (``dense-attention``).
* :mod:`.hva`: HyperVAttention (``HVAttention``) and the SVG2-style baseline (``KMeansSparseAttention``),
  standalone modules called as ``attn(q, k, v, grid=(F, H, W))``; built from :mod:`.clustering` (3D
  local-window and global k-means), :mod:`.kernels` (Triton clustering kernels), :mod:`.blocks` (merging,
  selection, permutation) and :mod:`.block_sparse` (execution: FlexAttention, Triton, dense reference).
* :mod:`.svg2`: Sparse VideoGen 2 as its public code runs it (``SVG2Attention``, accelerator ``svg2``), the
  faithful peer; executed by :mod:`.varlen` (one padded key list per query cluster: gathered keys with
  batched SDPA on CPU, a Triton kernel with indirect key loads on GPU), which HVA uses with ``layout=lists``.
* :mod:`.apply`: any of them as the self-attention of a video pipeline (``apply_hva``, ``apply_svg2``, ...).
"""
