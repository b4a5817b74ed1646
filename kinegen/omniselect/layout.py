"""Where the audio and video tokens of a prefill are and which time group each belongs to.

A group is a window of ``group_seconds`` on the temporal rotary position (TMRoPE's t index, counted in
``position_id_per_seconds`` ids per second from the first media token of the row). For Qwen2.5-Omni with audio in
video this is exactly its interleave chunk (2 s = 50 ids: the video grids and the 50 audio tokens of one chunk);
for Qwen3-Omni, which interleaves per token, it is the portable reading of a group (reference section 4.2).
Images are not time-grouped and are never pruned.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class RowLayout:
    """One batch row: sequence indices of its video and audio tokens and their time groups."""

    video: torch.Tensor  # [Nv] sequence indices
    audio: torch.Tensor  # [Na]
    video_group: torch.Tensor  # [Nv] group of each video token
    audio_group: torch.Tensor  # [Na]
    n_groups: int
    valid: torch.Tensor  # [L] bool: not padding

    @property
    def n_media(self) -> int:
        return int(self.video.numel() + self.audio.numel())


def temporal_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """The t row ``[B, L]`` of 3D (``[3, B, L]``) or text-plus-3D (``[4, B, L]``, as ``generate`` passes) positions."""
    if position_ids.ndim != 3 or position_ids.shape[0] not in (3, 4):
        raise ValueError(f"expected position ids of shape [3 or 4, B, L]; got {tuple(position_ids.shape)}")
    return position_ids[position_ids.shape[0] - 3]


def row_layouts(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
                video_token_id: int, audio_token_id: int, ids_per_group: float) -> list[RowLayout]:
    """Every row's :class:`RowLayout` (``ids_per_group = group_seconds * position_id_per_seconds``)."""
    t_all = temporal_positions(position_ids)
    rows = []
    for b in range(input_ids.shape[0]):
        ids = input_ids[b]
        valid = attention_mask[b].bool() if attention_mask is not None else torch.ones_like(ids, dtype=torch.bool)
        video = ((ids == video_token_id) & valid).nonzero().flatten()
        audio = ((ids == audio_token_id) & valid).nonzero().flatten()
        t = t_all[b].to(ids.device)
        media = torch.cat([video, audio])
        t0 = t[media].min() if media.numel() else 0
        vg = ((t[video] - t0).double() / ids_per_group).floor().long()
        ag = ((t[audio] - t0).double() / ids_per_group).floor().long()
        n_groups = int(torch.cat([vg, ag]).max()) + 1 if media.numel() else 0
        rows.append(RowLayout(video, audio, vg, ag, n_groups, valid))
    return rows
