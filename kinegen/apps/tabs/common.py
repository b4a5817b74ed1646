"""What the tabs share: the build context, user names, error messages, accelerator help and timing text."""

from __future__ import annotations

import dataclasses
import html
import logging
from typing import Any

from ...errors import KinegenError
from ...text import stat_items
from ..service import AppConfig, Service

log = logging.getLogger("kinegen.app")

NONE = "none"  # the "no accelerator" choice of the cache and attention pickers


@dataclasses.dataclass
class TabContext:
    """Everything a tab's ``build`` needs.

    Attributes:
        config: the server's settings.
        svc: the service every run goes through.
        history: the History tab's table. ``build_app`` creates it unrendered before any tab, so that
            every run's event can refresh it; the History tab renders it in its place.
        caches, attentions: the accelerator pickers' choices (``NONE`` first, then the registry's names).
    """

    config: AppConfig
    svc: Service
    history: Any
    caches: list[str]
    attentions: list[str]

    @property
    def text_models(self) -> list[str]:
        return list(self.config.models)

    @property
    def gan_models(self) -> list[str]:
        return list(self.config.gan_models)


def accelerator_choices(kind: str) -> list[str]:
    """``NONE`` and the name of every registered accelerator of ``kind`` (``cache`` or ``attention``)."""
    from ...accelerators.catalog import list_accelerators

    return [NONE] + [a.name for a in list_accelerators(kind)]


def user_name(request) -> str:
    """Who runs this (for the rate limit and the history): the login name, else the client address."""
    if request is None:
        return "anonymous"
    name = getattr(request, "username", None)
    if name:
        return f"user:{name}"
    client = getattr(request, "client", None)
    return f"ip:{getattr(client, 'host', None) or 'unknown'}"


def page_error(e: Exception):
    """A message for the page. A user's error (ours, or a ``gr.Error`` raised by a tab) is shown as it is and
    logged as one line, without a traceback; anything else is a bug: named on the page, logged with its
    traceback (the app keeps running)."""
    import gradio as gr

    if isinstance(e, gr.Error | KinegenError):
        message = e.message if isinstance(e, gr.Error) else str(e)
        log.info("request refused: %s", " ".join(message.split()))
        # print_exception=False: Gradio's queue would otherwise print a traceback for every refused request
        return gr.Error(message, print_exception=False)
    log.exception("run failed")
    return gr.Error(f"The run failed ({type(e).__name__}: {e}). The server is still up; try other settings.")


def accelerator_help(kind: str) -> str:
    """One Markdown line per registered accelerator of ``kind``: name, summary, keys and defaults."""
    from ...accelerators.catalog import list_accelerators

    lines = []
    for acc in list_accelerators(kind):
        keys = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(acc.config_cls))
        lines.append(f"- **{acc.name}**: {acc.summary}. Keys: `{keys}`")
    return "\n".join(lines)


# The largest on-screen side of an output video: small videos are shown at a whole multiple of their size (a
# 128x128 video at 3x), so that no pixel is smeared over a fraction of another; see ``display_size``.
DISPLAY_SIDE = 384

# Page styles: outputs scaled by whole multiples keep hard pixel edges; the profile table scrolls sideways
# rather than wrapping its headers letter by letter.
CSS = """
.kinegen-pixels { box-sizing: content-box !important; }
.kinegen-pixels video, .kinegen-pixels img { image-rendering: pixelated; width: 100% !important;
  height: 100% !important; object-fit: contain; }
.kinegen-table table { display: block; overflow-x: auto; }
.kinegen-table th, .kinegen-table td { white-space: nowrap; }
"""


def display_size(height: int, width: int) -> tuple[int, int]:
    """On-screen (height, width) of an output: the largest whole multiple of its size whose longer side is at most
    ``DISPLAY_SIDE`` (a 128x128 video at 384x384), or its own size when it is already larger."""
    scale = max(1, DISPLAY_SIDE // max(height, width, 1))
    return height * scale, width * scale


def timing_markdown(out: dict[str, Any]) -> str:
    """A run's warnings, seed, stage times, comparison with dense (if any) and each accelerator's scalar stats."""
    t = out["timings"]
    rows = [("text encoder", t.get("text_encoder")), ("transformer", t.get("transformer")),
            ("VAE decode", t.get("vae_decode")), ("other", t.get("other")), ("total", t.get("total"))]
    seed = out.get("request", {}).get("seed")
    md = f"Seed {seed}.\n\n" if seed is not None else ""  # a paragraph of its own: a table must start a block
    md += "| stage | seconds |\n|---|---|\n" + "".join(f"| {k} | {v:.2f} |\n" for k, v in rows if v is not None)
    md += f"\n\n{t.get('transformer_calls', '?')} transformer calls."
    if "speedup" in out:
        d = out["dense_timings"]
        md += (f"\n\n**Against dense** (same request, run after it): dense {d['total']:.2f} s, accelerated "
               f"{t['total']:.2f} s: **{out['speedup']:.2f}x** end to end, {out['transformer_speedup']:.2f}x "
               f"transformer; PSNR **{out['psnr_db']:.2f} dB**.")
    warnings = list(out.get("warnings") or []) + [st["warning"] for st in out["stats"] if st.get("warning")]
    md = "".join(f"**Warning:** {html.escape(w)}\n\n" for w in warnings) + md  # '<unk>' is not a tag
    for st in out["stats"]:
        shown = ", ".join(f"{k}={v}" for k, v in stat_items(st))
        if shown:
            md += f"\n\n`{st['name']}`: {shown}"
    if out.get("chunks"):
        md += "\n\n" + chunks_markdown(out["chunks"], t["total"])
    return md


def _latent_frames(n: int) -> str:
    return f"{n} latent frame{'' if n == 1 else 's'}"


def chunks_markdown(chunks: list[dict[str, Any]], total_s: float) -> str:
    """An autoregressive run's chunks: a summary line, then per chunk its video frames, transformer and decode
    seconds, when its frames were ready and the KV cache after it."""
    from ...profiling.chunks import bytes_text, chunk_summary, summary_line

    frames = sum(c["frames"] for c in chunks)
    md = (f"**Chunk by chunk**: {summary_line(chunk_summary([chunks], [total_s], frames))}.\n\n"
          "| chunk | frames | transformer s | VAE decode s | ready at s | KV cache |\n|---|---|---|---|---|---|\n")
    first = 0
    for c in chunks:
        last = first + c["frames"] - 1
        span = str(first) if last == first else f"{first}-{last}"
        md += (f"| {c['index'] + 1}/{len(chunks)} | {span} | {c['transformer_s']:.3f} | {c['decode_s']:.3f} | "
               f"{c['ready_s']:.2f} | {bytes_text(c['kv_bytes'])} ({_latent_frames(len(c['cached_frames']))}) |\n")
        first = last + 1
    return md
