"""MHLA on the Triton kernels.

Two entry points share one implementation (``forward_impl`` / ``backward_impl``):
- eager: a torch.autograd.Function (``_MHLAFunction``), the lowest per-call overhead;
- under torch.compile: torch.library custom ops ``mediagen::mhla_fwd`` / ``mediagen::mhla_bwd`` with
  fake implementations and registered autograd, so compiled models trace through without breaks.

Two forward algorithms (``algorithm``): "chunked" (per-block summaries in memory, mixed by a matmul;
long sequences) and "dense" (summaries recomputed on chip; short sequences); "auto" picks by a cost
model. The backward always runs the chunked kernels (for dMc it needs the block summaries).
"""

from __future__ import annotations

import math
import os

import torch
import triton

from .layout import block_token_lists, token_block_ids
from .triton_chunked import apply_kernel, key_grad_kernel, query_grad_kernel, summary_kernel
from .triton_dense import dense_forward_kernel

FEATURE_CODES = {"none": 0, "relu": 1, "elu1": 2}
ALGORITHMS = ("auto", "chunked", "dense")
# Tests set this to fill every output buffer with NaN before the kernels run, so an element a
# kernel forgets to write shows up.
POISON_OUTPUTS = False


def _new(shape, like, dtype):
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), device=like.device, dtype=dtype)
    return torch.empty(shape, device=like.device, dtype=dtype)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@torch.compiler.assume_constant_result
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _config(D: int):
    """Block sizes: BD covers the head dim, TILE columns per program, BT tokens per step."""
    BD = max(16, triton.next_power_of_2(D))
    TILE = min(BD, int(os.environ.get("MEDIAGEN_MHLA_TILE", 128)))
    BT = int(os.environ.get("MEDIAGEN_MHLA_BT", 64 if BD <= 128 else 32))
    warps = int(os.environ.get("MEDIAGEN_MHLA_WARPS", 4 if BD * TILE <= 8192 else 8))
    return BD, TILE, BT, warps


def choose_splits(B, H, M, largest_block, D, device) -> int:
    """Token splits per block so that the chunked kernels launch about 2 programs per SM."""
    forced = os.environ.get("MEDIAGEN_MHLA_SPLITS")
    if forced:
        return max(1, int(forced))
    if device.type != "cuda":
        return 1
    BD, TILE, BT, _ = _config(D)
    programs = B * H * M * (BD // TILE)
    want = math.ceil(2 * _num_sms(device.index or 0) / programs)
    return max(1, min(want, math.ceil(largest_block / BT)))


def choose_algorithm(B, N, H, D, M, splits, dtype) -> str:
    """Cost model in seconds on an H200-class GPU: bytes at ~3.5 TB/s, dot work at ~250 TFLOP/s,
    fp32 mixing at ~40 TFLOP/s, ~4 us per launch."""
    es = 4 if dtype == torch.float32 else 2
    BD = max(16, triton.next_power_of_2(D))
    X = D * D + D
    io = 4 * B * N * H * D * es
    chunked = (io + 4 * 4 * B * H * M * splits * X) / 3.5e12 + 2 * B * H * M * M * splits * X / 40e12 + 3 * 4e-6
    dense = io / 3.5e12 + 4 * B * H * N * N * BD / 250e12 + 4e-6
    return "dense" if dense < chunked else "chunked"


_blk_cache: dict = {}


def _token_blocks_int32(grid, blocks, device):
    key = (tuple(grid), tuple(blocks), str(device))
    hit = _blk_cache.get(key)
    if hit is None:
        hit = _blk_cache[key] = token_block_ids(grid, blocks, device).to(torch.int32)
    return hit


def _summaries(k, v, order, offsets, M, J, fcode):
    B, N, H, D = k.shape
    BD, TILE, BT, warps = _config(D)
    X = D * D + D
    sz = _new((B, H, M * J, X), k, torch.float32)
    summary_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        k, v, sz, order, offsets, *k.stride(), *v.stride(), H, M * J, J, D, X,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, DOT_F32=k.dtype == torch.float32 or _interpreting(),
        IEEE=k.dtype == torch.float32, num_warps=warps)
    return sz


def _mixed(mix, sz, J):
    """S~ = Mc @ S over (batch, head): (B, H, M, X) in fp32; J token splits are summed by the matmul."""
    m = mix.float()
    if J > 1:
        m = m.repeat_interleave(J, dim=-1)
    return torch.matmul(m, sz)


def forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits):
    """Returns (o, sz): sz holds the per-block (per-split) summaries for the backward, or is empty."""
    B, N, H, D = q.shape
    M = math.prod(blocks)
    fcode = FEATURE_CODES[feature_map]
    o = _new((B, N, H, D), q, q.dtype)
    ieee = q.dtype == torch.float32
    if algorithm == "dense":
        BD = max(16, triton.next_power_of_2(D))
        BT = 64 if BD <= 128 else 32
        mixf = mix.float().contiguous()
        dense_forward_kernel[(B * H, triton.cdiv(N, BT))](
            q, k, v, mixf, _token_blocks_int32(grid, blocks, q.device), o,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            N, H, D, M, M * M if mix.dim() == 3 else 0, eps, scale,
            BD=BD, BT=BT, BS=BT, FEATURE=fcode, NORMALIZE=normalize,
            DOT_F32=ieee or _interpreting(), IEEE=ieee, num_warps=4 if BD <= 64 else 8)
        return o, q.new_empty((0,), dtype=torch.float32)
    order, offsets, _ = block_token_lists(grid, blocks, q.device)
    sz = _summaries(k, v, order, offsets, M, splits, fcode)
    mixed = _mixed(mix, sz, splits)
    BD, TILE, BT, warps = _config(D)
    apply_kernel[(B * H, M * splits, triton.cdiv(D, TILE))](
        q, mixed, o, order, offsets, *q.stride(), *o.stride(), H, M, splits, D, D * D + D, eps, scale,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=ieee, num_warps=warps)
    return o, sz


