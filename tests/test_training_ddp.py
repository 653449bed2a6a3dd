"""Data-parallel training of a shipped video config (configs/train/wan-mmnist-mhla.yaml, made tiny by
overrides) on 2 CPU processes, launched as on GPUs: `accelerate launch --multi_gpu --num_processes 2`
(torchrun underneath; accelerate joins the processes with gloo on a CPU). Two processes at global batch
G train like one process at batch G, and a run whose rank 1 is SIGKILLed mid-run resumes from its last
checkpoint with the losses, weights and EMA of a run never interrupted.

On a CPU `accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's multi-CPU launch
goes through mpirun), so these tests launch with --multi_gpu, which starts both."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mediagen.training.checkpoint import list_checkpoints, read_state
from training_helpers import ROOT, read_losses, steps_logged

CONFIG = ROOT / "configs" / "train" / "wan-mmnist-mhla.yaml"
STEPS = 6
# the shipped config as it is (MHLA blocks [4, 2, 2], RoPE on the features, out_norm, EMA 0.999, constant LR
# after a warm-up), shrunk: 2 layers of 2 heads x 16, 4 frames of 32 x 32 -> 4 x 4 x 4 tokens, a seeded byte
# text encoder in place of MiniLM, global batch 4
TINY = ["model.overrides.num_layers=2", "model.overrides.num_attention_heads=2",
        "model.overrides.attention_head_dim=16", "model.overrides.ffn_dim=64", "model.overrides.text_dim=32",
        "model.text_encoder=byte", "model.text_max_length=16", "data.resolution=32", "data.num_frames=4",
        "train.batch_size=4", f"train.max_steps={STEPS}", "optim.warmup_steps=2", "checkpoint.every=2",
        "checkpoint.keep_last=0", "logging.progress=false",
        # fp32: one process and two agree to rounding; the config's bf16 (kept on a CPU with bf16 units) would not
        "train.mixed_precision=no"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(out: Path, processes: int) -> list[str]:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--num_processes", str(processes), "--main_process_port", str(_port())]
    if processes > 1:
        launch.append("--multi_gpu")
    return [*launch, "-m", "mediagen.cli", "train", str(CONFIG), f"output_dir={out}",
            f"data.cache_dir={out.parent / (out.name + '-cache')}", *TINY]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _train(out: Path, processes: int) -> None:
    proc = subprocess.run(_command(out, processes), env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _last_checkpoint(out: Path) -> tuple[dict, dict, dict]:
    step, folder = list_checkpoints(out)[-1]
    assert step == STEPS
    return (load_file(str(folder / "model.safetensors")), load_file(str(folder / "ema.safetensors")),
            read_state(folder))


def _flat(state: dict, names) -> torch.Tensor:
    return torch.cat([state[n].flatten().double() for n in names])


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The uninterrupted 2-process run, the reference of both tests."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    _train(out, 2)
    return out


def test_two_processes_train_a_shipped_video_config_like_one(two_processes, tmp_path):
    one = tmp_path / "one"
    _train(one, 1)                          # micro-batch 4 on one process
    a, b = read_losses(one), read_losses(two_processes)   # micro-batch 2 on each of two
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert len(set(a.values())) == STEPS
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5), (step, a, b)
    (w1, e1, s1), (w2, e2, s2) = _last_checkpoint(one), _last_checkpoint(two_processes)
    assert w1.keys() == w2.keys() and e1.keys() == e2.keys()
    assert s1["ema_updates"] == s2["ema_updates"] == STEPS
    for x, y in ((w1, w2), (e1, e2)):   # all weights together: a rounding difference moves a weight near 0 most
        fx, fy = _flat(x, sorted(x)), _flat(y, sorted(x))
        assert ((fy - fx).norm() / fx.norm()).item() < 1e-5
    assert any("mix" in n for n in w1)   # MHLA's Mc is trained and checkpointed


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the training process of ``rank`` among the launcher's children (its RANK variable)."""
    for pid in _children(launcher):
        try:
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


def test_a_rank_killed_mid_run_resumes_like_an_uninterrupted_run(two_processes, tmp_path):
    killed = tmp_path / "killed"
    launcher = subprocess.Popen(_command(killed, 2), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=ROOT)
    victim = None
    try:
        deadline = time.monotonic() + 500
        # step 3 logged: the checkpoint of step 2 is published (written before step 3 starts)
        while time.monotonic() < deadline and launcher.poll() is None:
            if (killed / "metrics.jsonl").is_file() and len(steps_logged(killed)) >= 3:
                victim = _rank_pid(launcher.pid, 1)
                break
            time.sleep(0.05)
        assert victim is not None, f"rank 1 not found while the run was at step 3 (exit {launcher.poll()})"
        os.kill(victim, signal.SIGKILL)
        said, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode != 0, said[-3000:]
    saved = [step for step, _ in list_checkpoints(killed)]
    assert saved and max(saved) < STEPS, (saved, said[-3000:])   # killed before the end, after a checkpoint
    # the same command again: the config's checkpoint.resume=latest picks the last complete checkpoint
    proc = subprocess.run(_command(killed, 2), env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"(step {max(saved)})" in proc.stdout                      # resumed there
    assert steps_logged(killed) == list(range(1, STEPS + 1))          # every step once
    assert read_losses(killed) == read_losses(two_processes)          # bitwise
    (w1, e1, s1), (w2, e2, s2) = _last_checkpoint(two_processes), _last_checkpoint(killed)
    assert s1["ema_updates"] == s2["ema_updates"] == STEPS
    for x, y in ((w1, w2), (e1, e2)):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
