"""Reading and writing videos as uint8 (T, H, W, 3) arrays: mp4/webm/avi/mov/mkv read through decord
(the reader VBench and most video-diffusion training code use), with PyAV as the fallback for a file
decord cannot open (e.g. AV1, which decord's bundled FFmpeg lacks) or decode (frames narrower than 32
pixels), or when decord is not installed; GIF through Pillow; .npy/.npz arrays (T, H, W) or (T, H, W, C).
Written videos go through PyAV. A file neither can read, whether it fails when opened or only at frames
past its header (a cut or overwritten file), raises one ``VideoReadError`` line that names it.

Both readers decode to RGB24 with FFmpeg's conversion, so they give the same pixels for the same
stream. Which one read a file is logged at DEBUG level (logger ``mediagen.eval.video_io``) and returned
by ``read_video_with_reader`` / ``open_video``; ``MEDIAGEN_VIDEO_READER=pyav`` (or ``decord``)
forces one."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np

VIDEO_EXTENSIONS = {".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif", ".npy", ".npz"}
CONTAINER_EXTENSIONS = {".mp4", ".webm", ".avi", ".mov", ".mkv"}
READERS = ("auto", "decord", "pyav")
READER_ENV = "MEDIAGEN_VIDEO_READER"
# ITU-R BT.601 luma weights: grey frames are made from the RGB frames the same way for both readers
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)

log = logging.getLogger(__name__)


class VideoReadError(ValueError):
    """Neither decord nor PyAV could read a video."""


def _choose(reader: str | None) -> str:
    reader = reader or os.environ.get(READER_ENV) or "auto"
    if reader not in READERS:
        raise ValueError(f"video reader {reader!r} is not allowed (argument or ${READER_ENV}): use one of {READERS}")
    return reader


def _decord():
    """The decord module, or None when it is not importable."""
    try:
        import decord
    except ImportError:
        return None
    return decord


def _decord_error(decord):
    """decord's own exception class (its C++ checks raise RuntimeError or DECORDError)."""
    base = getattr(getattr(decord, "_ffi", None), "base", None)
    return getattr(base, "DECORDError", RuntimeError)


class OpenVideo:
    """A container opened by decord or PyAV: ``reader`` ("decord" / "pyav"), ``frames`` (count; for
    PyAV the container's count, or a count by decoding when it gives none), ``height``, ``width``, and
    ``read(count)`` -> uint8 (count, H, W, 3), the first ``count`` frames (all when None). ``fallback``:
    the reader was chosen automatically, so frames decord cannot decode are read with PyAV."""

    def __init__(self, path, reader: str, frames: int, height: int, width: int, vr=None, fallback: bool = False):
        self.path, self.reader, self.frames, self.height, self.width = Path(path), reader, frames, height, width
        self._vr = vr
        self.fallback = fallback

    def read(self, count: int | None = None) -> np.ndarray:
        if count is not None and count > self.frames:
            raise VideoReadError(f"video {self.path} has {self.frames} frames; {count} were asked for")
        # Opening reads the header and the first frame only: a file whose later frames are corrupt opens
        # and fails here. The decoders' own errors (decord's multi-line C++ trace, PyAV's "[Errno ...]
        # Invalid data found" without the file's name) become one VideoReadError naming the file.
        try:
            out = self._decode(self.reader, count)
        except _decode_errors() as err:
            if not (self.fallback and self.reader == "decord"):
                raise VideoReadError(f"video {self.path}: its frames cannot be decoded with {self.reader} (the "
                                     f"header reads, later data is corrupt or cut short): {_one_line(err)}") from None
            # decord fails on some files PyAV decodes (e.g. frames narrower than 32 pixels: "Check failed:
            # from_size == to_size"); the two give the same pixels, so an automatic choice moves over
            log.debug("decord cannot decode %s (%s): reading it with PyAV", self.path, _one_line(err))
            try:
                out = self._decode("pyav", count)
            except _decode_errors() as err2:
                raise VideoReadError(f"video {self.path}: its frames cannot be decoded with pyav (the header reads, "
                                     f"later data is corrupt or cut short): {_one_line(err2)} (decord: "
                                     f"{_one_line(err)})") from None
            self.reader = "pyav"
        if count is not None and len(out) < count:
            raise VideoReadError(f"video {self.path} decoded {len(out)} frames with {self.reader}; "
                                 f"{count} were expected")
        log.debug("read %d frames of %s with %s", len(out), self.path, self.reader)
        return np.ascontiguousarray(out)

    def _decode(self, reader: str, count: int | None) -> np.ndarray:
        if reader == "decord":
            return self._vr.get_batch(list(range(self.frames if count is None else count))).asnumpy()
        return _pyav_frames(self.path, count)  # all that decode when count is None


