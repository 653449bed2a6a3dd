"""``mediagen attention-stats``: rank and entropy of every self-attention layer of a checkpoint,
on real inputs: real MNIST digits (image models) or a real digit moving across the frames (video
models), in pixel space, half noised (x_t = (x + noise) / 2 at timestep 500) as during sampling.
Pixel-space checkpoints (the project's small models) see real content; a latent-space model sees
the digits as if they were latents, which is only a smoke run. Prints a table and writes JSON."""

from __future__ import annotations

import os

import numpy as np
import torch

from .json_report import write_json_report


def register(sub):
    p = sub.add_parser("attention-stats", help="rank and entropy of the attention maps of a checkpoint's layers")
    p.add_argument("--checkpoint", required=True, help="a saved pipeline / transformer folder, or a preset name")
    p.add_argument("--attention", default=None,
                   help="convert first: sdpa, linear, mhla, wan-mhla-h (default: as saved)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=1e-6,
                   help="singular values below rtol x the largest do not count towards the rank")
    p.add_argument("--max-tokens", type=int, default=4096, help="skip layers with more tokens (N x N matrices)")
    p.add_argument("--frames", type=int, default=8, help="video models: frames of the input clip")
    p.add_argument("--size", type=int, default=32,
                   help="video models: height = width of the input clip in pixels (a multiple of the patch, >= 16)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=os.path.join("outputs", "attention_stats.json"))
    p.set_defaults(func=run)


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.array(Image.fromarray(img).resize((w, h), Image.BILINEAR))


def real_input(transformer, seed: int = 0, frames: int = 8, side: int = 32) -> dict:
    """Keyword inputs of one transformer forward built from a real held-out MNIST digit; video
    models get ``frames`` frames of ``side`` x ``side`` with the digit (side/2 wide) moving right."""
    from ..data import load_mnist10k

    images, labels = load_mnist10k("held_out")
    cfg = transformer.config
    channels = cfg.in_channels
    gen = torch.Generator().manual_seed(seed)
    if hasattr(cfg, "text_dim"):  # Wan-style video: (1, C, F, H, W), a digit moving right
        if frames < 1 or side < 16:
            raise ValueError(f"--frames {frames} --size {side} is not allowed: use frames >= 1 and size >= 16")
        canvas = np.zeros((frames, side, side), np.uint8)
        d = side // 2
        digit = _resize(images[0], d, d)
        step = min(2.0, (side - d) / max(frames - 1, 1))  # 2 px per frame, staying inside the frame
        for t in range(frames):
            x0 = int(round(t * step))
            canvas[t, side // 4:side // 4 + d, x0:x0 + d] = digit
        x = torch.from_numpy(canvas).float()[None, None].expand(1, channels, -1, -1, -1)
        extra = {"encoder_hidden_states": torch.zeros(1, 16, cfg.text_dim)}
    else:  # DiT: (1, C, S, S)
        side = cfg.sample_size
        x = torch.from_numpy(_resize(images[0], side, side)).float()[None, None].expand(1, channels, -1, -1)
        extra = {"class_labels": torch.tensor([int(labels[0]) % max(1, cfg.num_embeds_ada_norm or 1)])}
    x = x / 127.5 - 1.0
    x_t = (x + torch.randn(x.shape, generator=gen)) / 2
    return {"hidden_states": x_t.contiguous(), "timestep": torch.tensor([500]), **extra}


def run(args) -> int:
    from .attention_maps import AttentionRecorder
    from .sampling import load_pipeline

    pipe = load_pipeline(args.checkpoint, "cpu")
    model = pipe.transformer.eval()
    inputs = real_input(model, args.seed, args.frames, args.size)
    if args.attention:
        from ..models.convert import convert

        grid_axes = inputs["hidden_states"].shape[2:]
        patch = model.config.patch_size
        patch = tuple(patch) if isinstance(patch, (tuple, list)) else (patch,) * len(grid_axes)
        convert(model, args.attention, grid=tuple(s // p for s, p in zip(grid_axes, patch)))
    device = torch.device(args.device)
    model.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with AttentionRecorder(model, max_tokens=args.max_tokens) as rec, torch.no_grad():
        model(**inputs, return_dict=False)
    stats = rec.stats(rtol=args.rtol)
    if not stats:
        raise ValueError(f"no self-attention layer of {args.checkpoint!r} was recorded (more than "
                         f"--max-tokens {args.max_tokens} tokens, or no supported attention)")
    print("| layer | kind | tokens | rank (mean over heads) | entropy (nats) |")
    print("|---|---|---|---|---|")
    for name, s in stats.items():
        ent = "n/a (signed)" if s["entropy_mean"] is None else f"{s['entropy_mean']:.3f}"
        print(f"| {name} | {s['kind']} | {s['tokens']} | {s['rank_mean']:.1f} | {ent} |")
    if args.out:
        write_json_report(args.out, {"checkpoint": str(args.checkpoint), "rtol": args.rtol, "layers": stats})
    return 0
