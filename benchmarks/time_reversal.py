"""How much a text-to-video transformer can tell a clip from the same clip played backwards.

    python -m benchmarks.time_reversal video-sdpa video-mhla [--clips 4] [--sigmas 0.3 0.7]

For noised real Moving-MNIST clips x (with their captions) it prints |f(Rx) reversed - f(x)| / |f(x)|,
where R reverses the frames and f is the velocity the transformer predicts. A model whose output is
(nearly) the same for a clip and its reverse (ratio near 0) cannot learn which way a caption's
direction points in time: "moves left" and "moves right" differ only by that reversal.
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