# decord prefixes each C++ check it reports with "[hh:mm:ss] /path/to/source.cc:123: "
_DECORD_SOURCE = re.compile(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def _one_line(err: BaseException, limit: int = 300) -> str:
    """An error's text on one line, without decord's source locations (its messages carry a C++ trace
    over many lines)."""
    text = " ".join(_DECORD_SOURCE.sub("", str(err).split("Stack trace")[0]).split())
    return text[:limit] or type(err).__name__


def _decode_errors() -> tuple[type[BaseException], ...]:
    """What the decoders raise on data they cannot decode (decord's DECORDError, PyAV's FFmpegError, and
    the RuntimeError / OSError / ValueError / IndexError either may give)."""
    errors: list[type[BaseException]] = [RuntimeError, OSError, ValueError, IndexError, EOFError]
    decord = _decord()
    if decord is not None:
        errors.append(_decord_error(decord))
    try:
        import av

        errors.append(av.error.FFmpegError)
    except ImportError:
        pass
    return tuple(errors)


def _pyav_frames(path, count: int | None) -> np.ndarray:
    import av

    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            out.append(frame.to_ndarray(format="rgb24"))
            if count is not None and len(out) == count:
                break
    if not out:
        raise VideoReadError(f"video {path} has no decodable frame")
    return np.stack(out)


def _open_pyav(path: Path) -> OpenVideo:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames, first = stream.frames, None
        if not frames:  # the container does not say: count by decoding
            frames = 0
            for frame in container.decode(stream):
                first = first or frame
                frames += 1
        else:
            first = next(container.decode(stream))
        if first is None:
            raise VideoReadError("no decodable frame")
        return OpenVideo(path, "pyav", int(frames), first.height, first.width)


def open_video(path, reader: str | None = None) -> OpenVideo:
    """Open ``path`` with decord, else PyAV (``reader``: "auto" (default), "decord" or "pyav"; the
    default may be set by $MEDIAGEN_VIDEO_READER). A ``VideoReadError`` naming the file and both
    causes when nothing can read it."""
    path = Path(path)
    reader = _choose(reader)
    decord_error = None
    if reader in ("auto", "decord"):
        decord = _decord()
        if decord is None:
            decord_error = "decord is not installed (pip install decord==0.6.0)"
        else:
            try:
                vr = decord.VideoReader(str(path), ctx=decord.cpu(0))
                frames = len(vr)
                if frames < 1:
                    raise RuntimeError("no frames")
                height, width = vr[0].shape[:2]
                log.debug("opened %s with decord (%d frames)", path, frames)
                return OpenVideo(path, "decord", frames, height, width, vr, fallback=reader == "auto")
            except (RuntimeError, OSError, ValueError, IndexError, _decord_error(decord)) as err:
                decord_error = _one_line(err)
        if reader == "decord":
            raise VideoReadError(f"video {path} cannot be read with decord: {decord_error}")
        log.debug("decord cannot open %s (%s): reading it with PyAV", path, decord_error)
    import av

    try:
        opened = _open_pyav(path)
    except (av.error.FFmpegError, IndexError, StopIteration, ValueError, OSError) as err:
        also = f" (decord: {decord_error})" if decord_error else ""
        raise VideoReadError(f"video {path} cannot be read with PyAV: {' '.join(str(err).split())}{also}") from None
    log.debug("opened %s with PyAV (%d frames)", path, opened.frames)
    return opened


def to_gray(frames: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) uint8 RGB -> (T, H, W, 1) float32 luma in [0, 255]."""
    return (frames.astype(np.float32) @ LUMA)[..., None]


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


def read_video(path, reader: str | None = None) -> np.ndarray:
    """All frames of a video as uint8 (T, H, W, 3)."""
    return read_video_with_reader(path, reader)[0]


def read_video_with_reader(path, reader: str | None = None) -> tuple[np.ndarray, str]:
    """(frames uint8 (T, H, W, 3), what read them: "decord", "pyav", "pillow" or "numpy")."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".npy", ".npz", ".gif"):
        reader = "numpy" if suffix != ".gif" else "pillow"
        try:
            frames = _read_array_or_gif(path, suffix)
        except _decode_errors() as err:  # a cut or overwritten file: say which one
            raise VideoReadError(f"video {path} cannot be read with {reader}: {_one_line(err)}") from None
        return as_rgb_video(frames), reader
    video = open_video(path, reader)
    return as_rgb_video(video.read()), video.reader


def _read_array_or_gif(path: Path, suffix: str) -> np.ndarray:
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            key = "video" if "video" in data else ("frames" if "frames" in data else list(data.keys())[0])
            return data[key]
    import imageio.v3 as iio

    frames = iio.imread(path, index=None, plugin="pillow")
    return frames[None] if frames.ndim == 3 else frames  # a one-frame GIF


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
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise ValueError(f"--videos {folder} {what}: give a folder of videos or an .npz file of clips")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in VIDEO_EXTENSIONS)
    if not files:
        raise ValueError(f"no videos in {folder} (looked for {sorted(VIDEO_EXTENSIONS)})")
    return files
