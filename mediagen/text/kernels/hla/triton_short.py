"""HLA of up to two chunks in two Triton launches (``hla_short``'s math is in short.py).

Blocks of BT tokens, the chunkwise form of Gated DeltaNet. In block b, with S its (D x D) start state, g the
cumulative log alpha from the block's start, Gamma = e^g, A_ts = beta_t k_t.k_s e^(g_t - g_s) (s < t) and
T = (I + A)^-1, the block's update terms are delta = U - W S with U = T diag(beta) V and W = T diag(beta Gamma) K;
its outputs o = (Gamma q) S + Aqk delta with Aqk_ts = q_t.k_s e^(g_t - g_s) (s <= t); its end state
e^(g_last) S + (e^(g_last - g) k)^T delta.

hla_short_blocks_kernel, program (block, batch x head), independent of the state: normalises q and k, makes
beta and log alpha, inverts (I + A) by forward substitution in registers and writes U, W, Gamma q,
e^(g_last - g) k, Aqk and e^(g_last). hla_short_scan_kernel, program (batch x head): walks the blocks with S
in registers; from the second chunk's first block on it also runs the state restarted at zero (o^in) and
blends o = lerp(o^in, o, gate); then the per-head RMSNorm, and each row is stored once in the output dtype.
Everything in fp32. The blocks' products are exact (the triangular inverse amplifies rounding); the walk's
are exact too, except for a bf16 output, where they take tf32 (products to 11 bits, finer than the 8 that
bf16 stores): exact products are slower, most at two chunks, also with fewer warps (measured:
benchmarks/RESULTS.md, Encoding latency).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from ....kernels.launch import CachedLaunch
from ....kernels.triton_dot import dot as _dot


@triton.jit
def hla_short_blocks_kernel(P, MASK, NEG_A, U, W, QG, KD, AQK, GLAST,
                            sp_b, sp_n, sm_b, sm_n, N, H, D,
                            BT: tl.constexpr, BD: tl.constexpr, HAS_MASK: tl.constexpr, IEEE: tl.constexpr,
                            SB: tl.constexpr):
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    nblk = tl.num_programs(0)
    b = (bh // H).to(tl.int64)
    h = bh % H
    r = tl.arange(0, BT)
    j = tl.arange(0, BD)
    t = blk * BT + r
    valid = t < N
    cols = valid[:, None] & (j[None, :] < D)
    row = P + b * sp_b + t.to(tl.int64) * sp_n
    q = tl.load(row[:, None] + h * D + j[None, :], mask=cols, other=0.0).to(tl.float32)
    k = tl.load(row[:, None] + (H + h) * D + j[None, :], mask=cols, other=0.0).to(tl.float32)
    v = tl.load(row[:, None] + (2 * H + h) * D + j[None, :], mask=cols, other=0.0).to(tl.float32)
    pre_beta = tl.load(row + 3 * H * D + h, mask=valid, other=0.0).to(tl.float32)
    pre_decay = tl.load(row + 3 * H * D + H + h, mask=valid, other=0.0).to(tl.float32)
    q = q / tl.maximum(tl.sqrt(tl.sum(q * q, 1)), 1e-12)[:, None]
    k = k / tl.maximum(tl.sqrt(tl.sum(k * k, 1)), 1e-12)[:, None]
    keep = valid
    if HAS_MASK:
        keep = keep & (tl.load(MASK + b * sm_b + t * sm_n, mask=valid, other=0) != 0)
    beta = tl.where(keep, 1.0 / (1.0 + tl.exp(-pre_beta)), 0.0)
    softplus = tl.where(pre_decay > 20.0, pre_decay, tl.log(1.0 + tl.exp(pre_decay)))  # F.softplus' threshold
    g = tl.cumsum(tl.where(keep, softplus * tl.load(NEG_A + h), 0.0), 0)
    # masked before exp: above the diagonal g_t - g_s >= 0 could overflow
    decay = tl.exp(tl.where(r[:, None] >= r[None, :], g[:, None] - g[None, :], float("-inf")))
    a = tl.where(r[:, None] > r[None, :], _dot(k, tl.trans(k), IEEE) * decay * beta[:, None], 0.0)
    # (I + A)^-1 by block forward substitution over diagonal blocks of SB rows: first every diagonal block's
    # inverse at once (row i of each block = e_i - sum_{s < i} A_is (row s), SB - 1 steps), then block row b
    # below them: T_bj = -T_bb sum_{k < b} A_bk T_kj for the blocks j < b
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    rb = r // SB
    same = rb[:, None] == rb[None, :]
    a_diag = tl.where(same, a, 0.0)
    inv = eye
    for i in tl.static_range(1, SB):
        rows = (r % SB) == i
        inv = tl.where(rows[:, None], eye - _dot(tl.where(rows[:, None], a_diag, 0.0), inv, IEEE), inv)
    diag_inv = inv
    for b in tl.static_range(1, BT // SB):
        below = (rb[:, None] == b) & (rb[None, :] < b)
        x = _dot(tl.where(below, a, 0.0), inv, IEEE)
        y = _dot(tl.where((rb[:, None] == b) & same, diag_inv, 0.0), x, IEEE)
        inv = tl.where(below, -y, inv)
    gamma = tl.exp(g)
    g_last = tl.sum(tl.where(r == BT - 1, g, 0.0), 0)
    dst = (bh.to(tl.int64) * nblk * BT + t)[:, None] * BD + j[None, :]
    tl.store(U + dst, _dot(inv, v * beta[:, None], IEEE))
    tl.store(W + dst, _dot(inv, k * (beta * gamma)[:, None], IEEE))
    tl.store(QG + dst, q * gamma[:, None])
    tl.store(KD + dst, k * tl.exp(g_last - g)[:, None])
    aqk = tl.where(r[:, None] >= r[None, :], _dot(q, tl.trans(k), IEEE) * decay, 0.0)
    tl.store(AQK + (bh.to(tl.int64) * nblk + blk) * BT * BT + r[:, None] * BT + r[None, :], aqk)
    tl.store(GLAST + bh.to(tl.int64) * nblk + blk, tl.exp(g_last))


@triton.jit
def hla_short_scan_kernel(U, W, QG, KD, AQK, GLAST, GATE, NW, OUT,
                          sg_b, sg_h, so_b, so_n, so_h, N, H, D, NBLK, RB, C, eps,
                          BT: tl.constexpr, BD: tl.constexpr, HAS_GATE: tl.constexpr, IEEE: tl.constexpr):
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = bh % H
    r = tl.arange(0, BT)
    j = tl.arange(0, BD)
    nw = tl.load(NW + j, mask=j < D, other=0.0).to(tl.float32)
    s = tl.zeros((BD, BD), dtype=tl.float32)
    s_in = tl.zeros((BD, BD), dtype=tl.float32)
    base = bh.to(tl.int64) * NBLK
    for blk in range(NBLK):
        t = blk * BT + r
        src = ((base + blk) * BT + r)[:, None] * BD + j[None, :]
        u = tl.load(U + src)
        w = tl.load(W + src)
        qg = tl.load(QG + src)
        kd = tl.load(KD + src)
        aqk = tl.load(AQK + (base + blk) * BT * BT + r[:, None] * BT + r[None, :])
        gl = tl.load(GLAST + base + blk)
        delta = u - _dot(w, s, IEEE)
        o = _dot(qg, s, IEEE) + _dot(aqk, delta, IEEE)
        s = gl * s + _dot(tl.trans(kd), delta, IEEE)
        if HAS_GATE:
            if blk >= RB:  # the second chunk: also GDN from the zero state at its start, blended by the gate
                delta_in = u - _dot(w, s_in, IEEE)
                o_in = _dot(qg, s_in, IEEE) + _dot(aqk, delta_in, IEEE)
                s_in = gl * s_in + _dot(tl.trans(kd), delta_in, IEEE)
                gate = tl.load(GATE + b * sg_b + h * sg_h + (t - C), mask=t < N, other=0.0).to(tl.float32)
                o = o_in + gate[:, None] * (o - o_in)
        o = o * tl.rsqrt(tl.sum(o * o, 1) / D + eps)[:, None] * nw[None, :]
        out = OUT + b * so_b + t.to(tl.int64)[:, None] * so_n + h * so_h + j[None, :]
        tl.store(out, o.to(OUT.dtype.element_ty), mask=(t < N)[:, None] & (j < D)[None, :])


SUB_BLOCK = 8   # rows of the diagonal blocks the inverse is built from


def block_tokens(chunk: int) -> int:
    """Tokens per block: 32, or 16 for a chunk that 32 does not divide (the second chunk starts on a block);
    0 when neither divides it (the Triton path cannot serve that chunk)."""
    return 32 if chunk % 32 == 0 else 16 if chunk % 16 == 0 else 0


@lru_cache(maxsize=64)
def _launches(B, N, H, D, chunk, p_strides, m_strides, g_strides, o_strides, eps, has_mask, exact_scan):
    """The two launches of one shape and layout, made once (``CachedLaunch``): at prompt lengths the kernels
    run for microseconds, and Triton's dispatch would cost more than they do. ``exact_scan``: the walk's
    products in exact fp32 (else tf32)."""
    bt = block_tokens(chunk)
    nblk = triton.cdiv(N, bt)
    bd = max(16, triton.next_power_of_2(D))
    has_gate = N > chunk
    blocks = CachedLaunch((nblk, B * H), (*p_strides, *m_strides, N, H, D),
                          dict(BT=bt, BD=bd, HAS_MASK=has_mask, IEEE=True, SB=SUB_BLOCK, num_warps=4))
    scan = CachedLaunch((B * H,), (*g_strides, *o_strides, N, H, D, nblk, chunk // bt, chunk, eps),
                        dict(BT=bt, BD=bd, HAS_GATE=has_gate, IEEE=exact_scan, num_warps=4))
    return blocks, scan, nblk * bt, nblk, bd, bt


def hla_short_triton(proj, heads: int, head_dim: int, neg_a, norm_weight, eps: float, *, chunk: int, mask=None,
                     gate=None, out_dtype=None):
    """The Triton path of ``hla_short`` (shapes in short.py); chunk must be a multiple of 16."""
    if not block_tokens(chunk):
        raise ValueError(f"chunk={chunk} is not allowed on the Triton path: a multiple of 16")
    B, N, _ = proj.shape
    H, D = heads, head_dim
    if proj.stride(-1) != 1:
        proj = proj.contiguous()
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.to(torch.uint8)
    if gate is not None and gate.stride(-1) != 1:
        gate = gate.contiguous()
    out = torch.empty(B, N, H, D, device=proj.device, dtype=out_dtype or proj.dtype)
    blocks, scan, npad, nblk, bd, bt = _launches(
        B, N, H, D, chunk, (proj.stride(0), proj.stride(1)), (0, 0) if mask is None else tuple(mask.stride()),
        (0, 0) if gate is None else (gate.stride(0), gate.stride(1)), tuple(out.stride()[:3]), float(eps),
        mask is not None, out.dtype != torch.bfloat16)
    # the blocks' terms in one allocation, each a contiguous part (as the kernels address them) of a length
    # that keeps the next 16-byte aligned (Triton specialises pointers on it): U, W, Gamma q, e^(g_last - g) k,
    # then Aqk and e^(g_last)
    m = B * H
    terms = torch.empty(4 * m * npad * bd + m * nblk * bt * bt + m * nblk, device=proj.device, dtype=torch.float32)
    u, w, qg, kd = terms[:4 * m * npad * bd].view(4, m, npad, bd).unbind(0)
    aqk = terms[4 * m * npad * bd:4 * m * npad * bd + m * nblk * bt * bt].view(m, nblk, bt, bt)
    glast = terms[4 * m * npad * bd + m * nblk * bt * bt:].view(m, nblk)
    blocks(hla_short_blocks_kernel, proj, proj if mask is None else mask, neg_a.float(), u, w, qg, kd, aqk, glast)
    scan(hla_short_scan_kernel, u, w, qg, kd, aqk, glast, u if gate is None else gate, norm_weight, out)
    return out
