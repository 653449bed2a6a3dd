"""Sample the text-to-video grid a semantic score needs, and time sampling, for one or more pipelines.

    python -m benchmarks video_samples PIPELINE [PIPELINE ...] --out DIR [--seeds 0 1 2] [--steps 8]
        [--still-steps 16] [--guidance 4] [--device cuda] [--dtype bf16] [--time-batch 1] [--runtime eager]
        [--text-encoder NAME]

For each pipeline folder writes DIR/<name>.npz with ``videos`` uint8 (N, F, H, W), ``prompts`` and
``seeds``: every digit 0-9 x every direction x every seed, the caption the model was trained on
("the digit 3 moves left"), at the app's default steps (8) and guidance (4); and DIR/<name>-stills.npz,
the prompt-mode images of "the digit 0" ... "the digit 9" per seed (one-frame videos), at the app's default
steps for stills (16). Score them with
``mediagen vbench --videos DIR/<name>.npz --calibrate``. Also prints the wall time of sampling one
batch of ``--time-batch`` videos (median of 5, after a warm-up), text encoding and decoding included.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from mediagen.eval.timing import measure
from mediagen.host_memory import keep_freed_memory

DIRECTIONS = ("left", "right", "up", "down")


def grid_prompts() -> list[str]:
    return [f"the digit {d} moves {m}" for d in range(10) for m in DIRECTIONS]


def sample_grid(pipe, seeds, steps, guidance, batch=40, embed=None):
    """The grid's clips; ``embed`` (prompts -> token states): read the prompts with it instead of the
    pipeline's own text encoder (the negative prompt "" too), with the same noise."""
    prompts, clips, seed_of = grid_prompts(), [], []
    for seed in seeds:
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            g = torch.Generator("cpu").manual_seed(seed * 1000 + start)
            text = (dict(prompt=chunk) if embed is None else
                    dict(prompt_embeds=embed(chunk), negative_prompt_embeds=embed([""] * len(chunk))))
            out = pipe(**text, num_inference_steps=steps, guidance_scale=guidance, generator=g,
                       output_type="np").frames
            v = np.asarray(out, np.float32)                      # (B, F, H, W, C) in [0, 1]
            clips.append((np.clip(v.mean(-1), 0, 1) * 255 + 0.5).astype(np.uint8))
            seed_of += [seed] * len(chunk)
    return np.concatenate(clips), prompts * len(seeds), seed_of


def sample_stills(pipe, seeds, steps, guidance, frames):
    """Prompt-mode images: "the digit 0" ... "the digit 9" per seed, each the middle frame of a clip of
    ``frames`` frames (``TextToImagePipeline``'s rule), as uint8 (N, 1, H, W) one-frame videos."""
    from mediagen.pipelines import TextToImagePipeline

    still = TextToImagePipeline(**pipe.components)
    still.set_progress_bar_config(disable=True)
    prompts, images = [f"the digit {d}" for d in range(10)], []
    for seed in seeds:
        out = still(prompt=prompts, num_inference_steps=steps, guidance_scale=guidance, num_frames=frames,
                    generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
        images.append((np.clip(np.asarray(out, np.float32).mean(-1), 0, 1) * 255 + 0.5).astype(np.uint8)[:, None])
    return np.concatenate(images), prompts * len(seeds)


def time_sampling(pipe, device, steps, guidance, batch, repeats=5) -> list[float]:
    """Seconds of each of ``repeats`` samplings of one batch, after a warm-up one."""
    prompt = ["the digit 3 moves left"] * batch
    timing = measure(lambda: pipe(prompt=prompt, num_inference_steps=steps, guidance_scale=guidance, output_type="np"),
                     device, warmup=1, repeats=repeats)
    return [ms / 1e3 for ms in timing.times_ms]


def main(argv=None) -> int:
    from mediagen.app.limits import Limits
    from mediagen.pipelines import RUNTIMES, build_pipeline

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pipelines", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--still-steps", type=int, default=None,
                   help="steps of the prompt-mode stills (default: the app's, Limits.still_steps)")
    p.add_argument("--guidance", type=float, default=4.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--time-batch", type=int, default=1)
    p.add_argument("--no-grid", action="store_true", help="only time sampling")
    p.add_argument("--runtime", default="eager", choices=RUNTIMES,
                   help="how the denoising loop runs the transformer (the pipelines' set_runtime)")
    p.add_argument("--text-encoder", default=None,
                   help="read the grid's prompts with this text encoder (a load_text_encoder name or folder, "
                        "e.g. mediagen/checkpoints/text-mlra) instead of the pipeline's own; writes "
                        "DIR/<name>-<encoder>.npz and no stills")
    args = p.parse_args(argv)
    keep_freed_memory()  # as the console script runs the app and `mediagen generate` (mediagen/host_memory.py)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    still_steps = Limits().still_steps if args.still_steps is None else args.still_steps
    if still_steps < 1:
        p.error(f"--still-steps={still_steps} is not allowed: use 1 or more")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    embed = None
    if args.text_encoder:
        from mediagen.app.generation import TEXT_LENGTH   # the token states per prompt the app reads
        from mediagen.text.encoders import load_text_encoder

        encoder = load_text_encoder(args.text_encoder, device=args.device)

        def embed(prompts):
            with torch.no_grad():
                return encoder.encode(prompts, max_length=TEXT_LENGTH, padding="max_length")[0]
    for folder in args.pipelines:
        name = Path(folder).name
        pipe = build_pipeline(folder, device=args.device, dtype=dtype)
        pipe.set_progress_bar_config(disable=True)
        pipe.set_runtime(args.runtime)
        if embed is not None:
            name = f"{name}-{Path(args.text_encoder).name}"
        if not args.no_grid:
            t0 = time.perf_counter()  # the grid's wall time, logged once; the latency is time_sampling's measure
            videos, prompts, seeds = sample_grid(pipe, args.seeds, args.steps, args.guidance, embed=embed)
            np.savez_compressed(out / f"{name}.npz", videos=videos, prompts=np.array(prompts), seeds=np.array(seeds))
            print(f"{name}: {len(videos)} clips in {time.perf_counter() - t0:.1f} s -> {out / (name + '.npz')}")
            if embed is None:
                stills, still_prompts = sample_stills(pipe, args.seeds, still_steps, args.guidance, videos.shape[1])
                np.savez_compressed(out / f"{name}-stills.npz", videos=stills, prompts=np.array(still_prompts))
        times = time_sampling(pipe, args.device, args.steps, args.guidance, args.time_batch)
        report[name] = {"median_s": float(np.median(times)), "min_s": min(times), "max_s": max(times),
                        "batch": args.time_batch, "steps": args.steps, "guidance": args.guidance,
                        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                        "dtype": args.dtype, "runtime": args.runtime}
        print(f"{name}: sampling {args.time_batch} video(s), {args.steps} steps: median "
              f"{report[name]['median_s'] * 1000:.1f} ms (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})")
    (out / "sampling_latency.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
