"""A video whose header reads and whose later frames are corrupt passes the start-up check and fails when
a batch first reads it: data.bad_videos=stop ends the run with one line naming the file, after a
checkpoint of the last finished step, and the run resumes from there; data.bad_videos=skip trains on
without the file."""

from mediagen.cli import main as cli_main
from mediagen.training.checkpoint import list_checkpoints
from mediagen.training.data.sampler import StepBatches
from training_helpers import TINY_WAN, steps_logged, video_folder

MAX_STEPS = 4


def first_step_reading(index: int, videos: int, batch: int) -> tuple[int, int]:
    """(seed, step): a seed whose batches first draw video ``index`` at step 2 or later, and that step."""
    for seed in range(50):
        plan = StepBatches([0] * videos, batch, seed)
        step = next(s for s in range(1, 100) if index in plan.global_indices(s))
        if 2 <= step <= MAX_STEPS:
            return seed, step
    raise AssertionError("no seed reads the video at steps 2..MAX_STEPS")


def test_a_corrupt_video_stops_the_run_with_its_name_and_resumes(tmp_path, capsys):
    data = video_folder(tmp_path / "data", good=3, bad=("bad.mp4",))          # bad.mp4 sorts first: index 0
    seed, step = first_step_reading(0, videos=4, batch=2)
    config = tmp_path / "empty.yaml"
    config.write_text("{}\n")
    out = tmp_path / "run"
    args = ["train", str(config), f"output_dir={out}", *TINY_WAN, "data.dataset=video-folder", f"data.path={data}",
            "data.num_frames=8", "data.channels=1", "train.batch_size=2", f"train.seed={seed}",
            f"train.max_steps={MAX_STEPS}", "checkpoint.every=100", "checkpoint.save_pipeline=false"]
    # loader workers: the error is raised in a worker process and must still reach the user as one line
    assert cli_main([*args, "data.num_workers=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = [e for e in err if e.startswith("mediagen train: error:")]
    assert len(line) == 1 and "Traceback" not in "\n".join(err)
    assert "bad.mp4: its frames cannot be decoded" in line[0]
    assert f"stopped at step {step} (data.bad_videos='stop'), checkpoint of step {step - 1} written" in line[0]
    assert "checkpoint.resume=latest" in line[0]
    assert [s for s, _ in list_checkpoints(out)] == [step - 1]              # nothing trained is lost
    assert steps_logged(out) == list(range(1, step))
    # the same command resumes from there, leaving the file out
    assert cli_main([*args, "checkpoint.resume=latest", "data.bad_videos=skip"]) == 0
    said = capsys.readouterr()
    assert f"(step {step - 1})" in said.out
    assert said.err.count("data.bad_videos=skip: leaving out video") == 1 and "bad.mp4" in said.err
    assert steps_logged(out) == list(range(1, MAX_STEPS + 1))
