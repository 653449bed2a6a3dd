"""The 10,000 MNIST digits shipped in ``mediagen.data`` as a class-conditional image dataset."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...data import load_mnist10k

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def to_unit_range(images_uint8: np.ndarray) -> torch.Tensor:
    """uint8 in 0..255 -> float32 in [-1, 1]."""
    return torch.from_numpy(images_uint8.astype(np.float32) / 127.5 - 1.0)


class MNISTDataset(Dataset):
    """Digits as (C, R, R) in [-1, 1] (resized from 28 x 28 when R differs), labels 0..9; with
    ``captions=True`` each item also has a caption ("a handwritten digit 7") for text-to-image."""

    def __init__(self, split: str = "train", resolution: int = 28, channels: int = 1, captions: bool = False):
        images, labels = load_mnist10k(split)
        x = to_unit_range(images)[:, None]
        if resolution != 28:
            x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", antialias=True, align_corners=False)
        self.images = x.expand(-1, channels, -1, -1).contiguous()
        self.labels = labels
        self.captions = captions

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        item = {"pixels": self.images[i], "label": int(self.labels[i])}
        if self.captions:
            item["caption"] = f"a handwritten digit {int(self.labels[i])}"
        return item

    def all_captions(self) -> list[str]:
        return [f"a handwritten digit {d}" for d in range(10)]
