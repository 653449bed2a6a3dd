"""Text-encoder token mixers on hidden states (B, N, C), each with its own projections and a decode cache."""

from .hla import HLAttention
from .mlra import MLRAttention
from .self_attention import MultiHeadSelfAttention

__all__ = ["HLAttention", "MLRAttention", "MultiHeadSelfAttention"]
