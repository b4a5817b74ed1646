"""The Generate tab: one video (or image) with optional accelerators, previews, the dense comparison,
and the ``/generate`` API endpoint (named parameters, each with a default)."""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request,
# gr.Progress) at runtime to know which parameters it fills in itself.
import dataclasses
import queue
import random
import threading
from typing import Any

import numpy as np

from .common import NONE, TabContext, accelerator_help, display_size, log, page_error, timing_markdown, user_name

TAB_ID = "generate"


@dataclasses.dataclass
class GenerateTab:
    """What other tabs use: the settings a History row loads (in the order :meth:`load` fills them)."""

    settings: list  # model, prompt, negative, height, width, frames, steps, guidance, seed, cache, cache
    #                 options, attention, attention options
    outputs: list  # the output video, the output image and the run's information (what :meth:`show` fills)
    caches: list[str]
    attentions: list[str]
    svc: Any = None  # the service: a row's model decides the Frames field's label and step

    @property
    def prompt(self):
        """The prompt box (the Understand tab's caption button fills it)."""
        return self.settings[1]

    @staticmethod
    def show(entry: dict[str, Any]) -> list:
        """Values for :attr:`outputs` from a ``generate`` history entry: its video (or image) and where it came from."""
        import gradio as gr

        out, r = entry["output"], entry["request"]
        is_video = out.endswith(".mp4")
        h, w = display_size(r.get("height") or 128, r.get("width") or 128)
        total = entry.get("total_s")
        took = f", {total:.2f} s" if total is not None else ""
        accs = " + ".join(entry.get("accelerators") or []) or "dense"
        return [gr.update(value=out if is_video else None, visible=is_video, height=h, width=w),
                gr.update(value=None if is_video else out, visible=not is_video, height=h, width=w),
                f"From the History: the run of {entry['time']} ({accs}{took}), seed {r.get('seed', 0)}."]

    def load(self, entry: dict[str, Any]) -> list:
        """Values for :attr:`settings` from a ``generate`` history entry."""
        import gradio as gr

        r = entry["request"]
        specs = entry.get("accelerators") or []
        cache_spec = next((s for s in specs if s.split(":")[0] in self.caches), NONE)
        attn_spec = next((s for s in specs if s.split(":")[0] in self.attentions), NONE)
        frames = r.get("frames")
        if self.svc is not None:  # the row's model may be another kind than the selected one (4k+1 or 8k+1)
            frames = frames_update(self.svc, entry["model"], frames)
        return [gr.update(value=entry["model"]), r["prompt"], r.get("negative_prompt") or "",
                r.get("height"), r.get("width"), frames, r.get("steps"), r.get("guidance"),
                r.get("seed", 0), cache_spec.split(":")[0], cache_spec.split(":", 1)[1] if ":" in cache_spec else "",
                attn_spec.split(":")[0], attn_spec.split(":", 1)[1] if ":" in attn_spec else ""]


