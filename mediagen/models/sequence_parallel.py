"""Run a converted all-MHLA Wan transformer sequence-parallel: each rank keeps a slab of whole
MHLA blocks of the token grid through every transformer block; self-attention exchanges only block
summaries (``mediagen.attention.sequence_parallel``), everything else in a block is per token.

    enable_sequence_parallel(transformer, group)   # every rank, same weights, same inputs
    out = transformer(latents, t, text).sample      # full output on every rank

Hooks: the transformer's pre-hook records the token grid of the call; a pre-hook on every block
cuts hidden states, RoPE tables and per-token time embeddings to this rank's slab; a hook on the
output projection all-gathers the slabs back before the unpatchify.

Training: every rank computes the same loss on the full output; the gather's backward hands each
rank the gradient of its own slab, so each rank's parameter gradients are its share of the total.
Call ``mediagen.attention.sequence_parallel.sum_gradients(model, group)`` after ``backward()`` (and
do not also average them across the same ranks with DDP). Needs every
self-attention layer to be MHLA with blocks[0] divisible by the world size, without CPE (a
convolution across slab borders). RoPE on features works: each rank rotates its tokens with the
rows of the tables its pre-hook cut.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from ..attention.sequence_parallel import sequence_parallel_mhla, shard_layout
from .latent_grid import video_grid
from .processors import WanMHLAProcessor


class SequenceParallelState:
    """What the hooks and processors of one model share: the group and the current call's grid."""

    def __init__(self, group, blocks):
        self.group = group
        self.blocks = tuple(blocks)
        self.grid: tuple[int, ...] | None = None
        self.span: tuple[int, int] = (0, 0)

    def set_grid(self, grid):
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        self.grid = tuple(grid)
        self.span = _spans(self.grid, self.blocks, world)[rank]

    def attend(self, core, q, k, v, rope=None):
        return sequence_parallel_mhla(q, k, v, core.mix, self.grid, core.blocks, group=self.group,
                                      normalize=core.normalize, eps=core.eps, feature_map=core.feature_map,
                                      scale=core.scale if not core.normalize else None, rope=rope)


class _GatherSlabs(torch.autograd.Function):
    """(B, N_r, C) slabs of all ranks -> (B, N, C) on every rank; backward: this rank's slab of the
    gradient (every rank computes the same loss on the full output)."""

    @staticmethod
    def forward(ctx, slab, spans, group):
        rank = dist.get_rank(group)
        longest = max(e - f for f, e in spans)
        padded = torch.nn.functional.pad(slab, (0, 0, 0, longest - slab.shape[1])).contiguous()
        parts = [torch.empty_like(padded) for _ in spans]
        dist.all_gather(parts, padded, group=group)
        ctx.span = spans[rank]
        return torch.cat([p[:, :e - f] for p, (f, e) in zip(parts, spans)], dim=1)

    @staticmethod
    def backward(ctx, grad):
        first, end = ctx.span
        return grad[:, first:end], None, None


def _check(transformer, world):
    procs = [blk.attn1.processor for blk in transformer.blocks]
    bad = [i for i, p in enumerate(procs) if not (isinstance(p, WanMHLAProcessor) and p.kind == "mhla")]
    if bad:
        raise ValueError(f"sequence parallelism needs MHLA in every self-attention layer; layers {bad} are not "
                         f"(convert with attention='mhla')")
    for i, p in enumerate(procs):
        if p.cpe is not None:
            raise ValueError(f"layer {i}: cpe_kernel is not supported sequence-parallel (its convolution "
                             f"crosses slab borders)")
        if p.core.blocks[0] % world:
            raise ValueError(f"layer {i}: blocks[0]={p.core.blocks[0]} must be divisible by the world size {world}")
    blocks = {p.core.blocks for p in procs}
    if len(blocks) != 1:
        raise ValueError(f"all layers must share one block layout for sequence parallelism; got {sorted(blocks)}")
    return procs, blocks.pop()


@functools.lru_cache(maxsize=64)
def _spans(grid: tuple, blocks: tuple, world: int) -> tuple[tuple[int, int], ...]:
    """(first, end) token of every rank's slab, computed once per layout."""
    return tuple(shard_layout(grid, blocks, r, world)[:2] for r in range(world))


def enable_sequence_parallel(transformer, group=None):
    """Shard a converted Wan transformer's tokens over ``group``; returns the hook handles."""
    world = dist.get_world_size(group)
    procs, blocks = _check(transformer, world)
    state = SequenceParallelState(group, blocks)
    for p in procs:
        p.sequence_parallel = state

    def record(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        state.set_grid(video_grid(x, module.config.patch_size))

    def cut(module, args, kwargs):
        n = math.prod(state.grid)
        first, end = state.span

        def local(t, dim):
            return t.narrow(dim, first, end - first) if t is not None and t.shape[dim] == n else t

        hidden, text, temb, rotary = args
        if temb.dim() == 4:  # per-token time embedding (Wan 2.2 ti2v)
            temb = local(temb, 1)
        rotary = tuple(local(r, 1) for r in rotary) if rotary is not None else None
        return (local(hidden, 1), text, temb, rotary), kwargs

    def gather(module, args, kwargs, out):
        return _GatherSlabs.apply(out, _spans(state.grid, blocks, dist.get_world_size(group)), group)

    handles = [transformer.register_forward_pre_hook(record, with_kwargs=True)]
    handles += [blk.register_forward_pre_hook(cut, with_kwargs=True) for blk in transformer.blocks]
    # gathered after the output projection, so the output head too runs on slabs and every
    # parameter's gradient on a rank is that rank's share
    handles.append(transformer.proj_out.register_forward_hook(gather, with_kwargs=True))
    return handles
