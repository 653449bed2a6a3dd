"""Sequence-parallel MHLA: tokens sharded over ranks by whole blocks, only block summaries travel.

Each rank holds a slab of whole blocks along the first grid axis (frames for video): with
blocks[0] = b_F divisible by the world size P, rank r owns block rows [r*b_F/P, (r+1)*b_F/P) and so
the contiguous token range of those rows. One layer runs the single-process op's chunked steps on
the local blocks (``mhla_triton`` with an exchange hook, kernels/mhla/exchange.py: one autograd
function for both); this module is that hook, the collectives between the steps, and the slab
bookkeeping:

    forward   summaries (S_b, z_b) of its M/P blocks -> all-gather (every rank: all M)
              -> mix its own query rows, S~_i = sum_b Mc[i, b] S_b -> outputs of its tokens
    backward  local dS~_i and dq -> dS_b = sum_i Mc[i, b] dS~_i over its query rows, for all b
              -> summed over ranks, each keeping its own blocks -> dk, dv locally;
              dMc gets this rank's rows, dMc[i, b] = <dS~_i, S_b> for its query blocks i.

What is sent per layer, X = D*D + D values per block and head:
    forward   all-gather: each rank sends its B*H*(M/P)*X summaries and receives the other ranks'.
              They are stored as the single-process op stores them (``summary_dtype``): fp32 when a
              backward reads them, bf16 for a bf16 forward that nothing differentiates.
    backward  the B*H*M*X fp32 partial dS of every rank are summed: a reduce-scatter on NCCL
              (each rank keeps its M/P blocks); gloo has none, so there an all-reduce of all M.
``exchange_bytes`` gives the bytes a rank sends in each. Both are independent of the number of tokens at a
fixed block count; softmax attention spread over
ranks (Ulysses all-to-all or ring passes) moves q/k/v-sized tensors instead, growing with the sequence.

With ``rope`` the numerator's features are rotated as in the single-process op (rotation.py); each
rank passes the rows of the angle tables for its own tokens, cut as q, k, v are.

Like every other parameter of a sequence-parallel model, Mc's gradient on a rank is that rank's
share: sum parameter gradients over the group (``sum_gradients``) to get the whole sequence's.

The local pieces run on the Triton kernels (CUDA, or the Triton interpreter in the CPU tests).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from ..kernels.mhla.checks import check_mhla_args
from ..kernels.mhla.exchange import BlockExchange
from ..kernels.mhla.layout import block_token_lists
from ..kernels.mhla.rotation import split_rope
from ..kernels.mhla.tiles import _interpreting, summary_dtype


def shard_layout(grid, blocks, rank: int, world: int):
    """(first token, end token, local order, local offsets) of ``rank``'s slab of whole blocks."""
    grid, blocks = tuple(grid), tuple(blocks)
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world={world!r} is not allowed: use the number of ranks, an int >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"rank={rank!r} is not allowed: use an int in [0, {world}) for world={world}")
    if blocks[0] % world:
        raise ValueError(f"blocks[0]={blocks[0]} must be divisible by the world size {world} so that every "
                         f"rank holds whole blocks along the first grid axis")
    M = math.prod(blocks)
    m_local = M // world
    order, offsets, _ = block_token_lists(grid, blocks, torch.device("cpu"))
    lo_block, hi_block = rank * m_local, (rank + 1) * m_local
    start, end = int(offsets[lo_block]), int(offsets[hi_block])
    local_order = (order[start:end] - order[start:end].min()).to(torch.int32)
    first_token = int(order[start:end].min())
    local_offsets = (offsets[lo_block:hi_block + 1] - start).to(torch.int32)
    return first_token, first_token + (end - start), local_order, local_offsets


@functools.lru_cache(maxsize=64)
def _device_layout(grid: tuple, blocks: tuple, rank: int, world: int, device: torch.device):
    """shard_layout with order/offsets already on ``device``, computed and copied once per layout:
    a host-to-device copy per layer call would make the host wait for the GPU every layer."""
    first, end, order, offsets = shard_layout(grid, blocks, rank, world)
    return first, end, order.to(device), offsets.to(device)


def exchange_bytes(grid, blocks, *, batch: int, heads: int, head_dim: int, world: int, dtype=torch.float32,
                   backward: bool = True, backend: str = "nccl") -> dict[str, int]:
    """Bytes one rank sends per MHLA layer: {"forward": the summaries' all-gather, "backward": the sum of
    the partial dS (0 without a backward)}. A pure function of shapes, equal on every rank.

    Counted as the usual bandwidth-optimal algorithms send: an all-gather sends (P-1) x the rank's input, a
    reduce-scatter (P-1)/P x its input, an all-reduce 2(P-1)/P x its input. With M blocks, P ranks and
    X = D*D + D values per block and head, a rank's input is B*H*(M/P)*X summaries to the all-gather and the
    B*H*M*X fp32 partial dS to the sum, so
        forward   (P-1) * B*H*(M/P)*X * s      s: the summaries' bytes (``summary_dtype``: 4, or 2 for a bf16
                                               forward that nothing differentiates)
        backward  (P-1) * B*H*(M/P)*X * 4      NCCL (reduce-scatter)
                  2 * that                     gloo (no reduce-scatter: an all-reduce of all M blocks)
    Neither depends on the grid beyond its block count: more frames at fixed blocks send the same bytes.
    ``dtype`` is q's dtype; ``backward`` whether a backward follows (the forward keeps fp32 summaries)."""
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed: use an int >= 1")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend={backend!r} is not allowed: use 'nccl' or 'gloo'")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype={dtype!r} is not allowed: use torch.float32, torch.float16 or torch.bfloat16")
    shard_layout(grid, blocks, 0, world)  # the layout the exchange uses: whole blocks, blocks[0] split evenly
    held = math.prod(blocks) // world
    per_rank = batch * heads * held * (head_dim * head_dim + head_dim)
    forward = (world - 1) * per_rank * summary_dtype(dtype, backward).itemsize
    grads = (world - 1) * per_rank * 4 * (2 if backend == "gloo" else 1)
    return {"forward": forward, "backward": grads if backward else 0}


