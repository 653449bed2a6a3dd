"""MHLA: token-level multi-head linear attention (reference, Triton kernels, dispatch)."""

from .layout import block_bounds, block_token_lists, check_grid_blocks, token_block_ids
from .naive import mhla_reference
from .op import mhla
from .settings import kernel_settings, launch_settings

__all__ = ["mhla", "mhla_reference", "token_block_ids", "block_token_lists", "block_bounds", "check_grid_blocks",
           "launch_settings", "kernel_settings"]
