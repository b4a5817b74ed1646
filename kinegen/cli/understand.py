"""``kinegen understand VIDEO --question Q``: answer a question about a video with its sound, optionally pruning the
omni model's audio and video tokens (``--prune omniselect:keep=0.3``)."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "understand", help="answer a question about a video with sound (an omni model, optional token pruning)",
        description="Read VIDEO (frames at 2 fps and the sound track), ask the omni model QUESTION, print the answer. "
                    "--prune prunes the audio and video tokens of the model's prefill; the output reports the regime "
                    "OmniSelect chose and the tokens it kept.",
        epilog="Pruners are given as NAME[:key=value,...]; `kinegen models --accelerators` lists their keys.")
    p.add_argument("video", metavar="VIDEO", help="an mp4 (or any file PyAV reads) with or without sound")
    p.add_argument("--question", "-q", help="the question (default with --caption: describe the video.)")
    p.add_argument("--caption", action="store_true", help="write a caption (a prompt for `kinegen generate`)")
    p.add_argument("--model", "-m", default="kinegen-shapes-omni",
                   help="a bundled omni model or a folder from `kinegen train omni` (default: %(default)s)")
    p.add_argument("--prune", metavar="NAME[:k=v,...]", help="e.g. omniselect:keep=0.3 (default: no pruning)")
    p.add_argument("--relevance", default="auto",
                   help="the relevance estimator OmniSelect reads: auto (the bundled tri-modal scorer), heuristic, "
                        "clip-clap:CLIP_DIR,CLAP_DIR (local folders), or a scorer folder (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="longest answer (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import InvalidRequestError
    from ..pipelines.omni_understand import CAPTION_QUESTION, OmniUnderstandingPipeline, _prune_config

    if not args.question and not args.caption:
        raise InvalidRequestError("Give --question Q (or --caption).")
    if args.max_new_tokens < 1:
        raise InvalidRequestError("--max-new-tokens must be at least 1.")
    question = args.question or CAPTION_QUESTION
    _prune_config(args.prune)  # a bad spec fails before the model loads
    pipe = OmniUnderstandingPipeline.load(args.model, relevance=args.relevance)
    r = pipe.understand(args.video, question, prune=args.prune, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0
    print(r.answer)
    sound = "with sound" if r.has_audio else "no sound track: video only"
    line = f"{r.media_tokens} audio and video tokens ({sound})"
    if r.prune is not None:
        line += (f"; kept {r.media_kept} ({r.media_kept / max(r.media_tokens, 1):.0%}) with {r.prune['method']}"
                 + (f", regime {r.regime}" if r.regime and r.regime != "-" else ""))
    t = r.timings
    print(f"{line}; prefill {t['prefill_s'] * 1000:.0f} ms (relevance {t['relevance_s'] * 1000:.0f} ms)")
    return 0
