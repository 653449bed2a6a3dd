"""Sampling latency of the shipped class-to-image models (the app's Image tab), side by side.

    python -m benchmarks image_latency                          # CPU fp32 (the app without a GPU)
    python -m benchmarks image_latency --device cuda --dtype bf16 --batches 1 4 64 [--runtime compile]

Each round times every model once per batch size, the models' order reversed every other round so that
drift in the machine's speed (a shared or throttled CPU) falls on all of them alike; the first round is a
warm-up. Prints one markdown row per model: the median and range of the timed rounds, in ms.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from benchmarks.common import markdown_table
from mediagen.eval.timing import measure
from mediagen.host_memory import keep_freed_memory
from mediagen.pipelines import build_pipeline
from mediagen.pipelines.runtime import RUNTIMES, check_runtime

CHECKPOINTS = Path(__file__).resolve().parents[1] / "mediagen" / "checkpoints"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["image-sdpa", "image-mhla", "image-linear"],
                   help="shipped model names or pipeline folders")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=8, help="the app's default")
    p.add_argument("--rounds", type=int, default=6, help="timed rounds after one warm-up round")
    p.add_argument("--runtime", default="eager", choices=RUNTIMES,
                   help="how the denoising loop runs the transformer (the pipelines' set_runtime); a compiled "
                        "runtime compiles in the warm-up round")
    args = p.parse_args(argv)
    keep_freed_memory()  # as the console script runs the app and `mediagen generate` (mediagen/host_memory.py)
    for name, value in (("--steps", args.steps), ("--rounds", args.rounds), *(("--batches", b) for b in args.batches)):
        if value < 1:
            p.error(f"{name}={value} is not allowed: use 1 or more")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = torch.device(args.device)
    try:
        check_runtime(args.runtime, device)
    except ValueError as err:
        p.error(f"--runtime: {err}")
    pipes = {}
    for name in args.models:
        folder = Path(name) if Path(name).is_dir() else CHECKPOINTS / name
        if not folder.is_dir():
            p.error(f"--models: {name!r} is neither a folder nor a shipped model in {CHECKPOINTS}")
        pipes[folder.name] = build_pipeline(str(folder), device=device, dtype=dtype)
        pipes[folder.name].set_progress_bar_config(disable=True)
        pipes[folder.name].set_runtime(args.runtime)
    times = {(n, b): [] for n in pipes for b in args.batches}
    for rnd in range(args.rounds + 1):
        order = list(pipes.items()) if rnd % 2 == 0 else list(reversed(pipes.items()))
        for name, pipe in order:
            for b in args.batches:
                def sample(pipe=pipe, b=b, seed=rnd):
                    with torch.no_grad():
                        pipe(class_labels=[3] * b, num_inference_steps=args.steps,
                             generator=torch.Generator().manual_seed(seed), output_type="np")

                ms = measure(sample, device, warmup=0, repeats=1).median_ms
                if rnd > 0:
                    times[name, b].append(ms)
    print(f"device {device} ({torch.get_num_threads()} threads), {args.dtype}, {args.runtime}, {args.steps} steps, torch "
          f"{torch.__version__}, median (min-max) of {args.rounds} rounds, ms")
    print(markdown_table(["model", *(f"batch {b}" for b in args.batches)],
                         [[name, *(f"{statistics.median(c):.0f} ({min(c):.0f}-{max(c):.0f})"
                                   for c in (times[name, b] for b in args.batches))] for name in pipes]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
