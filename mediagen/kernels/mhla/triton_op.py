"""MHLA on the Triton kernels, registered as torch.library custom ops (``mediagen::mhla_fwd`` and
``mediagen::mhla_bwd``) with fake implementations and autograd, so torch.compile traces models that
use them without graph breaks.

Two forward algorithms (``algorithm``): "chunked" (per-block summaries in memory, mixed by a matmul;
long sequences) and "dense" (summaries recomputed on chip; short sequences). "auto" picks by a cost
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


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def _config(D: int):
    """Block sizes: BD covers the head dim, TILE columns per program, BT tokens per step."""
    BD = max(16, triton.next_power_of_2(D))
    TILE = min(BD, int(os.environ.get("MEDIAGEN_MHLA_TILE", 64)))
    BT = int(os.environ.get("MEDIAGEN_MHLA_BT", 64 if BD <= 128 else 32))
    warps = int(os.environ.get("MEDIAGEN_MHLA_WARPS", 4 if BD * TILE <= 8192 else 8))
    return BD, TILE, BT, warps


def choose_splits(B, H, M, largest_block, D, device) -> int:
    """Token splits per block so that the chunked kernels launch about 2 programs per SM."""
    forced = os.environ.get("MEDIAGEN_MHLA_SPLITS")
    if forced:
        return max(1, int(forced))
    BD, TILE, BT, _ = _config(D)
    programs = B * H * M * (BD // TILE)
    want = math.ceil(2 * _num_sms(device) / programs)
    return max(1, min(want, math.ceil(largest_block / BT)))


def choose_algorithm(B, N, H, D, M, splits, device, dtype) -> str:
    """Cost model in seconds on an H200-class GPU: bytes at ~3.5 TB/s, dot work at ~250 TFLOP/s,
    fp32 mixing at ~40 TFLOP/s, ~4 us per launch."""
    es = torch.empty((), dtype=dtype).element_size()
    BD = max(16, triton.next_power_of_2(D))
    X = D * D + D
    io = 4 * B * N * H * D * es
    chunked = (io + 4 * 4 * B * H * M * splits * X) / 3.5e12 + 2 * B * H * M * M * splits * X / 40e12 + 3 * 4e-6
    dense = io / 3.5e12 + 4 * B * H * N * N * BD / 250e12 + 4e-6
    return "dense" if dense < chunked else "chunked"


def _mix_matmul(mix, sz, transpose=False):
    """Mixed summaries: (B, H, M, X) = mix (M, M') or (H, M, M') @ sz (B, H, M', X), in fp32."""
    m = mix.float()
    if transpose:
        m = m.transpose(-1, -2)
    return torch.matmul(m, sz)


def _summaries(k, order, offsets, B, N, H, D, M, J, feature_code, v):
    BD, TILE, BT, warps = _config(D)
    X = D * D + D
    sz = _new((B, H, M * J, X), k, torch.float32)
    dot_f32 = k.dtype == torch.float32 or _interpreting()
    summary_kernel[(B * H, M * J, BD // TILE)](
        k, v, sz, order, offsets, *k.stride(), *v.stride(), H, M * J, J, D, X,
        BD=BD, TILE=TILE, BT=BT, FEATURE=feature_code, DOT_F32=dot_f32, IEEE=k.dtype == torch.float32,
        num_warps=warps)
    return sz


@torch.library.custom_op("mediagen::mhla_fwd", mutates_args=())
def mhla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, grid: list[int],
             blocks: list[int], normalize: bool, eps: float, feature_map: str, scale: float, algorithm: str,
             splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, H, D = q.shape
    M = math.prod(blocks)
    fcode = FEATURE_CODES[feature_map]
    o = _new((B, N, H, D), q, q.dtype)
    ieee = q.dtype == torch.float32
    if algorithm == "dense":
        BD = max(16, triton.next_power_of_2(D))
        BT = 64 if BD <= 128 else 32
        blk = token_block_ids(grid, blocks, q.device).to(torch.int32)
        mixf = mix.float().contiguous()
        dense_forward_kernel[(B * H, triton.cdiv(N, BT))](
            q, k, v, mixf, blk, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            N, H, D, M, M * M if mix.dim() == 3 else 0, eps, scale,
            BD=BD, BT=BT, BS=BT, FEATURE=fcode, NORMALIZE=normalize,
            DOT_F32=ieee or _interpreting(), IEEE=ieee, num_warps=4 if BD <= 64 else 8)
        return o, q.new_empty((0,), dtype=torch.float32)
    order, offsets, _ = block_token_lists(grid, blocks, q.device)
    J = splits
    sz = _summaries(k, order, offsets, B, N, H, D, M, J, fcode, v)
    mixed = _mix_matmul(mix.repeat_interleave(J, dim=-1) if J > 1 else mix, sz).contiguous()
    BD, TILE, BT, warps = _config(D)
    apply_kernel[(B * H, M * J, BD // TILE)](
        q, mixed, o, order, offsets, *q.stride(), *o.stride(), H, M, J, D, D * D + D, eps, scale,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=ieee, num_warps=warps)
    return o, sz


@mhla_fwd.register_fake
def _(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits):
    B, N, H, D = q.shape
    o = torch.empty((B, N, H, D), device=q.device, dtype=q.dtype)
    if algorithm == "dense":
        return o, q.new_empty((0,), dtype=torch.float32)
    return o, q.new_empty((B, H, math.prod(blocks) * splits, D * D + D), dtype=torch.float32)


@torch.library.custom_op("mediagen::mhla_bwd", mutates_args=())
def mhla_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor,
             o: torch.Tensor, sz: torch.Tensor, grid: list[int], blocks: list[int], normalize: bool, eps: float,
             feature_map: str, scale: float, splits: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, N, H, D = q.shape
    M = math.prod(blocks)
    J = splits
    X = D * D + D
    fcode = FEATURE_CODES[feature_map]
    order, offsets, _ = block_token_lists(grid, blocks, q.device)
    if sz.numel() == 0:  # the dense forward kept no summaries
        sz = _summaries(k, order, offsets, B, N, H, D, M, J, fcode, v)
    mixJ = mix.repeat_interleave(J, dim=-1) if J > 1 else mix
    mixed = _mix_matmul(mixJ, sz).contiguous()
    if normalize:  # delta_t = g_t . o_t, as flash attention's backward
        delta = (g.float() * o.float()).sum(-1).contiguous()
    else:
        delta = mixed  # unused placeholder
    BD, TILE, BT, warps = _config(D)
    ieee = q.dtype == torch.float32
    dq = _new((B, N, H, D), q, q.dtype)
    dsz_part = _new((B, H, M * J, X), q, torch.float32)
    query_grad_kernel[(B * H, M * J, BD // TILE)](
        q, g, delta, mixed, dq, dsz_part, order, offsets, *q.stride(), *g.stride(), *dq.stride(),
        N, H, M, J, D, X, eps, scale,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=ieee, num_warps=warps)
    dmixed = dsz_part.view(B, H, M, J, X).sum(3) if J > 1 else dsz_part
    dsz = _mix_matmul(mix, dmixed, transpose=True).contiguous()
    blocks_sz = sz.view(B, H, M, J, X).sum(3) if J > 1 else sz
    dmix = torch.matmul(dmixed, blocks_sz.transpose(-1, -2)).sum(0)  # (H, M, M)
    if mix.dim() == 2:
        dmix = dmix.sum(0)
    dk = _new((B, N, H, D), k, k.dtype)
    dv = _new((B, N, H, D), v, v.dtype)
    key_grad_kernel[(B * H, M * J, BD // TILE)](
        k, v, dsz, dk, dv, order, offsets, *k.stride(), *v.stride(), *dk.stride(), *dv.stride(),
        H, M, J, D, X, BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, IEEE=ieee, num_warps=warps)
    return dq, dk, dv, dmix.to(mix.dtype)


@mhla_bwd.register_fake
def _(g, q, k, v, mix, o, sz, grid, blocks, normalize, eps, feature_map, scale, splits):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(mix)


def _setup_context(ctx, inputs, output):
    q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits = inputs
    o, sz = output
    ctx.save_for_backward(q, k, v, mix, o, sz)
    ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)


def _backward(ctx, grad_o, grad_sz):
    q, k, v, mix, o, sz = ctx.saved_tensors
    grid, blocks, normalize, eps, feature_map, scale, splits = ctx.args
    dq, dk, dv, dmix = torch.ops.mediagen.mhla_bwd(grad_o, q, k, v, mix, o, sz, grid, blocks, normalize, eps,
                                                   feature_map, scale, splits)
    return dq, dk, dv, dmix, None, None, None, None, None, None, None, None


mhla_fwd.register_autograd(_backward, setup_context=_setup_context)


def mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                algorithm="auto", splits=None):
    """Arguments already validated by ``mhla``. Returns o (B, N, H, D) in q's dtype."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    B, N, H, D = q.shape
    M = math.prod(blocks)
    if splits is None:
        largest = math.prod(-(-g // b) for g, b in zip(grid, blocks))  # ceil(L/b) tokens per axis at most
        splits = choose_splits(B, H, M, largest, D, q.device)
    if algorithm == "auto":
        algorithm = choose_algorithm(B, N, H, D, M, splits, q.device, q.dtype)
    o, _ = torch.ops.mediagen.mhla_fwd(q, k, v, mix, list(grid), list(blocks), normalize, float(eps),
                                       feature_map or "none", 1.0 if scale is None else float(scale),
                                       algorithm, int(splits))
    return o
