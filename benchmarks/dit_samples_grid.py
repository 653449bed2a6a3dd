"""Picture grid of class-conditional digit samples, one band of rows per model (docs/RESULTS.md).

    python -m benchmarks dit_samples_grid --out docs/images/dit-mnist-samples.png \
        sdpa=runs/eval/samples-dit-sdpa.npz "mhla + CPE"=runs/eval/samples-dit-mhla-cpe.npz ...

Each .npz is what ``mediagen fid --save-samples`` writes (uint8 images, key "images"), sampled with
class labels cycling 0..9, so sample i shows digit i % 10. The grid shows the first ``--rows`` samples
of each digit, unpicked.
"""

import argparse

import numpy as np
from PIL import Image, ImageDraw


def band(images: np.ndarray, rows: int, classes: int = 10) -> np.ndarray:
    """(rows * H, classes * W) grayscale: row r, column c is the r-th sample of digit c."""
    gray = images[..., 0] if images.ndim == 4 else images
    h, w = gray.shape[1:3]
    out = np.zeros((rows * h, classes * w), dtype=np.uint8)
    for r in range(rows):
        for c in range(classes):
            out[r * h:(r + 1) * h, c * w:(c + 1) * w] = gray[r * classes + c]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="LABEL=samples.npz, one per band, top to bottom")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--scale", type=int, default=2, help="pixel upscaling (nearest)")
    ap.add_argument("--label-width", type=int, default=90)
    args = ap.parse_args()
    bands = []
    for spec in args.models:
        label, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"model {spec!r} must be LABEL=PATH.npz")
        bands.append((label, band(np.load(path)["images"], args.rows)))
    gap = 8
    width = bands[0][1].shape[1] * args.scale
    height = sum(b.shape[0] * args.scale for _, b in bands) + gap * (len(bands) - 1)
    canvas = Image.new("L", (args.label_width + width, height), 0)
    draw = ImageDraw.Draw(canvas)
    y = 0
    for i, (label, pixels) in enumerate(bands):
        img = Image.fromarray(pixels).resize((width, pixels.shape[0] * args.scale), Image.NEAREST)
        draw.text((6, y + img.height // 2 - 6), label, fill=255)
        canvas.paste(img, (args.label_width, y))  # after the label: a long label never covers samples
        y += img.height
        if i < len(bands) - 1:
            draw.rectangle([args.label_width, y, args.label_width + width, y + gap - 1], fill=128)
            y += gap
    canvas.save(args.out)
    print(f"wrote {args.out} ({canvas.width}x{canvas.height})")


if __name__ == "__main__":
    main()
