"""Attention modules behind one interface: module(q, k, v, grid) -> o, all tensors (B, N, H, D)."""

from .mhla import LinearAttention, MHLAttention, clip_mixes_, locality_mix, register_mix_clipping
from .sdpa import SDPAttention

__all__ = ["MHLAttention", "LinearAttention", "SDPAttention", "locality_mix", "clip_mixes_",
           "register_mix_clipping"]
