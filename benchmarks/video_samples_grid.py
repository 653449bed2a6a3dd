"""A picture of sampled Moving-MNIST clips: for a few digits, every direction, the first, middle and
last frame, one panel per model, from the ``.npz`` files ``benchmarks/video_samples.py`` writes.

    python -m benchmarks video_samples_grid A.npz [B.npz ...] --digits 0 3 7 --seed 0 --out grid.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

DIRECTIONS = ("left", "right", "up", "down")


def panel(npz: Path, digits, seed: int, gap: int = 2) -> np.ndarray:
    """Rows: digit x direction; columns: frames 0, F/2, F-1 (uint8, grey)."""
    data = np.load(npz)
    videos, prompts, seeds = data["videos"], [str(p) for p in data["prompts"]], data["seeds"]
    rows = []
    for d in digits:
        for m in DIRECTIONS:
            want = f"the digit {d} moves {m}"
            i = next(i for i, (p, s) in enumerate(zip(prompts, seeds)) if p == want and s == seed)
            v = videos[i]
            frames = [v[0], v[len(v) // 2], v[-1]]
            row = np.concatenate([np.pad(f, ((gap, gap), (gap, gap)), constant_values=96) for f in frames], 1)
            rows.append(row)
    return np.concatenate(rows, 0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz", nargs="+")
    p.add_argument("--digits", type=int, nargs="+", default=[0, 3, 7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    label_w, head_h = 110, 18
    panels = [panel(Path(f), args.digits, args.seed) for f in args.npz]
    h, w = panels[0].shape
    canvas = Image.new("L", (label_w + len(panels) * (w + 12), h + head_h), 255)
    draw = ImageDraw.Draw(canvas)
    for j, (f, im) in enumerate(zip(args.npz, panels)):
        x = label_w + j * (w + 12)
        canvas.paste(Image.fromarray(im), (x, head_h))
        draw.text((x, 3), f"{Path(f).stem}: first / middle / last frame", fill=0)
    row_h = h // (len(args.digits) * len(DIRECTIONS))
    for r, (d, m) in enumerate((d, m) for d in args.digits for m in DIRECTIONS):
        draw.text((4, head_h + r * row_h + row_h // 2 - 5), f"{d} moves {m}", fill=0)
    canvas.save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
