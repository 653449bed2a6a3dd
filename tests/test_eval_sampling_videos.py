"""Sampling videos from a checkpoint in batches, through a swapped-in text encoder."""

import numpy as np
import pytest
import torch

from mediagen.eval.sampling import sample_videos
from mediagen.models.presets import build_transformer
from mediagen.pipelines.building import pipeline_around
from mediagen.pipelines.schedulers import make_scheduler


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("wan384") / "pipe"
    pipeline_around(build_transformer("wan-tiny", text_dim=384), make_scheduler("flow-euler", 3.0)).save_pretrained(
        str(path), safe_serialization=True)
    return path


def test_batched_sampling_through_minilm(folder):
    kw = dict(height=8, width=8, num_frames=3, num_inference_steps=2)
    prompts = ["the digit 1 moves up", "the digit 2 moves left", "the digit 3 moves down"]
    videos = sample_videos(folder, prompts, progress=False, batch_size=2, text_encoder="minilm", **kw)
    assert len(videos) == 3 and all(v.shape == (3, 8, 8, 3) and v.dtype == np.uint8 for v in videos)
    again = sample_videos(folder, prompts, progress=False, batch_size=2, text_encoder="minilm", **kw)
    assert all(np.array_equal(a, b) for a, b in zip(videos, again))      # seeded
    # the conditioning reaches the model: another encoder (the pipeline's own byte encoder) differs
    own = sample_videos(folder, prompts, progress=False, batch_size=2, **kw)
    assert any(not np.array_equal(a, b) for a, b in zip(videos, own))


def test_encoder_of_the_wrong_width_is_refused(tmp_path):
    torch.manual_seed(0)
    pipeline_around(build_transformer("wan-tiny"), make_scheduler("flow-euler", 3.0)).save_pretrained(
        str(tmp_path / "p"), safe_serialization=True)
    with pytest.raises(ValueError, match="384-d states; the transformer takes 32"):
        sample_videos(tmp_path / "p", ["x"], progress=False, text_encoder="minilm", height=8, width=8,
                      num_frames=3, num_inference_steps=1)


def test_vbench_cli_samples_in_batches_through_another_encoder_and_saves_npy(folder, tmp_path, capsys):
    from mediagen.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the digit 1 moves up\nthe digit 2 moves left\nthe digit 3 moves down\n")
    args = ["vbench", "--checkpoint", str(folder), "--prompts", str(prompts), "--steps", "2", "--height", "8",
            "--width", "8", "--num-frames", "3", "--subject-features", "pixels", "--background-features", "pixels",
            "--device", "cpu", "--quiet", "--text-encoder", "minilm"]
    assert main([*args, "--batch-size", "2", "--save-format", "npy", "--save-videos", str(tmp_path / "v"),
                 "--out", str(tmp_path / "r.json")]) == 0
    saved = sorted((tmp_path / "v").glob("*.npy"))
    assert [p.name for p in saved] == ["the digit 1 moves up-0.npy", "the digit 2 moves left-1.npy",
                                       "the digit 3 moves down-2.npy"]
    assert np.load(saved[0]).shape == (3, 8, 8, 3)
    assert main([*args, "--batch-size", "0", "--out", str(tmp_path / "bad.json")]) == 2
    assert "--batch-size=0 must be >= 1" in capsys.readouterr().err


def test_vbench_cli_samples_in_the_asked_dtype_and_records_it(folder, tmp_path):
    """--dtype reaches the pipeline (bf16 clips differ from fp32 ones) and the report names it; without it a CPU
    samples in fp32, as mediagen generate does."""
    import json

    from mediagen.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the digit 1 moves up\nthe digit 2 moves left\n")
    args = ["vbench", "--checkpoint", str(folder), "--prompts", str(prompts), "--steps", "2", "--height", "8",
            "--width", "8", "--num-frames", "3", "--subject-features", "pixels", "--background-features", "pixels",
            "--device", "cpu", "--quiet", "--batch-size", "2", "--save-format", "npy"]
    clips = {}
    for name, extra in (("default", []), ("bf16", ["--dtype", "bf16"])):
        assert main([*args, *extra, "--save-videos", str(tmp_path / name), "--out", str(tmp_path / f"{name}.json")]) == 0
        clips[name] = [np.load(p) for p in sorted((tmp_path / name).glob("*.npy"))]
    assert json.loads((tmp_path / "default.json").read_text())["sampling_dtype"] == "float32"
    assert json.loads((tmp_path / "bf16.json").read_text())["sampling_dtype"] == "bfloat16"
    assert any(not np.array_equal(a, b) for a, b in zip(clips["default"], clips["bf16"]))


def test_each_prompt_gets_its_own_video_in_a_short_last_batch(monkeypatch):
    """5 prompts in batches of 3: the last batch holds prompts 3 and 4, and video i is drawn from prompt i
    (not the last batch's prompts rotated by the batch start)."""
    from mediagen.eval import sampling

    class Fake:
        def __call__(self, prompt, generator=None, output_type="np", num_frames=2):
            # each clip shows its prompt's number as its pixel value
            return {"frames": np.stack([np.full((num_frames, 4, 4, 3), int(p.split()[-1]), np.uint8)
                                        for p in prompt])}["frames"]

    monkeypatch.setattr(sampling, "load_pipeline", lambda checkpoint, device="cpu", dtype=None: Fake())
    prompts = [f"prompt {i}" for i in range(5)]
    videos = sample_videos("fake", prompts, progress=False, batch_size=3)
    assert [int(v[0, 0, 0, 0]) for v in videos] == [0, 1, 2, 3, 4]
