"""Reading and writing sets of images for FID: a folder of image files, or an .npz/.npy array."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def list_image_files(folder) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS or p.suffix == ".npy")


def load_array_file(path) -> np.ndarray:
    """uint8 images from .npy or .npz (key 'images', else the only array), never unpickling."""
    path = Path(path)
    if path.suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
    else:
        with np.load(path, allow_pickle=False) as data:
            keys = list(data.keys())
            if "images" in keys:
                arr = data["images"]
            elif len(keys) == 1:
                arr = data[keys[0]]
            else:
                raise ValueError(f"{path} holds arrays {keys}: name the image array 'images'")
    if arr.dtype != np.uint8:
        raise ValueError(f"{path}: images must be uint8 in 0..255; got dtype {arr.dtype}")
    if arr.ndim not in (3, 4):
        raise ValueError(f"{path}: images must be (N, H, W) or (N, H, W, C); got shape {arr.shape}")
    return arr


class ImageFolder:
    """A lazily loaded sequence of uint8 images from the files of a folder (sorted, recursive)."""

    def __init__(self, folder):
        self.files = list_image_files(folder)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path = self.files[i]
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        from PIL import Image

        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))


def load_images(path, limit: int | None = None):
    """Images from a folder or an .npz/.npy file, as a sequence of uint8 arrays (first ``limit``)."""
    path = Path(path)
    if path.is_dir():
        images = ImageFolder(path)
        if len(images) == 0:
            raise ValueError(f"no images found in folder {path} (looked for {sorted(IMAGE_EXTENSIONS)} and .npy)")
    elif path.is_file() and path.suffix in (".npz", ".npy"):
        images = load_array_file(path)
    elif not path.exists():
        raise ValueError(f"{path} does not exist: give a folder of images or an .npz/.npy file")
    else:
        raise ValueError(f"{path} is not allowed: give a folder of images or an .npz/.npy file")
    if limit is not None:
        if len(images) < limit:
            raise ValueError(f"asked for {limit} images but {path} holds only {len(images)}")
        images = images[:limit] if isinstance(images, np.ndarray) else _Head(images, limit)
    return images


class _Head:
    def __init__(self, seq, n):
        self.seq, self.n = seq, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.seq[i]


def save_images(images, folder, prefix: str = "") -> list[str]:
    """Write uint8 images as PNG files 000000.png, 000001.png, ... into ``folder``, or, when
    ``folder`` ends in .npz, as one compressed array under the key 'images'."""
    from PIL import Image

    if str(folder).endswith(".npz"):
        os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
        np.savez_compressed(folder, images=np.stack([np.asarray(im) for im in images]))
        return [str(folder)]
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, img in enumerate(images):
        img = np.asarray(img)
        if img.ndim == 3 and img.shape[-1] == 1:
            img = img[..., 0]
        p = os.path.join(folder, f"{prefix}{i:06d}.png")
        Image.fromarray(img).save(p)
        paths.append(p)
    return paths
