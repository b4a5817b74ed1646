"""``kinegen app``: the Gradio web UI (Generate, GAN, Profile, History) and its ``generate`` API.

The page is built from the registries: the model pickers list the server's models, and the
accelerator pickers list every registered accelerator of each kind with its keys and defaults,
so accelerators added later appear without changes here. All work goes through
:class:`kinegen.apps.service.Service`; this module only lays out components and turns errors
into messages shown in the page (the app keeps serving after any failed run).

API (``gradio_client``)::

    from gradio_client import Client
    result = Client("http://127.0.0.1:7860/").predict(prompt="a red circle moving right", seed=0,
                                                      api_name="/generate")
    result["video"]  # a local copy of the mp4
"""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request,
# gr.SelectData, gr.Progress) at runtime to know which parameters it fills in itself.
import logging
import queue
import random
import threading
from typing import Any

import numpy as np

from ..errors import KinegenError
from .service import AppConfig, Service

log = logging.getLogger("kinegen.app")

NONE = "none"


def _user(request) -> str:
    if request is None:
        return "anonymous"
    name = getattr(request, "username", None)
    if name:
        return f"user:{name}"
    client = getattr(request, "client", None)
    return f"ip:{getattr(client, 'host', None) or 'unknown'}"


def _error(e: Exception):
    """A message for the page: ours as they are, anything else named and logged (the app keeps running)."""
    import gradio as gr

    if isinstance(e, gr.Error):
        return e
    if isinstance(e, KinegenError):
        return gr.Error(str(e))
    log.exception("run failed")
    return gr.Error(f"The run failed ({type(e).__name__}: {e}). The server is still up; try other settings.")


def _accelerator_help(kind: str) -> str:
    import dataclasses as dc

    from ..accelerate import list_accelerators

    lines = []
    for acc in list_accelerators(kind):
        keys = ", ".join(f"{f.name}={f.default}" for f in dc.fields(acc.config_cls))
        lines.append(f"- **{acc.name}**: {acc.summary}. Keys: `{keys}`")
    return "\n".join(lines)


def _timing_markdown(out: dict[str, Any]) -> str:
    t = out["timings"]
    rows = [("text encoder", t.get("text_encoder")), ("transformer", t.get("transformer")),
            ("VAE decode", t.get("vae_decode")), ("other", t.get("other")), ("total", t.get("total"))]
    md = "| stage | seconds |\n|---|---|\n" + "".join(f"| {k} | {v:.2f} |\n" for k, v in rows if v is not None)
    md += f"\n{t.get('transformer_calls', '?')} transformer calls."
    if "speedup" in out:
        d = out["dense_timings"]
        md += (f"\n\n**Against dense** (same request, run after it): dense {d['total']:.2f} s, accelerated "
               f"{t['total']:.2f} s: **{out['speedup']:.2f}x** end to end, {out['transformer_speedup']:.2f}x "
               f"transformer; PSNR **{out['psnr_db']:.2f} dB**.")
    for st in out["stats"]:
        scalars = {k: v for k, v in st.items() if k not in ("name", "config") and isinstance(v, (int, float, str))}
        if scalars:
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in scalars.items())
            md += f"\n\n`{st['name']}`: {shown}"
    return md


