"""``kinegen eval adherence``: per-attribute prompt adherence of a text-to-video model (optionally
with accelerators); ``kinegen eval gan``: FD, KID, precision/recall, class accuracy and mode
coverage of a class-conditional GAN; ``kinegen eval omni``: question answering accuracy of an omni
model on procedural clips with sound (optionally with token pruning)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import accelerator_flags, add_generation_flags, add_loading_flags, load, request_fields


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_MODEL

    ev = subparsers.add_parser("eval", help="evaluate models (prompt adherence, GAN metrics)")
    esub = ev.add_subparsers(dest="what", metavar="WHAT", required=True)
    adh = esub.add_parser(
        "adherence", help="per-attribute prompt adherence of a text-to-video model",
        description="Generate prompts from the procedural caption distribution (training or held-out "
                    "attribute combinations) and report how often the adherence classifier sees the "
                    "prompted shape, colour and motion.")
    adh.add_argument("--prompts", type=int, default=100, metavar="N", help="prompts per split (default: %(default)s)")
    adh.add_argument("--split", choices=["train", "held_out", "both"], default="both",
                     help="attribute combinations to draw prompts from (default: %(default)s)")
    adh.add_argument("--seed", type=int, default=0, help="seed of the prompt set and generations (default: 0)")
    adh.add_argument("--cache", metavar="NAME[:k=v,...]", help="evaluate with a caching accelerator on")
    adh.add_argument("--attention", metavar="NAME[:k=v,...]", help="evaluate with an attention accelerator on")
    adh.add_argument("--classifier", metavar="DIR", help="adherence classifier folder (default: the bundled one)")
    adh.add_argument("--output", "-o", metavar="FILE", help="write the results (with every prompt) as JSON")
    add_generation_flags(adh)
    add_loading_flags(adh)
    adh.set_defaults(func=run_adherence, model=DEFAULT_MODEL)
    evg = esub.add_parser(
        "gan", help="FD, KID, precision/recall, class accuracy, mode coverage, class spread and backgrounds of a GAN",
        description="Generate images of every class from an MPGANPipeline folder and compare them with held-out "
                    "procedural images in the feature space of the bundled evaluation classifier (no downloads), and "
                    "their background colours and textures with the real images' (read by rule). "
                    "With --inception-weights, the Inception FID too.")
    evg.add_argument("--model", "-m", required=True, metavar="DIR", help="an MPGANPipeline folder")
    evg.add_argument("--images", type=int, default=1200, metavar="N", help="generated and real images (default: 1200)")
    evg.add_argument("--seed", type=int, default=0, help="seed of the generated set (default: 0)")
    evg.add_argument("--classifier", metavar="DIR", help="evaluation classifier folder (default: the bundled one)")
    evg.add_argument("--inception-weights", metavar="PATH", help="local Inception weights for the FID")
    evg.add_argument("--output", "-o", metavar="FILE", help="write the metrics as JSON")
    evg.set_defaults(func=run_gan)
    evo = esub.add_parser(
        "omni", help="accuracy of an omni model on procedural questions about clips with sound",
        description="Ask an omni model every question of N procedural clips with sound (held-out attribute "
                    "combinations by default) and report accuracy per sense needed (video, audio, both), per "
                    "question template, caption match, and with --prune the regime accuracy and the prefill time.")
    evo.add_argument("--model", "-m", default="kinegen-shapes-omni", help="omni model (default: %(default)s)")
    evo.add_argument("--clips", type=int, default=50, metavar="N", help="clips (default: %(default)s)")
    evo.add_argument("--split", choices=["train", "held_out"], default="held_out", help="(default: %(default)s)")
    evo.add_argument("--seed", type=int, default=0, help="seed of the clip set (default: 0)")
    evo.add_argument("--prune", metavar="NAME[:k=v,...]", help="evaluate with token pruning, e.g. omniselect:keep=0.3")
    evo.add_argument("--relevance", default="auto", help="auto, heuristic, clip-clap:CLIP_DIR,CLAP_DIR or a scorer "
                                                          "folder (default: %(default)s)")
    evo.add_argument("--output", "-o", metavar="FILE", help="write the results (with every answer) as JSON")
    evo.set_defaults(func=run_omni)


def run_adherence(args) -> int:
    from ..errors import ConfigError
    from ..evaluation.adherence import evaluate_adherence, load_classifier
    from ..media import atomic_path

    if args.prompts < 1:
        raise ConfigError("--prompts must be at least 1 (100 or more for a stable estimate).")
    accelerators = accelerator_flags(args)
    classifier = load_classifier(args.classifier)
    pipe, _ = load(args)
    pipe.set_progress_bar_config(disable=True)
    fields = {k: v for k, v in request_fields(args).items() if v is not None}
    splits = ["train", "held_out"] if args.split == "both" else [args.split]
    results = {}
    for split in splits:
        def progress(i, n, split=split):
            print(f"\r{split}: {i}/{n}", end="", file=sys.stderr, flush=True)

        results[split] = evaluate_adherence(pipe, args.prompts, split, seed=args.seed, classifier=classifier,
                                            accelerators=accelerators, progress=progress, **fields)
        print(file=sys.stderr)
    print(f"prompt adherence of {pipe.kinegen_spec.name} ({args.prompts} prompts per split)")
    print(f"{'split':<10} {'shape':>7} {'colour':>7} {'motion':>7}")
    for split, r in results.items():
        a = r["accuracy"]
        print(f"{split:<10} {a['shape']:>7.1%} {a['colour']:>7.1%} {a['motion']:>7.1%}")
    if args.output:
        with atomic_path(Path(args.output)) as tmp:
            tmp.write_text(json.dumps({"model": pipe.kinegen_spec.name, "results": results}, indent=2))
        print(f"wrote {args.output}")
    return 0


def run_gan(args) -> int:
    from ..errors import ConfigError
    from ..evaluation.gan_metrics import evaluate_pipeline, load_classifier
    from ..loading import load_pipeline, resolve_model
    from ..media import atomic_write_text

    if args.images < 24:
        raise ConfigError("--images must be at least 24 (two per class); 1000 or more for stable FD/KID.")
    resolved = resolve_model(args.model)  # a missing or incomplete folder, or an unknown name: a clear error
    if resolved.folder is None or resolved.spec is None or resolved.spec.adapter.conditioning != "class":
        raise ConfigError(f"{args.model} is not a class-conditional GAN here; `kinegen eval gan` takes a local "
                          "MPGANPipeline folder (from `kinegen train gan`) or kinegen-shapes-gan.")
    clf = load_classifier(args.classifier)
    pipe = load_pipeline(resolved, device="cpu", dtype="fp32", cache=False)  # corrupt files: a clear error too
    m = evaluate_pipeline(pipe, args.images, clf, seed=args.seed, fid_weights=args.inception_weights)
    print(f"{args.model}: FD {m['fd']:.4f} | KID {m['kid']:.5f} +- {m['kid_std']:.5f} | precision "
          f"{m['precision']:.3f} recall {m['recall']:.3f} | class accuracy {m['class_accuracy']:.1%} | modes "
          f"{m['modes_covered']}/{m['modes']} | class spread {m['class_spread']:.2f} | backgrounds: TV "
          f"{m['background_pair_tv']:.2f} over colour x "
          f"texture, {m['background_other']:.0%} none of the data's" + (f" | Inception FID {m['inception_fid']:.2f}"
                                                   if "inception_fid" in m else ""))
    if args.output:
        atomic_write_text(args.output, json.dumps(m, indent=2) + "\n")
    return 0


def run_omni(args) -> int:
    from ..errors import ConfigError
    from ..evaluation.omni import evaluate_omni
    from ..media import atomic_write_text
    from ..pipelines.omni_understand import OmniUnderstandingPipeline, _prune_config

    if args.clips < 1:
        raise ConfigError("--clips must be at least 1 (50 or more for a stable estimate).")
    _prune_config(args.prune)
    pipe = OmniUnderstandingPipeline.load(args.model, relevance=args.relevance)

    def progress(i, n):
        print(f"\r{i}/{n}", end="", file=sys.stderr, flush=True)

    r = evaluate_omni(pipe, args.clips, args.split, seed=args.seed, prune=args.prune, progress=progress)
    print(file=sys.stderr)
    by = " | ".join(f"{k} {v:.1%}" for k, v in r["by_need"].items())
    print(f"{args.model} on {r['questions']} {args.split} questions: {r['accuracy']:.1%} ({by}); captions "
          f"{r['caption_match']:.1%}" + (f"; media kept {r['mean_media_keep']:.0%}" if args.prune else ""))
    if r["regime_accuracy"]:
        print("regime accuracy: " + " | ".join(f"{k} {v:.0%}" for k, v in r["regime_accuracy"].items()))
    if args.output:
        atomic_write_text(args.output, json.dumps(r, indent=1) + "\n")
    return 0
