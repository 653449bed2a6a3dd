"""Frame and resolution buckets: items that share one are batched together.

A resolution bucket is (height, width); an item goes to the bucket whose aspect ratio is closest to
its own (log-ratio distance), then is resized to cover it and centre-cropped. A frame bucket is a
frame count; a video goes to the largest bucket it has enough frames for.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def nearest_resolution(height: int, width: int, buckets) -> tuple[int, int]:
    aspect = math.log(height / width)
    return tuple(min(buckets, key=lambda hw: abs(math.log(hw[0] / hw[1]) - aspect)))


def largest_frame_bucket(num_frames: int, buckets) -> int | None:
    fitting = [b for b in buckets if b <= num_frames]
    return max(fitting) if fitting else None


def resize_cover_crop(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """x (..., C, H, W) float -> resized so it covers (height, width), centre-cropped to it."""
    h, w = x.shape[-2:]
    scale = max(height / h, width / w)
    nh, nw = max(height, round(h * scale)), max(width, round(w * scale))
    lead = x.shape[:-3]
    y = x.reshape(-1, *x.shape[-3:])
    if (nh, nw) != (h, w):
        y = F.interpolate(y, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    top, left = (nh - height) // 2, (nw - width) // 2
    y = y[..., top:top + height, left:left + width]
    return y.reshape(*lead, *y.shape[-3:])
