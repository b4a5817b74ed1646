"""One-step GAN latency against a same-size diffusion sampler, interleaved in one process.

The diffusion side is diffusers' class-conditional UNet2DModel at the GAN's resolution with about
as many parameters as the GAN's generator (1.12M; the MP-GAN's generator has 1.03M, the bundled R3GAN
baseline's 0.84M), random weights (latency only), sampled with DDIM for 20 and 50 steps (one network
evaluation per step). Usage:

    .venv/bin/python benchmarks/gan_latency.py [--model assets/models/kinegen-shapes-gan] [--repeats 7] \
        [--output benchmarks/results/gan/latency.json]
"""

import argparse
import json
import statistics
import time

import torch
from diffusers import DDIMScheduler, UNet2DModel

from kinegen.media import atomic_write_text
from kinegen.pipelines import MPGANPipeline


def unet_sampler(resolution: int, num_classes: int):
    unet = UNet2DModel(sample_size=resolution, in_channels=3, out_channels=3, block_out_channels=(32, 64, 64),
                       layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"), num_class_embeds=num_classes,
                       norm_num_groups=16).eval()
    scheduler = DDIMScheduler(num_train_timesteps=1000)

    @torch.no_grad()
    def sample(batch: int, steps: int):
        scheduler.set_timesteps(steps)
        x = torch.randn(batch, 3, resolution, resolution, generator=torch.Generator().manual_seed(0))
        labels = torch.arange(batch) % num_classes
        for t in scheduler.timesteps:
            eps = unet(x, t, class_labels=labels).sample
            x = scheduler.step(eps, t, x).prev_sample
        return x

    return unet, sample


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="assets/models/kinegen-shapes-gan")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--output", default="benchmarks/results/gan/latency.json")
    args = ap.parse_args()
    pipe = MPGANPipeline.from_pretrained(args.model, use_safetensors=True)
    res, n_cls = pipe.gan.config.resolution, pipe.gan.config.num_classes
    unet, sample = unet_sampler(res, n_cls)
    g_params = sum(p.numel() for p in pipe.gan.parameters())
    u_params = sum(p.numel() for p in unet.parameters())
    cases = {}
    for batch in (1, 16):
        cases[f"gan b{batch}"] = lambda b=batch: pipe(class_labels=[i % n_cls for i in range(b)], seeds=0,
                                                     output_type="pt")
        for steps in (20, 50):
            cases[f"ddim{steps} b{batch}"] = lambda b=batch, s=steps: sample(b, s)
    times = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(args.repeats):  # interleaved
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"generator {g_params / 1e6:.2f}M parameters; UNet {u_params / 1e6:.2f}M; {res}x{res}; "
          f"torch threads {torch.get_num_threads()}; median of {args.repeats} interleaved runs")
    print("| batch | GAN (1 step) | DDIM 20 steps | DDIM 50 steps | GAN speedup vs 20 / 50 |")
    print("|---|---|---|---|---|")
    for b in (1, 16):
        g, d20, d50 = med[f"gan b{b}"], med[f"ddim20 b{b}"], med[f"ddim50 b{b}"]
        print(f"| {b} | {g:.1f} ms | {d20:.1f} ms | {d50:.1f} ms | {d20 / g:.0f}x / {d50 / g:.0f}x |")
    atomic_write_text(args.output, json.dumps({"model": args.model, "median_ms": med, "generator_params": g_params,
                                               "unet_params": u_params}, indent=2) + "\n")


if __name__ == "__main__":
    main()
