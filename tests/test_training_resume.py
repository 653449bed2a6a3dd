"""A run killed at any moment resumes with the losses it would have had; a kill during a checkpoint
save never leaves a torn checkpoint. Each case runs training in a subprocess that SIGKILLs itself."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from mediagen.training.checkpoint import common_step, list_checkpoints, read_optimizer, read_state
from training_helpers import TINY_DIT, read_losses, run_training_process, steps_logged

ARGS = [*TINY_DIT, "train.max_steps=12", "checkpoint.every=4", "checkpoint.keep_last=5", "optim.ema_decay=0.9",
        "optim.warmup_steps=3", "optim.schedule=cosine"]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One uninterrupted run, the reference for both tests."""
    out = tmp_path_factory.mktemp("full")
    assert run_training_process([f"output_dir={out}", *ARGS]) == 0
    return out


def test_killed_run_resumes_with_identical_losses(tmp_path, full):
    killed = tmp_path / "killed"
    assert run_training_process([f"output_dir={killed}", *ARGS], KILL_AT=7) == -9
    assert steps_logged(killed) == list(range(1, 8))
    assert run_training_process([f"output_dir={killed}", *ARGS, "checkpoint.resume=latest"]) == 0
    assert steps_logged(killed)[7:] == list(range(5, 13))          # really resumed from step 4
    a, b = read_losses(full), read_losses(killed)
    assert a == b                                                  # bitwise, steps 1..12
    assert len(set(a.values())) == 12


def test_kill_during_save_leaves_no_torn_checkpoint(tmp_path, full):
    out = tmp_path / "run"
    # killed after the weights file of checkpoint 8, before its optimizer state
    assert run_training_process([f"output_dir={out}", *ARGS], KILL_IN="write_main", KILL_SAVE_STEP=8) == -9
    assert [s for s, _ in list_checkpoints(out)] == [4]
    # killed with checkpoint 4 complete on disk but not yet renamed into place
    out2 = tmp_path / "run2"
    assert run_training_process([f"output_dir={out2}", *ARGS], KILL_IN="publish", KILL_SAVE_STEP=4) == -9
    assert list_checkpoints(out2) == []
    assert list((out2 / "checkpoints").glob(".tmp-*"))              # the unfinished one stays hidden
    for step, folder in list_checkpoints(out):                     # what is there is whole
        assert read_state(folder)["step"] == step
        assert load_file(str(folder / "model.safetensors")) and read_optimizer(folder)["state"]
    # resuming the torn run continues from 4 and matches an uninterrupted run from there on
    assert run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest"]) == 0
    assert [s for s, _ in list_checkpoints(out)] == [4, 8, 12]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert read_losses(out) == read_losses(full)
    last = list_checkpoints(out)[-1][1]
    ref = load_file(str(list_checkpoints(full)[-1][1] / "model.safetensors"))
    assert all(torch.equal(v, ref[k]) for k, v in load_file(str(last / "model.safetensors")).items())


def test_time_limit_checkpoints_stops_and_resumes_identically(tmp_path, full):
    out = tmp_path / "timed"
    # a limit already past after the first step: checkpoint at step 1, stop, no final pipeline
    assert run_training_process([f"output_dir={out}", *ARGS, "train.time_limit_minutes=1e-6"]) == 0
    assert steps_logged(out) == [1]
    assert [s for s, _ in list_checkpoints(out)] == [1]
    assert not (out / "pipeline").exists()
    assert run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest"]) == 0
    assert steps_logged(out) == list(range(1, 13))
    assert read_losses(out) == read_losses(full)
    assert (out / "pipeline" / "model_index.json").is_file()


def test_sigterm_checkpoints_stops_and_resumes_identically(tmp_path, full):
    out = tmp_path / "terminated"
    # SIGTERM after step 5 (no checkpoint due): the flag is seen at the end of step 6, which is saved
    assert run_training_process([f"output_dir={out}", *ARGS], TERM_AT=5) == 0
    assert steps_logged(out) == list(range(1, 7))
    assert [s for s, _ in list_checkpoints(out)] == [4, 6]
    assert not (out / "pipeline").exists()
    assert run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest"]) == 0
    assert steps_logged(out) == list(range(1, 13))
    assert read_losses(out) == read_losses(full)


def test_common_step_is_the_last_step_every_run_saved(tmp_path):
    """Runs stopped by a time limit at different steps are compared at the last checkpoint all of them hold;
    an unfinished save (.tmp-*) does not count. The shell scripts call it as a module."""
    saved = {"a": [100, 200, 300, 350], "b": [100, 200, 300], "c": [100, 200, 400]}
    for run, steps in saved.items():
        for s in steps:
            (tmp_path / run / "checkpoints" / f"checkpoint-{s:07d}").mkdir(parents=True)
    (tmp_path / "c" / "checkpoints" / ".tmp-checkpoint-0000300").mkdir()
    runs = [tmp_path / r for r in saved]
    assert common_step(runs) == 200
    assert common_step(runs[:2]) == 300
    assert common_step([*runs, tmp_path / "never-started"]) == 0
    assert common_step([]) == 0
    out = subprocess.run([sys.executable, "-m", "mediagen.training.checkpoint", *map(str, runs)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "200"

