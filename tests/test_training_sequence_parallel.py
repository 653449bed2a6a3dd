"""Two CPU processes (torchrun, gloo) train like one at equal global batch: data parallel (DDP through
accelerate, each process half of every batch) and train.sequence_parallel (each process its slab of
every sample's tokens): same losses, same weights, up to float summation order."""

import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from mediagen.training import load_config
from mediagen.training.checkpoint import list_checkpoints
from training_helpers import ROOT, TINY_WAN, read_losses

ARGS = [*TINY_WAN, "model.attention=mhla", "model.blocks=[2,2,2]", "train.max_steps=5", "train.batch_size=4",
        "train.micro_batch_size=2", "checkpoint.every=5", "optim.warmup_steps=2", "logging.sample_every=5",
        "logging.sample_steps=2", "logging.sample_prompts=[the digit 3 moves left]", "data.length=64"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(out, processes: int, *extra, args=ARGS):
    from mediagen.training.config import save_config
    config = save_config(load_config(None, [f"output_dir={out}", *args]), out.parent / f"{out.name}.yaml")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
           f"--master_port={_port()}", "-m", "mediagen.cli", "train", str(config), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_two_processes_sequence_parallel_train_like_one(tmp_path):
    _train(tmp_path / "one", 1)
    # with gradient checkpointing: each block's forward runs again in the backward, and its pre-hook must cut the
    # same slab again
    _train(tmp_path / "sp", 2, "train.sequence_parallel=true", "model.gradient_checkpointing=true")
    one, sp = read_losses(tmp_path / "one"), read_losses(tmp_path / "sp")
    assert sorted(one) == sorted(sp) == [1, 2, 3, 4, 5]
    for step in one:
        assert sp[step] == pytest.approx(one[step], rel=1e-4), (step, one, sp)
    a = load_file(str(list_checkpoints(tmp_path / "one")[-1][1] / "model.safetensors"))
    b = load_file(str(list_checkpoints(tmp_path / "sp")[-1][1] / "model.safetensors"))
    for name, w in a.items():
        assert ((b[name] - w).norm() / w.norm().clamp_min(1e-12)).item() < 1e-3, name
    assert (tmp_path / "sp" / "samples" / "step-0000005" / "prompt0.gif").is_file()
    assert (tmp_path / "sp" / "pipeline" / "model_index.json").is_file()


def test_sequence_parallel_config_errors(tmp_path):
    from mediagen.training.config import ConfigError
    with pytest.raises(ConfigError, match="needs task='text-to-video'"):
        load_config(None, [f"output_dir={tmp_path}", "task=class-to-image", "model.preset=dit-tiny",
                           "train.sequence_parallel=true"])


def test_two_processes_data_parallel_train_like_one(tmp_path):
    from training_helpers import TINY_DIT
    args = [*TINY_DIT, "train.max_steps=6", "train.batch_size=8", "train.micro_batch_size=2", "checkpoint.every=6",
            "optim.warmup_steps=2"]
    _train(tmp_path / "one", 1, args=args)      # micro-batch 2, 4 accumulation steps
    _train(tmp_path / "ddp", 2, args=args)      # micro-batch 2 on each process, 2 accumulation steps
    one, ddp = read_losses(tmp_path / "one"), read_losses(tmp_path / "ddp")
    assert sorted(one) == sorted(ddp) == list(range(1, 7))
    assert len(set(one.values())) == 6
    for step in one:
        assert ddp[step] == pytest.approx(one[step], rel=1e-5), (step, one, ddp)
    a = load_file(str(list_checkpoints(tmp_path / "one")[-1][1] / "model.safetensors"))
    b = load_file(str(list_checkpoints(tmp_path / "ddp")[-1][1] / "model.safetensors"))
    # all weights together (a key bias gets only rounding noise as gradient: softmax ignores it)
    flat_a = torch.cat([w.flatten() for w in a.values()])
    flat_b = torch.cat([b[name].flatten() for name in a])
    assert ((flat_b - flat_a).norm() / flat_a.norm()).item() < 1e-5
    assert (flat_b - flat_a).abs().max().item() < 1e-4
