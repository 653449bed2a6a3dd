"""Triton kernels and their plain-PyTorch references (no nn.Modules here)."""

from .mhla import mhla, mhla_reference, token_block_ids

__all__ = ["mhla", "mhla_reference", "token_block_ids"]
