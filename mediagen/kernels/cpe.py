"""Conditional positional encoding (CPE) added to an attention output, in one Triton launch.

    out[b, t, c] = o[b, t, c] + bias[c] + sum_taps w[c, tap] * v[b, t + offset(tap), c]

a depthwise convolution of the tokens v (B, N, C) over their (G0, G1, G2) grid (row-major, zero past the
grid's ends, odd kernel sizes centred on the token) plus its bias, added to o (B, N, C). The tokens stay in
their own layout: no channels-first copy, no separate add. Where a model samples on a GPU this replaces a
layout copy, the conv and the add, and their host time eager (measured: benchmarks/RESULTS.md, Alternatives behind
the defaults and rules); accumulation is fp32 with one rounding at the end. An MHLA layer sampling eager hands its
CPE to the op instead, whose dense forward adds the same sum before it stores o (``kernels/mhla/triton_dense.py``)
while its launch fits in one wave.

Forward only: training goes through ``nn.Conv*`` and autograd. ``cpe_add_reference`` is the plain-PyTorch
oracle (``torch.nn.functional.conv3d``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import CachedLaunch


@triton.jit
def cpe_taps(acc, vbase, t, tmask, cols, cmask, svn, svd, W, ch, N, G1, G2,
             K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr):
    """acc (tokens t x columns cols, fp32) plus the depthwise taps of v at those tokens: v's columns ``cols``
    (stride ``svd``, tokens ``svn`` from ``vbase``) are the channels ``ch`` of the weights W (C, K0 * K1 * K2).
    (Also the dense MHLA forward's epilogue, kernels/mhla/triton_dense.py.)"""
    plane = G1 * G2
    G0 = N // plane
    f = t // plane
    y = (t // G2) % G1
    x = t % G2
    for i in tl.static_range(K0):
        fi = f + (i - K0 // 2)
        fok = tmask & (fi >= 0) & (fi < G0)
        for j in tl.static_range(K1):
            yj = y + (j - K1 // 2)
            yok = fok & (yj >= 0) & (yj < G1)
            for l in tl.static_range(K2):
                xl = x + (l - K2 // 2)
                ok = yok & (xl >= 0) & (xl < G2)
                s = (fi * G1 + yj) * G2 + xl
                tap = tl.load(vbase + s.to(tl.int64)[:, None] * svn + cols[None, :] * svd,
                              mask=ok[:, None] & cmask[None, :], other=0.0)
                w = tl.load(W + ch * (K0 * K1 * K2) + ((i * K1 + j) * K2 + l), mask=cmask, other=0.0)
                acc += tap.to(tl.float32) * w.to(tl.float32)[None, :]
    return acc


@triton.jit
def cpe_add_kernel(O, V, W, BIAS, OUT, N, C, G1, G2, sob, son, svb, svn,
                   K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BT: tl.constexpr, BC: tl.constexpr):
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    tmask = t < N
    cmask = c < C
    acc = cpe_taps(tl.zeros((BT, BC), dtype=tl.float32), V + b * svb, t, tmask, c, cmask, svn, 1, W, c, N, G1, G2,
                   K0, K1, K2)
    if HAS_BIAS:
        acc += tl.load(BIAS + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    m = tmask[:, None] & cmask[None, :]
    rows = t.to(tl.int64)[:, None]
    acc += tl.load(O + b * sob + rows * son + c[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + b * N * C + rows * C + c[None, :], acc.to(OUT.dtype.element_ty), mask=m)


def grid3(grid) -> tuple[int, int, int]:
    """A 1D, 2D or 3D grid as (G0, G1, G2), leading axes of length 1."""
    grid = tuple(int(g) for g in grid)
    return (1,) * (3 - len(grid)) + grid


def check_cpe_args(o, v, weight, bias, grid):
    """One-line errors for arguments the kernel cannot take; returns (grid3, kernel3)."""
    if o.dim() != 3 or v.shape != o.shape:
        raise ValueError(f"o and v must both be (B, N, C); got o {tuple(o.shape)}, v {tuple(v.shape)}")
    B, N, C = o.shape
    if not 1 <= len(grid) <= 3 or math.prod(grid) != N:
        raise ValueError(f"grid={tuple(grid)} must have 1 to 3 axes whose product is the token count N={N}")
    k = tuple(weight.shape[2:])
    if weight.shape[:2] != (C, 1) or len(k) != len(grid) or any(a % 2 == 0 for a in k):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; allowed: ({C}, 1, *k) with one odd size per "
                         f"grid axis ({len(grid)})")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; allowed: ({C},) or None")
    return grid3(grid), (1,) * (3 - len(k)) + k


def cpe_add_reference(o, v, weight, bias, grid):
    """``o + depthwise_conv(v over grid) + bias`` with torch ops in float64, returned in the dtype ``o + v``
    promotes to."""
    check_cpe_args(o, v, weight, bias, grid)
    B, N, C = v.shape
    g3 = grid3(grid)
    k = (1,) * (3 - (weight.dim() - 2)) + tuple(weight.shape[2:])
    x = v.transpose(1, 2).reshape(B, C, *g3).double()  # (float64: a GPU's fp32 conv may round to tf32)
    conv = torch.nn.functional.conv3d(x, weight.reshape(C, 1, *k).double(),
                                      None if bias is None else bias.double(), padding=tuple(a // 2 for a in k),
                                      groups=C)
    return (o.double() + conv.flatten(2).transpose(1, 2)).to(torch.promote_types(o.dtype, v.dtype))


def _launch(shape, strides, g3, k3, has_bias) -> CachedLaunch:
    B, N, C = shape
    (sob, son), (svb, svn) = strides
    # 16 tokens x 64 channels, 2 warps: the best over image-mhla's B = 2 and 128 and video-mhla's B = 2 together
    # (measured: benchmarks/RESULTS.md, Kernel launch settings, CPE)
    BT, BC = 16, min(64, max(16, triton.next_power_of_2(C)))
    return CachedLaunch((triton.cdiv(N, BT), triton.cdiv(C, BC), B), (N, C, g3[1], g3[2], sob, son, svb, svn),
                        dict(K0=k3[0], K1=k3[1], K2=k3[2], HAS_BIAS=has_bias, BT=BT, BC=BC, num_warps=2))


_launches: dict = {}


def _unit_channels(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def cpe_add(o, v, weight, bias, grid):
    """``cpe_add_reference`` in one launch (o, v on a GPU, or on a CPU under TRITON_INTERPRET=1). Returns a new
    contiguous (B, N, C) tensor; nothing is differentiated."""
    o, v = _unit_channels(o), _unit_channels(v)
    key = (o.shape, o.stride(), v.stride(), tuple(grid), tuple(weight.shape), bias is not None)
    launch = _launches.get(key)
    if launch is None:
        g3, k3 = check_cpe_args(o, v, weight, bias, grid)
        if len(_launches) >= 256:
            _launches.clear()
        launch = _launches[key] = _launch(o.shape, (o.stride()[:2], v.stride()[:2]), g3, k3, bias is not None)
    out = torch.empty(o.shape, device=o.device, dtype=torch.promote_types(o.dtype, v.dtype))
    w = weight if weight.is_contiguous() else weight.contiguous()
    launch(cpe_add_kernel, o, v, w, w if bias is None else bias, out)
    return out


@torch.library.triton_op("mediagen::cpe_add", mutates_args=())
def cpe_add_op(o: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, grid: list[int]
               ) -> torch.Tensor:
    """``cpe_add`` for traced code: Inductor's generated code launches the kernel (no Python call per step)."""
    from torch.library import wrap_triton

    o, v = _unit_channels(o), _unit_channels(v)
    g3, k3 = check_cpe_args(o, v, weight, bias, grid)
    launch = _launch(o.shape, (o.stride()[:2], v.stride()[:2]), g3, k3, True)
    out = torch.empty(o.shape, device=o.device, dtype=torch.promote_types(o.dtype, v.dtype))
    wrap_triton(cpe_add_kernel)[launch.grid](o, v, weight.contiguous(), bias, out, *launch.scalars, **launch.consts)
    return out
