"""Softmax attention through torch SDPA (FlashAttention / cuDNN / efficient, torch picks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SDPAttention(nn.Module):
    """Softmax attention on (B, N, H, D) tensors; ``grid`` is accepted and ignored."""

    def forward(self, q, k, v, grid=None, attn_mask: torch.Tensor | None = None, is_causal: bool = False):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=attn_mask, is_causal=is_causal)
        return o.transpose(1, 2)
