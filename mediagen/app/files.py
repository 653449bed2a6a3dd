"""Writing a request's outputs, each request in its own folder: images as PNG at their own size
plus enlarged previews for the page; videos as MP4 (enlarged, so they play at a visible size) plus
enlarged GIF previews for galleries. Enlarging is nearest-neighbour, so small digits stay crisp."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

PREVIEW_SIDE = 256
KEEP_SECONDS = 6 * 3600          # request folders older than this are removed when a new one is made


def output_root(root: str | Path | None = None) -> Path:
    path = Path(root) if root is not None else Path(tempfile.gettempdir()) / "mediagen-app"
    path.mkdir(parents=True, exist_ok=True)
    return path


def request_dir(root: Path, kind: str, keep_seconds: float = KEEP_SECONDS) -> Path:
    """A new folder for one request's outputs; old request folders are pruned first."""
    cutoff = time.time() - keep_seconds
    for old in root.glob("*-" + "?" * 12):
        try:
            if old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except FileNotFoundError:                     # pruned by a concurrent request
            pass
    path = root / f"{kind}-{uuid.uuid4().hex[:12]}"
    path.mkdir(parents=True)
    return path


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "output"


def enlarge(frames: np.ndarray, side: int = PREVIEW_SIDE) -> np.ndarray:
    """(..., H, W, C) enlarged by a whole factor so that the shorter side reaches about ``side``."""
    h, w = frames.shape[-3:-1]
    factor = max(1, side // max(1, min(h, w)))
    return frames.repeat(factor, axis=-3).repeat(factor, axis=-2)


def save_images(images: np.ndarray, folder: Path, stem: str) -> tuple[list[str], list[str]]:
    """(download paths, preview paths) of images (B, H, W, C) in [0, 1]."""
    from ..pipelines.export import save_image

    downloads, previews = [], []
    for i, image in enumerate(images):
        downloads.append(str(save_image(image, folder / f"{stem}-{i}.png")))
        previews.append(str(save_image(enlarge(image), folder / f"{stem}-{i}-preview.png")))
    return downloads, previews


def save_videos(videos: np.ndarray, folder: Path, stem: str, fps: int = 8) -> tuple[list[str], list[str]]:
    """(mp4 paths for download and playback, enlarged GIF previews) of videos (B, F, H, W, C)."""
    from ..pipelines.export import save_video

    downloads, previews = [], []
    for i, video in enumerate(videos):
        downloads.append(str(save_video(enlarge(video), folder / f"{stem}-{i}.mp4", fps)))
        previews.append(str(save_video(enlarge(video, 128), folder / f"{stem}-{i}-preview.gif", fps)))
    return downloads, previews
