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
    d = svc.model_defaults(text_models[0]) if text_models else {}

    # Profiling needs the models in this process: shown for a local runner only (not kinegen serve's front end).
    with gr.Tab("Profile", id=TAB_ID, visible=svc.runner.local):
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(text_models, value=text_models[0] if text_models else None, label="Model")
                configs = gr.Textbox(label="Configurations (one per line; join with + to combine)",
                                     value="mapguided\nfirst-block:threshold=0.05", lines=4)
                prompts = gr.Textbox(label="Prompts (one per line)",
                                     value="a red circle moving to the right on a gray background", lines=3)
                with gr.Row():
                    steps = gr.Number(label="Steps (the model's default is filled in)", value=d.get("steps", 20),
                                      precision=0, minimum=1, maximum=config.max_steps)
                    repeats = gr.Slider(1, config.max_profile_repeats, value=1, step=1, label="Timed repeats")
                run_btn = gr.Button("Run profile", variant="primary")
            with gr.Column():
                plots = gr.Gallery(label="Plots", columns=2, height=360, object_fit="contain",
                                   elem_id="kinegen-plots")
                report = gr.File(label="Report (zip)")
        # Full width, below: the table has a column per measure; it scrolls sideways rather than wrapping.
        table = gr.Markdown(elem_classes="kinegen-table", elem_id="kinegen-profile-table")
        # The API (hidden components). Prompts and configurations have no value, so the API marks them required.
        with gr.Row(visible=False):
            api_prompts = gr.Textbox(label="prompts")
            api_configs = gr.Textbox(label="configs")
            api_steps = gr.Number(value=0, precision=0, label="steps")
            api_repeats = gr.Number(value=1, precision=0, label="repeats")
            api_model = gr.Textbox(value="", label="model")
            api_table = gr.Textbox(label="table")
            api_report = gr.File(label="report")
            api_btn = gr.Button()

    def on_model(name):
        return gr.update(value=svc.model_defaults(name).get("steps"))

    model.input(on_model, [model], [steps], api_visibility="private")

    def tick_for(progress):
        return lambda done, total, label: progress((done, total), desc=f"{label} ({done}/{total})")

    def run_profile(model, configs, prompts, steps, repeats, request: gr.Request, progress=gr.Progress()):
        """The Run button: the dense baseline and each configuration (one per line) on the prompts."""
        try:
            out = svc.profile(model, (prompts or "").splitlines(), (configs or "").splitlines(),
                              repeats=int(repeats), steps=int(steps) if steps else None, user=user_name(request),
                              progress=tick_for(progress))
        except Exception as e:
            raise page_error(e) from None
        return out["table"], out["plots"], out["archive"], svc.history_rows()

    run_btn.click(run_profile, [model, configs, prompts, steps, repeats], [table, plots, report, ctx.history],
                  concurrency_id="device", api_visibility="undocumented")

    def profile(prompts: str, configs: str, steps: int = 0, repeats: int = 1, model: str = "",
                request: gr.Request = None, progress=gr.Progress()):
        """Profile configurations (one per line; a+b combines) against the dense baseline on the prompts (one
        per line); returns the report's Markdown table and its zip. steps 0 = the model's default; an empty
        model = the server's first."""
        try:
            out = svc.profile(model or (text_models[0] if text_models else ""), (prompts or "").splitlines(),
                              (configs or "").splitlines(), repeats=int(repeats), steps=int(steps) or None,
                              user=user_name(request), progress=tick_for(progress))
        except Exception as e:
            raise page_error(e) from None
        return out["table"], out["archive"]

    api_btn.click(profile, [api_prompts, api_configs, api_steps, api_repeats, api_model], [api_table, api_report],
                  concurrency_id="device", api_name="profile")
    return ProfileTab(run=run_btn, table=table, plots=plots, report=report)
