"""DiT-XL/2 images per second for one sampling step (a CFG-batched forward), sdpa vs mhla vs linear,
eager and torch.compile, at 256 px (32x32 latents, 256 tokens) and 512 px (64x64, 1024 tokens); with --train,
for one training step instead (forward, MSE loss, backward, AdamW step and the Mc clipping that mediagen's
training does after it) on --batch images.

Uses diffusers' stock ``DiTTransformer2DModel`` (random weights) converted by ``mediagen.convert``.

    python -m benchmarks dit_images                 # both sizes, batch 32 images (64 with CFG)
    python -m benchmarks dit_images --train --presets dit-xl-2-256 --batch 64   # training steps
    python -m benchmarks dit_images --tiny          # CPU smoke run of the whole script (with --train too)

(from the repository root)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import mediagen
from diffusers.models.attention_processor import AttnProcessor2_0
from mediagen.attention.mhla import clip_mixes_
from benchmarks.common import (ProjectionsOnly, device_name, graph_breaks, markdown_table, reset_compiler,
                                     reset_self_attention)
from mediagen.eval.timing import measure
from mediagen.models.presets import build_transformer

VARIANTS = ("sdpa", "mhla", "linear", "projections-only")  # projections-only: common.ProjectionsOnly


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny DiT on CPU in fp32: checks the script runs")
    ap.add_argument("--presets", default="dit-xl-2-256,dit-xl-2-512")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--blocks", default=None, help="MHLA blocks, e.g. 4,4 (default: auto from the grid)")
    ap.add_argument("--batch", type=int, default=32, help="images per step (the forward sees 2x with CFG)")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None, help="also append the table to this markdown file")
    ap.add_argument("--train", action="store_true", help="time a training step on --batch images (no CFG) instead")
    args = ap.parse_args(argv)
    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        args.presets, args.batch, args.warmup, args.iters = "dit-tiny", 2, 1, 1
        args.compile_backend = "eager" if args.compile_backend == "inductor" else args.compile_backend
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA GPU visible: run with --tiny for a CPU smoke run")
        device, dtype = torch.device("cuda"), torch.bfloat16
    modes = [m for m in args.modes.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants) or any(m not in ("eager", "compile") for m in modes):
        ap.error(f"--variants must be from {VARIANTS}, --modes from eager,compile")
    print(f"device: {device_name(device)}, dtype {dtype}, torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    rows = []
    for name in args.presets.split(","):
        with torch.device(device):
            model = build_transformer(name).to(dtype).eval()
        cfg = model.config
        side = cfg.sample_size // cfg.patch_size
        blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else mediagen.models.auto_blocks((side, side))
        n = args.batch if args.train else 2 * args.batch
        x = torch.randn(n, cfg.in_channels, cfg.sample_size, cfg.sample_size, device=device, dtype=dtype)
        t = torch.full((n,), 500, device=device)
        y = torch.randint(0, cfg.num_embeds_ada_norm, (n,), device=device)
        base = {}
        for mode in modes:
            for variant in variants:
                # every layer from scratch: convert keeps layers it recorded as the attention asked, and records
                # the hand-set ProjectionsOnly as sdpa (common.reset_self_attention)
                reset_self_attention(model, [block.attn1 for block in model.transformer_blocks], AttnProcessor2_0)
                if variant == "projections-only":
                    mediagen.convert(model, "sdpa", reinit=True)
                    for block in model.transformer_blocks:
                        block.attn1.set_processor(ProjectionsOnly())
                else:
                    mediagen.convert(model, variant, blocks=blocks, reinit=True)
                reset_compiler()
                model.train(args.train)
                fn = torch.compile(model, backend=args.compile_backend) if mode == "compile" else model
                if args.train:
                    step = training_step(model, fn, x, t, y)
                else:
                    def step():
                        with torch.no_grad():
                            fn(x, timestep=t, class_labels=y, return_dict=False)

                ms = measure(step, device, warmup=args.warmup, repeats=args.iters).median_ms
                ips = args.batch / (ms / 1e3)
                base.setdefault(mode, ips if variant == "sdpa" else None)
                rel = f"{ips / base[mode]:.2f}x" if base.get(mode) else "-"
                rows.append([name, side * side, "x".join(map(str, blocks)), variant, mode, f"{ms:.2f}",
                             f"{ips:.0f}", rel, graph_breaks() if mode == "compile" else "-"])
                print(rows[-1], flush=True)
        del model
    header = ["model", "tokens", "blocks", "variant", "mode", "ms/step", "images/s", "vs sdpa", "graph breaks"]
    table = markdown_table(header, rows)
    title = (f"### DiT training step, {args.batch} images" if args.train
             else f"### DiT sampling step, {args.batch} images (CFG batch {2 * args.batch})")
    print(f"\n{title}\n\n{table}")
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(f"\n## DiT images/s ({device_name(device)}, {dtype})\n\n{title}\n\n{table}\n")


def training_step(model, fn, x, t, y):
    """One training step of ``model`` (``fn``: it, or its compiled form): an MSE loss of the whole output against
    a fixed random target, backward, AdamW, then Mc clipped to [0, 1] as mediagen's training does."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    target = None

    def step():
        nonlocal target
        out = fn(x, timestep=t, class_labels=y, return_dict=False)[0]
        if target is None:
            target = torch.randn_like(out)
        F.mse_loss(out.float(), target.float()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clip_mixes_(model)

    return step


if __name__ == "__main__":
    main()
