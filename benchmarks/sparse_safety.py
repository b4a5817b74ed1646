"""Sparse attention at the bundled model's default size keeps the prompt: adherence on held-out prompts, dense
against HVA and SVG2 at their defaults, alone and composed with Map-Guided Caching, one run side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sparse_safety.py [--n 100]

Prompts: ``kinegen.evaluation.adherence.adherence_prompts(n, "held_out", seed=3)`` (held-out combinations;
seed 3 was never used to tune anything). Per prompt, every configuration runs with the same seed, one after
another; the adherence classifier reads shape, colour and motion. Also reported per configuration: on how
many prompts its frames equal its reference's bit for bit (dense for the sparse methods alone, mapguided alone
for the compositions) and the accelerators' warnings.
"""

import argparse
import json
from pathlib import Path

import numpy as np

import kinegen
from kinegen.evaluation.adherence import ATTRIBUTES, adherence_prompts, classify, load_classifier

CONFIGS = {
    "dense": [],
    "hva": ["hva"],
    "svg2": ["svg2"],
    "mapguided": ["mapguided"],
    "mapguided + hva": ["mapguided", "hva"],
}
REFERENCE = {"hva": "dense", "svg2": "dense", "mapguided + hva": "mapguided"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--output", default="benchmarks/results/sparse_safety.json")
    args = ap.parse_args()
    pipe = kinegen.load_pipeline("kinegen-shapes-t2v")
    pipe.set_progress_bar_config(disable=True)
    classifier = load_classifier()
    records, warnings = [], {}
    for i, (prompt, truth) in enumerate(adherence_prompts(args.n, "held_out", seed=3)):
        frames, rec = {}, {"prompt": prompt, "truth": truth, "seed": i}
        for name, specs in CONFIGS.items():
            res = kinegen.generate(pipe, prompt, seed=i, accelerators=specs)
            frames[name] = res.frames
            rec[name] = classify(classifier, res.frames)
            for st in res.accelerators:
                if st.get("warning"):
                    warnings.setdefault(name, st["warning"])
        for name, ref in REFERENCE.items():
            rec[f"{name} equals {ref}"] = bool(np.array_equal(frames[name], frames[ref]))
        records.append(rec)
        print(f"{i + 1}/{args.n} {prompt!r}: " + ", ".join(
            f"{n} {sum(rec[n][a] == truth[a] for a in ATTRIBUTES)}/3" for n in CONFIGS), flush=True)
    table = {name: {a: float(np.mean([r[name][a] == r["truth"][a] for r in records])) for a in ATTRIBUTES}
             for name in CONFIGS}
    equal = {f"{n} equals {r}": int(sum(rec[f"{n} equals {r}"] for rec in records)) for n, r in REFERENCE.items()}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"n": args.n, "adherence": table, "bit_identical": equal, "warnings": warnings,
                               "records": records}, indent=1))
    tmp.replace(out)
    print("| configuration | shape | colour | motion |\n|---|---|---|---|")
    for name, acc in table.items():
        print(f"| {name} | " + " | ".join(f"{100 * acc[a]:.0f}%" for a in ATTRIBUTES) + " |")
    print(equal)
    print(warnings)


if __name__ == "__main__":
    main()
