"""A picture of sampled Moving-MNIST clips: for a few digits, every direction, the first, middle and
last frame, one panel per model, from the ``.npz`` files ``benchmarks/video_samples.py`` writes, or from the
clips ``mediagen vbench --save-format npy --save-videos DIR`` wrote (``<prompt>-<i>.npy``), packed first:

    python -m benchmarks video_samples_grid A.npz [B.npz ...] --digits 0 3 7 --seed 0 --out grid.png
    python -m benchmarks video_samples_grid --pack DIR --clips-per-seed 40 --out A.npz

A two-digit clip ("the digit 3 moves left while the digit 4 moves up") stands in the row of its first digit and
direction, labelled with both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

DIRECTIONS = ("left", "right", "up", "down")


def pack(folder: Path, out: Path, clips_per_seed: int | None = None) -> int:
    """Pack the clips ``mediagen vbench --save-videos`` wrote as ``<prompt>-<i>.npy`` (uint8 F x H x W) into one
    ``.npz`` of their first, middle and last frames, with ``prompts`` and ``seeds`` (clip i sampled with seed
    i // clips_per_seed, as ``benchmarks/video_gpu.sh long-score`` samples; all seed 0 without it)."""
    clips = []
    for f in Path(folder).glob("*.npy"):
        prompt, _, index = f.stem.rpartition("-")
        if not index.isdigit():
            raise ValueError(f"{f.name}: expected <prompt>-<index>.npy, as mediagen vbench --save-videos names clips")
        clips.append((int(index), prompt, f))
    if not clips:
        raise ValueError(f"--pack: no <prompt>-<index>.npy clips in {folder}")
    clips.sort()
    frames = []
    for _, _, f in clips:
        v = np.load(f, allow_pickle=False)
        v = v[..., 0] if v.ndim == 4 else v
        frames.append(np.stack([v[0], v[len(v) // 2], v[-1]]).astype(np.uint8))
    seeds = [i // clips_per_seed if clips_per_seed else 0 for i, _, _ in clips]
    np.savez_compressed(out, videos=np.stack(frames), prompts=np.array([p for _, p, _ in clips]), seeds=np.array(seeds))
    return len(clips)


def pick(prompts, seeds, digit: int, direction: str, seed: int) -> int:
    """The clip of ``digit`` moving ``direction`` with ``seed``: the one-digit caption, or a two-digit caption
    that starts with it."""
    want = f"the digit {digit} moves {direction}"
    for i, (p, s) in enumerate(zip(prompts, seeds)):
        if s == seed and (p == want or p.startswith(want + " ")):
            return i
    raise ValueError(f"no clip of {want!r} with seed {seed}")


def panel(npz: Path, digits, seed: int, gap: int = 2) -> tuple[np.ndarray, list[str]]:
    """Rows: digit x direction; columns: frames 0, F/2, F-1 (uint8, grey); and each row's prompt."""
    data = np.load(npz)
    videos, prompts, seeds = data["videos"], [str(p) for p in data["prompts"]], data["seeds"]
    rows, labels = [], []
    for d in digits:
        for m in DIRECTIONS:
            i = pick(prompts, seeds, d, m, seed)
            labels.append(prompts[i])
            v = videos[i]
            frames = [v[0], v[len(v) // 2], v[-1]]
            row = np.concatenate([np.pad(f, ((gap, gap), (gap, gap)), constant_values=96) for f in frames], 1)
            rows.append(row)
    return np.concatenate(rows, 0), labels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("npz", nargs="*")
    p.add_argument("--pack", default=None, help="a folder of <prompt>-<i>.npy clips to pack into --out (.npz)")
    p.add_argument("--clips-per-seed", type=int, default=None, help="with --pack: clip i has seed i // this")
    p.add_argument("--digits", type=int, nargs="+", default=[0, 3, 7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.clips_per_seed is not None and args.clips_per_seed < 1:
        p.error(f"--clips-per-seed {args.clips_per_seed} is not allowed: use a whole number >= 1")
    try:
        if args.pack:
            print(f"packed {pack(Path(args.pack), Path(args.out), args.clips_per_seed)} clips into {args.out}")
            return 0
        if not args.npz:
            p.error("give the .npz files to draw, or --pack FOLDER")
        panels = [panel(Path(f), args.digits, args.seed) for f in args.npz]
    except ValueError as e:
        p.error(str(e))
    two = any(" while " in label for _, labels in panels for label in labels)
    label_w, head_h = (200 if two else 110), 18
    h, w = panels[0][0].shape
    titles = [f"{Path(f).stem}: first / middle / last frame" for f in args.npz]
    measure = ImageDraw.Draw(Image.new("L", (1, 1)))
    col_w = max([w] + [int(measure.textlength(t)) for t in titles]) + 12
    canvas = Image.new("L", (label_w + len(panels) * col_w, h + head_h), 255)
    draw = ImageDraw.Draw(canvas)
    for j, (title, (im, _)) in enumerate(zip(titles, panels)):
        x = label_w + j * col_w
        canvas.paste(Image.fromarray(im), (x, head_h))
        draw.text((x, 3), title, fill=0)
    row_h = h // (len(args.digits) * len(DIRECTIONS))
    for r, label in enumerate(panels[0][1]):
        short = label.replace("the digit ", "").replace(" while ", " + ")
        draw.text((4, head_h + r * row_h + row_h // 2 - 5), short, fill=0)
    canvas.save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