def shard_tokens(x: torch.Tensor, grid, blocks, rank: int, world: int) -> torch.Tensor:
    """The slab of tokens (dim 1 of a (B, N, ...) tensor) that ``rank`` holds."""
    first, end, _, _ = shard_layout(grid, blocks, rank, world)
    return x[:, first:end]


def _gather_blocks(local: torch.Tensor, group) -> torch.Tensor:
    """(B, H, M/P, X) per rank -> (B, H, M, X), ranks in order."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts, dim=2)


def _reduce_scatter_blocks(full: torch.Tensor, group) -> torch.Tensor:
    """Sum (B, H, M, X) over ranks; each rank keeps its (B, H, M/P, X) slice."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    m_local = full.shape[2] // world
    if dist.get_backend(group) == "nccl":
        chunks = full.unflatten(2, (world, m_local)).movedim(2, 0).contiguous()
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter_tensor(out, chunks, group=group)
        return out
    dist.all_reduce(full, group=group)  # gloo has no reduce-scatter: reduce all, keep ours
    return full[:, :, rank * m_local:(rank + 1) * m_local].contiguous()


class _SummaryExchange(BlockExchange):
    """The op's exchange hook (kernels/mhla/exchange.py) over the ranks of ``group``: this rank holds
    the block rows [rank*M/P, (rank+1)*M/P) and its slab's token lists."""

    def __init__(self, group, rows: slice, order: torch.Tensor, offsets: torch.Tensor):
        self.group, self.rows, self.order, self.offsets = group, rows, order, offsets

    def gather_summaries(self, sz: torch.Tensor) -> torch.Tensor:
        return _gather_blocks(sz, self.group)

    def sum_summary_grads(self, dsz: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_blocks(dsz, self.group)


def sequence_parallel_mhla(q, k, v, mix, grid, blocks, *, group=None, normalize=True, eps=1e-6, feature_map=None,
                           scale=None, rope=None):
    """MHLA over a token grid sharded across the ranks of ``group`` by whole blocks.

    q, k, v: this rank's slab (B, N_r, H, D), as ``shard_tokens`` cuts it; grid and blocks are the
    global ones; mix (M, M) or (H, M, M) is replicated. ``rope``: None or the (cos, sin) angle tables
    of this rank's tokens, (N_r, D/2) rows of the tables ``mhla`` takes, cut as ``shard_tokens`` cuts
    (dim 0). Returns this rank's output slab.
    """
    if not q.is_cuda and not _interpreting():
        # the exchange hook is in the Triton op only; off CUDA Triton runs in its interpreter alone
        raise ValueError(f"q is on {q.device}: sequence-parallel MHLA runs the Triton kernels, on CUDA GPUs, or on "
                         f"a CPU with TRITON_INTERPRET=1 set before mediagen is imported (slow: tests and smoke runs)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    first, end, order, offsets = _device_layout(tuple(grid), tuple(blocks), rank, world, q.device)
    if q.shape[1] != end - first:
        raise ValueError(f"q holds {q.shape[1]} tokens but rank {rank} of {world} owns {end - first} tokens of "
                         f"grid={tuple(grid)} with blocks={tuple(blocks)} (cut with shard_tokens)")
    full_n = math.prod(grid)
    # validate against the global problem with a zero-stride stand-in of the full token count
    stand_in = q[:, :1].expand(q.shape[0], full_n, *q.shape[2:])
    check_mhla_args(stand_in, stand_in, stand_in, mix, grid, blocks, normalize, eps, feature_map, scale)
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have one shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    cos, sin = split_rope(rope, q)  # rows numbered from ``first``, as the local order numbers the tokens
    from ..kernels.mhla.triton_op import mhla_triton

    m_local = math.prod(blocks) // world
    exchange = _SummaryExchange(group, slice(rank * m_local, (rank + 1) * m_local), order, offsets)
    return mhla_triton(q, k, v, mix, tuple(grid), tuple(blocks), normalize=normalize, eps=eps,
                       feature_map=feature_map, scale=scale, rope=None if cos is None else (cos, sin),
                       exchange=exchange)


def sum_gradients(module: torch.nn.Module, group=None) -> None:
    """Sum every parameter gradient over the sequence-parallel group (each rank holds its share)."""
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
