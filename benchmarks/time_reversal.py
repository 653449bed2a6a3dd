"""How much a text-to-video transformer can tell a clip from the same clip played backwards.

    python -m benchmarks time_reversal video-sdpa video-mhla [--clips 4] [--sigmas 0.3 0.7]

For noised real Moving-MNIST clips x (with their captions) it prints |f(Rx) reversed - f(x)| / |f(x)|,
where R reverses the frames and f is the velocity the transformer predicts. A model whose output is
(nearly) the same for a clip and its reverse (ratio near 0) cannot learn which way a caption's
direction points in time: "moves left" and "moves right" differ only by that reversal.

It also prints the caption-direction gap: the flow-matching loss of each clip under the opposite
direction's caption ("moves right" for a clip that moves left) over its loss under its own caption,
minus 1, with the same noise. A model that reads the caption's direction scores it above 0; for one
that commutes with R it is 0 on average over clips (the loss of (x, opposite caption) is that of the
reversed clip under x's own caption), so the gap tells early in training whether direction is being
learned, long before sampled clips can be scored.
"""

from __future__ import annotations

import argparse

import torch


def main(argv=None) -> int:
    from mediagen.pipelines import build_pipeline
    from mediagen.pipelines.prompt_encoding import encode_prompts
    from mediagen.training.data.moving_mnist import MovingMNISTDataset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="shipped checkpoint names or pipeline folders")
    p.add_argument("--clips", type=int, default=4)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.3, 0.7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gap-clips", type=int, default=32, help="clips for the caption-direction gap (0: skip it)")
    args = p.parse_args(argv)
    for name in args.models:
        pipe = build_pipeline(name)
        model = pipe.transformer.eval()
        cfg = model.config
        data = MovingMNISTDataset(resolution=64, num_frames=16, split="held_out", seed=args.seed)
        items = [data[i] for i in range(args.clips)]
        x0 = torch.stack([it["pixels"] for it in items])[:, : cfg.in_channels]
        context, _ = encode_prompts(pipe.text_encoder, pipe.tokenizer, [it["caption"] for it in items], 64, "cpu",
                                    torch.float32)
        g = torch.Generator().manual_seed(args.seed)
        for s in args.sigmas:
            xt = (1 - s) * x0 + s * torch.randn(x0.shape, generator=g)
            t = torch.full((len(items),), s * 1000.0)
            with torch.no_grad():
                f = model(xt, t, context).sample
                f_rev = model(xt.flip(2), t, context).sample.flip(2)
            print(f"{name}: sigma {s}: |f(Rx) reversed - f(x)| / |f(x)| = {((f_rev - f).norm() / f.norm()).item():.4f}")
        if args.gap_clips:
            print(f"{name}: caption-direction gap {caption_gap(pipe, data, args.gap_clips, args.sigmas, args.seed):+.4f}")
    return 0


OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}


def caption_gap(pipe, data, n_clips, sigmas, seed) -> float:
    """mean over clips of L(x, opposite caption) / L(x, own caption) - 1, flow-matching loss (velocity
    noise - x) at each sigma in ``sigmas`` with the same noise for both captions."""
    import re

    from mediagen.pipelines.prompt_encoding import encode_prompts

    model = pipe.transformer.eval()
    items = [data[i] for i in range(n_clips)]
    x0 = torch.stack([it["pixels"] for it in items])[:, : model.config.in_channels]
    own = [it["caption"] for it in items]
    flip = [re.sub(r"\b(left|right|up|down)\b", lambda m: OPPOSITE[m[1]], c) for c in own]
    states = [encode_prompts(pipe.text_encoder, pipe.tokenizer, c, 64, "cpu", torch.float32)[0] for c in (own, flip)]
    g = torch.Generator().manual_seed(seed + 1)
    ratios = []
    for s in sigmas:
        noise = torch.randn(x0.shape, generator=g)
        xt, target = (1 - s) * x0 + s * noise, noise - x0
        t = torch.full((n_clips,), s * 1000.0)
        with torch.no_grad():
            loss = [(model(xt, t, c).sample - target).square().flatten(1).mean(1) for c in states]
        ratios.append(loss[1] / loss[0] - 1)
    return torch.cat(ratios).mean().item()


if __name__ == "__main__":
    raise SystemExit(main())
