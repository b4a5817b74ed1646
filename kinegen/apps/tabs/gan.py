"""The GAN tab: a grid of class-conditional GAN images (``/gan`` in the API)."""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request)
# at runtime to know which parameters it fills in itself.
import dataclasses
from typing import Any

from .common import TabContext, page_error, user_name

TAB_ID = "gan"


@dataclasses.dataclass
class GanTab:
    """What other tabs use: the settings a History row loads (in the order :meth:`load` fills them)."""

    settings: list  # model, classes, number of images, first seed

    def load(self, entry: dict[str, Any]) -> list:
        """Values for :attr:`settings` from a ``gan`` history entry."""
        import gradio as gr

        r = entry["request"]
        return [gr.update(value=entry["model"]), gr.update(value=r["prompt"].split(", ")), r.get("num_images", 16),
                r.get("seed", 0)]


def build(ctx: TabContext) -> GanTab:
    import gradio as gr

    config, svc = ctx.config, ctx.svc
    gan_models = ctx.gan_models

    with gr.Tab("GAN", id=TAB_ID, visible=bool(gan_models)):
        gan_classes = svc.class_names(gan_models[0]) if gan_models else []
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(gan_models, value=gan_models[0] if gan_models else None, label="Model")
                classes = gr.CheckboxGroup(gan_classes, value=gan_classes[:1], label="Classes")
                with gr.Row():
                    num_images = gr.Slider(1, config.max_gan_images, value=16, step=1, label="Images")
                    seed = gr.Number(label="First seed", value=0, precision=0, minimum=0)
                truncation = gr.Slider(0.1, 1.0, value=1.0, step=0.05, label="Truncation (1 = off)")
                run_btn = gr.Button("Generate grid", variant="primary")
            with gr.Column():
                grid = gr.Image(label="Grid", type="filepath")
                info = gr.Markdown(label="timing")

    def run_gan(model, classes, num_images, seed, truncation, request: gr.Request):
        """A grid of one-step GAN images: image i uses seed + i and cycles through the classes."""
        try:
            out = svc.generate_gan(model, classes or [], int(num_images), int(seed or 0), float(truncation),
                                   user=user_name(request))
        except Exception as e:
            raise page_error(e) from None
        t = out["timings"]
        return (out["output"], f"{len(out['classes'])} images in {t['generator'] * 1000:.1f} ms "
                               f"({t['per_image'] * 1000:.2f} ms each; one step, batched generator forwards).",
                svc.history_rows())

    run_btn.click(run_gan, [model, classes, num_images, seed, truncation], [grid, info, ctx.history],
                  concurrency_id="device", api_name="gan")

    def on_gan_model(name):
        names = svc.class_names(name)
        return gr.update(choices=names, value=names[:1])

    model.input(on_gan_model, [model], [classes], api_visibility="private")

    return GanTab(settings=[model, classes, num_images, seed])
