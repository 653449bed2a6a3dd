"""Attention modules behind one interface: module(q, k, v, grid) -> o, all tensors (B, N, H, D)."""

from .mhla import LinearAttention, MHLAttention, clip_mixes_, locality_mix, register_mix_clipping
from .sdpa import SDPAttention

# modules on hidden states (B, N, C) with their own projections (text-encoder token mixers)
from .hla import HLAttention  # noqa: E402
from .mlra import MLRAttention  # noqa: E402
from .self_attention import MultiHeadSelfAttention  # noqa: E402

__all__ = ["MHLAttention", "LinearAttention", "SDPAttention", "locality_mix", "clip_mixes_",
           "register_mix_clipping", "HLAttention", "MLRAttention", "MultiHeadSelfAttention"]
