"""Retrain the shipped digit classifier: ``python -m mediagen.eval.train_digit_classifier``.

Trains on the first 8,000 shipped MNIST digits with small random shifts, rotations and scalings,
reports accuracy on the 2,000 held out, and writes safetensors (to a temporary name, then renamed).
About two minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F

from ..data import load_mnist10k
from .digit_classifier import DigitClassifier, weights_path


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random affine jitter: rotation +-12 deg, scale 0.9..1.1, shift +-2 px (28 px images)."""
    b = x.shape[0]
    angle = (torch.rand(b, generator=gen) * 2 - 1) * math.radians(12)
    scale = 0.9 + 0.2 * torch.rand(b, generator=gen)
    shift = (torch.rand(b, 2, generator=gen) * 2 - 1) * (2 / 14)  # normalised coordinates
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


@torch.no_grad()
def accuracy(model, images, labels) -> float:
    model.eval()
    x = torch.from_numpy(images).float()[:, None] / 255.0
    pred = torch.cat([model(x[i:i + 1000]).argmax(1) for i in range(0, len(x), 1000)])
    return (pred == torch.from_numpy(labels)).float().mean().item()


def train(epochs=15, batch_size=128, lr=2e-3, seed=0, log=print) -> DigitClassifier:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    xtr, ytr = load_mnist10k("train")
    xte, yte = load_mnist10k("held_out")
    x = torch.from_numpy(xtr).float()[:, None] / 255.0
    y = torch.from_numpy(ytr)
    model = DigitClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * math.ceil(len(x) / batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        total = 0.0
        for i in range(0, len(x), batch_size):
            idx = perm[i:i + batch_size]
            loss = F.cross_entropy(model(augment(x[idx], gen)), y[idx], label_smoothing=0.05)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        log(f"epoch {epoch + 1}/{epochs}: loss {total / len(x):.4f}, held-out accuracy "
            f"{accuracy(model, xte, yte):.4f}")
    return model.eval()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(weights_path()), help="where to write the safetensors")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from safetensors.torch import save_file

    model = train(epochs=args.epochs, seed=args.seed)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    tmp = args.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(state, tmp, metadata={"trained_on": "mediagen/data/mnist10k.npz[:8000]", "seed": str(args.seed)})
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
