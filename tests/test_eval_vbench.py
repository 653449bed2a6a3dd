"""VBench-style dimensions: flickering by hand, ordering of static / flickering / moving videos,
Moving-MNIST semantic scores, VBench's aggregation, and the CLI on a folder of videos."""

import json

import numpy as np
import pytest

from mediagen.data import load_mnist10k
from mediagen.eval import vbench_quality as vq
from mediagen.eval.moving_mnist import motion_direction, parse_prompt, semantic_scores
from mediagen.eval.vbench_score import QUALITY_DIMS, aggregate

SIZE, FRAMES = 64, 10


def _digit(label=3):
    images, labels = load_mnist10k("held_out")
    return images[np.flatnonzero(labels == label)[0]]


def _place(digit, x, y, size=SIZE):
    frame = np.zeros((size, size), np.uint8)
    frame[y:y + 28, x:x + 28] = digit
    return np.repeat(frame[..., None], 3, axis=-1)


def make_videos(label=3):
    d = _digit(label)
    static = np.stack([_place(d, 18, 18)] * FRAMES)
    moving = np.stack([_place(d, 2 + 3 * t, 18) for t in range(FRAMES)])  # 3 px per frame to the right
    rng = np.random.default_rng(0)
    # flickering: the digit blinks and random bright noise appears on alternate frames
    flicker = static.copy()
    for t in range(1, FRAMES, 2):
        flicker[t] = rng.integers(0, 256, flicker[t].shape, dtype=np.uint8)
    return {"static": static, "moving": moving, "flicker": flicker}


def test_temporal_flickering_by_hand():
    rng = np.random.default_rng(1)
    video = rng.integers(0, 256, (4, 3, 5, 3), dtype=np.uint8)
    diffs = []
    for t in range(3):
        total = 0.0
        for idx in np.ndindex(video.shape[1:]):
            total += abs(int(video[t + 1][idx]) - int(video[t][idx]))
        diffs.append(total / (3 * 5 * 3))
    want = (255 - sum(diffs) / 3) / 255
    assert vq.temporal_flickering(video) == pytest.approx(want, abs=1e-12)
    assert vq.temporal_flickering(np.zeros((5, 4, 4, 3), np.uint8)) == 1.0


def test_consistency_formula():
    f = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    c = 1 / np.sqrt(2)
    # frame 1: prev c, first c; frame 2: prev c, first 0; frame 3: prev 0 (cos 0), first max(0, -1) = 0
    want = ((c + c) / 2 + (c + 0) / 2 + (0 + 0) / 2)
    total, count = vq.consistency_from_features(f)
    assert count == 3 and total == pytest.approx(want)


@pytest.fixture(scope="module")
def videos():
    return make_videos()


@pytest.fixture(scope="module")
def effnet():
    from mediagen.eval.frame_features import get_frame_extractor

    return get_frame_extractor("effnet-lite0")


