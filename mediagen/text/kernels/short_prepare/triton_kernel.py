"""Triton kernels of MLRA's short path (the math is in reference.py).

short_prepare_kernel: program (token m, part): part 0 normalises the query latent c_q; part 1 + l
normalises latent head l and writes it with the token's rotated rope key after it, so the key
[c_l | rope(k_r)] of every latent head comes out of one launch where the torch ops take two norms, two
rope products and a concatenation. rope_columns_kernel: program m rotates, in place, the rope columns
of every query head of token m (one load of the whole row block before any store, so the half-swap
reads only values not yet written). Statistics and products in fp32; each output is rounded once.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from ....kernels.launch import CachedLaunch


@triton.jit
def short_prepare_kernel(Hs, COS, SIN, CQ, K,
                         shm, shx, scn, scx, scm, skm, skl, skx,
                         N, DQ, DL, E, eps_q, eps_kv,
                         BQ: tl.constexpr, BL: tl.constexpr, BE: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    row = Hs + m * shm
    if part == 0:
        jq = tl.arange(0, BQ)
        xq = tl.load(row + jq * shx, mask=jq < DQ, other=0.0).to(tl.float32)
        inv_q = tl.rsqrt(tl.sum(xq * xq, axis=0) / DQ + eps_q)
        tl.store(CQ + m * scm + jq, (xq * inv_q).to(CQ.dtype.element_ty), mask=jq < DQ)
    else:
        lat = part - 1
        dst = K + m * skm + lat * skl
        jl = tl.arange(0, BL)
        xl = tl.load(row + (DQ + lat * DL + jl) * shx, mask=jl < DL, other=0.0).to(tl.float32)
        inv_l = tl.rsqrt(tl.sum(xl * xl, axis=0) / DL + eps_kv)
        tl.store(dst + jl * skx, (xl * inv_l).to(K.dtype.element_ty), mask=jl < DL)
        n = m % N
        L = (tl.num_programs(1) - 1).to(tl.int64)
        e = tl.arange(0, BE)
        me = e < E
        src = row + (DQ + L * DL) * shx
        y = tl.load(src + e * shx, mask=me, other=0.0).to(tl.float32)
        swapped = tl.load(src + ((e + E // 2) % E) * shx, mask=me, other=0.0).to(tl.float32)
        cos = tl.load(COS + n * scn + e * scx, mask=me, other=0.0).to(tl.float32)
        sin = tl.load(SIN + n * scn + e * scx, mask=me, other=0.0).to(tl.float32)
        tl.store(dst + (DL + e) * skx, (y * cos + swapped * sin).to(K.dtype.element_ty), mask=me)


@triton.jit
def rope_columns_kernel(Q, COS, SIN, sqm, sqh, sqx, scn, scx, N, H, S, E,
                        BH: tl.constexpr, BE: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    n = m % N
    h = tl.arange(0, BH)[:, None]
    e = tl.arange(0, BE)[None, :]
    mask = (h < H) & (e < E)
    base = Q + m * sqm + h * sqh + S * sqx
    y = tl.load(base + e * sqx, mask=mask, other=0.0).to(tl.float32)
    swapped = tl.load(base + ((e + E // 2) % E) * sqx, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + n * scn + e * scx, mask=e < E, other=0.0).to(tl.float32)
    sin = tl.load(SIN + n * scn + e * scx, mask=e < E, other=0.0).to(tl.float32)
    tl.store(base + e * sqx, (y * cos + swapped * sin).to(Q.dtype.element_ty), mask=mask)


@lru_cache(maxsize=64)
def _prepare_launch(M, L, h_strides, cos_strides, cq_stride, k_strides, N, d_q, d_l, d_r, eps_q, eps_kv):
    """The launch of one shape and layout: made once, then launched directly (``CachedLaunch``): at prompt
    lengths these kernels run for a few µs, and Triton's dispatch would cost more than they do."""
    return CachedLaunch((M, L + 1), (*h_strides, *cos_strides, cq_stride, *k_strides, N, d_q, d_l, d_r, eps_q, eps_kv),
                        dict(BQ=triton.next_power_of_2(d_q), BL=triton.next_power_of_2(d_l),
                             BE=max(2, triton.next_power_of_2(d_r)), num_warps=1))


@lru_cache(maxsize=64)
def _rope_launch(M, q_strides, cos_strides, N, H, start, d_r):
    return CachedLaunch((M,), (*q_strides, *cos_strides, N, H, start, d_r),
                        dict(BH=triton.next_power_of_2(H), BE=max(2, triton.next_power_of_2(d_r)), num_warps=1))


def short_prepare_triton(h, d_q: int, latents: int, d_l: int, cos, sin, eps_q: float, eps_kv: float):
    """The Triton path of ``short_prepare`` (shapes in reference.py); h's last dim may be strided."""
    B, N, _ = h.shape
    d_r = cos.shape[-1]
    if h.stride(0) != N * h.stride(1):  # token m = b N + n is addressed as m * stride(1)
        h = h.contiguous()
    c_q = torch.empty(B, N, d_q, device=h.device, dtype=h.dtype)
    k = torch.empty(B, N, latents, d_l + d_r, device=h.device, dtype=h.dtype)
    launch = _prepare_launch(B * N, latents, h.stride()[1:], cos.stride(), c_q.stride(1), k.stride()[1:], N, d_q, d_l,
                             d_r, float(eps_q), float(eps_kv))
    launch(short_prepare_kernel, h, cos, sin, c_q, k)
    return c_q, k


def rope_columns_triton(q, start: int, cos, sin):
    """The Triton path of ``rope_columns``, in place on q (B, N, H, W) (returned)."""
    B, N, H, _ = q.shape
    _rope_launch(B * N, q.stride()[1:], cos.stride(), N, H, start, cos.shape[-1])(rope_columns_kernel, q, cos, sin)
    return q
