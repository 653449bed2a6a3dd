"""Tiny training configs and helpers shared by the training tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mediagen.training import load_config

ROOT = Path(__file__).resolve().parents[1]

TINY_DIT = ["task=class-to-image", "model.preset=dit-tiny", "data.dataset=mnist", "data.resolution=8",
            "train.batch_size=16", "optim.lr=2e-3", "logging.progress=false", "logging.tensorboard=false"]

TINY_WAN = ["task=text-to-video", "model.preset=wan-tiny", "model.text_max_length=40", "data.dataset=moving-mnist",
            "data.resolution=16", "data.num_frames=4", "data.length=512", "train.batch_size=4", "optim.lr=2e-3",
            "logging.progress=false", "logging.tensorboard=false"]


def tiny_config(out, base, *extra):
    return load_config(None, [f"output_dir={out}", *base, *extra])


def read_losses(output_dir) -> dict[int, float]:
    """Per-step losses from metrics.jsonl, which holds one line per step, in order (a resumed run drops
    the lines past its checkpoint before it appends): a repeated or out-of-order step fails."""
    out = {}
    for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["step"] > max(out, default=0), f"step {row['step']} logged after step {max(out)}"
        out[row["step"]] = row["loss"]
    return out


def steps_logged(output_dir) -> list[int]:
    return [json.loads(l)["step"] for l in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]


# `mediagen train` (through mediagen.cli.main, so its exit status is the command's) on an empty YAML
# file plus the dotlist given, in a process that SIGKILLs itself at a chosen point: after step KILL_AT,
# or inside the checkpoint writer (KILL_IN=publish: all files written, not yet renamed;
# KILL_IN=write_main: after the weights file, before the optimizer state). TERM_AT: sends itself
# SIGTERM after that step instead.
KILLABLE = r'''
import os, signal, sys, tempfile
from mediagen import cli
from mediagen.training import trainer
from mediagen.training import checkpoint as ckpt
from safetensors.torch import save_file as _save_file

def die():
    os.kill(os.getpid(), signal.SIGKILL)

kill_at = int(os.environ.get("KILL_AT", "0"))
term_at = int(os.environ.get("TERM_AT", "0"))
kill_in = os.environ.get("KILL_IN", "")
kill_save_step = int(os.environ.get("KILL_SAVE_STEP", "0"))
if kill_in == "publish":
    real = ckpt.publish
    def publish(out, step, keep):
        if step == kill_save_step:
            die()
        return real(out, step, keep)
    ckpt.publish = publish
if kill_in == "write_main":
    def save_file(tensors, path, *a, **k):
        _save_file(tensors, path, *a, **k)
        if path.endswith("model.safetensors") and f"{kill_save_step:07d}" in path:
            die()
    ckpt.save_file = save_file

def on_step_end(step, loss):
    if step == kill_at:
        die()
    if step == term_at:
        os.kill(os.getpid(), signal.SIGTERM)
real_train = trainer.train
trainer.train = lambda cfg: real_train(cfg, on_step_end=on_step_end)
with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    f.write("{}\n")
try:
    rc = cli.main(["train", f.name, *sys.argv[1:]])
finally:
    os.unlink(f.name)
sys.exit(rc)
'''

# exit statuses of `mediagen train` (mediagen/training/train_cli.py): done, stopped early (resumable)
DONE, STOPPED = 0, 3


def run_training_process(args, output=False, **env):
    """The exit status of KILLABLE run with ``args`` (-9 when it killed itself); with output=True,
    (status, stdout). Any other status (a crash, a config error) fails the test."""
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **{k: str(v) for k, v in env.items()})
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", KILLABLE, *args], env=e, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode not in (DONE, STOPPED, -9):
        raise AssertionError(f"training process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return (proc.returncode, proc.stdout) if output else proc.returncode


def corrupt_mp4(path, frames=24, size=32, seed=0):
    """A small mp4 (random frames) whose header is whole and whose last third of frame data is overwritten: it
    opens with decord or PyAV (container header, first frame) and fails once its later frames are decoded. (With
    the damage from the middle on, decord's threaded decoder, which reads a few packets ahead of the frame asked,
    sometimes reached it while opening the file on a loaded machine.)"""
    import numpy as np

    from mediagen.eval.video_io import write_video

    path = Path(path)
    rng = np.random.default_rng(seed)
    write_video(rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8), path, fps=8)
    data = bytearray(path.read_bytes())
    for i in range(int(len(data) * 0.7), int(len(data) * 0.85)):   # frame data; the index (moov) is at the end
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def video_folder(folder, good=3, bad=("bad.mp4",), frames=8, size=32):
    """A captioned folder (metadata.jsonl) of ``good`` readable mp4s and the corrupt files named in ``bad``."""
    import numpy as np

    from mediagen.eval.video_io import write_video

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(good):
        rng = np.random.default_rng(100 + i)
        write_video(rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8), folder / f"good{i}.mp4", fps=8)
        rows.append({"file_name": f"good{i}.mp4", "text": f"the digit {i} moves left"})
    for j, name in enumerate(bad):
        corrupt_mp4(folder / name, frames, size, seed=j)
        rows.append({"file_name": name, "text": "the digit 9 moves up"})
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder
