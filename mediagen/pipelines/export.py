"""Write pipeline outputs to disk: PNG for images, MP4 or GIF for videos (no system ffmpeg needed)."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_FORMATS = ("png",)
VIDEO_FORMATS = ("mp4", "gif")


def _to_uint8(frames) -> np.ndarray:
    a = np.asarray(frames, dtype=np.float32)
    return (np.clip(a, 0.0, 1.0) * 255).round().astype(np.uint8)


@contextmanager
def _written_atomically(path: Path):
    """Yields a hidden temp path in ``path``'s folder (same suffix, so the writer picks the same format); once
    written it replaces ``path``, and on any failure it is removed: no partial or 0-byte file is left, and an
    existing ``path`` is kept as it was. The writer creates the temp file, so it gets the usual permissions."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_image(image, path: str | Path) -> Path:
    """image: PIL or an (H, W, C) array in [0, 1]. Written to a temp file, then renamed to ``path``."""
    path = Path(path)
    if not isinstance(image, Image.Image):
        a = _to_uint8(image)
        image = Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a)
    with _written_atomically(path) as tmp:
        image.save(tmp)
    return path


def save_video(frames, path: str | Path, fps: int = 8) -> Path:
    """frames: (F, H, W, C) array in [0, 1]; the format follows the suffix (.mp4 or .gif). Written to a temp
    file, then renamed to ``path``."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in VIDEO_FORMATS:
        raise ValueError(f"video path {str(path)!r} has suffix .{fmt}; allowed: {VIDEO_FORMATS}")
    a = _to_uint8(frames)
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    if fmt == "gif":
        images = [Image.fromarray(f) for f in a]
        with _written_atomically(path) as tmp:
            images[0].save(tmp, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
        return path
    import imageio.v3 as iio

    # H.264 wants even sides: pad by one pixel where needed
    pad_h, pad_w = a.shape[1] % 2, a.shape[2] % 2
    if pad_h or pad_w:
        a = np.pad(a, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    with _written_atomically(path) as tmp:
        iio.imwrite(tmp, a, fps=fps, codec="libx264", plugin="pyav", out_pixel_format="yuv420p")
    return path


def save_media(output, path: str | Path, fps: int = 8) -> list[Path]:
    """Save every sample of an image (B, H, W, C) or video (B, F, H, W, C) batch; return the paths.

    With several samples, ``name.png`` becomes ``name-0.png``, ``name-1.png``, ...
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = np.asarray(output)
    is_video = batch.ndim == 5
    fmt = path.suffix.lstrip(".").lower()
    allowed = VIDEO_FORMATS if is_video else IMAGE_FORMATS
    if fmt not in allowed:
        raise ValueError(f"output path {str(path)!r}: a {'video' if is_video else 'image'} is written as "
                         f"{' or '.join(allowed)}, not .{fmt}")
    paths = [path] if len(batch) == 1 else [path.with_name(f"{path.stem}-{i}{path.suffix}") for i in range(len(batch))]
    for sample, p in zip(batch, paths):
        save_video(sample, p, fps) if is_video else save_image(sample, p)
    return paths
