"""``kinegen app``: the Gradio web UI (Generate, GAN, Understand, Profile, History) and its API.

The page is built from the registries: the model pickers list the server's models, and the
accelerator pickers list every registered accelerator of each kind with its keys and defaults,
so accelerators added later appear without changes here. All work goes through
:class:`kinegen.apps.service.Service`. Each tab is a module of :mod:`kinegen.apps.tabs` that lays
out its components and wires its own events; this module composes them, wires the events that
cross tabs (a History row loads its settings into the Generate or GAN tab) and launches the app.

API (``gradio_client``)::

    from gradio_client import Client
    path = Client("http://127.0.0.1:7860/").predict(prompt="a red circle moving right", seed=0,
                                                    api_name="/generate")
    # path: a local copy of the mp4
"""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.SelectData)
# at runtime to know which parameters it fills in itself.
from .service import AppConfig, Service
from .tabs import gan, generate, history, profile, understand
from .tabs.common import CSS, TabContext, accelerator_choices, page_error
from .tabs.generate import preview_frame


def build_app(config: AppConfig | None = None, service: Service | None = None):
    """The Gradio Blocks app (not launched). ``launch_app`` adds the queue, auth and allowed paths."""
    import gradio as gr

    config = config or AppConfig()
    svc = service or Service(config)

    with gr.Blocks(title="Kinegen") as app:
        gr.Markdown("# Kinegen\nFast video and image generation on diffusers pipelines: generate, compare "
                    "accelerators with the dense baseline, and profile them.")
        ctx = TabContext(config=config, svc=svc, history=history.make_table(svc),
                         caches=accelerator_choices("cache"), attentions=accelerator_choices("attention"))
        with gr.Tabs() as tabs:
            gen_tab = generate.build(ctx)
            gan_tab = gan.build(ctx)
            understand_tab = understand.build(ctx)
            profile.build(ctx)
            history_tab = history.build(ctx)
        _wire_history_select(svc, tabs, history_tab, gen_tab, gan_tab)
        _wire_caption(svc, tabs, understand_tab, gen_tab)
    app.kinegen_service = svc
    return app


def _wire_history_select(svc: Service, tabs, history_tab: "history.HistoryTab", gen_tab: "generate.GenerateTab",
                         gan_tab: "gan.GanTab") -> None:
    """Clicking a History row shows its output and settings in the Generate or GAN tab (and switches to it); a
    profile's row offers its report in the History tab."""
    import gradio as gr

    gen_fields = gen_tab.settings + gen_tab.outputs
    gan_fields = gan_tab.settings + gan_tab.outputs

    def on_history_select(evt: gr.SelectData):
        try:
            e = svc.history_entry(str(evt.row_value[-1]))  # by output name, not by position
        except Exception as err:
            raise page_error(err) from None
        keep_gen, keep_gan = [gr.update()] * len(gen_fields), [gr.update()] * len(gan_fields)
        if e["type"] == "generate":
            filled, selected = gen_tab.load(e) + gen_tab.show(e) + keep_gan, gr.Tabs(selected=generate.TAB_ID)
        elif e["type"] == "gan":
            filled, selected = keep_gen + gan_tab.load(e) + gan_tab.show(e), gr.Tabs(selected=gan.TAB_ID)
        else:
            filled, selected = keep_gen + keep_gan, gr.update()
        return history_tab.show(e) + filled + [selected]

    history_tab.table.select(on_history_select, None, history_tab.outputs + gen_fields + gan_fields + [tabs],
                             api_visibility="private")


def _wire_caption(svc: Service, tabs, understand_tab: "understand.UnderstandTab", gen_tab: "generate.GenerateTab"):
    """The Understand tab's caption button: the omni model describes the uploaded video, and the caption becomes
    the Generate tab's prompt (and the page switches to it)."""
    import gradio as gr

    from ..pipelines.omni_understand import CAPTION_QUESTION
    from .tabs.common import user_name

    def on_caption(model, video, request: gr.Request):
        try:
            out = svc.understand(model, video, CAPTION_QUESTION, None, user=user_name(request))
        except Exception as err:
            raise page_error(err) from None
        return gr.update(value=out["answer"]), gr.Tabs(selected=generate.TAB_ID)

    understand_tab.caption_button.click(on_caption, [understand_tab.model, understand_tab.video],
                                        [gen_tab.prompt, tabs], concurrency_id="device", api_visibility="private")


def launch_app(config: AppConfig, *, host: str = "127.0.0.1", port: int | None = None,
               prevent_thread_lock: bool = False, service: Service | None = None, **launch_kwargs):
    """Build the app, enable Gradio's queue with the configured limits, and launch it. ``service`` defaults to a
    local one on ``config``; ``kinegen serve``'s front end passes one whose runner is its Ray Serve backend."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from a private server
    app = build_app(config, service)
    app.queue(max_size=config.max_queue, default_concurrency_limit=config.concurrency)
    app.launch(server_name=host, server_port=port, auth=config.auth, allowed_paths=[str(config.output_dir.resolve())],
               prevent_thread_lock=prevent_thread_lock, show_error=True, max_file_size="10mb", css=CSS,
               **launch_kwargs)
    return app


__all__ = ["AppConfig", "Service", "build_app", "launch_app", "preview_frame"]
