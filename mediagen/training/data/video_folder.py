"""A folder of videos with captions (metadata.jsonl / metadata.csv), read with decord (PyAV where decord
cannot open a file or is not installed; ``mediagen.eval.video_io.open_video``), with frame and resolution
buckets. Every video is opened once at start-up, so a file that cannot be opened fails at load with its
name, not hours into a run; the reader that opened each file is kept in ``readers`` and read again with it.

Opening reads a file's header and first frame only, so a file whose later frames are corrupt is found when
its frames are first read. ``bad_videos`` (``data.bad_videos``) says what then happens: "stop" (default)
raises a ``VideoReadError`` naming the file (the trainer checkpoints and stops with that one line), "skip"
leaves the file out: at start-up it is not listed, and mid-run its place in a batch goes to the next
readable video of its bucket (same frames and size, chosen by index, so a resumed run draws the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ...eval.video_io import VideoReadError, open_video, to_gray
from .buckets import largest_frame_bucket, nearest_resolution, resize_cover_crop
from .captions import read_captions

VIDEO_EXTENSIONS = {".mp4", ".webm", ".avi", ".mov", ".mkv"}
BAD_VIDEOS = ("stop", "skip")


def probe_video(path: Path, reader: str | None = None) -> tuple[int, int, int, str]:
    """(frames, height, width, reader) of a video; a ValueError naming the file if neither decord nor
    PyAV can open it."""
    video = open_video(path, reader)
    return video.frames, video.height, video.width, video.reader


def read_frames(path: Path, count: int, channels: int, reader: str | None = None) -> np.ndarray:
    """The first ``count`` frames as float32 (count, H, W, C) in [0, 255]; one channel is BT.601 luma
    of the RGB frames, the same for either reader. ``reader`` None: decord, PyAV where decord fails."""
    frames = open_video(path, reader).read(count)
    return to_gray(frames) if channels == 1 else frames.astype(np.float32)


class VideoFolderDataset(Dataset):
    """Videos as (C, F, H, W) in [-1, 1]: F from the frame buckets (default ``[num_frames]``), (H, W)
    from the resolution buckets (default one square bucket). Videos shorter than every frame bucket
    are skipped (their count is in ``skipped``); with ``bad_videos="skip"``, so are files that cannot
    be opened or decoded (``unreadable``: file name -> reason, as this process found them)."""

    def __init__(self, folder: str | Path, *, num_frames: int = 16, resolution: int = 64, channels: int = 3,
                 frame_buckets=None, resolution_buckets=None, bad_videos: str = "stop"):
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"data.path={str(folder)!r} is not a folder")
        if bad_videos not in BAD_VIDEOS:
            raise ValueError(f"data.bad_videos={bad_videos!r} is not allowed: use one of {list(BAD_VIDEOS)}")
        captions = read_captions(folder)
        self.channels, self.bad_videos = channels, bad_videos
        self.frame_buckets = list(frame_buckets or []) or [num_frames]
        self.res_buckets = [tuple(b) for b in (resolution_buckets or [])] or [(resolution, resolution)]
        self.files, self.captions, self.shapes, self.skipped, self.readers = [], [], [], [], []
        self.unreadable: dict[str, str] = {}
        for name in sorted(captions):
            path = folder / name
            if path.suffix.lower() not in VIDEO_EXTENSIONS:
                continue
            if not path.is_file():
                raise ValueError(f"metadata names {name!r} but {path} does not exist")
            try:
                frames, h, w, reader = probe_video(path)
            except VideoReadError as err:
                self._unreadable(name, err)
                continue
            f = largest_frame_bucket(frames, self.frame_buckets)
            if f is None:
                self.skipped.append(name)
                continue
            self.files.append(path)
            self.captions.append(captions[name])
            self.shapes.append((f, *nearest_resolution(h, w, self.res_buckets)))
            self.readers.append(reader)                               # "decord" or "pyav"
        if not self.files:
            unreadable = f", {len(self.unreadable)} unreadable" if self.unreadable else ""
            raise ValueError(f"data.path={str(folder)!r}: no usable videos ({sorted(VIDEO_EXTENSIONS)}); "
                             f"{len(self.skipped)} shorter than every frame bucket {self.frame_buckets}{unreadable}")
        self.keys = sorted(set(self.shapes))
        self._bad: set[int] = set()

    def _unreadable(self, name: str, err: VideoReadError) -> None:
        """Stop on an unreadable file, or (bad_videos="skip") note it and say so once."""
        if self.bad_videos == "stop":
            raise VideoReadError(f"{err} (data.bad_videos='stop'; data.bad_videos=skip trains without such "
                                 f"files)") from None
        if name not in self.unreadable:
            self.unreadable[name] = str(err)
            print(f"data.bad_videos=skip: leaving out {err}", file=sys.stderr, flush=True)

    def __len__(self) -> int:
        return len(self.files)

    def bucket_ids(self) -> list[int]:
        return [self.keys.index(s) for s in self.shapes]

    def num_buckets(self) -> int:
        """One bucket per clip size (frames, height, width) present, in sorted order."""
        return len(self.keys)

    def _read(self, i: int) -> dict:
        f, h, w = self.shapes[i]
        # a file decord opened is read as the automatic choice would (PyAV where decord cannot decode it);
        # one only PyAV could open goes to PyAV directly
        reader = self.readers[i] if self.readers[i] != "decord" else None
        a = read_frames(self.files[i], f, self.channels, reader) / 127.5 - 1.0
        x = torch.from_numpy(a).permute(0, 3, 1, 2)                # (F, C, H, W)
        x = resize_cover_crop(x, h, w).permute(1, 0, 2, 3)          # (C, F, h, w)
        return {"pixels": x.contiguous(), "caption": self.captions[i]}

    def __getitem__(self, i: int) -> dict:
        """Item ``i``; with bad_videos="skip", an unreadable video's place goes to the next readable one of
        its bucket in index order (its ``index`` is then that video's), so the batch keeps its shape and
        the same steps draw the same videos in a resumed run."""
        if self.bad_videos == "stop":
            try:
                return self._read(i)
            except VideoReadError as err:
                self._unreadable(self.files[i].name, err)
        same = [j for j in range(len(self.files)) if self.shapes[j] == self.shapes[i]]
        start = same.index(i)
        for j in same[start:] + same[:start]:
            if j in self._bad:
                continue
            try:
                item = self._read(j)
            except VideoReadError as err:
                self._bad.add(j)
                self._unreadable(self.files[j].name, err)
                continue
            return item if j == i else dict(item, index=j)
        f, h, w = self.shapes[i]
        raise VideoReadError(f"data.path={str(self.files[i].parent)!r}: every video of {f} frames at {h}x{w} is "
                             f"unreadable ({len(same)} files, e.g. {self.files[i].name}): nothing to train on there")

    def all_captions(self) -> list[str]:
        return sorted(set(self.captions))
