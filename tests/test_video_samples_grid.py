"""The frame picture of sampled clips: packing ``mediagen vbench --save-videos`` clips, and picking each row's clip
(one digit, or a two-digit caption in its first digit's row)."""

import numpy as np
import pytest
from PIL import Image

from benchmarks import video_samples_grid as grid

DIRS = ("left", "right", "up", "down")


def _write_clips(folder, prompts, frames=5, side=8):
    rng = np.random.default_rng(0)
    clips = []
    for i, p in enumerate(prompts):
        v = rng.integers(0, 256, (frames, side, side), dtype=np.uint8)
        np.save(folder / f"{p}-{i}.npy", v)
        clips.append(v)
    return clips


def test_pack_keeps_first_middle_last_frames_in_clip_order(tmp_path):
    prompts = [f"the digit {d} moves {m}" for d in (3, 5) for m in DIRS] * 2
    clips = _write_clips(tmp_path, prompts)
    out = tmp_path / "frames.npz"
    assert grid.pack(tmp_path, out, clips_per_seed=8) == 16
    data = np.load(out)
    assert data["videos"].shape == (16, 3, 8, 8)
    for i in (0, 7, 12):
        np.testing.assert_array_equal(data["videos"][i], clips[i][[0, 2, 4]])
    assert list(data["prompts"]) == prompts
    assert list(data["seeds"]) == [0] * 8 + [1] * 8


def test_pick_finds_one_and_two_digit_captions_by_seed():
    prompts = ["the digit 3 moves left", "the digit 3 moves left while the digit 4 moves up",
               "the digit 13 moves left", "the digit 3 moves left"]
    seeds = [0, 1, 1, 2]
    assert grid.pick(prompts, seeds, 3, "left", 0) == 0
    assert grid.pick(prompts, seeds, 3, "left", 1) == 1
    assert grid.pick(prompts, seeds, 3, "left", 2) == 3
    with pytest.raises(ValueError, match="digit 1 moves left"):
        grid.pick(prompts, seeds, 1, "left", 1)


def test_picture_has_a_row_per_digit_and_direction(tmp_path):
    prompts = [f"the digit {d} moves {m} while the digit {(d + 1) % 10} moves up" for d in (3, 5) for m in DIRS]
    _write_clips(tmp_path, prompts, side=16)
    npz, png = tmp_path / "a.npz", tmp_path / "a.png"
    grid.pack(tmp_path, npz)
    assert grid.main([str(npz), "--digits", "3", "5", "--out", str(png)]) == 0
    im = Image.open(png)
    assert im.size[1] == 18 + 8 * (16 + 4)   # header + 8 rows of a padded 16-px frame


def test_pack_refuses_a_folder_without_clips(tmp_path):
    with pytest.raises(ValueError, match="no <prompt>-<index>.npy"):
        grid.pack(tmp_path, tmp_path / "x.npz")


def test_bad_arguments_get_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        grid.main(["--pack", str(tmp_path), "--clips-per-seed", "0", "--out", str(tmp_path / "x.npz")])
    assert "--clips-per-seed 0 is not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        grid.main(["--pack", str(tmp_path), "--out", str(tmp_path / "x.npz")])
    assert "no <prompt>-<index>.npy clips" in capsys.readouterr().err
