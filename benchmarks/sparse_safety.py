"""Sparse attention keeps the prompt: adherence on held-out prompts, dense against HVA and SVG2 at their
defaults, alone and composed with Map-Guided Caching, one run side by side, at any size.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_safety.py [--n 100]          # the default 17x128x128
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_safety.py --frames 29 --height 384 --width 384 \\
        --configs dense,hva,mapguided+hva --output benchmarks/results/sparse_safety_29x384.json

Prompts: ``kinegen.evaluation.adherence.adherence_prompts(n, "held_out", seed=3)`` (held-out combinations;
seed 3 was never used to tune anything). Per prompt, every configuration runs with the same seed, one after
another; the adherence classifier reads shape, colour and motion. Also reported per configuration: on how
many prompts its frames equal its reference's bit for bit (dense for the sparse methods alone, mapguided alone
for the compositions, where both ran), its readings that differ from dense's, its PSNR against dense, and the
accelerators' warnings.

Resumable: every finished prompt is appended to ``<output>.partial.jsonl``; run the same command again and
it goes on with the prompts not done (the settings must match). Two lanes can share the file, one with
``--order reverse`` (from the last prompt down): each skips what the other finished. The JSON summary is
written when all ``n`` are done (``--summary`` writes it from what is there).
"""

import argparse
import json
from pathlib import Path

import numpy as np

import kinegen
from kinegen.evaluation.adherence import ATTRIBUTES, adherence_prompts, classify, load_classifier
from kinegen.profiling.metrics import psnr
from kinegen.sparse_attn.hva import MIN_TOKENS

CONFIGS = {
    "dense": [],
    "hva": ["hva"],
    "svg2": ["svg2"],
    "mapguided": ["mapguided"],
    "mapguided+hva": ["mapguided", "hva"],
}
REFERENCE = {"hva": "dense", "svg2": "dense", "mapguided+hva": "mapguided"}


def summarise(records: list[dict], configs: list[str]) -> dict:
    n = len(records)
    table = {c: {a: float(np.mean([r[c][a] == r["truth"][a] for r in records])) for a in ATTRIBUTES}
             for c in configs}
    changed = {c: {a: int(sum(r[c][a] != r["dense"][a] for r in records)) for a in ATTRIBUTES}
               for c in configs if c != "dense" and "dense" in configs}
    equal = {f"{c} equals {ref}": int(sum(r[f"{c} equals {ref}"] for r in records))
             for c, ref in REFERENCE.items() if c in configs and ref in configs}
    psnrs = {c: float(np.median([r["psnr"][c] for r in records])) for c in configs if c != "dense"
             and "dense" in configs}
    return {"n": n, "adherence": table, "changed_against_dense": changed, "bit_identical": equal,
            "median_psnr_against_dense": psnrs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--frames", type=int, default=None, help="default: the model's (17)")
    ap.add_argument("--height", type=int, default=None, help="default: the model's (128)")
    ap.add_argument("--width", type=int, default=None, help="default: the model's (128)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--output", default="benchmarks/results/sparse_safety.json")
    ap.add_argument("--summary", action="store_true", help="write the summary from the prompts done so far")
    ap.add_argument("--order", choices=("forward", "reverse"), default="forward",
                    help="prompt order; a second lane on the same --output runs reverse")
    ap.add_argument("--min-tokens", type=int, default=MIN_TOKENS,
                    help=f"the sparse methods' min_tokens (default: theirs, {MIN_TOKENS}; grids below it run dense)")
    args = ap.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or not configs:
        ap.error(f"unknown configuration(s) {bad}; choose from {', '.join(CONFIGS)}")
    size = {k: v for k, v in (("frames", args.frames), ("height", args.height), ("width", args.width)) if v}
    settings = {"configs": configs, **size, "min_tokens": args.min_tokens}
    sparse = {"hva": f"hva:min_tokens={args.min_tokens}", "svg2": f"svg2:min_tokens={args.min_tokens}"}
    runs = {name: [sparse.get(a, a) for a in accelerators] for name, accelerators in CONFIGS.items()}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.jsonl")
    def done() -> dict[int, dict]:  # the prompts finished so far, by index (either lane's)
        if not partial.is_file():
            return {}
        lines = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()]
        if lines and lines[0].get("settings") != settings:
            ap.error(f"{partial} was made with {lines[0].get('settings')}; these are {settings}. "
                     "Give another --output or remove it.")
        return {r["seed"]: r for r in lines if "prompt" in r}

    if not partial.is_file() and not args.summary:
        partial.write_text(json.dumps({"settings": settings}) + "\n")
    done()  # checks the settings before any work
    warnings: dict[str, str] = {}
    if not args.summary:
        pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
        pipe.set_progress_bar_config(disable=True)
        classifier = load_classifier()
        prompts = list(enumerate(adherence_prompts(args.n, "held_out", seed=3)))
        for i, (prompt, truth) in prompts[::-1] if args.order == "reverse" else prompts:
            if i in done():
                continue
            frames, rec = {}, {"prompt": prompt, "truth": truth, "seed": i, "psnr": {}, "warnings": {}}
            for name in configs:
                res = kinegen.generate(pipe, prompt, seed=i, accelerators=runs[name], **size)
                frames[name] = res.frames
                rec[name] = classify(classifier, res.frames)
                for st in res.accelerators:
                    if st.get("warning"):
                        rec["warnings"][name] = st["warning"]
            for name, ref in REFERENCE.items():
                if name in frames and ref in frames:
                    rec[f"{name} equals {ref}"] = bool(np.array_equal(frames[name], frames[ref]))
            if "dense" in frames:
                rec["psnr"] = {c: psnr(frames["dense"], frames[c]) for c in configs if c != "dense"}
            with partial.open("a") as f:  # one line per prompt: a stopped run loses at most the prompt it was on
                f.write(json.dumps(rec) + "\n")
            print(f"{i + 1}/{args.n} {prompt!r}: " + ", ".join(
                f"{n} {sum(rec[n][a] == truth[a] for a in ATTRIBUTES)}/3" for n in configs), flush=True)
    records = [r for i, r in sorted(done().items()) if i < args.n]
    if not records:
        print(f"no prompts done yet in {partial}")
        return
    for r in records:
        for name, w in r.get("warnings", {}).items():
            warnings.setdefault(name, w)
    summary = {**summarise(records, configs), "settings": settings, "warnings": warnings, "records": records}
    if len(records) >= args.n or args.summary:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(out)
    print(f"{len(records)} prompts at {size or 'the defaults'}")
    print("| configuration | shape | colour | motion | readings changed against dense | median PSNR vs dense |")
    print("|---|---|---|---|---|---|")
    psnrs = summary["median_psnr_against_dense"]
    for name in configs:
        acc = summary["adherence"][name]
        ch = summary["changed_against_dense"].get(name)
        print(f"| {name} | " + " | ".join(f"{100 * acc[a]:.0f}%" for a in ATTRIBUTES)
              + f" | {'/'.join(str(ch[a]) for a in ATTRIBUTES) if ch else ''} | "
              + (f"{psnrs[name]:.1f} |" if name in psnrs else " |"))
    print(summary["bit_identical"])
    print(warnings)


if __name__ == "__main__":
    main()
