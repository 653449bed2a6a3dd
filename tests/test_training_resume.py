"""A run killed at any moment resumes with the losses it would have had; a kill during a checkpoint
save never leaves a torn checkpoint; metrics.jsonl keeps one line per step across resumes; `mediagen
train` exits 3 when stopped early (resumable) and 0, saying so, when there is nothing left to train.
Each case runs `mediagen train` in a subprocess that can SIGKILL or SIGTERM itself."""

import json

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from mediagen.training.checkpoint import common_step, list_checkpoints, read_optimizer, read_state
from mediagen.training.trainer import trim_metrics
from training_helpers import DONE, STOPPED, TINY_DIT, read_losses, run_training_process, steps_logged

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
    rc, said = run_training_process([f"output_dir={killed}", *ARGS, "checkpoint.resume=latest"], output=True)
    assert rc == DONE and "(step 4)" in said                       # really resumed from step 4
    assert steps_logged(killed) == list(range(1, 13))              # steps 5..7 logged once, by the resumed run
    a, b = read_losses(full), read_losses(killed)
    assert a == b                                                  # bitwise, steps 1..12
    assert len(set(a.values())) == 12
    assert_same_ema_and_pipeline(killed, full)


def pipeline_tensors(output_dir) -> dict[str, torch.Tensor]:
    """Every tensor of the exported pipeline folder, keyed by file and name."""
    out = {}
    for path in sorted((output_dir / "pipeline").rglob("*.safetensors")):
        for k, v in load_file(str(path)).items():
            out[f"{path.relative_to(output_dir)}:{k}"] = v
    return out


def assert_same_ema_and_pipeline(resumed, full):
    """The EMA weights are what a run exports and ships, and losses never read them: the EMA of a resumed
    run (the shadow weights restored, its update count, on which the decay's warm-up depends, saved and
    restored) and the pipeline written from it equal an uninterrupted run's, bitwise."""
    last, ref = list_checkpoints(resumed)[-1][1], list_checkpoints(full)[-1][1]
    assert read_state(last)["ema_updates"] == read_state(ref)["ema_updates"] == 12
    ema, ema_ref = load_file(str(last / "ema.safetensors")), load_file(str(ref / "ema.safetensors"))
    assert ema.keys() == ema_ref.keys() and all(torch.equal(ema[k], ema_ref[k]) for k in ema_ref)
    model = load_file(str(ref / "model.safetensors"))
    assert any(not torch.equal(ema_ref[k], model[k]) for k in ema_ref)   # the EMA is not just the weights
    got, want = pipeline_tensors(resumed), pipeline_tensors(full)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    transformer = {k.split(":", 1)[1]: v for k, v in want.items() if k.startswith("pipeline/transformer/")}
    assert all(torch.equal(transformer[k], ema_ref[k]) for k in ema_ref)   # the pipeline holds the EMA weights


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
    rc, said = run_training_process([f"output_dir={out}", *ARGS, "train.time_limit_minutes=1e-6"], output=True)
    assert rc == STOPPED and "stopped at step 1 of 12" in said and "checkpoint.resume=latest" in said
    assert steps_logged(out) == [1]
    assert [s for s, _ in list_checkpoints(out)] == [1]
    assert not (out / "pipeline").exists()
    assert run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest"]) == DONE
    assert steps_logged(out) == list(range(1, 13))
    assert read_losses(out) == read_losses(full)
    assert (out / "pipeline" / "model_index.json").is_file()
    # the finished run started again, or asked for fewer steps than it has: nothing to train, said so;
    # metrics, checkpoints and config.yaml stay as they are
    before = {p: p.read_bytes() for p in (out / "metrics.jsonl", out / "config.yaml")}
    for max_steps in (12, 8):
        rc, said = run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest",
                                         f"train.max_steps={max_steps}"], output=True)
        assert rc == DONE
        assert f"already at step 12 (train.max_steps={max_steps}): nothing to train" in said
    assert {p: p.read_bytes() for p in before} == before
    assert [s for s, _ in list_checkpoints(out)][-1] == 12


def test_sigterm_checkpoints_stops_and_resumes_identically(tmp_path, full):
    out = tmp_path / "terminated"
    # SIGTERM after step 5 (no checkpoint due): the flag is seen at the end of step 6, which is saved
    rc, said = run_training_process([f"output_dir={out}", *ARGS], TERM_AT=5, output=True)
    assert rc == STOPPED and "SIGTERM received at step 6 of 12" in said
    assert steps_logged(out) == list(range(1, 7))
    assert [s for s, _ in list_checkpoints(out)] == [4, 6]
    assert not (out / "pipeline").exists()
    assert run_training_process([f"output_dir={out}", *ARGS, "checkpoint.resume=latest"]) == DONE
    assert steps_logged(out) == list(range(1, 13))
    assert read_losses(out) == read_losses(full)
    assert_same_ema_and_pipeline(out, full)


def test_trim_metrics_keeps_the_steps_up_to_the_checkpoint(tmp_path):
    """Lines past the step a run restarts from go, and so does a line cut short by a kill; the file is
    replaced by a rename (no temporary left behind)."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 8)]
    path.write_text("\n".join(lines) + '\n{"step": 8, "lo')
    trim_metrics(path, 4)
    assert path.read_text() == "\n".join(lines[:4]) + "\n"
    trim_metrics(path, 0)                                          # a run started from scratch
    assert path.read_text() == ""
    trim_metrics(tmp_path / "absent.jsonl", 3)                     # a first run: nothing to trim
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


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

