"""``PromptEncoder``: a tokenizer plus an encoder behind one call, ``encode(prompts, max_length)``.

Documented behaviour at the edges (never a crash):
  * an empty prompt ("" or None) encodes to the tokenizer's special tokens alone (BERT: [CLS] [SEP]);
    if a tokenizer yields no token at all, one pad token is marked real so no row is empty;
  * a prompt longer than ``max_length`` tokens is truncated (special tokens kept) with a
    ``UserWarning`` naming the prompt and its length;
  * ``max_length`` above what the encoder can take (MiniLM: 512 positions), or below the tokenizer's
    special tokens (BERT: 2), is a ``ValueError``; None means ``default_max_length``;
  * an empty list of prompts is a ``ValueError``.
Padding is on the right; outputs at padded positions are zero.
"""

from __future__ import annotations

import json
import operator
import warnings
from pathlib import Path

import torch

# The encoding settings a saved folder keeps beside the model: without them a reloaded encoder would pad
# prompts to its loader's default length (512 for a plain transformers folder) and encode differently.
OPTIONS_FILE = "prompt_encoder.json"


class PromptEncoder:
    """Args: tokenizer, model (returns an object with ``last_hidden_state``), ``kind`` ("minilm",
    "mediagen", "hub"), ``max_length_limit`` (None = no limit), ``default_max_length``."""

    def __init__(self, tokenizer, model, *, kind: str, max_length_limit: int | None = None,
                 default_max_length: int = 77):
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        self.model = model
        self.kind = kind
        self.max_length_limit = max_length_limit
        self.default_max_length = default_max_length

    @property
    def min_max_length(self) -> int:
        """The shortest ``max_length`` honoured: the tokenizer's special tokens, at least one token."""
        return max(1, int(self.tokenizer.num_special_tokens_to_add(pair=False)))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model"))

    def to(self, device=None, dtype=None) -> "PromptEncoder":
        self.model.to(device=device, dtype=dtype)
        return self

    def tokenize(self, prompts, max_length: int | None = None, padding: str = "max_length"):
        """Token ids and mask (B, L) on the model's device, with the documented edge behaviour."""
        if isinstance(prompts, str) or prompts is None:
            prompts = [prompts]
        try:
            prompts = ["" if p is None else str(p) for p in prompts]
        except TypeError:                                              # a number, say: not a list of prompts
            raise ValueError(f"prompts={prompts!r} is not allowed: give a string or a list of strings") from None
        if not prompts:
            raise ValueError("prompts is an empty list: give at least one prompt (\"\" is allowed)")
        if max_length is None:
            max_length = self.default_max_length
        try:                                                           # an int, never a rounded float
            max_length = operator.index(max_length)
        except TypeError:
            raise ValueError(f"max_length={max_length!r} is not allowed: give an int >= "
                             f"{self.min_max_length}, or None for {self.default_max_length}") from None
        # The special tokens ([CLS] [SEP]) are never cut, so a shorter length could not be honoured:
        # the tokenizer would return rows longer than max_length.
        if max_length < self.min_max_length:
            raise ValueError(f"max_length={max_length!r} is not allowed: it must be >= {self.min_max_length} "
                             "(the tokenizer's special tokens take that many)")
        if self.max_length_limit is not None and max_length > self.max_length_limit:
            raise ValueError(f"max_length={max_length} exceeds this encoder's limit of "
                             f"{self.max_length_limit} tokens")
        if padding not in ("max_length", "longest"):
            raise ValueError(f"padding={padding!r} is not allowed: use 'max_length' or 'longest'")
        lengths = [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=True, verbose=False)["input_ids"]]
        for i, n in enumerate(lengths):
            if n > max_length:
                warnings.warn(f"prompt {i} has {n} tokens, more than max_length={max_length}; it is "
                              f"truncated to {max_length} tokens", UserWarning, stacklevel=3)
        batch = self.tokenizer(prompts, padding=padding, truncation=True, max_length=max_length,
                               return_tensors="pt")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        empty = mask.sum(1) == 0
        if bool(empty.any()):                                          # tokenizer gave nothing at all
            mask[empty, 0] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def encode(self, prompts, max_length: int | None = None, padding: str = "max_length"):
        """Returns (embeds (B, L, C) in the model's dtype, attention mask (B, L) int64)."""
        ids, mask = self.tokenize(prompts, max_length, padding)
        hidden = self.forward(ids, mask)
        return hidden, mask

    def forward(self, ids, mask) -> torch.Tensor:
        """Hidden states with padding zeroed (differentiable; used by distillation)."""
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return hidden * mask[..., None].to(hidden.dtype)

    def __call__(self, prompts, max_length: int | None = None, padding: str = "max_length"):
        return self.encode(prompts, max_length, padding)

    def save_pretrained(self, directory: str | Path, slim: bool = False, dtype: torch.dtype = torch.float16):
        """Model (safetensors) and tokenizer side by side, loadable by ``load_text_encoder(directory)``.
        ``slim=True`` (a MediagenTextEncoder initialised from MiniLM): only the tensors that differ from
        the installed MiniLM, in ``dtype``, and no tokenizer (``slim.py``); returns ``save_slim``'s summary.
        Either way ``prompt_encoder.json`` keeps ``default_max_length``, which ``load_text_encoder`` restores."""
        directory = Path(directory)
        info = None
        if slim:
            from .slim import save_slim
            info = save_slim(self.model, directory, dtype)
        else:
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
        (directory / OPTIONS_FILE).write_text(json.dumps({"default_max_length": self.default_max_length}) + "\n")
        if info is not None:
            from .slim import folder_bytes
            info["bytes"] = folder_bytes(directory)
        return info
