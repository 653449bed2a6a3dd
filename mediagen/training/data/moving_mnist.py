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
from ...data.captions import STILL, template_caption
from .wordings import varied_caption

DIRECTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}  # (dy, dx)
# STILL (imported): the motion of a clip whose digits stand still (``static_fraction``)
MOTIONS = dict(DIRECTIONS, **{STILL: (0, 0)})


def clip_caption(digits, directions, rng: np.random.Generator | None = None) -> str:
    """The template caption ("the digit 3 moves left", ``mediagen.data.captions.template_caption``), which the
    shipped video models were trained on;
    with ``rng`` a wording drawn from the varied set (``wordings.varied_caption``) instead."""
    if rng is not None:
        return varied_caption(digits, directions, rng)
    return template_caption(digits, directions)


MIN_STEP = 1.0  # pixels per frame: a moving digit moves at least this far on every frame


def clip_sizes(num_frames: int, resolution: int, frame_buckets=(), resolution_buckets=()) -> list[tuple[int, int]]:
    """The clip sizes (frames, canvas side) of a dataset, from the ``data`` section's keys.

    Without buckets: one size, ``num_frames`` frames of ``resolution`` x ``resolution``. With buckets the
    lists pair up: size j is ``frame_buckets[j]`` frames of ``resolution_buckets[j]`` (a square [side,
    side]); a list of one entry goes with every entry of the other. Each size gets an equal share of
    the clips (``bucket_ids``), so a size listed twice gets twice the share."""
    frames = [int(f) for f in frame_buckets] or [int(num_frames)]
    sides = []
    for hw in resolution_buckets:
        hw = [int(v) for v in hw]
        if len(hw) != 2 or hw[0] != hw[1]:
            raise ValueError(f"data.resolution_buckets entry {hw} is not allowed for moving-mnist: use [side, side] "
                             "(the canvas is square)")
        sides.append(hw[0])
    sides = sides or [int(resolution)]
    if len(frames) > 1 and len(sides) > 1 and len(frames) != len(sides):
        raise ValueError(f"data.frame_buckets={frames} and data.resolution_buckets={[[s, s] for s in sides]} are not "
                         "allowed together: for moving-mnist they pair up (size j is frame_buckets[j] frames of "
                         "resolution_buckets[j]), so give as many entries in each, or one in either")
    n = max(len(frames), len(sides))
    frames, sides = (frames * n if len(frames) == 1 else frames), (sides * n if len(sides) == 1 else sides)
    for f, s in zip(frames, sides):
        if f < 1:
            raise ValueError(f"data.num_frames (or a data.frame_buckets entry) = {f} is not allowed: use 1 or more")
        if s < 10:
            raise ValueError(f"data.resolution (or a data.resolution_buckets side) = {s} is too small for "
                             "Moving-MNIST: use 10 or more")
    return list(zip(frames, sides))


def digit_side(resolution: int) -> int:
    """The side of a digit on a canvas of ``resolution``: 7/16 of it (28 px on 64, 56 on 128). The digit keeps
    its share of the canvas at every size, so a larger canvas is the same clip at a higher resolution (and
    a digit covers as many of a model's blocks of tokens as at the trained size), not a smaller digit in
    more background."""
    return resolution * 7 // 16