def build(ctx: TabContext) -> GenerateTab:
    import gradio as gr

    from ...generation import GenerationRequest

    config, svc = ctx.config, ctx.svc
    text_models = ctx.text_models
    d = svc.model_defaults(text_models[0]) if text_models else {}

    with gr.Tab("Generate", id=TAB_ID):
        with gr.Row():
            with gr.Column(scale=2):
                model = gr.Dropdown(text_models, value=text_models[0] if text_models else None, label="Model")
                prompt = gr.Textbox(label="Prompt", value="a red circle moving to the right on a gray background",
                                    lines=2, max_length=config.max_prompt_chars)
                negative = gr.Textbox(label="Negative prompt", value="", lines=1, max_length=config.max_prompt_chars)
                with gr.Row():
                    height = gr.Number(label="Height", value=d.get("height", 128), precision=0)
                    width = gr.Number(label="Width", value=d.get("width", 128), precision=0)
                    frames = gr.Number(value=d.get("frames", 17), precision=0,
                                       **frames_field(svc, text_models[0] if text_models else "", d))
                with gr.Row():
                    steps = gr.Slider(1, config.max_steps, value=d.get("steps", 20), step=1, label="Steps")
                    guidance = gr.Slider(0, 20, value=d.get("guidance", 4.0), step=0.5, label="Guidance")
                with gr.Row():
                    seed = gr.Number(label="Seed", value=0, precision=0, minimum=0)
                    randomize = gr.Checkbox(label="Randomise seed", value=False)
                with gr.Accordion("Accelerators", open=True):
                    with gr.Row():
                        cache = gr.Dropdown(ctx.caches, value=NONE, label="Cache")
                        cache_opts = gr.Textbox(label="Cache options (key=value,...)", placeholder="speedup=3")
                    with gr.Row():
                        attention = gr.Dropdown(ctx.attentions, value=NONE, label="Attention")
                        attention_opts = gr.Textbox(label="Attention options (key=value,...)",
                                                    placeholder="backend=native")
                    with gr.Accordion("What each accelerator does", open=False):
                        gr.Markdown(accelerator_help("cache") + "\n" + accelerator_help("attention"))
                    compare = gr.Checkbox(label="Compare with dense (runs the dense baseline too)", value=False)
                with gr.Row():
                    run_btn = gr.Button("Generate", variant="primary", scale=3)
                    stop_btn = gr.Button("Stop", variant="stop", scale=1)
            with gr.Column(scale=3):
                preview = gr.Image(label="Preview (denoising in progress)", type="numpy", height=200)
                # Shown at a whole multiple of the output's size (display_size), with hard pixel edges.
                out_h, out_w = display_size(d.get("height", 128), d.get("width", 128))
                with gr.Row():
                    video = gr.Video(label="Output", format="mp4", autoplay=True, loop=True, height=out_h,
                                     width=out_w, elem_classes="kinegen-pixels", elem_id="kinegen-output")
                    image_out = gr.Image(label="Output image", type="filepath", visible=False, height=out_h,
                                         width=out_w, elem_classes="kinegen-pixels")
                    dense_video = gr.Video(label="Dense baseline (same seed)", format="mp4", visible=False,
                                           autoplay=True, loop=True, height=out_h, width=out_w,
                                           elem_classes="kinegen-pixels")
                info = gr.Markdown(elem_id="kinegen-info")
                # The pictures carry their own titles; a label would sit on top of them.
                heatmap = gr.Image(label="Map-Guided Caching: TVMap and plan", show_label=False, type="filepath",
                                   visible=False, elem_id="kinegen-heatmap")
                pattern = gr.Image(label="Sparse attention: kept blocks", show_label=False, type="filepath",
                                   visible=False)
        api_video = gr.Video(label="video", visible=False)
        api_btn = gr.Button(visible=False)
        # The API's parameters (hidden: the page has its own controls). The prompt has no value, so the API marks
        # it required; every other one has its default.
        api_prompt = gr.Textbox(label="prompt", visible=False)
        api_seed = gr.Number(value=0, label="seed", precision=0, visible=False)
        api_text = {k: gr.Textbox(value=v, label=k, visible=False) for k, v in (
            ("negative_prompt", ""), ("model", ""), ("cache", NONE), ("cache_options", ""), ("attention", NONE),
            ("attention_options", ""))}
        api_num = {k: gr.Number(value=v, label=k, visible=False) for k, v in (
            ("height", 0), ("width", 0), ("frames", 0), ("steps", 0), ("guidance", -1.0))}

    def on_model(name):
        dd = svc.model_defaults(name)
        return (gr.update(value=dd.get("height")), gr.update(value=dd.get("width")), frames_update(svc, name),
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

    # The running generation of each browser session, so that Stop can end it at its next step. (Gradio's own
    # cancel only abandons the event; the worker thread would otherwise run on and keep the model.)
    running: dict[str, threading.Event] = {}

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
            raise page_error(e) from None
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()  # set by Stop, or when Gradio closes this generator (the page went away)
        session = getattr(request, "session_hash", None) or str(id(cancel))
        running[session] = cancel
        every = config.preview_every or max(1, int(req.steps or 20) // 5)
        pipe_box: dict[str, Any] = {}
        grown = GrowingVideo(svc.partial_video(model_))  # an autoregressive model's video so far

        def on_step(i, n, latents):
            preview_img = None
            if latents is not None and ((i + 1) % every == 0) and "pipe" in pipe_box and not grown.total:
                preview_img = preview_frame(pipe_box["pipe"], latents)  # chunks show their own frames instead
            events.put(("step", i + 1, n, preview_img))

        def work():
            try:
                if svc.runner.local:  # a remote runner's pipeline is on the backend: no latents previews
                    pipe_box["pipe"] = svc.pipeline(model_)
                out = svc.generate(model_, req, specs, compare=bool(compare_), user=user_name(request),
                                   step_callback=on_step, chunk_callback=grown.on_chunk(events), cancel=cancel)
                events.put(("done", out))
            except Exception as e:  # handed to the page below
                if cancel.is_set():  # stopped: the page is gone or going, remove its previews now
                    grown.close()
                events.put(("error", e))

        threading.Thread(target=work, daemon=True).start()
        progress(0, desc="loading the model and encoding the prompt")
        try:
            while True:
                ev = events.get()
                if ev[0] == "step":
                    _, i, n, img = ev
                    if grown.total:  # chunk by chunk: the status line, not Gradio's progress (it would hide the video)
                        yield {info: grown.status(i, n)}
                        continue
                    then = ", then the dense baseline" if compare_ and specs else ""
                    done = f" (decoding{then})" if i == n else ""
                    progress((i, n), desc=f"denoising step {i}/{n}{done}")
                    # Yield at every step, even with nothing to show: Gradio can stop a generator only at a yield.
                    yield {preview: img if img is not None else gr.update()}
                elif ev[0] == "chunk":
                    yield {**grown.show(ev[1], video, image_out), info: grown.chunk_status(ev[1]),
                           preview: None if ev[1] == 0 else gr.update()}
                elif ev[0] == "error":
                    raise page_error(ev[1])
                else:
                    out = ev[1]
                    break
        finally:  # Stop, a closed page, or an error: the worker stops at its next step and frees the model
            cancel.set()
            grown.close()
            if running.get(session) is cancel:
                del running[session]
        is_video = out["kind"] == "video"
        h, w = display_size(out["request"]["height"], out["request"]["width"])
        grown_label = {"label": "Output"} if grown.total else {}  # the label said how far the video had grown
        yield {
            video: gr.update(value=out["output"] if is_video else None, visible=is_video, height=h, width=w,
                             **grown_label),
            image_out: gr.update(value=None if is_video else out["output"], visible=not is_video, height=h,
                                 width=w),
            dense_video: gr.update(value=out.get("dense_output") if is_video else None,
                                   visible=is_video and "dense_output" in out, height=h, width=w),
            info: timing_markdown(out),
            heatmap: gr.update(value=out.get("heatmap"), visible="heatmap" in out),
            pattern: gr.update(value=out.get("block_pattern"), visible="block_pattern" in out),
            seed: out["request"]["seed"],
            ctx.history: svc.history_rows(),
        }

    gen_inputs = [model, prompt, negative, height, width, frames, steps, guidance, seed, randomize, cache,
                  cache_opts, attention, attention_opts, compare]
    run_event = run_btn.click(run_generate, gen_inputs,
                              [preview, video, image_out, dense_video, info, heatmap, pattern, seed, ctx.history],
                              concurrency_id="device", api_visibility="undocumented")

    def stop_run(request: gr.Request):
        """The Stop button: this session's run ends at its next denoising step; nothing is written."""
        cancel = running.get(getattr(request, "session_hash", None) or "")
        if cancel is not None:
            cancel.set()

    stop_btn.click(stop_run, None, None, cancels=[run_event], queue=False, api_visibility="private")

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
            return svc.generate(name, req, specs, user=user_name(request))["output"]
        except Exception as e:
            raise page_error(e) from None

    api_btn.click(generate, [api_prompt, api_seed, api_text["negative_prompt"], api_text["model"], api_num["height"],
                             api_num["width"], api_num["frames"], api_num["steps"], api_num["guidance"],
                             api_text["cache"], api_text["cache_options"], api_text["attention"],
                             api_text["attention_options"]],
                  [api_video], api_name="generate", concurrency_id="device")

    return GenerateTab(settings=[model, prompt, negative, height, width, frames, steps, guidance, seed, cache,
                                 cache_opts, attention, attention_opts], outputs=[video, image_out, info],
                       caches=list(ctx.caches), attentions=list(ctx.attentions), svc=svc)


def frames_update(svc, model: str, value: int | None = None):
    """The Frames field for ``model``: ``value`` (default: the model's frame count), its label and step, shown
    for video models only. A model the server cannot resolve keeps the field as it is, with the value."""
    import gradio as gr

    try:
        dd = svc.model_defaults(model)
    except Exception:  # a History row of a model this server no longer offers: the Generate button says why
        log.debug("defaults of %s", model, exc_info=True)
        return gr.update(value=value)
    return gr.update(value=dd.get("frames") if value is None else value, visible=dd.get("kind") == "video",
                     **frames_field(svc, model, dd))


def frames_field(svc, model: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """The Frames field's label, step and note for ``model``: ``4k+1`` for most models; for an autoregressive
    model the counts that split into its chunks (``8k+1``, listed in the note), so that the arrows step through
    valid counts only. Falls back to ``4k+1`` when the model cannot be loaded (the run then says why)."""
    plain = {"label": "Frames (4k+1)", "step": 1, "info": None}
    if not defaults.get("autoregressive"):
        return plain
    try:
        counts = svc.frame_counts(model)
    except Exception:  # the Generate button reports the real error
        log.debug("frame counts of %s", model, exc_info=True)
        return plain
    if not counts:
        return {"label": "Frames", "step": 1,
                "info": f"Chunk by chunk: no frame count up to this server's limit splits into {model}'s chunks."}
    steps = {b - a for a, b in zip(counts, counts[1:], strict=False)}
    step = steps.pop() if len(steps) == 1 else 1
    rule = f"{step}k+{counts[0] % step}" if step > 1 else ", ".join(map(str, counts[:6]))
    shown = ", ".join(map(str, counts[:4])) + (f", ... {counts[-1]}" if len(counts) > 4 else "")
    return {"label": f"Frames ({rule})", "step": step,
            "info": f"Chunk by chunk: frame counts that split into {model}'s chunks: {shown}."}


def _frames(n: int) -> str:
    return f"{n} frame{'' if n == 1 else 's'}"


class GrowingVideo:
    """The Generate tab's view of an autoregressive run: the chunk callback (run in the worker thread) keeps the
    frames so far and tells the page's loop; the loop writes the newest frames as a preview video (skipping any
    that a newer chunk has already replaced) and shows a status line, ``chunk i/n, step j/k``, where other models
    have Gradio's progress bar: a progress message covers every output of the event, and the video must stay in
    sight while it grows."""

    def __init__(self, partial):
        self.partial = partial  # a service.PartialVideo
        self.total = 0  # chunks in the run (0 until the run says: a model that is not autoregressive)
        self.done = 0  # chunks committed, as the page's loop has seen them
        self.frames = 0  # video frames shown so far
        self._latest: tuple[int, Any] = (0, None)

    def on_chunk(self, events: queue.Queue):
        """The run's ``chunk_callback``: keeps the newest frames and queues a ``("chunk", done)`` event."""

        def callback(done: int, total: int, frames) -> None:
            self.total = total
            self._latest = (done, frames)
            events.put(("chunk", done))

        return callback

    def status(self, step: int, steps: int) -> str:
        """The status line during denoising step ``step`` of ``steps`` of the chunk after the ones done."""
        so_far = f" ({_frames(self.frames)} so far)" if self.frames else ""
        return f"Generating: chunk {min(self.done + 1, self.total)}/{self.total}, step {step}/{steps}{so_far}."

    def chunk_status(self, done: int) -> str:
        """The status line once ``done`` chunks are committed and decoded."""
        if done == 0:
            return f"Generating: chunk 1/{self.total}, encoding the prompt."
        if done == self.total:
            return f"Generating: chunk {done}/{self.total} done, writing the video ({_frames(self.frames)})."
        return f"Generating: chunk {done}/{self.total} done ({_frames(self.frames)} so far)."

    def show(self, done: int, video, image_out) -> dict:
        """Updates for the page after chunk ``done``: the video so far (written only for the newest chunk)."""
        import gradio as gr

        self.done = done
        latest, frames = self._latest
        path = self.partial.write(frames) if done == latest and frames is not None else None
        if path is None:
            return {video: gr.update()}
        self.frames = len(frames)
        h, w = display_size(frames.shape[1], frames.shape[2])
        return {video: gr.update(value=path, visible=True, height=h, width=w,
                                 label=f"Output so far: chunk {done}/{self.total}, {_frames(len(frames))}"),
                image_out: gr.update(visible=False)}

    def close(self) -> None:
        self.partial.close()


def preview_frame(pipe, latents) -> np.ndarray | None:
    """The current (noisy) latents as a uint8 picture, or None.

    The model family's adapter decides whether a preview is cheap enough and decodes it
    (``ModelAdapter.preview_frame``); a preview must never break the run, so any failure is None.
    """
    try:
        from ...adapters import get_adapter

        return get_adapter(pipe).preview_frame(pipe, latents)
    except Exception:  # a preview must never break the run
        log.debug("preview failed", exc_info=True)
        return None
