"""The GAN tab: a grid of class-conditional GAN images (``/gan`` in the API)."""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request)
# at runtime to know which parameters it fills in itself.
import dataclasses
from typing import Any

from .common import TabContext, page_error, user_name

TAB_ID = "gan"
FROM_SEED = "from the seed"  # the texture menu's first entry: each seed draws its own background

@dataclasses.dataclass
class GanTab:
    """What other tabs use: the settings a History row loads (in the order :meth:`load` fills them)."""

    settings: list  # model, classes, number of images, first seed, truncation, background texture
    outputs: list  # the grid and its information (what :meth:`show` fills)

    @staticmethod
    def show(entry: dict[str, Any]) -> list:
        """Values for :attr:`outputs` from a ``gan`` history entry."""
        total = entry.get("total_s")
        took = f" ({total:.2f} s)" if total is not None else ""
        return [entry["output"], f"From the History: the grid of {entry['time']}{took}."]

    def load(self, entry: dict[str, Any]) -> list:
        """Values for :attr:`settings` from a ``gan`` history entry."""
        import gradio as gr

        r = entry["request"]
        return [gr.update(value=entry["model"]), gr.update(value=r["prompt"].split(", ")), r.get("num_images", 16),
                r.get("seed", 0), r.get("truncation", 1.0), gr.update(value=r.get("texture") or FROM_SEED)]

def build(ctx: TabContext) -> GanTab:
    import gradio as gr

    config, svc = ctx.config, ctx.svc
    gan_models = ctx.gan_models

    with gr.Tab("GAN", id=TAB_ID, visible=bool(gan_models)):
        gan_classes = svc.class_names(gan_models[0]) if gan_models else []
        gan_textures = svc.texture_names(gan_models[0]) if gan_models else []
        # Controls above, the grid below at the page's full width: with 12 classes it has 12 columns.
        with gr.Row():
            model = gr.Dropdown(gan_models, value=gan_models[0] if gan_models else None, label="Model", scale=1)
            classes = gr.CheckboxGroup(gan_classes, value=gan_classes[:1], label="Classes (one column each)",
                                       scale=3)
        with gr.Row(equal_height=True):
            num_images = gr.Slider(1, config.max_gan_images, value=16, step=1, label="Images",
                                   elem_id="kinegen-gan-images")
            seed = gr.Number(label="First seed", value=0, precision=0, minimum=0)
            truncation = gr.Slider(0.1, 1.0, value=1.0, step=0.05, label="Truncation (1 = off; lower: less variety)",
                                   elem_id="kinegen-gan-truncation")
            # GANs trained with texture labels only (the menu is hidden for the others)
            texture = gr.Dropdown([FROM_SEED, *gan_textures], value=FROM_SEED, label="Background texture",
                                  visible=bool(gan_textures), elem_id="kinegen-gan-texture")
            run_btn = gr.Button("Generate grid", variant="primary")
        grid = gr.Image(label="Grid", type="filepath", elem_id="kinegen-gan-grid",
                        buttons=["download", "fullscreen"])
        info = gr.Markdown(label="timing")
        # The API (hidden components: the page has its own). Classes have no value, so the API marks them required.
        with gr.Row(visible=False):
            api_classes = gr.Dropdown(gan_classes, value=None, multiselect=True, allow_custom_value=True,
                                      label="classes")
            api_num = gr.Number(value=16, precision=0, label="num_images")
            api_seed = gr.Number(value=0, precision=0, label="seed")
            api_trunc = gr.Number(value=1.0, label="truncation")
            api_model = gr.Textbox(value="", label="model")
            api_texture = gr.Textbox(value="", label="texture")
            api_grid = gr.Image(type="filepath", label="grid")
            api_info = gr.Textbox(label="info")
            api_btn = gr.Button()

    def run_gan(model, classes, num_images, seed, truncation, texture, request: gr.Request):
        """A grid of one-step GAN images: image i uses seed + i and cycles through the classes."""
        try:
            out = svc.generate_gan(model, classes or [], int(num_images), int(seed or 0), float(truncation),
                                   user=user_name(request), texture=None if texture == FROM_SEED else texture)
        except Exception as e:
            raise page_error(e) from None
        return out["output"], _timing_line(out), svc.history_rows()

    run_btn.click(run_gan, [model, classes, num_images, seed, truncation, texture], [grid, info, ctx.history],
                  concurrency_id="device", api_visibility="undocumented")

    def gan(classes: list, num_images: int = 16, seed: int = 0, truncation: float = 1.0, model: str = "",
            texture: str = "", request: gr.Request = None):
        """A grid of one-step GAN images of the given classes (image i uses seed + i and cycles through the
        classes); returns the grid's file and a line of timing. An empty model = the server's first GAN; an empty
        texture = each seed's own background (GANs with texture labels take a texture name)."""
        try:
            name = model or (gan_models[0] if gan_models else "")
            out = svc.generate_gan(name, classes or [], int(num_images), int(seed or 0), float(truncation),
                                   user=user_name(request), texture=texture or None)
        except Exception as e:
            raise page_error(e) from None
        return out["output"], _timing_line(out)

    api_btn.click(gan, [api_classes, api_num, api_seed, api_trunc, api_model, api_texture], [api_grid, api_info],
                  concurrency_id="device", api_name="gan")

    def on_gan_model(name):
        names, textures = svc.class_names(name), svc.texture_names(name)
        return (gr.update(choices=names, value=names[:1]),
                gr.update(choices=[FROM_SEED, *textures], value=FROM_SEED, visible=bool(textures)))

    model.input(on_gan_model, [model], [classes, texture], api_visibility="private")

    return GanTab(settings=[model, classes, num_images, seed, truncation, texture], outputs=[grid, info])

def _timing_line(out: dict[str, Any]) -> str:
    t = out["timings"]
    names = list(dict.fromkeys(out["classes"]))
    columns = f"Columns, left to right: {', '.join(names)}. " if len(names) > 1 else f"Class: {names[0]}. "
    if out.get("texture"):
        columns += f"Backgrounds: {out['texture']}. "
    return (columns + f"{len(out['classes'])} images in {t['generator'] * 1000:.1f} ms "
            f"({t['per_image'] * 1000:.2f} ms each; one step, batched generator forwards).")
