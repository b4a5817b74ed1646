"""The History tab: this server's recent runs, newest first.

Clicking a generation's (or GAN grid's) row shows its output and settings in the Generate (or GAN) tab; that
crosses tabs, so :func:`kinegen.apps.web.build_app` wires it. A profile's row offers its report here, and an
Understand run's row its picture of the kept tokens (:meth:`HistoryTab.show`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..service import Service
from .common import TabContext

TAB_ID = "history"
HEADERS = ["time", "type", "model", "prompt", "seed", "accelerators", "seconds", "output"]
# Shares of the table's width: the prompt and the output's file name wrap; the rest fit on one line.
WIDTHS = ["12%", "7%", "13%", "22%", "5%", "14%", "7%", "20%"]


def make_table(svc: Service):
    """The history table, not yet rendered: every tab's run refreshes it; :func:`build` places it."""
    import gradio as gr

    return gr.Dataframe(headers=HEADERS, value=svc.history_rows, interactive=False, wrap=True, render=False,
                        column_widths=WIDTHS, label="history", show_label=False,
                        elem_id="kinegen-history")


@dataclasses.dataclass
class HistoryTab:
    """The table, its Refresh button and the selected profile's report."""

    table: Any
    refresh: Any
    report: Any

    @property
    def outputs(self) -> list:
        """The components :meth:`show` fills."""
        return [self.report]

    @staticmethod
    def show(entry: dict[str, Any] | None) -> list:
        """Updates for :attr:`outputs`: a profile's report or an Understand run's picture, or nothing (a generation
        shows in its own tab)."""
        import gradio as gr

        offered = entry is not None and entry["type"] in ("profile", "understand")
        return [gr.update(value=entry["output"] if offered else None, visible=offered)]


def build(ctx: TabContext) -> HistoryTab:
    import gradio as gr

    with gr.Tab("History", id=TAB_ID):
        gr.Markdown("This server's recent runs, newest first. Click a row to see its output with its settings in "
                    "the Generate (or GAN) tab; a profile's row offers its report here, an Understand run's row its "
                    "picture.")
        table = ctx.history.render()
        refresh = gr.Button("Refresh")
        report = gr.File(label="Selected row's report (zip) or picture", visible=False)
    refresh.click(ctx.svc.history_rows, None, [table], api_visibility="private")
    return HistoryTab(table=table, refresh=refresh, report=report)
