"""Moving-MNIST text-to-video clips, generated on the fly from the shipped digits.

Clip ``i`` is a pure function of (seed, i): which digits, where they start and which way each one
moves (left, right, up or down, in a straight line that stays inside the canvas, no bouncing, so
the caption stays true). Captions read like "the digit 3 moves left while the digit 8 moves down",
which ``mediagen.eval.moving_mnist.parse_prompt`` understands.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...data import load_mnist10k

DIRECTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}  # (dy, dx)


def clip_caption(digits, directions) -> str:
    return " while ".join(f"the digit {d} moves {m}" for d, m in zip(digits, directions))


class MovingMNISTDataset(Dataset):
    """``length`` clips of (C, F, R, R) in [-1, 1] with a caption each.

    The digit side is min(28, 7R/16) (28 on a 64 canvas); speed is capped so a digit crossing the
    whole clip stays inside the canvas. Digits overlap by taking the brighter pixel.
    """

    def __init__(self, *, resolution: int = 64, num_frames: int = 16, num_digits: int = 1, speed: float = 2.0,
                 length: int = 100000, channels: int = 1, split: str = "train", seed: int = 0):
        if num_digits < 1:
            raise ValueError(f"data.num_digits={num_digits} is not allowed: use 1 or more")
        images, labels = load_mnist10k(split)
        self.digit = min(28, resolution * 7 // 16)
        if self.digit < 4:
            raise ValueError(f"data.resolution={resolution} is too small for Moving-MNIST: use 10 or more")
        x = torch.from_numpy(images.astype(np.float32) / 255.0)[:, None]
        self.digits = F.interpolate(x, size=(self.digit, self.digit), mode="bilinear", antialias=True,
                                    align_corners=False)[:, 0].numpy()
        self.labels = labels
        self.resolution, self.num_frames, self.num_digits = resolution, num_frames, num_digits
        self.speed, self.length, self.channels, self.seed = speed, length, channels, seed

    def __len__(self) -> int:
        return self.length

    def clip(self, i: int):
        """(frames float32 (F, R, R) in [0, 1], digits, directions) of clip ``i``."""
        rng = np.random.default_rng([self.seed, i])
        R, D, T = self.resolution, self.digit, self.num_frames
        free = R - D
        speed = min(self.speed, free / max(T - 1, 1))
        travel = speed * (T - 1)
        frames = np.zeros((T, R, R), np.float32)
        digits, directions = [], []
        for _ in range(self.num_digits):
            k = int(rng.integers(len(self.labels)))
            name = list(DIRECTIONS)[int(rng.integers(4))]
            dy, dx = DIRECTIONS[name]
            # start where the whole path fits: moving axis leaves room for the travel
            lo_y, hi_y = (travel, free) if dy < 0 else (0, free - travel if dy > 0 else free)
            lo_x, hi_x = (travel, free) if dx < 0 else (0, free - travel if dx > 0 else free)
            y0, x0 = rng.uniform(lo_y, hi_y), rng.uniform(lo_x, hi_x)
            for t in range(T):
                y, x = int(round(y0 + dy * speed * t)), int(round(x0 + dx * speed * t))
                np.maximum(frames[t, y:y + D, x:x + D], self.digits[k], out=frames[t, y:y + D, x:x + D])
            digits.append(int(self.labels[k]))
            directions.append(name)
        return frames, digits, directions

    def __getitem__(self, i: int) -> dict:
        frames, digits, directions = self.clip(i)
        pixels = torch.from_numpy(frames * 2.0 - 1.0)[None].expand(self.channels, -1, -1, -1).contiguous()
        return {"pixels": pixels, "caption": clip_caption(digits, directions)}

    def all_captions(self) -> list[str]:
        """Every caption a clip can have (for a text-embedding cache)."""
        one = [(d, m) for d in range(10) for m in DIRECTIONS]
        return [clip_caption([c[0] for c in combo], [c[1] for c in combo])
                for combo in itertools.product(one, repeat=self.num_digits)]
