"""The History tab: this server's recent runs, newest first; a row shows its output.

Loading a row's settings into the Generate or GAN tab crosses tabs, so
:func:`kinegen.apps.web.build_app` wires that event (with :meth:`HistoryTab.show`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..service import Service
from .common import TabContext

TAB_ID = "history"
HEADERS = ["time", "type", "model", "prompt", "seed", "accelerators", "seconds", "output"]


def make_table(svc: Service):
    """The history table, not yet rendered: every tab's run refreshes it; :func:`build` places it."""
    import gradio as gr

    return gr.Dataframe(headers=HEADERS, value=svc.history_rows, interactive=False, wrap=True, render=False)


@dataclasses.dataclass
class HistoryTab:
    """The table, its Refresh button and the selected run's output (a video, or else an image)."""

    table: Any
    refresh: Any
    video: Any
    image: Any

    @property
    def outputs(self) -> list:
        """The components :meth:`show` fills."""
        return [self.video, self.image]

    @staticmethod
    def show(entry: dict[str, Any]) -> list:
        """Updates for :attr:`outputs`: the entry's video, or its image (a profile's zip shows nothing)."""
        import gradio as gr

        out = entry["output"]
        is_video = out.endswith(".mp4")
        return [gr.update(value=out if is_video else None, visible=is_video),
                gr.update(value=None if is_video or out.endswith(".zip") else out, visible=not is_video)]


def build(ctx: TabContext) -> HistoryTab:
    import gradio as gr

    with gr.Tab("History", id=TAB_ID):
        gr.Markdown("This server's recent runs, newest first. Click a row to load its settings into "
                    "the Generate (or GAN) tab.")
        table = ctx.history.render()
        refresh = gr.Button("Refresh")
        video = gr.Video(label="Selected output", format="mp4")
        image = gr.Image(label="Selected output", type="filepath", visible=False)
    refresh.click(ctx.svc.history_rows, None, [table], api_visibility="private")
    return HistoryTab(table=table, refresh=refresh, video=video, image=image)
