"""A folder of videos with captions (metadata.jsonl / metadata.csv), read with decord (PyAV where decord
cannot open a file or is not installed; ``mediagen.eval.video_io.open_video``), with frame and resolution
buckets. Every video is opened once at start-up, so an unreadable file fails at load with its name, not
hours into a run; the reader that opened each file is kept in ``readers`` and read again with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ...eval.video_io import open_video, to_gray
from .buckets import largest_frame_bucket, nearest_resolution, resize_cover_crop
from .captions import read_captions

VIDEO_EXTENSIONS = {".mp4", ".webm", ".avi", ".mov", ".mkv"}


def probe_video(path: Path, reader: str | None = None) -> tuple[int, int, int, str]:
    """(frames, height, width, reader) of a video; a ValueError naming the file if neither decord nor
    PyAV can open it."""
    video = open_video(path, reader)
    return video.frames, video.height, video.width, video.reader


def read_frames(path: Path, count: int, channels: int, reader: str | None = None) -> np.ndarray:
    """The first ``count`` frames as float32 (count, H, W, C) in [0, 255]; one channel is BT.601 luma
    of the RGB frames, the same for either reader."""
    frames = open_video(path, reader).read(count)
    return to_gray(frames) if channels == 1 else frames.astype(np.float32)


class VideoFolderDataset(Dataset):
    """Videos as (C, F, H, W) in [-1, 1]: F from the frame buckets (default ``[num_frames]``), (H, W)
    from the resolution buckets (default one square bucket). Videos shorter than every frame bucket
    are skipped (their count is in ``skipped``)."""

    def __init__(self, folder: str | Path, *, num_frames: int = 16, resolution: int = 64, channels: int = 3,
                 frame_buckets=None, resolution_buckets=None):
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"data.path={str(folder)!r} is not a folder")
        captions = read_captions(folder)
        self.channels = channels
        self.frame_buckets = list(frame_buckets or []) or [num_frames]
        self.res_buckets = [tuple(b) for b in (resolution_buckets or [])] or [(resolution, resolution)]
        self.files, self.captions, self.shapes, self.skipped, self.readers = [], [], [], [], []
        for name in sorted(captions):
            path = folder / name
            if path.suffix.lower() not in VIDEO_EXTENSIONS:
                continue
            if not path.is_file():
                raise ValueError(f"metadata names {name!r} but {path} does not exist")
            frames, h, w, reader = probe_video(path)
            f = largest_frame_bucket(frames, self.frame_buckets)
            if f is None:
                self.skipped.append(name)
                continue
            self.files.append(path)
            self.captions.append(captions[name])
            self.shapes.append((f, *nearest_resolution(h, w, self.res_buckets)))
            self.readers.append(reader)                               # "decord" or "pyav"
        if not self.files:
            raise ValueError(f"data.path={str(folder)!r}: no usable videos ({sorted(VIDEO_EXTENSIONS)}); "
                             f"{len(self.skipped)} shorter than every frame bucket {self.frame_buckets}")
        self.keys = sorted(set(self.shapes))

    def __len__(self) -> int:
        return len(self.files)

    def bucket_ids(self) -> list[int]:
        return [self.keys.index(s) for s in self.shapes]

    def __getitem__(self, i: int) -> dict:
        f, h, w = self.shapes[i]
        a = read_frames(self.files[i], f, self.channels, self.readers[i]) / 127.5 - 1.0
        x = torch.from_numpy(a).permute(0, 3, 1, 2)                # (F, C, H, W)
        x = resize_cover_crop(x, h, w).permute(1, 0, 2, 3)          # (C, F, h, w)
        return {"pixels": x.contiguous(), "caption": self.captions[i]}

    def all_captions(self) -> list[str]:
        return sorted(set(self.captions))
