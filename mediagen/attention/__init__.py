"""Attention modules behind one interface: module(q, k, v, grid) -> o, all tensors (B, N, H, D).

These are the attentions of the diffusion transformers; the text encoders' token mixers (HLA, MLRA,
multi-head self-attention) live in ``mediagen.text.attention``.
"""

from .mhla import LinearAttention, MHLAttention, clip_mixes_, locality_mix, register_mix_clipping
from .sdpa import SDPAttention

__all__ = ["MHLAttention", "LinearAttention", "SDPAttention", "locality_mix", "clip_mixes_",
           "register_mix_clipping"]
