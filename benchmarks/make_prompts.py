"""Write the prompt files used by the caching benchmarks (deterministic; re-run to regenerate).

    python benchmarks/make_prompts.py

- prompts/calibration.txt: 160 captions of the procedural distribution (training attribute
  combinations, one or two objects), the prompt set `kinegen calibrate` records maps on.
- prompts/simple.txt: 16 single-object captions on plain backgrounds (seeds disjoint from calibration).
- prompts/complex.txt: 16 two-object captions on textured backgrounds (seeds disjoint from calibration).
"""

from __future__ import annotations

from pathlib import Path

from kinegen.data.shapes import sample_clip

HERE = Path(__file__).parent / "prompts"


def _write(name: str, prompts: list[str]) -> None:
    HERE.mkdir(exist_ok=True)
    (HERE / name).write_text("\n".join(prompts) + "\n")
    print(f"{name}: {len(prompts)} prompts")


def main() -> None:
    _write("calibration.txt", [sample_clip(900_000 + i, split="train").caption for i in range(160)])
    simple, complex_, seed = [], [], 950_000
    while len(simple) < 16 or len(complex_) < 16:
        seed += 1
        one = sample_clip(seed, split="train", num_objects=1)
        if one.texture == "plain" and len(simple) < 16:
            simple.append(one.caption)
        two = sample_clip(seed, split="train", num_objects=2)
        if two.texture != "plain" and len(complex_) < 16:
            complex_.append(two.caption)
    _write("simple.txt", simple)
    _write("complex.txt", complex_)


if __name__ == "__main__":
    main()
