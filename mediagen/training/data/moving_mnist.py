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
STILL = "still"  # the motion of a clip whose digits stand still (``static_fraction``)
MOTIONS = dict(DIRECTIONS, **{STILL: (0, 0)})


def clip_caption(digits, directions) -> str:
    if all(m == STILL for m in directions):  # a caption without a direction: "the digit 3"
        return " and ".join(f"the digit {d}" for d in digits)
    return " while ".join(f"the digit {d} moves {m}" for d, m in zip(digits, directions))


class MovingMNISTDataset(Dataset):
    """``length`` clips of (C, F, R, R) in [-1, 1] with a caption each.

    The digit side is min(28, 7R/16) (28 on a 64 canvas); speed is capped so a digit crossing the
    whole clip stays inside the canvas. Digits overlap by taking the brighter pixel. A fraction
    ``static_fraction`` of the clips stand still, captioned without a direction ("the digit 3"): a model
    trained on them draws a still digit for a caption that names no motion (prompt-mode images).
    """

    def __init__(self, *, resolution: int = 64, num_frames: int = 16, num_digits: int = 1, speed: float = 2.0,
                 length: int = 100000, channels: int = 1, split: str = "train", seed: int = 0,
                 static_fraction: float = 0.0):
        if num_digits < 1:
            raise ValueError(f"data.num_digits={num_digits} is not allowed: use 1 or more")
        if not 0.0 <= static_fraction <= 1.0:
            raise ValueError(f"data.static_fraction={static_fraction} is not allowed: use a number in [0, 1]")
        self.static_fraction = static_fraction
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
        self.step = min(speed, (resolution - self.digit) / max(num_frames - 1, 1))  # pixels per frame
        self._device_digits: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.length

    def plan(self, i: int):
        """What clip ``i`` shows, drawn from its own generator: (images (nd,) into ``self.digits``,
        directions (nd,), start rows (nd,), start columns (nd,)), with the speed ``self.step``."""
        rng = np.random.default_rng([self.seed, i])
        # drawn from a generator of its own, so that with static_fraction=0 every clip is unchanged
        still = self.static_fraction > 0 and np.random.default_rng([self.seed, i, 1]).random() < self.static_fraction
        free = self.resolution - self.digit
        travel = self.step * (self.num_frames - 1)
        ks, names, ys, xs = [], [], [], []
        for _ in range(self.num_digits):
            k = int(rng.integers(len(self.labels)))
            name = list(DIRECTIONS)[int(rng.integers(4))]
            if still:
                name = STILL
            dy, dx = MOTIONS[name]
            # start where the whole path fits: moving axis leaves room for the travel
            lo_y, hi_y = (travel, free) if dy < 0 else (0, free - travel if dy > 0 else free)
            lo_x, hi_x = (travel, free) if dx < 0 else (0, free - travel if dx > 0 else free)
            ks.append(k)
            names.append(name)
            ys.append(rng.uniform(lo_y, hi_y))
            xs.append(rng.uniform(lo_x, hi_x))
        return ks, names, ys, xs

    def render(self, indices, device="cpu") -> tuple[torch.Tensor, list[list[int]], list[list[str]]]:
        """Clips ``indices`` drawn on ``device`` in one pass: (frames float32 (B, F, R, R) in [0, 1],
        digits, directions). The plans are drawn on the CPU (a few draws per clip); the pixels are a
        gather from the digit images, so a GPU renders a training batch in well under a millisecond."""
        device = torch.device(device)
        plans = [self.plan(int(i)) for i in indices]
        B, nd, T, R, D = len(plans), self.num_digits, self.num_frames, self.resolution, self.digit
        t = np.arange(T, dtype=np.float64) * self.step
        k = np.array([p[0] for p in plans], np.int64)                                   # (B, nd)
        vel = np.array([[MOTIONS[m] for m in p[1]] for p in plans], np.float64)         # (B, nd, 2)
        y0 = np.array([p[2] for p in plans], np.float64)
        x0 = np.array([p[3] for p in plans], np.float64)
        # positions rounded half to even on the float64 path, the same numbers on every device
        ys = np.rint(y0[..., None] + vel[..., 0:1] * t).astype(np.int64)               # (B, nd, T)
        xs = np.rint(x0[..., None] + vel[..., 1:2] * t).astype(np.int64)
        digits = self._digits_on(device)
        span = torch.arange(R, device=device)
        frames = torch.zeros(B, T, R, R, device=device)
        b = torch.arange(B, device=device)[:, None, None, None]
        for j in range(nd):
            dr = span - torch.from_numpy(ys[:, j]).to(device)[..., None]               # (B, T, R)
            dc = span - torch.from_numpy(xs[:, j]).to(device)[..., None]
            inside = ((dr >= 0) & (dr < D))[..., :, None] & ((dc >= 0) & (dc < D))[..., None, :]
            img = digits[torch.from_numpy(k[:, j]).to(device)]                            # (B, D, D)
            drawn = img[b, dr.clamp(0, D - 1)[..., :, None], dc.clamp(0, D - 1)[..., None, :]]
            frames = torch.maximum(frames, drawn * inside)  # overlapping digits: the brighter pixel
        labels = [[int(self.labels[kk]) for kk in p[0]] for p in plans]
        return frames, labels, [p[1] for p in plans]

    def _digits_on(self, device) -> torch.Tensor:
        key = str(device)
        if key not in self._device_digits:
            self._device_digits[key] = torch.from_numpy(self.digits).to(device)
        return self._device_digits[key]

    def clip(self, i: int):
        """(frames float32 (F, R, R) in [0, 1], digits, directions) of clip ``i``."""
        frames, digits, directions = self.render([i])
        return frames[0].numpy(), digits[0], directions[0]

    def render_batch(self, indices, device) -> dict:
        """The training batch of clips ``indices``, drawn on ``device`` (``data.on_device``): pixels
        (B, C, F, R, R) in [-1, 1] and the captions, as the loader's collated items would hold."""
        frames, digits, directions = self.render(indices, device)
        pixels = (frames * 2.0 - 1.0)[:, None].expand(-1, self.channels, -1, -1, -1).contiguous()
        return {"pixels": pixels, "caption": [clip_caption(d, m) for d, m in zip(digits, directions)]}

    def __getitem__(self, i: int) -> dict:
        frames, digits, directions = self.clip(i)
        pixels = torch.from_numpy(frames * 2.0 - 1.0)[None].expand(self.channels, -1, -1, -1).contiguous()
        return {"pixels": pixels, "caption": clip_caption(digits, directions)}

    def all_captions(self) -> list[str]:
        """Every caption a clip can have (for a text-embedding cache)."""
        one = [(d, m) for d in range(10) for m in DIRECTIONS]
        moving = [clip_caption([c[0] for c in combo], [c[1] for c in combo])
                  for combo in itertools.product(one, repeat=self.num_digits)]
        if not self.static_fraction:
            return moving
        still = [clip_caption(list(ds), [STILL] * self.num_digits)
                 for ds in itertools.product(range(10), repeat=self.num_digits)]
        return moving + still
