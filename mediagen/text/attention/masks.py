"""Turning a (B, N) padding mask into what SDPA takes, for causal or bidirectional attention."""

from __future__ import annotations

import weakref

import torch


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is ones then zeros (real tokens first, padding last)."""
    m = attention_mask.to(torch.int8)
    return bool((m[:, 1:] <= m[:, :-1]).all())


def sdpa_mask(attention_mask: torch.Tensor | None, n: int, causal: bool, device):
    """Returns (attn_mask, is_causal) for F.scaled_dot_product_attention with (B, H, N, N) scores.

    Causal with right padding needs no mask at all: padding comes after every real token, so no real
    query can see it. Otherwise keys are masked, and each query may always see itself so that a row
    is never fully masked (a padded query then attends only to itself; its output is discarded).

    The result for the last mask tensor seen is kept (one entry, matched by identity and in-place
    version): every layer of an encoder forward passes the same mask, and deciding whether it needs
    masking reads its values on the host, a GPU sync, so it is built once per forward, not per layer.
    """
    if attention_mask is None:
        return None, causal
    if torch.compiler.is_compiling():
        return _build_sdpa_mask(attention_mask, n, causal, device)
    global _last
    key = (n, causal, str(device), attention_mask._version)
    if _last is not None and _last[0]() is attention_mask and _last[1] == key:
        return _last[2]
    result = _build_sdpa_mask(attention_mask, n, causal, device)
    _last = (weakref.ref(attention_mask), key, result)
    return result


_last = None  # (weak reference to the mask, key, result) of the last sdpa_mask call


def _build_sdpa_mask(attention_mask: torch.Tensor, n: int, causal: bool, device):
    if bool(attention_mask.all()):
        return None, causal
    if causal and is_right_padded(attention_mask):
        return None, True
    allowed = attention_mask.bool()[:, None, None, :].expand(-1, 1, n, n)
    eye = torch.eye(n, dtype=torch.bool, device=device)
    allowed = allowed | eye
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return allowed, False
