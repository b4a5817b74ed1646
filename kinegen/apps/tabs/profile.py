"""The Profile tab: ``kinegen.profile`` on the server's models (``/profile`` in the API)."""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request,
# gr.Progress) at runtime to know which parameters it fills in itself.
import dataclasses
from typing import Any

from .common import TabContext, page_error, user_name

TAB_ID = "profile"


@dataclasses.dataclass
class ProfileTab:
    """The tab's run button and outputs (no other tab needs more)."""

    run: Any
    table: Any
    plots: Any
    report: Any


def build(ctx: TabContext) -> ProfileTab:
    import gradio as gr

    config, svc = ctx.config, ctx.svc
    text_models = ctx.text_models

    with gr.Tab("Profile", id=TAB_ID):
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(text_models, value=text_models[0] if text_models else None, label="Model")
                configs = gr.Textbox(label="Configurations (one per line; join with + to combine)",
                                     value="mapguided\nfirst-block:threshold=0.05", lines=4)
                prompts = gr.Textbox(label="Prompts (one per line)",
                                     value="a red circle moving to the right on a gray background", lines=3)
                with gr.Row():
                    steps = gr.Number(label="Steps (empty = model default)", value=None, precision=0)
                    repeats = gr.Slider(1, config.max_profile_repeats, value=1, step=1, label="Timed repeats")
                run_btn = gr.Button("Run profile", variant="primary")
            with gr.Column():
                table = gr.Markdown(label="table")
                plots = gr.Gallery(label="Plots", columns=2, height=320)
                report = gr.File(label="Report (zip)")

    def run_profile(model, configs, prompts, steps, repeats, request: gr.Request, progress=gr.Progress()):
        """The dense baseline and each configuration (one per line) on the prompts (one per line)."""
        def tick(done, total, label):
            progress((done, total), desc=f"{label} ({done}/{total})")

        try:
            out = svc.profile(model, (prompts or "").splitlines(), (configs or "").splitlines(),
                              repeats=int(repeats), steps=int(steps) if steps else None, user=user_name(request),
                              progress=tick)
        except Exception as e:
            raise page_error(e) from None
        return out["table"], out["plots"], out["archive"], svc.history_rows()

    run_btn.click(run_profile, [model, configs, prompts, steps, repeats], [table, plots, report, ctx.history],
                  concurrency_id="device", api_name="profile")
    return ProfileTab(run=run_btn, table=table, plots=plots, report=report)
