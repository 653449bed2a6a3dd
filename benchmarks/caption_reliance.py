"""How much a text-to-video model's prediction on the digit's pixels depends on the caption's digit, by noise level.

    python -m benchmarks caption_reliance video-mhla --frames 16 --size 64 [--clips 8] [--sigmas 0.5 0.85 0.95]

For held-out Moving-MNIST clips x0 noised to x_t = (1 - s) x0 + s e, it prints per noise level s the flow-matching
loss on the ink pixels (those of the clean clip) and the wrong-digit gap: that loss under the same caption with the
digit replaced (d -> d + 3 mod 10), over the loss under the clip's own caption, minus 1, with the same noise. A gap
near 0 at a noise level means the model draws the digit's pixels there from the noisy clip alone, not from the
caption's digit: where sampling decides the shape, a model with a small gap draws whatever shape the noise suggests.

``--attention-share`` (MHLA models) also prints, per layer at the first noise level, how much of a digit token's
denominator phi(q_t) . sum_j Mc[i, j] z_j comes from the keys of digit tokens (tokens whose patch has ink): the part
of the attention a digit token gives the digit itself, the rest going to background.
"""

from __future__ import annotations

import argparse
import re

import torch


def digit_tokens(x0: torch.Tensor, patch) -> torch.Tensor:
    """(B, N) 1.0 where the token's patch of the clean clip (B, C, F, H, W) has ink (above the background)."""
    ink = (x0 > x0.amin() + 0.1).float()
    return torch.nn.functional.max_pool3d(ink, kernel_size=tuple(patch), stride=tuple(patch)).flatten(1)


def attention_share(core, q, k, grid, tokens: torch.Tensor) -> float:
    """Mean over digit tokens of the digit keys' part of the MHLA denominator (see the module docstring)."""
    from mediagen.attention.mhla import fit_blocks, fit_mix

    blocks = fit_blocks(core.blocks, grid)
    mix = fit_mix(core.mix, core.blocks, blocks).float()
    if mix.dim() == 2:
        mix = mix.expand(q.shape[2], -1, -1)
    fq, fk = torch.relu(q.float()), torch.relu(k.float())
    size = torch.tensor(grid) // torch.tensor(blocks)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    ids = torch.zeros(coords.shape[0], dtype=torch.long)
    for axis, b in enumerate(blocks):
        ids = ids * b + coords[:, axis] // size[axis]
    member = torch.nn.functional.one_hot(ids, mix.shape[-1]).float()           # (N, M)
    z_all = torch.einsum("nm,bnhd->bhmd", member, fk)
    z_ink = torch.einsum("nm,bnhd->bhmd", member, fk * tokens[:, :, None, None])
    fqh = fq.permute(0, 2, 1, 3)                                                # (B, H, N, D)
    den = (fqh * torch.einsum("him,bhmd->bhid", mix, z_all)[:, :, ids]).sum(-1)
    num = (fqh * torch.einsum("him,bhmd->bhid", mix, z_ink)[:, :, ids]).sum(-1)
    share = num / den.clamp_min(1e-12)
    weight = tokens[:, None, :].expand_as(share)
    return ((share * weight).sum() / weight.sum()).item()


def main(argv=None) -> int:
    from mediagen.attention.mhla import MHLAttention
    from mediagen.pipelines import build_pipeline
    from mediagen.pipelines.prompt_encoding import encode_prompts
    from mediagen.training.data.moving_mnist import MovingMNISTDataset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a shipped checkpoint name or a pipeline folder")
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=64, help="canvas side in pixels")
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 0.7, 0.85, 0.9, 0.95])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention-share", action="store_true")
    args = p.parse_args(argv)

    pipe = build_pipeline(args.model)
    model = pipe.transformer.eval()
    data = MovingMNISTDataset(resolution=args.size, num_frames=args.frames, split="held_out", seed=args.seed)
    items = [data[i] for i in range(args.clips)]
    x0 = torch.stack([it["pixels"] for it in items])[:, : model.config.in_channels]
    tokens = digit_tokens(x0, model.config.patch_size)
    own = [it["caption"] for it in items]
    wrong = [re.sub(r"digit (\d)", lambda m: f"digit {(int(m[1]) + 3) % 10}", c) for c in own]
    states = [encode_prompts(pipe.text_encoder, pipe.tokenizer, c, 64, "cpu", torch.float32)[0] for c in (own, wrong)]
    ink = x0 > x0.amin() + 0.1
    print(f"{args.model}, {args.frames} frames of {args.size}x{args.size}, {args.clips} clips: digit tokens "
          f"{tokens.mean().item():.3f} of all")

    shares: dict[str, float] = {}
    hooks = []
    if args.attention_share:
        for name, module in model.named_modules():
            if isinstance(module, MHLAttention):
                def hook(mod, inputs, _name=name):
                    q, k, _, grid = inputs[:4]
                    shares.setdefault(_name, attention_share(mod, q, k, tuple(grid), tokens))
                hooks.append(module.register_forward_pre_hook(hook))
    g = torch.Generator().manual_seed(args.seed + 1)
    for s in args.sigmas:
        noise = torch.randn(x0.shape, generator=g)
        xt, target = (1 - s) * x0 + s * noise, noise - x0
        t = torch.full((len(items),), s * 1000.0)
        with torch.no_grad():
            loss = [(model(xt, t, c).sample - target).square()[ink].mean().item() for c in states]
        for h in hooks:
            h.remove()
        hooks = []
        print(f"sigma {s}: loss on ink {loss[0]:.4f}, wrong-digit gap {loss[1] / loss[0] - 1:+.3f}")
    for name, share in shares.items():
        print(f"  {name}: digit keys' share of a digit token's denominator {share:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
