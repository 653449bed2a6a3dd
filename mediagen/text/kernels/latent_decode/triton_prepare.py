"""Triton kernel of ``decode_prepare`` (the math is in prepare_reference.py): one launch for the query
RMSNorm, the L latent heads' RMSNorms with the cache write, and the rope key's rotation with its cache
write, where the torch ops take about a dozen small kernels per decode step.

Program (b, part): part 0 normalises c_q, part 1 + l normalises latent head l, part L + 1 rotates the
rope key. Statistics in fp32; each output is rounded once, to its destination's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_row(src, sx, dst, sd, W, n, eps, BLOCK: tl.constexpr):
    """dst[j] = src[j] / sqrt(mean(src^2) + eps) * W[j], j < n."""
    j = tl.arange(0, BLOCK)
    m = j < n
    x = tl.load(src + j * sx, mask=m, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(W + j, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + j * sd, (x * inv * w).to(dst.dtype.element_ty), mask=m)


@triton.jit
def _rotate_row(src, sx, dst, sd, COS, SIN, n, BLOCK: tl.constexpr):
    """dst = src * cos_full + [src2, src1] * sin_signed over n entries (n even)."""
    j = tl.arange(0, BLOCK)
    m = j < n
    x = tl.load(src + j * sx, mask=m, other=0.0).to(tl.float32)
    swapped = tl.load(src + ((j + n // 2) % n) * sx, mask=m, other=0.0).to(tl.float32)
    cos = tl.load(COS + j, mask=m, other=0.0).to(tl.float32)
    sin = tl.load(SIN + j, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + j * sd, (x * cos + swapped * sin).to(dst.dtype.element_ty), mask=m)


@triton.jit
def decode_prepare_kernel(Hs, QW, KVW, COS, SIN, CQ, LAT, KR,
                          shb, shx, scb, slb, sll, sld, skb, ske,
                          DQ, L, DL, E, eps_q, eps_kv,
                          BQ: tl.constexpr, BL: tl.constexpr, BE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    row = Hs + b * shb
    if part == 0:
        _rms_norm_row(row, shx, CQ + b * scb, 1, QW, DQ, eps_q, BQ)
    elif part <= L:
        lat = part - 1
        _rms_norm_row(row + (DQ + lat * DL) * shx, shx, LAT + b * slb + lat * sll, sld, KVW + lat * DL, DL, eps_kv, BL)
    else:
        _rotate_row(row + (DQ + L * DL) * shx, shx, KR + b * skb, ske, COS, SIN, E, BE)


def decode_prepare_triton(h, q_weight, kv_weight, rope_rotation, latent_slot, rope_slot,
                          eps_q: float, eps_kv: float) -> torch.Tensor:
    """The Triton path of ``decode_prepare`` (shapes as in prepare_reference.py)."""
    B = h.shape[0]
    (L, d_l), d_q, d_r = kv_weight.shape, q_weight.shape[0], rope_slot.shape[-1]
    c_q = torch.empty(B, d_q, device=h.device, dtype=h.dtype)
    cos, sin = (t.contiguous() for t in rope_rotation)
    decode_prepare_kernel[(B, L + 1 + (d_r > 0))](  # no rope key: no last part
        h, q_weight.contiguous(), kv_weight.contiguous(), cos, sin, c_q, latent_slot, rope_slot,
        *h.stride(), c_q.stride(0), *latent_slot.stride(), *rope_slot.stride(),
        d_q, L, d_l, d_r, float(eps_q), float(eps_kv),
        BQ=triton.next_power_of_2(d_q), BL=triton.next_power_of_2(d_l), BE=max(2, triton.next_power_of_2(d_r)),
        num_warps=4)
    return c_q