class MovingMNISTDataset(Dataset):
    """``length`` clips of (C, F, R, R) in [-1, 1] with a caption each.

    The digit side is 7R/16 (28 on a 64 canvas, 56 on 128). A moving digit moves ``speed`` pixels per frame,
    capped so that its path over the whole clip stays inside the canvas, and never less than 1 pixel per
    frame: a size or speed that would make it slower is refused, since a digit that barely moves (or
    stands still on some frames) does not show the motion its caption names. Positions are rounded half
    up, so a step of at least one pixel moves the digit on every frame. Digits overlap by taking the
    brighter pixel; digits that move the same way start with boxes apart (they would overlap all clip
    long), digits moving different ways may pass each other. A fraction ``static_fraction`` of the
    clips stand still, captioned without a direction ("the digit 3"): a model trained on them draws a
    still digit for a caption that names no motion (prompt-mode images).

    ``frame_buckets`` / ``resolution_buckets`` (``clip_sizes``) give several clip sizes; clip ``i`` has
    size ``i % len(sizes)`` and ``bucket_ids`` tells the trainer's sampler to batch clips of one size
    together. ``resolution``, ``num_frames``, ``digit``, ``digits`` and ``step`` are those of the first size.

    With ``num_digits=1``, a fraction ``two_digit_fraction`` of the clips shows two digits instead ("the
    digit 3 moves left while the digit 8 moves down"), so one model learns both kinds of prompt; the choice
    comes from a generator of its own, so the one-digit clips are those of a one-digit dataset.
    """

    def __init__(self, *, resolution: int = 64, num_frames: int = 16, num_digits: int = 1, speed: float = 2.0,
                 length: int = 100000, channels: int = 1, split: str = "train", seed: int = 0,
                 static_fraction: float = 0.0, frame_buckets=(), resolution_buckets=(),
                 two_digit_fraction: float = 0.0):
        if num_digits < 1:
            raise ValueError(f"data.num_digits={num_digits} is not allowed: use 1 or more")
        if not 0.0 <= two_digit_fraction <= 1.0:
            raise ValueError(f"data.two_digit_fraction={two_digit_fraction} is not allowed: use a number in [0, 1]")
        if two_digit_fraction and num_digits != 1:
            raise ValueError(f"data.two_digit_fraction={two_digit_fraction} is not allowed with data.num_digits="
                             f"{num_digits}: it mixes two-digit clips into a one-digit dataset (num_digits: 1)")
        if not 0.0 <= static_fraction <= 1.0:
            raise ValueError(f"data.static_fraction={static_fraction} is not allowed: use a number in [0, 1]")
        self.sizes = clip_sizes(num_frames, resolution, frame_buckets, resolution_buckets)
        moving = static_fraction < 1.0
        if moving and any(f > 1 for f, _ in self.sizes) and not speed >= MIN_STEP:
            raise ValueError(f"data.speed={speed} is not allowed: use {MIN_STEP:g} or more (pixels per frame; a "
                             "moving digit must move on every frame for its caption to stay true)")
        self.static_fraction = static_fraction
        images, labels = load_mnist10k(split)
        self.labels = labels
        self._images = torch.from_numpy(images.astype(np.float32) / 255.0)[:, None]
        self._digits_by_side: dict[int, np.ndarray] = {}
        self.steps = []
        for f, r in self.sizes:
            free = r - digit_side(r)
            step = min(speed, free / max(f - 1, 1))  # pixels per frame
            if moving and f > 1 and step < MIN_STEP:
                raise ValueError(f"data.num_frames={f} with data.resolution={r} is not allowed: a {digit_side(r)}-px "
                                 f"digit has {free} px to cross in {f - 1} steps, {step:.2f} px per frame, and a "
                                 f"moving digit needs at least {MIN_STEP:g}: use at most {int(free // MIN_STEP) + 1} "
                                 f"frames at this resolution, or a larger canvas")
            self.steps.append(step)
        self.num_frames, self.resolution = self.sizes[0]
        self.digit, self.step = digit_side(self.resolution), self.steps[0]
        self.digits = self.digit_images(self.digit)
        self.num_digits = num_digits
        self.two_digit_fraction = two_digit_fraction
        self.speed, self.length, self.channels, self.seed = speed, length, channels, seed
        self._device_digits: dict[tuple[str, int], torch.Tensor] = {}

    def __len__(self) -> int:
        return self.length

    def digit_images(self, side: int) -> np.ndarray:
        """The split's digits resized to ``side`` x ``side`` (float32 in [0, 1]), made once per side."""
        if side not in self._digits_by_side:
            self._digits_by_side[side] = F.interpolate(self._images, size=(side, side), mode="bilinear",
                                                       antialias=True, align_corners=False)[:, 0].numpy()
        return self._digits_by_side[side]

    def size_index(self, i: int) -> int:
        """Which of ``self.sizes`` clip ``i`` has."""
        return int(i) % len(self.sizes)

    def bucket_ids(self) -> list[int]:
        """The size of every clip: the trainer's sampler puts only clips of one size in a batch."""
        return (np.arange(self.length) % len(self.sizes)).tolist()

    def num_buckets(self) -> int:
        """One bucket per size: size j is bucket j."""
        return len(self.sizes)

    def plan(self, i: int):
        """What clip ``i`` shows, drawn from its own generator: (images (nd,) into ``digit_images``,
        directions (nd,), start rows (nd,), start columns (nd,)), with the speed of its size's ``steps``."""
        rng = np.random.default_rng([self.seed, i])
        # drawn from a generator of its own, so that with static_fraction=0 every clip is unchanged
        still = self.static_fraction > 0 and np.random.default_rng([self.seed, i, 1]).random() < self.static_fraction
        count = self.num_digits
        if self.two_digit_fraction > 0 and np.random.default_rng([self.seed, i, 3]).random() < self.two_digit_fraction:
            count = 2
        s = self.size_index(i)
        (num_frames, resolution), step = self.sizes[s], self.steps[s]
        side = digit_side(resolution)
        free = resolution - side
        travel = step * (num_frames - 1)
        ks, names, ranges, ys, xs = [], [], [], [], []
        for _ in range(count):
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
            ranges.append((lo_y, hi_y, lo_x, hi_x))
            ys.append(rng.uniform(lo_y, hi_y))
            xs.append(rng.uniform(lo_x, hi_x))
        # digits that move the same way keep their offset for the whole clip: where their boxes overlap
        # they are one blob from the first frame to the last and no one can tell which digit moves
        # where, so the starts are drawn again until such digits lie apart (as far as the canvas allows;
        # digits moving different ways only pass each other). One-digit clips draw nothing more, so they
        # do not change.
        for _ in range(1000):
            if not any(names[a] == names[b] and abs(ys[a] - ys[b]) < side and abs(xs[a] - xs[b]) < side
                       for a in range(len(names)) for b in range(a)):
                break
            ys = [rng.uniform(r[0], r[1]) for r in ranges]
            xs = [rng.uniform(r[2], r[3]) for r in ranges]
        return ks, names, ys, xs

    def render(self, indices, device="cpu") -> tuple[torch.Tensor, list[list[int]], list[list[str]]]:
        """Clips ``indices`` drawn on ``device`` in one pass: (frames float32 (B, F, R, R) in [0, 1],
        digits, directions). The plans are drawn on the CPU (a few draws per clip); the pixels are a
        gather from the digit images, so a GPU renders a training batch in well under a millisecond.
        The clips must share one size (``bucket_ids``)."""
        device = torch.device(device)
        indices = [int(i) for i in indices]
        which = {self.size_index(i) for i in indices}
        if len(which) > 1:
            shown = sorted(f"{self.sizes[s][0]} frames of {self.sizes[s][1]}x{self.sizes[s][1]}" for s in which)
            raise ValueError(f"clips {indices[:8]} have different sizes ({', '.join(shown)}): a batch holds clips of "
                             "one size (bucket_ids)")
        s = which.pop() if which else 0
        (T, R), step = self.sizes[s], self.steps[s]
        plans = [self.plan(i) for i in indices]
        B, nd, D = len(plans), max((len(p[0]) for p in plans), default=self.num_digits), digit_side(R)
        t = np.arange(T, dtype=np.float64) * step

        def padded(values, fill):                                     # clips with fewer digits: (B, nd)
            return [list(v) + [fill] * (nd - len(v)) for v in values]

        shown = np.array(padded([[1.0] * len(p[0]) for p in plans], 0.0), np.float32)  # (B, nd)
        k = np.array(padded([p[0] for p in plans], 0), np.int64).reshape(B, nd)
        vel = np.array(padded([[MOTIONS[m] for m in p[1]] for p in plans], (0, 0)), np.float64).reshape(B, nd, 2)
        y0 = np.array(padded([p[2] for p in plans], 0.0), np.float64).reshape(B, nd)
        x0 = np.array(padded([p[3] for p in plans], 0.0), np.float64).reshape(B, nd)
        # positions rounded half up on the float64 path (the same numbers on every device): rounding is
        # then monotone with round(x + 1) = round(x) + 1, so a step of at least one pixel moves the digit
        # on every frame (half-to-even rounding would give 2.5 -> 2 after 1.5 -> 2)
        ys = np.floor(y0[..., None] + vel[..., 0:1] * t + 0.5).astype(np.int64)         # (B, nd, T)
        xs = np.floor(x0[..., None] + vel[..., 1:2] * t + 0.5).astype(np.int64)
        digits = self._digits_on(device, D)
        span = torch.arange(R, device=device)
        frames = torch.zeros(B, T, R, R, device=device)
        b = torch.arange(B, device=device)[:, None, None, None]
        for j in range(nd):
            dr = span - torch.from_numpy(ys[:, j]).to(device)[..., None]               # (B, T, R)
            dc = span - torch.from_numpy(xs[:, j]).to(device)[..., None]
            inside = ((dr >= 0) & (dr < D))[..., :, None] & ((dc >= 0) & (dc < D))[..., None, :]
            img = digits[torch.from_numpy(k[:, j]).to(device)]                            # (B, D, D)
            drawn = img[b, dr.clamp(0, D - 1)[..., :, None], dc.clamp(0, D - 1)[..., None, :]]
            drawn = drawn * torch.from_numpy(shown[:, j]).to(device)[:, None, None, None]
            frames = torch.maximum(frames, drawn * inside)  # overlapping digits: the brighter pixel
        labels = [[int(self.labels[kk]) for kk in p[0]] for p in plans]
        return frames, labels, [p[1] for p in plans]

    def _digits_on(self, device, side: int | None = None) -> torch.Tensor:
        side = self.digit if side is None else side
        key = (str(device), side)
        if key not in self._device_digits:
            self._device_digits[key] = torch.from_numpy(self.digit_images(side)).to(device)
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
        counts = [self.num_digits] + ([2] if self.two_digit_fraction else [])
        moving = [clip_caption([c[0] for c in combo], [c[1] for c in combo])
                  for n in counts for combo in itertools.product(one, repeat=n)]
        if not self.static_fraction:
            return moving
        still = [clip_caption(list(ds), [STILL] * n) for n in counts for ds in itertools.product(range(10), repeat=n)]
        return moving + still
