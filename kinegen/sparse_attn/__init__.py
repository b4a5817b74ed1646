"""Attention accelerators.

* :mod:`.backends`: dense attention through a diffusers backend, selectable by name (``dense-attention``).
* :mod:`.hva`: HyperVAttention (``HVAttention``) and the SVG2-style baseline (``KMeansSparseAttention``),
  standalone modules called as ``attn(q, k, v, grid=(F, H, W))``; built from :mod:`.clustering` (3D
  local-window and global k-means), :mod:`.kernels` (Triton clustering kernels), :mod:`.blocks` (merging,
  selection, permutation) and :mod:`.block_sparse` (execution: FlexAttention, Triton, dense reference).
"""
