"""Training checkpoints: safetensors for every tensor, JSON for the rest; never a pickle.

    <output_dir>/checkpoints/checkpoint-0000100/
        model.safetensors            trainable model's full state dict (LoRA / Mc included)
        ema.safetensors              EMA weights (when EMA is on)
        optimizer.safetensors        optimizer state, flattened: "<param name>/<key>" -> tensor
        optimizer.json               param_groups and the non-tensor state
        rng-<rank>.safetensors/.json torch (CPU + CUDA), numpy and python RNG states of each process
        state.json                   step, LR-scheduler state, EMA update count

Atomicity: everything is written into ``.tmp-checkpoint-0000100``, flushed to disk, and the folder
is then renamed to its final name (a rename within one filesystem is atomic). A process killed at
any moment leaves either a complete ``checkpoint-*`` folder or a ``.tmp-*`` one, which is ignored
and removed by the next save. ``resume: latest`` picks the highest complete step.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

NAME = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir) -> list[tuple[int, Path]]:
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := NAME.match(p.name))]
    return sorted(found)


def common_step(output_dirs) -> int:
    """The last checkpoint step that every run folder given has saved; 0 when they share none (or none given).
    Runs compared at equal steps (docs/RESULTS.md) use it; from a shell:
    ``python -m mediagen.training.checkpoint RUN_DIR ...`` prints it."""
    steps = [{s for s, _ in list_checkpoints(d)} for d in output_dirs]
    return max(set.intersection(*steps), default=0) if steps else 0


def find_resume(output_dir, resume: str | None) -> Path | None:
    """The folder to resume from: None, 'latest' (None if there is none yet) or a path."""
    if resume is None:
        return None
    if resume == "latest":
        found = list_checkpoints(output_dir)
        return found[-1][1] if found else None
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise ValueError(f"checkpoint.resume={resume!r} is not a checkpoint folder (no state.json)")
    return path


# What a run writes into output_dir (besides the data caches a config may place there). A run that does
# not resume must not write over another run's: its config.yaml and pipeline/ would be replaced, its
# metrics.jsonl cut to nothing, and keep_last would delete the newer run's checkpoints in favour of the
# older run's higher steps, which a later resume would then continue.
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "checkpoints", "pipeline", "lora", "samples", "tensorboard")


def earlier_run(output_dir) -> list[str]:
    """The names in ``output_dir`` that a run wrote (RUN_OUTPUTS and exported ``pipeline-step-*``
    folders); empty for a missing or fresh folder."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [name for name in RUN_OUTPUTS if (out / name).exists()]
    return found + sorted(p.name for p in out.glob("pipeline-step-*") if p.is_dir())


def check_output_dir(output_dir, resume, overwrite: bool) -> None:
    """A run without ``checkpoint.resume`` starts only in an output_dir that holds no earlier run, unless
    ``overwrite_output_dir`` asks to start that run over (``clear_earlier_run``)."""
    found = earlier_run(output_dir)
    if resume is None and not overwrite and found:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ValueError(f"output_dir={str(output_dir)!r} already holds a run ({shown}): add checkpoint.resume=latest "
                         f"to continue it, overwrite_output_dir=true to delete it and start over, or choose another "
                         f"output_dir")


def clear_earlier_run(output_dir) -> list[str]:
    """(main process, overwrite_output_dir=true) delete what an earlier run wrote in output_dir; other files
    stay. Returns the names deleted."""
    out = Path(output_dir)
    found = earlier_run(out)
    for name in found:
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return found


def load_model_state(model, folder: Path, output_dir, model_config: dict | None = None) -> None:
    """Load the weights of checkpoint ``folder`` into ``model``, or say in one line that they belong to
    another model (keys or shapes differ: the output_dir was reused with another model config) instead
    of torch's list of every mismatched tensor. ``model_config``: this run's ``model`` section, compared
    with the earlier run's config.yaml for the message."""
    saved = read_model(folder)
    own = model.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    reshaped = [k for k in own if k in saved and tuple(own[k].shape) != tuple(saved[k].shape)]
    if missing or unexpected or reshaped:
        parts = []
        if missing:
            parts.append(f"{len(missing)} weights of this model missing (e.g. {missing[0]!r})")
        if unexpected:
            parts.append(f"{len(unexpected)} not in this model (e.g. {unexpected[0]!r})")
        if reshaped:
            k = reshaped[0]
            parts.append(f"{len(reshaped)} of other shapes (e.g. {k!r}: {tuple(saved[k].shape)} saved, "
                         f"{tuple(own[k].shape)} here)")
        was = _model_config_diff(Path(output_dir) / "config.yaml", model_config or {})
        raise ValueError(f"checkpoint {folder} holds another model's weights ({'; '.join(parts)}){was}: resume it "
                         f"with the model config that wrote it, or give this run another output_dir (or "
                         f"overwrite_output_dir=true without checkpoint.resume to start it over)")
    model.load_state_dict(saved)


