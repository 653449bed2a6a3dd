"""Block layout of a token grid: validation, per-token block ids, block-sorted token lists.

Tokens lie in row-major order over ``grid`` (for video (F, H, W)). Along an axis of length L cut
into b blocks, block j spans [floor(j*L/b), floor((j+1)*L/b)), so any grid works and blocks may be
ragged (sizes differ by at most one per axis). Token x of that axis is in block
j = ((x + 1) * b - 1) // L, the inverse of the span formula. Block ids are row-major over the block
grid. Nothing here copies q, k or v: kernels read tokens in place through these index lists.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import Sequence

import torch


def check_grid_blocks(grid: Sequence[int], blocks: Sequence[int], n_tokens: int | None = None):
    """Validate ``grid`` and ``blocks``; return them as tuples of ints."""
    if isinstance(grid, int):
        grid = (grid,)
    if isinstance(blocks, int):
        blocks = (blocks,)
    grid, blocks = tuple(grid), tuple(blocks)
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"grid must have 1 to 3 axes (tokens, (H, W) or (F, H, W)); got grid={grid}")
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in grid):
        raise ValueError(f"grid must hold positive ints; got grid={grid}")
    if len(blocks) != len(grid):
        raise ValueError(
            f"blocks must have one count per grid axis: len(grid)={len(grid)}, got blocks={blocks}"
        )
    for axis, (g, b) in enumerate(zip(grid, blocks)):
        if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= g:
            raise ValueError(
                f"blocks[{axis}]={b!r} is not allowed: each block count must be an int from 1 to the "
                f"axis length grid[{axis}]={g}"
            )
    if n_tokens is not None and n_tokens != math.prod(grid):
        raise ValueError(
            f"N={n_tokens} tokens do not fill grid={grid}: N must equal prod(grid)={math.prod(grid)}"
        )
    return grid, blocks


def axis_block_ids(length: int, n_blocks: int) -> torch.Tensor:
    """Block id of every position along one axis (int64, shape (length,))."""
    x = torch.arange(length)
    return ((x + 1) * n_blocks - 1) // length


def block_bounds(length: int, n_blocks: int) -> list[tuple[int, int]]:
    """[start, end) of every block along one axis."""
    return [(j * length // n_blocks, (j + 1) * length // n_blocks) for j in range(n_blocks)]


@lru_cache(maxsize=256)
def _token_block_ids_cpu(grid: tuple[int, ...], blocks: tuple[int, ...]) -> torch.Tensor:
    ids = torch.zeros((), dtype=torch.int64)
    for g, b in zip(grid, blocks):
        ids = ids[..., None] * b + axis_block_ids(g, b)
    return ids.reshape(-1)


def token_block_ids(grid, blocks, device=None) -> torch.Tensor:
    """Block id of every token (int64, shape (N,)), tokens in row-major grid order."""
    grid, blocks = check_grid_blocks(grid, blocks)
    return _token_block_ids_cpu(grid, blocks).to(device)


@lru_cache(maxsize=256)
def _block_lists_cpu(grid: tuple[int, ...], blocks: tuple[int, ...]):
    ids = _token_block_ids_cpu(grid, blocks)
    order = torch.sort(ids, stable=True).indices.to(torch.int32)
    counts = torch.bincount(ids, minlength=math.prod(blocks))
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return order, offsets, int(counts.max())


_device_cache: dict = {}


def persistent_copy(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` copied to ``device`` for a cache that outlives the call. On CUDA the copy is made by a short-lived
    thread of its own: under CUDA graphs (torch.compile mode="reduce-overhead") the graphs' private memory pool
    takes every allocation the running thread makes, warm-up runs included, and a cached tensor left in that
    pool is a live allocation that is no graph output, which CUDA graph trees refuse ("tensor(s) in the
    cudagraph pool not tracked as outputs"). The thread waits for its copy, so the tensor is ready when it
    returns. Called once per cache entry."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return t.to(device)  # (during a capture a copy from the host fails either way, with torch's message)
    out = []

    def copy():
        with torch.cuda.device(device):
            out.append(t.to(device))
            torch.cuda.current_stream(device).synchronize()

    worker = threading.Thread(target=copy, name="mediagen-persistent-copy")
    worker.start()
    worker.join()
    if not out:
        raise RuntimeError(f"copying a {tuple(t.shape)} index tensor to {device} failed (see the thread's error above)")
    # the memory belongs to the thread's stream; were the cache to drop it, it must wait for this stream's work
    out[0].record_stream(torch.cuda.current_stream(device))
    return out[0]


def kept_on(t: torch.Tensor, name: str, build, *extra):
    """``build()``, a tensor derived from ``t``'s values, kept on ``t`` as attribute ``name`` and returned again while
    t's data pointer and version counter (an in-place write, an optimizer step or a load bumps it) and the objects
    ``extra`` (by identity; held, so their ids stay theirs) are the same. Not kept from inside a CUDA-graph capture,
    whose memory belongs to the graph."""
    key = (t.data_ptr(), t._version, *map(id, extra))
    hit = getattr(t, name, None)
    if hit is not None and hit[0] == key:
        return hit[2]
    value = build()
    if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
        setattr(t, name, (key, extra, value))
    return value


def on_device(build, grid, blocks, device):
    """``build(grid, blocks)`` (a tuple of CPU index tensors and ints, lru-cached by the caller) with its
    tensors moved to ``device``, cached per (build, grid, blocks, device) so repeated layers reuse one copy."""
    key = (build, grid, blocks, str(device))
    hit = _device_cache.get(key)
    if hit is None:
        hit = tuple(persistent_copy(x, device) if isinstance(x, torch.Tensor) else x for x in build(grid, blocks))
        if len(_device_cache) > 256:
            _device_cache.clear()
        _device_cache[key] = hit
    return hit


def block_token_lists(grid, blocks, device):
    """Tokens sorted by block (int32 (N,)), block offsets into it (int32 (M+1,)), largest block size.

    Cached per (grid, blocks, device) so repeated layers reuse one small index array.
    """
    grid, blocks = check_grid_blocks(grid, blocks)
    return on_device(_block_lists_cpu, grid, blocks, device)