def backward_impl(g, q, k, v, mix, o, sz, grid, blocks, normalize, eps, feature_map, scale, splits):
    B, N, H, D = q.shape
    M, J, X = math.prod(blocks), splits, D * D + D
    fcode = FEATURE_CODES[feature_map]
    order, offsets, _ = block_token_lists(grid, blocks, q.device)
    if sz.numel() == 0:  # the dense forward kept no summaries
        sz = _summaries(k, v, order, offsets, M, J, fcode)
    mixed = _mixed(mix, sz, J)
    BD, TILE, BT, warps = _config(D)
    ieee = q.dtype == torch.float32
    dq = _new((B, N, H, D), q, q.dtype)
    dsz_part = _new((B, H, M * J, X), q, torch.float32)
    query_grad_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        q, g, o, mixed, dq, dsz_part, order, offsets, *q.stride(), *g.stride(), *o.stride(), *dq.stride(),
        H, M, J, D, X, eps, scale,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=ieee, num_warps=warps)
    dmixed = dsz_part.view(B, H, M, J, X).sum(3) if J > 1 else dsz_part  # dS~ per query block
    dsz = torch.matmul(mix.float().transpose(-1, -2), dmixed)            # dS_b = Mc^T dS~
    block_sz = sz.view(B, H, M, J, X).sum(3) if J > 1 else sz
    dmix = torch.matmul(dmixed, block_sz.transpose(-1, -2)).sum(0)      # dMc_ib = <dS~_i, S_b>
    if mix.dim() == 2:
        dmix = dmix.sum(0)
    dk = _new((B, N, H, D), k, k.dtype)
    dv = _new((B, N, H, D), v, v.dtype)
    key_grad_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        k, v, dsz, dk, dv, order, offsets, *k.stride(), *v.stride(), *dk.stride(), *dv.stride(),
        H, M, J, D, X, BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, IEEE=ieee, num_warps=warps)
    return dq, dk, dv, dmix.to(mix.dtype)


# ---- eager path ---------------------------------------------------------------------------------

class _MHLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mix, *args):
        o, sz = forward_impl(q, k, v, mix, *args)
        ctx.save_for_backward(q, k, v, mix, o, sz)
        grid, blocks, normalize, eps, feature_map, scale, algorithm, splits = args
        ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, mix, o, sz = ctx.saved_tensors
        grads = backward_impl(g, q, k, v, mix, o, sz, *ctx.args)
        return (*grads,) + (None,) * 8


# ---- torch.compile path: custom ops -------------------------------------------------------------

@torch.library.custom_op("mediagen::mhla_fwd", mutates_args=())
def mhla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, grid: list[int],
             blocks: list[int], normalize: bool, eps: float, feature_map: str, scale: float, algorithm: str,
             splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    return forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits)


@mhla_fwd.register_fake
def _(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits):
    B, N, H, D = q.shape
    o = q.new_empty((B, N, H, D))
    if algorithm == "dense":
        return o, q.new_empty((0,), dtype=torch.float32)
    return o, q.new_empty((B, H, math.prod(blocks) * splits, D * D + D), dtype=torch.float32)


@torch.library.custom_op("mediagen::mhla_bwd", mutates_args=())
def mhla_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor,
             o: torch.Tensor, sz: torch.Tensor, grid: list[int], blocks: list[int], normalize: bool, eps: float,
             feature_map: str, scale: float, splits: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward_impl(g.contiguous() if g.stride(-1) == 0 else g, q, k, v, mix, o, sz, grid, blocks,
                         normalize, eps, feature_map, scale, splits)


@mhla_bwd.register_fake
def _(g, q, k, v, mix, o, sz, grid, blocks, normalize, eps, feature_map, scale, splits):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), mix.new_empty(mix.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits = inputs
    o, sz = output
    ctx.save_for_backward(q, k, v, mix, o, sz)
    ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)


def _backward(ctx, grad_o, grad_sz):
    q, k, v, mix, o, sz = ctx.saved_tensors
    grads = torch.ops.mediagen.mhla_bwd(grad_o, q, k, v, mix, o, sz, *ctx.args)
    return (*grads,) + (None,) * 8


mhla_fwd.register_autograd(_backward, setup_context=_setup_context)


def mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                algorithm="auto", splits=None):
    """Arguments already validated by ``mhla``. Returns o (B, N, H, D) in q's dtype."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    B, N, H, D = q.shape
    M = math.prod(blocks)
    if splits is None:
        largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
        splits = choose_splits(B, H, M, largest, D, q.device)
    if algorithm == "auto":
        algorithm = choose_algorithm(B, N, H, D, M, splits, q.dtype)
    args = (list(grid), list(blocks), normalize, float(eps), feature_map or "none",
            1.0 if scale is None else float(scale), algorithm, int(splits))
    if torch.compiler.is_compiling():
        return torch.ops.mediagen.mhla_fwd(q, k, v, mix, *args)[0]
    return _MHLAFunction.apply(q, k, v, mix, *args)