def test_static_flickering_moving_order(videos, effnet):
    s, m, f = videos["static"], videos["moving"], videos["flicker"]
    flick = {k: vq.temporal_flickering(v) for k, v in videos.items()}
    assert flick["static"] == 1.0 and flick["static"] > flick["moving"] > flick["flicker"]
    cons = {k: vq.consistency(v, effnet) for k, v in videos.items()}
    assert cons["static"] == pytest.approx(1.0, abs=1e-6)
    assert cons["static"] > cons["moving"] > cons["flicker"], cons
    smooth = {k: vq.motion_smoothness(v) for k, v in videos.items()}
    # constant-velocity motion interpolates almost exactly; a flickering frame cannot be interpolated
    assert smooth["static"] == 1.0 and smooth["static"] >= smooth["moving"] > smooth["flicker"] + 0.2, smooth
    assert smooth["moving"] > 0.98
    assert vq.dynamic_degree(m) and not vq.dynamic_degree(s)
    # a video that only changes brightness everywhere is not motion
    fade = np.stack([(s[0].astype(np.int32) * (t + 4) // (FRAMES + 3)).astype(np.uint8) for t in range(FRAMES)])
    assert not vq.dynamic_degree(fade)
    assert f.shape == s.shape


def test_moving_mnist_semantics(videos):
    moving = videos["moving"]
    assert motion_direction(moving) == "right"
    assert motion_direction(moving[::-1]) == "left"
    assert motion_direction(np.swapaxes(moving, 1, 2)) == "down"
    assert motion_direction(videos["static"]) is None
    right = semantic_scores(moving, parse_prompt("the digit 3 moving right"))
    assert right == {"digit_identity": 1.0, "motion_direction": 1.0, "digit_count": 1.0}
    wrong = semantic_scores(moving, parse_prompt("two digits 8 and 1 moving up"))
    assert wrong["digit_identity"] == 0.0 and wrong["motion_direction"] == 0.0 and wrong["digit_count"] == 0.0


def test_two_digits_count_and_identity():
    a, b = _digit(7), _digit(0)
    frames = []
    for t in range(8):
        frame = np.zeros((64, 96), np.uint8)
        frame[4 + 2 * t:32 + 2 * t, 4:32] = a
        frame[4 + 2 * t:32 + 2 * t, 60:88] = b
        frames.append(np.repeat(frame[..., None], 3, -1))
    video = np.stack(frames)
    assert semantic_scores(video, parse_prompt("two digits 7 and 0 moving down")) == {
        "digit_identity": 1.0, "motion_direction": 1.0, "digit_count": 1.0}


def _seven_left_zero_down():
    """8 frames of 64x96: a 7 moving left along the top while a 0 moves down on the left."""
    a, b = _digit(7), _digit(0)
    frames = []
    for t in range(8):
        frame = np.zeros((64, 96), np.uint8)
        frame[4:32, 60 - 3 * t:88 - 3 * t] = a
        frame[20 + 2 * t:48 + 2 * t, 4:32] = b
        frames.append(np.repeat(frame[..., None], 3, -1))
    return np.stack(frames)


def test_each_digit_its_own_direction():
    """Training captions give each digit its own direction: 7 moves left while 0 moves down."""
    video = _seven_left_zero_down()
    good = semantic_scores(video, parse_prompt("the digit 7 moves left while the digit 0 moves down"))
    assert good == {"digit_identity": 1.0, "motion_direction": 1.0, "digit_count": 1.0}
    swapped = semantic_scores(video, parse_prompt("the digit 7 moves down while the digit 0 moves left"))
    assert swapped["motion_direction"] == 0.0
    half = semantic_scores(video, parse_prompt("the digit 7 moves left while the digit 0 moves up"))
    assert half["motion_direction"] == 0.5


def test_vbench_rates_count_each_of_two_digits():
    """evaluate_videos on a two-digit clip: semantic_rates' per_digit counts each asked digit on its own (one
    of two ways right: direction 0.5 per digit, 0 per clip), and each clip keeps its per-digit verdicts."""
    from mediagen.eval.frame_features import get_frame_extractor
    from mediagen.eval.vbench import evaluate_videos

    video = _seven_left_zero_down()
    fx = get_frame_extractor("pixels")
    rep = evaluate_videos([video], ["the digit 7 moves left while the digit 0 moves up"], fx, fx, progress=False)
    rates = rep["semantic_rates"]
    assert rates["digit"] == 1.0 and rates["direction"] == 0.0 and rates["both"] == 0.0
    assert rates["per_digit"] == {"digit": 1.0, "direction": 0.5}
    assert [(d["digit"], d["moved"]) for d in rep["per_video"][0]["per_digit"]] == [(7, True), (0, False)]
    from mediagen.eval.vbench_score import report_tables
    assert "| these videos, each asked digit | 1 | 1.000 | 0.500 | — |" in report_tables(rep)


def test_prompt_parsing():
    p = parse_prompt("Two digits, 4 and seven, moving upwards")
    assert p.digits == [4, 7] and p.direction == "up" and p.count == 2
    p = parse_prompt("the digit 3 moves left while the digit 8 moves down")
    assert p.digits == [3, 8] and p.directions == ["left", "down"] and p.direction is None and p.count == 2
    assert parse_prompt("the digit 5").directions == [None]
    assert parse_prompt("a seven moving left").digits == [7]
    assert parse_prompt("a cat playing piano") is None


def test_aggregate_matches_vbench_weights():
    raw = {"subject_consistency": 0.95, "background_consistency": 0.96, "temporal_flickering": 0.97,
           "motion_smoothness": 0.98, "dynamic_degree": 0.5, "aesthetic_quality": 0.6, "imaging_quality": 0.65,
           "digit_identity": 0.9, "motion_direction": 0.8}
    rep = aggregate(raw)
    norm = {d: (raw[d] - QUALITY_DIMS[d][0]) / (QUALITY_DIMS[d][1] - QUALITY_DIMS[d][0]) for d in QUALITY_DIMS}
    quality = (sum(norm.values()) - 0.5 * norm["dynamic_degree"]) / 6.5
    assert rep["quality"] == pytest.approx(quality)
    assert rep["semantic"] == pytest.approx(0.85)
    assert rep["total"] == pytest.approx((4 * quality + 0.85) / 5)
    with pytest.raises(ValueError, match="unknown VBench dimensions"):
        aggregate({"smoothness": 1.0})


def test_vbench_cli_on_a_folder(tmp_path, videos):
    from mediagen.cli import main
    from mediagen.eval.video_io import read_video, write_video

    folder = tmp_path / "videos"
    folder.mkdir()
    write_video(videos["moving"], folder / "the digit 3 moving right-0.gif")
    write_video(videos["static"], folder / "the digit 3 moving left-0.npy")
    assert np.array_equal(read_video(folder / "the digit 3 moving left-0.npy"), videos["static"])
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the digit 3 moving right\nthe digit 3 moving left\n")
    out = tmp_path / "vbench.json"
    rc = main(["vbench", "--videos", str(folder), "--prompts", str(prompts), "--subject-features", "pixels",
               "--background-features", "mnist", "--out", str(out), "--quiet"])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["raw"]["motion_direction"] == 0.5 and rep["raw"]["dynamic_degree"] == 0.5
    assert rep["raw"]["digit_identity"] == 1.0
    assert 0 < rep["quality"] <= 1 and rep["total"] is not None
    assert {v["prompt"] for v in rep["per_video"]} == {"the digit 3 moving right", "the digit 3 moving left"}


def test_vbench_scores_stills_by_digit_only(tmp_path):
    """One-frame clips (prompt-mode images) get the digit verdict and no frame-comparing dimension: real
    digits read right, blank frames read nothing."""
    from mediagen.cli import main
    from mediagen.eval.moving_mnist import real_clips

    clips, captions = real_clips(1)
    stills = clips[::4, 8:9]                                    # one clip per digit, its middle frame
    prompts = [c.split(" moves")[0] for c in captions[::4]]     # "the digit 3"
    for name, videos, want in (("real", stills, 1.0), ("blank", np.zeros_like(stills), 0.0)):
        path, out = tmp_path / f"{name}.npz", tmp_path / f"{name}.json"
        np.savez(path, videos=videos, prompts=np.array(prompts))
        assert main(["vbench", "--videos", str(path), "--out", str(out), "--quiet"]) == 0
        rep = json.loads(out.read_text())
        assert rep["semantic_rates"]["clips"] == 10 and rep["semantic_rates"]["direction"] is None
        assert rep["semantic_rates"]["digit"] >= want if want else rep["semantic_rates"]["digit"] == 0.0
        assert rep["quality"] is None and "subject_consistency" not in rep["raw"]


def test_two_frame_videos_score_without_motion_smoothness():
    """Motion smoothness re-creates frame 1 from frames 0 and 2, so a two-frame clip has none to score: it gets the
    other quality dimensions (which compare two frames) instead of stopping the run."""
    from mediagen.eval.frame_features import get_frame_extractor
    from mediagen.eval.vbench import evaluate_videos

    fx = get_frame_extractor("pixels")
    two = make_videos()["moving"][:2]
    rep = evaluate_videos([two], [None], fx, fx, progress=False)
    assert "motion_smoothness" not in rep["raw"]
    assert rep["raw"]["temporal_flickering"] == pytest.approx(vq.temporal_flickering(two))
    assert rep["raw"]["subject_consistency"] == pytest.approx(vq.consistency(two, fx))
