"""A folder of images with captions (metadata.jsonl / metadata.csv), for text-to-image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .buckets import nearest_resolution, resize_cover_crop
from .captions import read_captions

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


class ImageFolderDataset(Dataset):
    """Images resized/cropped to their resolution bucket (default: one square bucket of
    ``resolution``), as (C, H, W) in [-1, 1], with their captions."""

    def __init__(self, folder: str | Path, *, resolution: int = 64, channels: int = 3,
                 resolution_buckets=None):
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"data.path={str(folder)!r} is not a folder")
        captions = read_captions(folder)
        self.folder, self.channels = folder, channels
        self.buckets = [tuple(b) for b in (resolution_buckets or [])] or [(resolution, resolution)]
        self.files, self.captions, self.sizes = [], [], []
        for name in sorted(captions):
            path = folder / name
            if path.suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            if not path.is_file():
                raise ValueError(f"metadata names {name!r} but {path} does not exist")
            try:
                with Image.open(path) as im:
                    w, h = im.size
            except OSError as err:
                raise ValueError(f"image {path} cannot be read: {err}") from None
            self.files.append(path)
            self.captions.append(captions[name])
            self.sizes.append(nearest_resolution(h, w, self.buckets))
        if not self.files:
            raise ValueError(f"data.path={str(folder)!r}: metadata lists no image files ({sorted(IMAGE_EXTENSIONS)})")

    def __len__(self) -> int:
        return len(self.files)

    def bucket_ids(self) -> list[int]:
        return [self.buckets.index(s) for s in self.sizes]

    def num_buckets(self) -> int:
        """One bucket per data.resolution_buckets entry (in that order), holding images or not."""
        return len(self.buckets)

    def __getitem__(self, i: int) -> dict:
        mode = "L" if self.channels == 1 else "RGB"
        with Image.open(self.files[i]) as im:
            a = np.asarray(im.convert(mode), dtype=np.float32) / 127.5 - 1.0
        x = torch.from_numpy(a).reshape(a.shape[0], a.shape[1], -1).permute(2, 0, 1)
        return {"pixels": resize_cover_crop(x, *self.sizes[i]).contiguous(), "caption": self.captions[i]}

    def all_captions(self) -> list[str]:
        return sorted(set(self.captions))
