"""The Understand tab: ask the omni model about an uploaded video with its sound, optionally pruning its tokens,
and see what was kept (``/understand`` in the API). A button turns the video's caption into the Generate tab's
prompt (wired in :mod:`kinegen.apps.web`)."""

# No `from __future__ import annotations` here: Gradio reads the handlers' annotations (gr.Request)
# at runtime to know which parameters it fills in itself.
import dataclasses
from typing import Any

from .common import TabContext, page_error, user_name

TAB_ID = "understand"
NO_PRUNING = "none"


@dataclasses.dataclass
class UnderstandTab:
    caption_button: Any
    video: Any
    model: Any


def prune_spec(method: str, keep: float) -> str | None:
    """The pickers' choice as a spec: ``("omniselect", 0.3)`` -> ``"omniselect:keep=0.3"``."""
    if not method or method == NO_PRUNING:
        return None
    if method == "omniselect":
        return f"omniselect:keep={float(keep)}"
    return f"omniselect:keep={float(keep)},method={method}"


def build(ctx: TabContext) -> UnderstandTab:
    import gradio as gr

    from ...omniselect.config import METHODS

    svc, config = ctx.svc, ctx.config
    models = list(config.omni_models)
    with gr.Tab("Understand", id=TAB_ID, visible=bool(models)):
        gr.Markdown("Ask about a video **with its sound**. Pruning keeps a share of the audio and video tokens of "
                    "the model's prefill: OmniSelect picks the sense the question is about from a relevance model, "
                    "then which moments and tokens to keep. The picture shows the kept tokens (bright) and the kept "
                    f"audio (shaded). Uploads: up to {config.max_upload_mb:.0f} MB and "
                    f"{config.max_upload_seconds:.0f} s.")
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(models, value=models[0] if models else None, label="Model")
                video = gr.Video(label="Video (with sound)", sources=["upload"], elem_id="kinegen-understand-video")
                question = gr.Textbox(label="Question", value="which shape makes the high tone?",
                                      max_length=config.max_question_chars)
                with gr.Row():
                    method = gr.Dropdown([NO_PRUNING, *METHODS], value="omniselect", label="Token pruning")
                    keep = gr.Slider(0.05, 1.0, value=0.3, step=0.05, label="Share of audio and video tokens kept")
                with gr.Row():
                    ask = gr.Button("Answer", variant="primary")
                    caption = gr.Button("Caption into the Generate prompt")
            with gr.Column():
                answer = gr.Textbox(label="Answer", interactive=False, elem_id="kinegen-understand-answer")
                info = gr.Markdown(elem_id="kinegen-understand-info")
                picture = gr.Image(label="Kept tokens", type="filepath", elem_id="kinegen-understand-picture")

    def run(model_name, video_path, question_text, method_name, keep_share, request: gr.Request):
        try:
            out = svc.understand(model_name, video_path, question_text, prune_spec(method_name, keep_share),
                                 user=user_name(request))
        except Exception as e:
            raise page_error(e) from None
        return out["answer"], _info(out), out["picture"], svc.history_rows()

    ask.click(run, [model, video, question, method, keep], [answer, info, picture, ctx.history],
              concurrency_id="device", api_name="understand")
    return UnderstandTab(caption_button=caption, video=video, model=model)


def _info(out: dict[str, Any]) -> str:
    t = out["timings"]
    sound = "with sound" if out["has_audio"] else "no sound track: video only"
    line = f"{out['media_tokens']} audio and video tokens ({sound})"
    if out["prune"]:
        line += f"; kept {out['media_kept']} ({out['media_kept'] / max(out['media_tokens'], 1):.0%})"
        if out["regime"] and out["regime"] != "-":
            line += f", **{out['regime']}** regime"
    return (f"{line}. Prefill {t['prefill_s'] * 1000:.0f} ms, relevance {t['relevance_s'] * 1000:.0f} ms, "
            f"decode {t['decode_s'] * 1000:.0f} ms.")
