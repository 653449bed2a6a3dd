"""Turning prompts into the text states a transformer cross-attends to, for any text encoder.

An encoder plugs in one of two ways:
- it has ``encode_text(prompts, max_length) -> (hidden (B, L, C), mask (B, L))`` and tokenises for
  itself (``ByteTextEncoder``; any encoder wrapper can add this one method);
- or the pipeline has a Hugging Face ``tokenizer`` and the encoder's forward takes
  ``input_ids``/``attention_mask`` and returns an object with ``last_hidden_state``.
The encoder is a pipeline component, so it needs ``.device`` and ``.dtype`` (``ModelMixin`` and
``PreTrainedModel`` have them). Padded positions are zeroed, as Wan's pipeline does, so the transformer sees the same states
whatever the padding length.
"""

from __future__ import annotations

import torch


def encode_prompts(text_encoder, tokenizer, prompts: list[str], max_length: int, device, dtype):
    """(hidden states (B, L, C) in ``dtype``, attention mask (B, L) int64) for ``prompts``."""
    if text_encoder is None:
        raise ValueError("prompt needs a text_encoder in the pipeline; without one pass prompt_embeds")
    if hasattr(text_encoder, "encode_text"):
        hidden, mask = text_encoder.encode_text(prompts, max_length)
    elif tokenizer is not None:
        tokens = tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True,
                           add_special_tokens=True, return_tensors="pt")
        mask = tokens["attention_mask"].to(device)
        out = text_encoder(input_ids=tokens["input_ids"].to(device), attention_mask=mask)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    else:
        raise ValueError(f"text_encoder {type(text_encoder).__name__} has no encode_text(prompts, max_length) "
                         "and the pipeline has no tokenizer: give one of the two, or pass prompt_embeds")
    mask = mask.to(device=device, dtype=torch.long)
    hidden = hidden.to(device=device, dtype=dtype) * mask[..., None].to(dtype)
    return hidden, mask


def as_prompt_list(prompt, name: str) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    raise ValueError(f"{name} must be a string or a list of strings; got {type(prompt).__name__}")
