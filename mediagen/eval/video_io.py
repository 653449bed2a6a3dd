"""Reading and writing videos as uint8 (T, H, W, 3) arrays: mp4/webm/avi/mov through PyAV (no system
ffmpeg), GIF through Pillow, and .npy/.npz arrays (T, H, W) or (T, H, W, C)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VIDEO_EXTENSIONS = {".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif", ".npy", ".npz"}


def as_rgb_video(frames) -> np.ndarray:
    v = np.asarray(frames)
    if v.dtype != np.uint8:
        raise ValueError(f"video frames must be uint8 in 0..255; got dtype {v.dtype}")
    if v.ndim == 3:
        v = v[..., None]
    if v.ndim != 4 or v.shape[-1] not in (1, 3, 4):
        raise ValueError(f"a video must be (T, H, W) or (T, H, W, C) with C in 1, 3, 4; got shape {v.shape}")
    if v.shape[-1] == 1:
        v = np.repeat(v, 3, axis=-1)
    return np.ascontiguousarray(v[..., :3])


def read_video(path) -> np.ndarray:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return as_rgb_video(np.load(path, allow_pickle=False))
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            key = "video" if "video" in data else ("frames" if "frames" in data else list(data.keys())[0])
            return as_rgb_video(data[key])
    import imageio.v3 as iio

    plugin = "pillow" if suffix == ".gif" else "pyav"
    frames = iio.imread(path, index=None, plugin=plugin)
    if frames.ndim == 3 and suffix == ".gif":  # a one-frame GIF
        frames = frames[None]
    return as_rgb_video(frames)


def write_video(frames, path, fps: int = 8) -> None:
    path = Path(path)
    video = as_rgb_video(frames)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        np.save(path, video)
        return
    import imageio.v3 as iio

    if suffix == ".gif":
        iio.imwrite(path, video, plugin="pillow", duration=1000 / fps, loop=0)
    else:
        iio.imwrite(path, video, plugin="pyav", codec="libx264", fps=fps)


def list_videos(folder) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--videos {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in VIDEO_EXTENSIONS)
    if not files:
        raise ValueError(f"no videos in {folder} (looked for {sorted(VIDEO_EXTENSIONS)})")
    return files