def _model_config_diff(config_file: Path, current: dict) -> str:
    """"; config.yaml there has model.preset='wan-tiny' (this run: 'dit-tiny')" for the model settings that
    differ from the earlier run's config.yaml (read before this run replaces it); "" when there is none."""
    if not config_file.is_file():
        return ""
    try:
        import yaml

        saved = (yaml.safe_load(config_file.read_text()) or {}).get("model") or {}
    except Exception:  # noqa: BLE001 (a hand-edited or cut file: the weights' message stands alone)
        return ""
    keys = [k for k in ("preset", "pretrained", "attention", "layers", "blocks", "overrides", "attention_options")
            if saved.get(k) != current.get(k)]
    shown = ", ".join(f"model.{k}={saved.get(k)!r} (this run: {current.get(k)!r})" for k in keys)
    return f"; its run's {config_file} has {shown}" if shown else ""


# --- flattening state dicts into tensors + JSON ------------------------------------------------

def flatten_optimizer_state(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, other = {}, {}
    for name, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}/{key}"] = value.detach().cpu().contiguous()
            else:
                other.setdefault(str(name), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "other": other}


def unflatten_optimizer_state(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for flat, value in tensors.items():
        name, key = flat.rsplit("/", 1)
        state.setdefault(name, {})[key] = value
    for name, extra in meta["other"].items():
        state.setdefault(name, {}).update(extra)
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = s
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(keys.astype(np.int64))
    version, py_state, py_gauss = random.getstate()
    meta = {"numpy": [kind, int(pos), int(has_gauss), float(gauss)],
            "python": [version, list(py_state), py_gauss]}
    return tensors, meta


def set_rng_state(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    kind, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, py_state, py_gauss = meta["python"]
    random.setstate((version, tuple(py_state), py_gauss))


# --- writing -------------------------------------------------------------------------------

def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1))


def tmp_dir_for(output_dir, step: int) -> Path:
    return checkpoint_dir(output_dir) / f".tmp-checkpoint-{step:07d}"


def prepare_tmp(output_dir, step: int) -> Path:
    """(main process) a fresh temporary folder; stale ones from killed saves are removed."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-checkpoint-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tmp_dir_for(output_dir, step)
    tmp.mkdir()
    return tmp


def write_rng(tmp: Path, rank: int) -> None:
    tensors, meta = rng_state()
    save_file(tensors, str(tmp / f"rng-{rank}.safetensors"))
    _write_json(tmp / f"rng-{rank}.json", meta)


def write_main(tmp: Path, *, step: int, model_state: dict, optimizer_state: dict, scheduler_state: dict,
               ema=None, scaler_state: dict | None = None) -> None:
    """(main process) everything but the RNG files. ``scaler_state``: an fp16 run's loss-scaler state (its scale
    and growth count: plain numbers), None in other precisions."""
    save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items()}, str(tmp / "model.safetensors"))
    tensors, meta = flatten_optimizer_state(optimizer_state)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    _write_json(tmp / "optimizer.json", meta)
    state = {"step": step, "scheduler": scheduler_state, "ema_updates": None, "scaler": scaler_state}
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.state_dict().items()}, str(tmp / "ema.safetensors"))
        state["ema_updates"] = ema.updates
    _write_json(tmp / "state.json", state)  # written last: its presence marks the content complete


def publish(output_dir, step: int, keep_last: int) -> Path:
    """(main process) flush, rename the temporary folder into place, drop the checkpoints past ``step`` and
    the oldest beyond keep_last.

    A run saves its steps in increasing order, so a checkpoint past the one just saved was written by the
    run this one went back from (resumed from an earlier checkpoint folder): that future was abandoned, as
    its metrics.jsonl lines were. Kept, it would count among the keep_last newest (deleting this run's own
    checkpoints, even the one just saved) and ``resume: latest`` would continue the abandoned run."""
    tmp = tmp_dir_for(output_dir, step)
    _fsync_tree(tmp)
    final = checkpoint_dir(output_dir) / f"checkpoint-{step:07d}"
    if final.exists():  # the same step saved again (e.g. the last step after a resume): replace it
        old = final.with_name(f".old-{final.name}")
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    found = list_checkpoints(output_dir)
    for s, path in found:
        if s > step:
            shutil.rmtree(path, ignore_errors=True)
    kept = [path for s, path in found if s <= step]
    if keep_last > 0:
        for path in kept[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    return final


# --- reading -------------------------------------------------------------------------------

def read_state(folder: Path) -> dict:
    return json.loads((Path(folder) / "state.json").read_text())


def read_model(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def read_optimizer(folder: Path) -> dict:
    folder = Path(folder)
    return unflatten_optimizer_state(load_file(str(folder / "optimizer.safetensors")),
                                     json.loads((folder / "optimizer.json").read_text()))


def read_ema(folder: Path) -> dict[str, torch.Tensor] | None:
    path = Path(folder) / "ema.safetensors"
    return load_file(str(path)) if path.is_file() else None


def restore_rng(folder: Path, rank: int) -> None:
    folder = Path(folder)
    path = folder / f"rng-{rank}.safetensors"
    if not path.is_file():  # resumed on more processes than saved: reuse rank 0's
        path = folder / "rng-0.safetensors"
    set_rng_state(load_file(str(path)), json.loads(path.with_suffix(".json").read_text()))


if __name__ == "__main__":
    import sys

    print(common_step(sys.argv[1:]))
