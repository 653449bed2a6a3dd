"""The hook through which the chunked MHLA op runs with its blocks spread over several processes.

The Triton op (triton_op.py; its steps in autograd.py) runs one sequence of steps, forward and backward. Alone it holds every
block; given a ``BlockExchange`` it holds the blocks ``rows`` of Mc's block order, and calls the
exchange at the two points where the processes must combine their parts:

    forward   summary (S_b, z_b of the held blocks) -> gather_summaries -> all M blocks' summaries
              -> mix: S~_i = sum_b Mc[i, b] S_b for the held query blocks i -> apply (held tokens)
    backward  query_grad (dq, dS~_i of the held query blocks) -> mix^T: the partial
              dS_b = sum_i Mc[i, b] dS~_i over the held i, for all M blocks -> sum_summary_grads
              -> the whole dS_b of the held blocks -> key_grad (dk, dv of the held tokens);
              dMc gets the held rows, dMc[i, b] = <dS~_i, S_b>, zero elsewhere.

The kernels package knows nothing of how the parts travel: the exchange is made by the caller
(``mediagen.attention.sequence_parallel`` with torch.distributed).
"""

from __future__ import annotations

import torch


class BlockExchange:
    """What one process holds of the block grid, and how its block summaries meet the others'.

    Attributes the op reads when it first plans a call (a plan is cached per ``rows`` range, so equal
    ranges must come with equal token lists):
        rows      slice of block indices (Mc's block order) this process holds, its query and key blocks
        order     int32 (N_local,) this process's tokens sorted by block, numbered as its q, k, v rows
        offsets   int32 (len(rows) + 1,) where each held block starts in ``order``
    """

    rows: slice
    order: torch.Tensor
    offsets: torch.Tensor

    def gather_summaries(self, sz: torch.Tensor) -> torch.Tensor:
        """(B, H, held, X) summaries of the held blocks -> (B, H, M, X) of all blocks, in block order.
        The result must be contiguous (the mix kernel reads it so)."""
        raise NotImplementedError

    def sum_summary_grads(self, dsz: torch.Tensor) -> torch.Tensor:
        """(B, H, M, X) fp32 partial dS of this process (its query blocks' share, for every key block)
        -> (B, H, held, X): the sum over all processes of the held blocks' rows, contiguous."""
        raise NotImplementedError