def build_app(config: AppConfig | None = None, service: Service | None = None):
    """The Gradio Blocks app (not launched). ``launch_app`` adds the queue, auth and allowed paths."""
    import gradio as gr

    from ..accelerate import list_accelerators
    from ..generation import GenerationRequest

    config = config or AppConfig()
    svc = service or Service(config)
    caches = [NONE] + [a.name for a in list_accelerators("cache")]
    attentions = [NONE] + [a.name for a in list_accelerators("attention")]
    text_models, gan_models = list(config.models), list(config.gan_models)
    d = svc.model_defaults(text_models[0]) if text_models else {}

    with gr.Blocks(title="Kinegen") as app:
        gr.Markdown("# Kinegen\nFast video and image generation on diffusers pipelines: generate, compare "
                    "accelerators with the dense baseline, and profile them.")
        with gr.Tabs() as tabs:
            # ---------------------------------------------------------------- Generate
            with gr.Tab("Generate", id="generate"):
                with gr.Row():
                    with gr.Column(scale=2):
                        model = gr.Dropdown(text_models, value=text_models[0] if text_models else None,
                                            label="Model")
                        prompt = gr.Textbox(label="Prompt", value="a red circle moving to the right on a gray "
                                            "background", lines=2, max_length=config.max_prompt_chars)
                        negative = gr.Textbox(label="Negative prompt", value="", lines=1,
                                              max_length=config.max_prompt_chars)
                        with gr.Row():
                            height = gr.Number(label="Height", value=d.get("height", 128), precision=0)
                            width = gr.Number(label="Width", value=d.get("width", 128), precision=0)
                            frames = gr.Number(label="Frames (4k+1)", value=d.get("frames", 17), precision=0)
                        with gr.Row():
                            steps = gr.Slider(1, config.max_steps, value=d.get("steps", 20), step=1, label="Steps")
                            guidance = gr.Slider(0, 20, value=d.get("guidance", 4.0), step=0.5, label="Guidance")
                        with gr.Row():
                            seed = gr.Number(label="Seed", value=0, precision=0, minimum=0)
                            randomize = gr.Checkbox(label="Randomise seed", value=False)
                        with gr.Accordion("Accelerators", open=True):
                            with gr.Row():
                                cache = gr.Dropdown(caches, value=NONE, label="Cache")
                                cache_opts = gr.Textbox(label="Cache options (key=value,...)",
                                                        placeholder="speedup=3")
                            with gr.Row():
                                attention = gr.Dropdown(attentions, value=NONE, label="Attention")
                                attention_opts = gr.Textbox(label="Attention options (key=value,...)",
                                                            placeholder="backend=native")
                            with gr.Accordion("What each accelerator does", open=False):
                                gr.Markdown(_accelerator_help("cache") + "\n" + _accelerator_help("attention"))
                            compare = gr.Checkbox(label="Compare with dense (runs the dense baseline too)",
                                                  value=False)
                        run_btn = gr.Button("Generate", variant="primary")
                    with gr.Column(scale=3):
                        preview = gr.Image(label="Preview (denoising in progress)", type="numpy", height=200)
                        with gr.Row():
                            video = gr.Video(label="Output", format="mp4", autoplay=True, loop=True)
                            image_out = gr.Image(label="Output image", type="filepath", visible=False)
                            dense_video = gr.Video(label="Dense baseline (same seed)", format="mp4", visible=False,
                                                   autoplay=True, loop=True)
                        info = gr.Markdown()
                        heatmap = gr.Image(label="Map-Guided Caching: TVMap and plan", type="filepath",
                                           visible=False)
                        pattern = gr.Image(label="Sparse attention: kept blocks", type="filepath", visible=False)
                api_video = gr.Video(label="video", visible=False)
                api_btn = gr.Button(visible=False)

            # ---------------------------------------------------------------- GAN
            with gr.Tab("GAN", id="gan", visible=bool(gan_models)):
                gan_classes = svc.class_names(gan_models[0]) if gan_models else []
                with gr.Row():
                    with gr.Column():
                        gan_model = gr.Dropdown(gan_models, value=gan_models[0] if gan_models else None,
                                                label="Model")
                        gan_class = gr.CheckboxGroup(gan_classes, value=gan_classes[:1], label="Classes")
                        with gr.Row():
                            gan_n = gr.Slider(1, config.max_gan_images, value=16, step=1, label="Images")
                            gan_seed = gr.Number(label="First seed", value=0, precision=0, minimum=0)
                        gan_trunc = gr.Slider(0.1, 1.0, value=1.0, step=0.05, label="Truncation (1 = off)")
                        gan_btn = gr.Button("Generate grid", variant="primary")
                    with gr.Column():
                        gan_grid = gr.Image(label="Grid", type="filepath")
                        gan_info = gr.Markdown(label="timing")

            # ---------------------------------------------------------------- Profile
            with gr.Tab("Profile", id="profile"):
                with gr.Row():
                    with gr.Column():
                        prof_model = gr.Dropdown(text_models, value=text_models[0] if text_models else None,
                                                 label="Model")
                        prof_configs = gr.Textbox(label="Configurations (one per line; join with + to combine)",
                                                  value="mapguided:speedup=2\nfirst-block:threshold=0.05", lines=4)
                        prof_prompts = gr.Textbox(label="Prompts (one per line)",
                                                  value="a red circle moving to the right on a gray background",
                                                  lines=3)
                        with gr.Row():
                            prof_steps = gr.Number(label="Steps (empty = model default)", value=None, precision=0)
                            prof_repeats = gr.Slider(1, config.max_profile_repeats, value=1, step=1,
                                                     label="Timed repeats")
                        prof_btn = gr.Button("Run profile", variant="primary")
                    with gr.Column():
                        prof_table = gr.Markdown(label="table")
                        prof_plots = gr.Gallery(label="Plots", columns=2, height=320)
                        prof_file = gr.File(label="Report (zip)")

            # ---------------------------------------------------------------- History
            with gr.Tab("History", id="history"):
                gr.Markdown("This server's recent runs, newest first. Click a row to load its settings into "
                            "the Generate (or GAN) tab.")
                history = gr.Dataframe(headers=["time", "type", "model", "prompt", "seed", "accelerators",
                                                "seconds", "output"], value=svc.history_rows,
                                       interactive=False, wrap=True)
                refresh = gr.Button("Refresh")
                history_out = gr.Video(label="Selected output", format="mp4")
                history_img = gr.Image(label="Selected output", type="filepath", visible=False)

        # -------------------------------------------------------------------- handlers

        def on_model(name):
            dd = svc.model_defaults(name)
            return (gr.update(value=dd.get("height")), gr.update(value=dd.get("width")),
                    gr.update(value=dd.get("frames"), visible=dd.get("kind") == "video"),
                    gr.update(value=dd.get("steps")), gr.update(value=dd.get("guidance")))

        # .input, not .change: loading a history row sets the model too, and must keep the row's settings.
        model.input(on_model, [model], [height, width, frames, steps, guidance], api_visibility="private")

        def make_request(prompt_, seed_, negative_, height_, width_, frames_, steps_, guidance_):
            return GenerationRequest(prompt=prompt_ or "", negative_prompt=negative_ or None,
                                     height=None if height_ is None else int(height_),
                                     width=None if width_ is None else int(width_),
                                     frames=None if frames_ is None else int(frames_),
                                     steps=None if steps_ is None else int(steps_),
                                     guidance=None if guidance_ is None else float(guidance_),
                                     seed=int(seed_ or 0))

        def run_generate(model_, prompt_, negative_, height_, width_, frames_, steps_, guidance_, seed_, randomize_,
                         cache_, cache_opts_, attention_, attention_opts_, compare_, request: gr.Request,
                         progress=gr.Progress()):
            """The Generate button: progress per step, previews, outputs and (optionally) the dense run."""
            try:
                if randomize_:
                    seed_ = random.randrange(0, 2**31 - 1)
                req = make_request(prompt_, seed_, negative_, height_, width_, frames_, steps_, guidance_)
                specs = svc.accelerator_specs(cache_, cache_opts_, attention_, attention_opts_)
                svc.check_request(req)
            except Exception as e:
                raise _error(e) from None
            events: queue.Queue = queue.Queue()
            every = config.preview_every or max(1, int(req.steps or 20) // 5)
            pipe_box: dict[str, Any] = {}

            def on_step(i, n, latents):
                preview_img = None
                if latents is not None and ((i + 1) % every == 0) and "pipe" in pipe_box:
                    preview_img = preview_frame(pipe_box["pipe"], latents)
                events.put(("step", i + 1, n, preview_img))

            def work():
                try:
                    pipe_box["pipe"] = svc.pipeline(model_)
                    out = svc.generate(model_, req, specs, compare=bool(compare_), user=_user(request),
                                       step_callback=on_step)
                    events.put(("done", out))
                except Exception as e:  # handed to the page below
                    events.put(("error", e))

            threading.Thread(target=work, daemon=True).start()
            progress(0, desc="loading the model and encoding the prompt")
            while True:
                ev = events.get()
                if ev[0] == "step":
                    _, i, n, img = ev
                    then = ", then the dense baseline" if compare_ and specs else ""
                    done = f" (decoding{then})" if i == n else ""
                    progress((i, n), desc=f"denoising step {i}/{n}{done}")
                    if img is not None:
                        yield {preview: img}
                elif ev[0] == "error":
                    raise _error(ev[1])
                else:
                    out = ev[1]
                    break
            is_video = out["kind"] == "video"
            yield {
                video: gr.update(value=out["output"] if is_video else None, visible=is_video),
                image_out: gr.update(value=None if is_video else out["output"], visible=not is_video),
                dense_video: gr.update(value=out.get("dense_output") if is_video else None,
                                       visible=is_video and "dense_output" in out),
                info: f"Seed {out['request']['seed']}. " + _timing_markdown(out),
                heatmap: gr.update(value=out.get("heatmap"), visible="heatmap" in out),
                pattern: gr.update(value=out.get("block_pattern"), visible="block_pattern" in out),
                seed: out["request"]["seed"],
                history: svc.history_rows(),
            }

        gen_inputs = [model, prompt, negative, height, width, frames, steps, guidance, seed, randomize, cache,
                      cache_opts, attention, attention_opts, compare]
        run_btn.click(run_generate, gen_inputs,
                      [preview, video, image_out, dense_video, info, heatmap, pattern, seed, history],
                      concurrency_id="device", api_visibility="undocumented")

        def generate(prompt: str, seed: int = 0, negative_prompt: str = "", model: str = "", height: int = 0,
                     width: int = 0, frames: int = 0, steps: int = 0, guidance: float = -1.0, cache: str = NONE,
                     cache_options: str = "", attention: str = NONE, attention_options: str = "",
                     request: gr.Request = None) -> str:
            """Generate one video (or image) and return its file. Zero (or -1 for guidance) = the model's
            default; cache/attention take an accelerator name and options as key=value,..."""
            try:
                name = model or text_models[0]
                req = GenerationRequest(prompt=prompt or "", negative_prompt=negative_prompt or None,
                                        height=int(height) or None, width=int(width) or None,
                                        frames=int(frames) or None, steps=int(steps) or None,
                                        guidance=None if guidance is None or guidance < 0 else float(guidance),
                                        seed=int(seed))
                specs = svc.accelerator_specs(cache, cache_options, attention, attention_options)
                return svc.generate(name, req, specs, user=_user(request))["output"]
            except Exception as e:
                raise _error(e) from None

        # The API's optional parameters, each with its default (hidden: the page has its own controls).
        api_text = {k: gr.Textbox(value=v, label=k, visible=False) for k, v in (
            ("negative_prompt", ""), ("model", ""), ("cache", NONE), ("cache_options", ""), ("attention", NONE),
            ("attention_options", ""))}
        api_num = {k: gr.Number(value=v, label=k, visible=False) for k, v in (
            ("height", 0), ("width", 0), ("frames", 0), ("steps", 0), ("guidance", -1.0))}
        api_btn.click(generate, [prompt, seed, api_text["negative_prompt"], api_text["model"], api_num["height"],
                                 api_num["width"], api_num["frames"], api_num["steps"], api_num["guidance"],
                                 api_text["cache"], api_text["cache_options"], api_text["attention"],
                                 api_text["attention_options"]],
                      [api_video], api_name="generate", concurrency_id="device")

        def run_gan(model, classes, num_images, seed, truncation, request: gr.Request):
            """A grid of one-step GAN images: image i uses seed + i and cycles through the classes."""
            try:
                out = svc.generate_gan(model, classes or [], int(num_images), int(seed or 0), float(truncation),
                                       user=_user(request))
            except Exception as e:
                raise _error(e) from None
            t = out["timings"]
            return (out["output"], f"{len(out['classes'])} images in {t['generator'] * 1000:.1f} ms "
                                   f"({t['per_image'] * 1000:.2f} ms each; one step, batched generator forwards).",
                    svc.history_rows())

        gan_btn.click(run_gan, [gan_model, gan_class, gan_n, gan_seed, gan_trunc], [gan_grid, gan_info, history],
                      concurrency_id="device", api_name="gan")

        def on_gan_model(name):
            names = svc.class_names(name)
            return gr.update(choices=names, value=names[:1])

        gan_model.input(on_gan_model, [gan_model], [gan_class], api_visibility="private")

        def run_profile(model, configs, prompts, steps, repeats, request: gr.Request, progress=gr.Progress()):
            """The dense baseline and each configuration (one per line) on the prompts (one per line)."""
            def tick(done, total, label):
                progress((done, total), desc=f"{label} ({done}/{total})")

            try:
                out = svc.profile(model, (prompts or "").splitlines(), (configs or "").splitlines(),
                                  repeats=int(repeats), steps=int(steps) if steps else None, user=_user(request),
                                  progress=tick)
            except Exception as e:
                raise _error(e) from None
            return out["table"], out["plots"], out["archive"], svc.history_rows()

        prof_btn.click(run_profile, [prof_model, prof_configs, prof_prompts, prof_steps, prof_repeats],
                       [prof_table, prof_plots, prof_file, history], concurrency_id="device", api_name="profile")

        def on_history_select(evt: gr.SelectData):
            try:
                e = svc.history_entry(str(evt.row_value[-1]))  # by output name, not by position
            except Exception as err:
                raise _error(err) from None
            r = e["request"]
            out_is_video = e["output"].endswith(".mp4")
            updates = [gr.update(value=e["output"] if out_is_video else None, visible=out_is_video),
                       gr.update(value=None if out_is_video or e["output"].endswith(".zip") else e["output"],
                                 visible=not out_is_video)]
            if e["type"] == "generate":
                specs = e.get("accelerators") or []
                cache_spec = next((s for s in specs if s.split(":")[0] in caches), NONE)
                attn_spec = next((s for s in specs if s.split(":")[0] in attentions), NONE)
                updates += [gr.update(value=e["model"]), r["prompt"], r.get("negative_prompt") or "",
                            r.get("height"), r.get("width"), r.get("frames"), r.get("steps"), r.get("guidance"),
                            r.get("seed", 0), cache_spec.split(":")[0],
                            cache_spec.split(":", 1)[1] if ":" in cache_spec else "",
                            attn_spec.split(":")[0], attn_spec.split(":", 1)[1] if ":" in attn_spec else "",
                            gr.update(), gr.update(), gr.update(), gr.update(), gr.Tabs(selected="generate")]
            elif e["type"] == "gan":
                updates += [gr.update()] * 13 + [gr.update(value=e["model"]),
                                                 gr.update(value=r["prompt"].split(", ")), r.get("num_images", 16),
                                                 r.get("seed", 0), gr.Tabs(selected="gan")]
            else:
                updates += [gr.update()] * 17 + [gr.update()]
            return updates

        select_outputs = [history_out, history_img, model, prompt, negative, height, width, frames, steps, guidance,
                          seed, cache, cache_opts, attention, attention_opts, gan_model, gan_class, gan_n, gan_seed]
        history.select(on_history_select, None, select_outputs + [tabs],
                       api_visibility="private")
        refresh.click(svc.history_rows, None, [history], api_visibility="private")
    app.kinegen_service = svc
    return app


def preview_frame(pipe, latents) -> np.ndarray | None:
    """The first frame of the current (noisy) latents, decoded by the VAE: cheap for Wan's causal VAE,
    which decodes one latent frame alone. ``None`` for families where a preview would cost a full decode."""
    import torch

    from ..registry import family_for_pipeline

    try:
        if family_for_pipeline(pipe).name != "wan":
            return None
        vae = pipe.vae
        z = latents[:1, :, :1].to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(z)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(z)
        with torch.no_grad():
            x = vae.decode(z * std + mean, return_dict=False)[0]
        img = ((x[0, :, 0].float().clamp(-1, 1) + 1) / 2).permute(1, 2, 0).cpu().numpy()
        return (img * 255).round().astype(np.uint8)
    except Exception:  # a preview must never break the run
        log.debug("preview failed", exc_info=True)
        return None


def launch_app(config: AppConfig, *, host: str = "127.0.0.1", port: int | None = None,
               prevent_thread_lock: bool = False, **launch_kwargs):
    """Build the app, enable Gradio's queue with the configured limits, and launch it."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from a private server
    app = build_app(config)
    app.queue(max_size=config.max_queue, default_concurrency_limit=config.concurrency)
    app.launch(server_name=host, server_port=port, auth=config.auth, allowed_paths=[str(config.output_dir.resolve())],
               prevent_thread_lock=prevent_thread_lock, show_error=True, max_file_size="10mb",
               **launch_kwargs)
    return app


__all__ = ["AppConfig", "Service", "build_app", "launch_app", "preview_frame"]
