"""Split-K (flash-decoding) Triton kernels for ``latent_decode``.

latent_decode_kernel: program (b*L + l, split s) owns the rows of latent l and a contiguous slice of
the T cached tokens: it streams that slice once, in place (the cache's own strides), with an online
softmax, and writes its partial (max, sum, weighted latents).
merge_splits_kernel: one program per (b, l) merges the splits' partials:
    out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s,   M = max_s m_s.
Splits spread a long context over the GPU when B*L alone would occupy few SMs (batch-1 decode).
Scores use exp2 with log2(e) folded into the scale. Accumulation is fp32; DOT_F32 upcasts the dot
operands (fp32 inputs, and the CPU interpreter); IEEE selects exact fp32 dots over tf32.
Latent l reads the rope query of group l % G (G = 1: every latent serves the same heads, as in
MLRA-4, without an expanded copy). ROTATE applies the new token's rotary rotation to the rope query
in the kernel: x * cos_full + swap_halves(x) * sin_signed (rope.apply_rope_tables), so the caller
needs no separate RoPE kernels.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ....kernels.switches import empty_output
from ....kernels.triton_dot import dot as _dot  # the shared dot of mediagen/kernels

_LOG2E = 1.4426950408889634


@triton.jit
def latent_decode_kernel(Q, QR, C, KR, ACC, ML, COS, SIN,
                         sqb, sql, sqr, sqd, srb, srl, srr, sre,
                         scb, sct, scl, scd, skb, skt, ske,
                         L, G, R, T, D, E, S, chunk, scale_log2,
                         BR: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr, BT: tl.constexpr,
                         HAS_ROPE: tl.constexpr, ROTATE: tl.constexpr, DOT_F32: tl.constexpr,
                         IEEE: tl.constexpr):
    bl = tl.program_id(0)
    s = tl.program_id(1)
    b = bl // L
    lat = bl % L
    rows = tl.arange(0, BR)
    dd = tl.arange(0, BD)
    ee = tl.arange(0, BE)
    tt = tl.arange(0, BT)
    rmask = rows < R
    q = tl.load(Q + b * sqb + lat * sql + rows[:, None] * sqr + dd[None, :] * sqd,
                mask=rmask[:, None] & (dd[None, :] < D), other=0.0)
    emask = rmask[:, None] & (ee[None, :] < E)
    qr_rows = QR + b * srb + (lat % G) * srl + rows[:, None] * srr
    qr = tl.load(qr_rows + ee[None, :] * sre, mask=emask, other=0.0)
    if ROTATE:  # x * [cos, cos] + [x2, x1] * [-sin, sin], in fp32, rounded back to the input dtype
        swapped = tl.load(qr_rows + ((ee + E // 2) % E)[None, :] * sre, mask=emask, other=0.0)
        cos = tl.load(COS + ee, mask=ee < E, other=0.0).to(tl.float32)
        sin = tl.load(SIN + ee, mask=ee < E, other=0.0).to(tl.float32)
        qr = (qr.to(tl.float32) * cos[None, :] + swapped.to(tl.float32) * sin[None, :]).to(qr.dtype)
    if DOT_F32:
        q = q.to(tl.float32)
        qr = qr.to(tl.float32)
    m = tl.full((BR,), -1.0e30, tl.float32)  # finite: a split without tokens gives no inf - inf
    lsum = tl.zeros((BR,), tl.float32)
    acc = tl.zeros((BR, BD), tl.float32)
    lo = s * chunk
    hi = tl.minimum(T, lo + chunk)
    for t0 in range(lo, hi, BT):
        t = t0 + tt
        tmask = t < hi
        c = tl.load(C + b * scb + t[:, None] * sct + lat * scl + dd[None, :] * scd,
                    mask=tmask[:, None] & (dd[None, :] < D), other=0.0)
        if DOT_F32:
            c = c.to(tl.float32)
        sc = _dot(q, tl.trans(c), IEEE)
        if HAS_ROPE:
            kr = tl.load(KR + b * skb + t[:, None] * skt + ee[None, :] * ske,
                         mask=tmask[:, None] & (ee[None, :] < E), other=0.0)
            if DOT_F32:
                kr = kr.to(tl.float32)
            sc += _dot(qr, tl.trans(kr), IEEE)
        sc = tl.where(tmask[None, :], sc * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(sc - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(c.dtype), c, IEEE)
        m = m_new
    part = bl * S + s
    tl.store(ACC + part * BR * BD + rows[:, None] * BD + dd[None, :], acc)
    tl.store(ML + part * 2 * BR + rows, m)
    tl.store(ML + part * 2 * BR + BR + rows, lsum)


@triton.jit
def merge_splits_kernel(ACC, ML, OUT, S, R, D, BR: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr):
    bl = tl.program_id(0)
    rows = tl.arange(0, BR)
    dd = tl.arange(0, BD)
    ss = tl.arange(0, BS)
    first = bl * S
    m_all = tl.load(ML + (first + ss)[:, None] * 2 * BR + rows[None, :], mask=(ss < S)[:, None], other=-1.0e30)
    l_all = tl.load(ML + (first + ss)[:, None] * 2 * BR + BR + rows[None, :], mask=(ss < S)[:, None], other=0.0)
    m_max = tl.max(m_all, axis=0)                                 # (BR,)
    den = tl.sum(tl.exp2(m_all - m_max[None, :]) * l_all, axis=0)  # empty splits: 2^(-1e30 - M) = 0
    out = tl.zeros((BR, BD), tl.float32)
    for s in range(0, S):
        w = tl.exp2(tl.load(ML + (first + s) * 2 * BR + rows) - m_max)
        out += tl.load(ACC + (first + s) * BR * BD + rows[:, None] * BD + dd[None, :]) * w[:, None]
    out = out / den[:, None]
    tl.store(OUT + bl * R * D + rows[:, None] * D + dd[None, :], out.to(OUT.dtype.element_ty),
             mask=(rows < R)[:, None] & (dd < D)[None, :])



def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def choose_splits(B: int, L: int, T: int, BT: int, device) -> int:
    """Splits per (batch, latent): enough programs for about two per SM, none shorter than 4 tiles."""
    forced = os.environ.get("MEDIAGEN_DECODE_SPLITS")
    if forced:
        return max(1, int(forced))
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(T, 4 * BT), triton.cdiv(2 * sms, B * L)))


def latent_decode_triton(q_lat, q_rope, latents, rope_keys, scale: float, splits: int | None = None,
                         rope_rotation=None):
    """The Triton path of ``latent_decode`` (shapes as there); reads every tensor in place. Two launches:
    the split-K pass and the merge."""
    B, L, R, D = q_lat.shape
    G = q_rope.shape[1]
    T, E = latents.shape[1], rope_keys.shape[-1]
    BR, BD = max(16, triton.next_power_of_2(R)), max(16, triton.next_power_of_2(D))
    BE = max(16, triton.next_power_of_2(max(E, 1)))
    BT = 64 if BD <= 128 else 32
    S = splits or choose_splits(B, L, T, BT, q_lat.device)
    chunk = triton.cdiv(triton.cdiv(T, S), BT) * BT  # split length, whole tiles
    # (the per-split workspace: NaN under poison_outputs, so a partial result the kernel forgets shows)
    acc, ml = empty_output((B * L, S, BR, BD), q_lat.device), empty_output((B * L, S, 2, BR), q_lat.device)
    dot_f32 = q_lat.dtype == torch.float32 or _interpreting()
    qr = q_rope if E else q_lat  # a valid pointer when there is no rope part (never read)
    kr = rope_keys if E else latents
    cos, sin = rope_rotation if rope_rotation is not None else (qr, qr)  # never read without ROTATE
    latent_decode_kernel[(B * L, S)](
        q_lat, qr, latents, kr, acc, ml, cos, sin,
        *q_lat.stride(), *qr.stride(), *latents.stride(), *rope_keys.stride(),
        L, G, R, T, D, E, S, chunk, float(scale) * _LOG2E,
        BR=BR, BD=BD, BE=BE, BT=BT, HAS_ROPE=E > 0, ROTATE=rope_rotation is not None and E > 0,
        DOT_F32=dot_f32, IEEE=q_lat.dtype == torch.float32, num_warps=4, num_stages=2)
    out = torch.empty(B, L, R, D, device=q_lat.device, dtype=q_lat.dtype)
    merge_splits_kernel[(B * L,)](acc, ml, out, S, R, D, BR=BR, BD=BD, BS=max(2, triton.next_power_of_2(S)),
                                  num_warps=4)
    return out
