"""Position interpolation for Wan's 3D RoPE: one set of weights at several video sizes.

Wan's rotary embedding gives latent token ``(f, h, w)`` the integer positions ``f``, ``h``, ``w``.
A model trained on one grid (the bundled model: 5 x 8 x 8 tokens at 17 x 128 x 128) sees a 24 x 24
grid as a larger *scene* at the same scale: it draws its 8-token shapes four and nine times over, or
texture (benchmarks/bundled_model.md). The procedural data are the same scene at every size (positions,
sizes and speeds are fractions of the frame and of the clip), so the right positions for a larger grid
are the reference grid's, sampled more densely:

    pos_axis(i) = i * s_axis,   s = ref / n  (height, width),   s = (ref - 1) / (n - 1)  (frames)

(Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation",
Eq. 2, per axis). Space scales by the token pitch (the frame is ``n`` cells wide at every size); time by
the frame interval, because a clip's first and last frames are its trajectory's ends at any length.
On the reference grid every ``s`` is 1 and :class:`InterpolatedWanRoPE` returns Wan's own tables, bit for
bit, so the default size costs and computes exactly what it did.

Interpolation alone puts the shapes at the right scale at 256 x 256 (docs/bundled_model.md); the
multi-resolution fine-tune (``kinegen train t2v --sizes ...``) teaches the model the denser positions.
A model folder that needs it says so in ``kinegen_rope.json`` (``{"reference_grid": [5, 8, 8]}``), which
:func:`kinegen.load_pipeline` reads; with plain diffusers, call :func:`install_position_interpolation`
after loading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from ..errors import ConfigError

ROPE_FILE = "kinegen_rope.json"


def interpolated_positions(size: int, reference: int, temporal: bool) -> torch.Tensor:
    """Positions of ``size`` tokens along an axis trained with ``reference`` tokens (float64)."""
    if temporal:
        scale = (reference - 1) / (size - 1) if size > 1 and reference > 1 else 1.0
    else:
        scale = reference / size
    return torch.arange(size, dtype=torch.float64) * scale


class InterpolatedWanRoPE(WanRotaryPosEmbed):
    """Wan's RoPE with positions interpolated to ``reference_grid`` (latent tokens after patching:
    frames, height, width). Same tables and output layout as :class:`WanRotaryPosEmbed`."""

    def __init__(self, base: WanRotaryPosEmbed, reference_grid: tuple[int, int, int], theta: float = 10000.0):
        super().__init__(base.attention_head_dim, base.patch_size, base.max_seq_len, theta)
        self.freqs_cos, self.freqs_sin = base.freqs_cos, base.freqs_sin  # keep the base's dtype and device
        self.reference_grid = tuple(int(n) for n in reference_grid)
        self.theta = theta
        self._grids: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, hidden_states: torch.Tensor):
        _, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        grid = (frames // p_t, height // p_h, width // p_w)
        if grid == self.reference_grid:
            return super().forward(hidden_states)  # Wan's own tables
        key = (grid, self.freqs_cos.device, self.freqs_cos.dtype)
        if key not in self._grids:
            self._grids = {key: self._tables(grid)}  # one size at a time: a run keeps its size
        return self._grids[key]

    def _tables(self, grid: tuple[int, int, int]):
        dims = (self.t_dim, self.h_dim, self.w_dim)
        cos, sin = [], []
        for axis, (dim, n, ref) in enumerate(zip(dims, grid, self.reference_grid, strict=True)):
            pos = interpolated_positions(n, ref, temporal=axis == 0)
            c, s = get_1d_rotary_pos_embed(dim, pos, self.theta, use_real=True, repeat_interleave_real=True,
                                           freqs_dtype=torch.float64)
            shape = [1, 1, 1, dim]
            shape[axis] = n
            cos.append(c.view(shape).expand(*grid, dim))
            sin.append(s.view(shape).expand(*grid, dim))
        like = self.freqs_cos
        return tuple(torch.cat(t, dim=-1).reshape(1, -1, 1, self.attention_head_dim).to(like.device, like.dtype)
                     for t in (cos, sin))


def install_position_interpolation(transformer, reference_grid) -> InterpolatedWanRoPE:
    """Replace ``transformer.rope`` (a ``WanRotaryPosEmbed``) with :class:`InterpolatedWanRoPE`; idempotent."""
    rope = transformer.rope
    if isinstance(rope, InterpolatedWanRoPE):
        rope.reference_grid = tuple(int(n) for n in reference_grid)
        rope._grids = {}
        return rope
    if not isinstance(rope, WanRotaryPosEmbed):
        raise ConfigError(f"position interpolation is for Wan's 3D RoPE; this transformer's is {type(rope).__name__}.")
    transformer.rope = InterpolatedWanRoPE(rope, reference_grid)
    return transformer.rope


def read_rope_file(folder: str | os.PathLike) -> tuple[int, int, int] | None:
    """The reference grid a model folder declares in ``kinegen_rope.json`` (None without the file)."""
    path = Path(folder) / ROPE_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); restore it from the model's source.") from e
    grid = raw.get("reference_grid") if isinstance(raw, dict) else None
    if not (isinstance(grid, list) and len(grid) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in grid)):
        raise ConfigError(f'{path} must be {{"reference_grid": [frames, height, width]}} with three positive '
                          f"integers (latent tokens of the training size); got {raw!r}.")
    return tuple(grid)


def write_rope_file(folder: str | os.PathLike, reference_grid) -> None:
    """Declare the reference grid in ``folder/kinegen_rope.json`` (written atomically)."""
    from ..media import atomic_path

    with atomic_path(Path(folder) / ROPE_FILE) as tmp:
        tmp.write_text(json.dumps({"reference_grid": [int(n) for n in reference_grid]}) + "\n")
