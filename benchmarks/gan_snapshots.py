"""A GAN run's EMA snapshots measured as `kinegen eval gan` measures a model: one row per snapshot.

Each snapshot ``RUN/snapshots/STEP_SIGMA.safetensors`` is G's EMA at that step and ``sigma_rel``; the rows give
class accuracy, modes, FD, KID, precision, recall and the backgrounds (total variation of colour x texture to
the held-out real images', pooled and within each class; share of backgrounds that are none of the data's).
Useful for runs whose ``eval.jsonl`` predates a metric, and to compare the tracked EMA lengths.

    .venv/bin/python benchmarks/gan_snapshots.py runs/gan-long/mp-g005-cls1-s0 [--images 600] [--sigma 0.1]
"""

import argparse
from pathlib import Path


def measure(run: Path, n_images: int, sigma: float | None) -> list[dict]:
    from safetensors.torch import load_file

    from kinegen.models.mpgan import Generator
    from kinegen.training.gan import EVAL_FIELDS, GeneratorEval, load_run_config

    net = load_run_config(run)
    evaluate = GeneratorEval(n_images, net.resolution, net)  # the training eval's images and latents
    rows = []
    for f in sorted((run / "snapshots").glob("*.safetensors")):
        step_s, sigma_s = f.stem.split("_")
        if sigma is not None and abs(float(sigma_s) - sigma) > 1e-6:
            continue
        g = Generator(net).eval()
        g.load_state_dict(load_file(str(f)))
        m = evaluate(g)
        rows.append({"step": int(step_s), "sigma_rel": float(sigma_s), **{k: m[k] for k in EVAL_FIELDS},
                     "fake_textures": m["backgrounds"]["fake"]["textures"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--sigma", type=float, default=None, help="only the snapshots of this sigma_rel")
    args = parser.parse_args()
    print("| step | sigma_rel | class accuracy | modes | FD | KID | precision | recall | class spread | backgrounds TV "
          "| colour TV within a class | other | plain / checkered / striped / noisy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in measure(args.run, args.images, args.sigma):
        t = r["fake_textures"]
        print(f"| {r['step']} | {r['sigma_rel']:.2f} | {r['class_accuracy']:.1%} | {r['modes_covered']} "
              f"| {r['fd']:.1f} | {r['kid']:.2f} | {r['precision']:.2f} | {r['recall']:.2f} "
              f"| {r['class_spread']:.2f} "
              f"| {r['background_pair_tv']:.2f} | {r['background_colour_tv_by_class']:.2f} "
              f"| {r['background_other']:.0%} "
              f"| {' / '.join(f'{t[k]:.0%}' for k in ('plain', 'checkered', 'striped', 'noisy'))} |")


if __name__ == "__main__":
    main()
