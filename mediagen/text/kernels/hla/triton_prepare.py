"""HLA's inference inputs from the layer's projections in one Triton pass (forward only).

Between the projections and the chunk summaries an HLA layer does about twenty small ops per call:
l2-normalise q and k, the routed query q̂ R_h, beta = sigmoid(.), log alpha = -exp(A_log) softplus(. + dt),
padding to whole chunks, the value padding fla's summaries need, and the bucket representatives
(in-bucket softmax attention of the keys, mean-pooled, projected). Each reads and writes (B, N, H, D)
tensors, several through permuted copies. Here one program per (batch·head, group of buckets) loads a
bucket's raw q, k, v rows once and writes every output:

    q̂ = q / max(|q|, 1e-12)       k̂ likewise              q_route = q̂ R_h
    beta = sigmoid(b)             log alpha = -exp(A_log) softplus(a + dt_bias)
    v_pad = [v | 0]               rep = mean_rows(softmax(k̂Wk (k̂Wk)^T / sqrt D) k̂Wv) Wo

Tokens past N (padding to whole chunks) are identity steps: q̂ = k̂ = v = 0, beta = 0, log alpha = 0,
and their zero keys still take part in their bucket's representative, as in the unpadded-then-padded
PyTorch path (``hla_prepare_reference``). No masks: a padding mask takes the PyTorch path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ....kernels.switches import kernel_switches
from ....kernels.triton_dot import dot as _dot  # the shared dot of mediagen/kernels
from .chunk import pad_to_chunks
from .router import bucket_representatives

BUCKETS_PER_PROGRAM = 8


@triton.jit
def hla_prepare_kernel(Q, K, V, BR, AR, RQ, WK, WV, WO, ALOG, DTB,
                       QN, KN, VP, QR, BETA, LA, REPS,
                       sx_b, sx_n, sx_h, sx_d, sg_b, sg_n, sg_h,
                       so_b, so_n, so_h, so_d, sv_b, sv_n, sv_h, sv_d, sl_b, sl_n, sl_h,
                       sr_b, sr_h, sr_c, sr_p, sr_d,
                       H, N, NP, D, POOL, NBC, NBUCKETS, scale,
                       BP: tl.constexpr, BD: tl.constexpr, GROUP: tl.constexpr, IEEE: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, BP)
    dd = tl.arange(0, BD)
    dmask = dd < D
    in_pool = rows < POOL
    wmask = dmask[:, None] & dmask[None, :]
    w_off = h * D * D + dd[:, None] * D + dd[None, :]
    rq = tl.load(RQ + w_off, mask=wmask, other=0.0)
    wk = tl.load(WK + w_off, mask=wmask, other=0.0)
    wv = tl.load(WV + w_off, mask=wmask, other=0.0)
    wo = tl.load(WO + w_off, mask=wmask, other=0.0).to(tl.float32)
    if IEEE:
        rq = rq.to(tl.float32)
        wk = wk.to(tl.float32)
        wv = wv.to(tl.float32)
    decay_rate = tl.exp(tl.load(ALOG + h).to(tl.float32))
    dt = tl.load(DTB + h).to(tl.float32)

    for i in range(GROUP):
        p = tl.program_id(1) * GROUP + i                      # global bucket index along the padded sequence
        t = p * POOL + rows
        keep = in_pool & (t < NP) & (p < NBUCKETS)          # rows this program writes
        real = keep & (t < N)                                 # rows holding tokens (the rest are padding)
        x_off = b * sx_b + t[:, None] * sx_n + h * sx_h + dd[None, :] * sx_d
        m2 = real[:, None] & dmask[None, :]
        q = tl.load(Q + x_off, mask=m2, other=0.0).to(tl.float32)
        k = tl.load(K + x_off, mask=m2, other=0.0).to(tl.float32)
        v = tl.load(V + x_off, mask=m2, other=0.0)
        qn = q / tl.maximum(tl.sqrt(tl.sum(q * q, axis=1)), 1e-12)[:, None]
        kn = k / tl.maximum(tl.sqrt(tl.sum(k * k, axis=1)), 1e-12)[:, None]
        o_off = b * so_b + t[:, None] * so_n + h * so_h + dd[None, :] * so_d
        w2 = keep[:, None] & dmask[None, :]
        tl.store(QN + o_off, qn.to(QN.dtype.element_ty), mask=w2)
        tl.store(KN + o_off, kn.to(KN.dtype.element_ty), mask=w2)
        v_off = b * sv_b + t[:, None] * sv_n + h * sv_h + dd[None, :] * sv_d
        tl.store(VP + v_off, v.to(VP.dtype.element_ty), mask=w2)                   # [v | 0]: fla's extra columns
        tl.store(VP + v_off + D * sv_d, tl.zeros([BP, BD], dtype=VP.dtype.element_ty), mask=w2)
        qr = _dot(qn.to(rq.dtype), rq, IEEE)
        tl.store(QR + o_off, qr.to(QR.dtype.element_ty), mask=w2)
        # per-token scalars: beta, log alpha (identity steps on padding)
        g_off = b * sg_b + t * sg_n + h * sg_h
        braw = tl.load(BR + g_off, mask=real, other=0.0).to(tl.float32)
        araw = tl.load(AR + g_off, mask=real, other=0.0).to(tl.float32) + dt
        softplus = tl.where(araw > 20.0, araw, tl.log(1.0 + tl.exp(tl.minimum(araw, 20.0))))
        beta = tl.where(real, 1.0 / (1.0 + tl.exp(-braw)), 0.0)
        la = tl.where(real, -decay_rate * softplus, 0.0)
        l_off = b * sl_b + t * sl_n + h * sl_h
        tl.store(BETA + l_off, beta.to(BETA.dtype.element_ty), mask=keep)
        tl.store(LA + l_off, la, mask=keep)
        # the bucket's representative: softmax self-attention of its keys, mean over its rows, then Wo
        kw = kn.to(wk.dtype)
        pk = _dot(kw, wk, IEEE)
        pv = _dot(kw, wv, IEEE)
        pk_op = pk.to(wk.dtype)
        s = _dot(pk_op, tl.trans(pk_op), IEEE) * scale
        s = tl.where(in_pool[None, :], s, float("-inf"))
        s = tl.exp(s - tl.max(s, axis=1)[:, None])
        attn = s / tl.sum(s, axis=1)[:, None]
        ctx = _dot(attn.to(wv.dtype), pv.to(wv.dtype), IEEE)
        pooled = tl.sum(tl.where(in_pool[:, None], ctx, 0.0), axis=0) / POOL       # (BD,)
        rep = tl.sum(pooled[:, None] * wo, axis=0)
        r_off = b * sr_b + h * sr_h + (p // NBC) * sr_c + (p % NBC) * sr_p + dd * sr_d
        tl.store(REPS + r_off, rep.to(REPS.dtype.element_ty), mask=dmask & (p < NBUCKETS))


def hla_prepare_reference(q, k, v, beta_raw, decay_raw, route_q, pool_k, pool_v, pool_o, a_log, dt_bias,
                          chunk: int, pool: int):
    """What ``hla_prepare_triton`` computes, from the layer's PyTorch pieces. q, k, v (B, N, H, D) raw
    projections; beta_raw, decay_raw (B, N, H). Returns q̂, k̂, v_pad (B, Np, H, 2D), q_route, beta,
    log_alpha (fp32), reps (B, H, nC, C/pool, D), padded to Np = whole chunks."""
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = torch.sigmoid(beta_raw)
    log_alpha = -a_log.exp() * F.softplus(decay_raw + dt_bias)
    qn, kn, v, log_alpha, beta, _ = pad_to_chunks(qn, kn, v, log_alpha, beta, chunk)
    q_route = torch.einsum("bnhd,hde->bnhe", qn, route_q.to(qn.dtype))
    reps = bucket_representatives(kn, pool_k.to(kn.dtype), pool_v.to(kn.dtype), pool_o.to(kn.dtype), chunk, pool)
    return qn, kn, F.pad(v, (0, q.shape[-1])), q_route, beta, log_alpha.float(), reps


def hla_prepare_triton(q, k, v, beta_raw, decay_raw, route_q, pool_k, pool_v, pool_o, a_log, dt_bias,
                       chunk: int, pool: int, *, ieee: bool | None = None):
    """The fused pass (see the module docstring); the same arguments and results as
    ``hla_prepare_reference``. q, k, v and the raw scalars may be strided views (e.g. slices of one
    fused projection's output). q, k, v must share one head dim D <= 128."""
    B, N, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one shape (B, N, H, D); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if beta_raw.shape != (B, N, H) or decay_raw.shape != (B, N, H) or beta_raw.stride() != decay_raw.stride():
        raise ValueError(f"beta_raw and decay_raw must be (B, N, H) = ({B}, {N}, {H}) views with one layout; "
                         f"got {tuple(beta_raw.shape)} and {tuple(decay_raw.shape)}")
    if q.stride() != k.stride() or q.stride() != v.stride():
        raise ValueError("q, k and v must share one memory layout (e.g. slices of one projection)")
    if chunk % pool:
        raise ValueError(f"pool={pool} must divide chunk={chunk}")
    if D > 128 or pool > 128:
        raise ValueError(f"head dim and pool up to 128 are supported; got D={D}, pool={pool}")
    if ieee is None:
        ieee = not q.is_cuda
    np_ = N + (-N) % chunk
    nbc, nbuckets = chunk // pool, np_ // pool
    new = lambda *shape, dtype=q.dtype: torch.empty(*shape, device=q.device, dtype=dtype)  # noqa: E731
    qn, kn, qr = new(B, np_, H, D), new(B, np_, H, D), new(B, np_, H, D)
    v_pad = new(B, np_, H, 2 * D)
    beta, log_alpha = new(B, np_, H), new(B, np_, H, dtype=torch.float32)
    reps = new(B, H, np_ // chunk, nbc, D)
    if kernel_switches().poison_outputs:
        for t in (qn, kn, qr, v_pad, beta, log_alpha, reps):
            t.fill_(float("nan"))
    wdt = q.dtype if q.dtype in (torch.float16, torch.bfloat16) and not ieee else torch.float32
    weights = [w.to(wdt).contiguous() for w in (route_q, pool_k, pool_v)] + [pool_o.float().contiguous()]
    bp, bd = max(16, triton.next_power_of_2(pool)), max(16, triton.next_power_of_2(D))
    group = BUCKETS_PER_PROGRAM
    grid = (B * H, triton.cdiv(nbuckets, group))
    hla_prepare_kernel[grid](
        q, k, v, beta_raw, decay_raw, *weights, a_log.float().contiguous(), dt_bias.float().contiguous(),
        qn, kn, v_pad, qr, beta, log_alpha, reps,
        *q.stride(), *beta_raw.stride(), *qn.stride(), *v_pad.stride(), *beta.stride(), *reps.stride(),
        H, N, np_, D, pool, nbc, nbuckets, 1.0 / math.sqrt(D),
        BP=bp, BD=bd, GROUP=group, IEEE=ieee, num_warps=4)
    return qn, kn, v_pad, qr, beta, log_alpha, reps


@torch.library.custom_op("mediagen::hla_prepare", mutates_args=())
def hla_prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta_raw: torch.Tensor, decay_raw: torch.Tensor,
                route_q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, pool_o: torch.Tensor,
                a_log: torch.Tensor, dt_bias: torch.Tensor, chunk: int, pool: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor]:
    """``hla_prepare_triton`` as an opaque op (torch.compile traces the layer through it)."""
    return hla_prepare_triton(q, k, v, beta_raw, decay_raw, route_q, pool_k, pool_v, pool_o, a_log, dt_bias,
                              chunk, pool)


@hla_prepare.register_fake
def _(q, k, v, beta_raw, decay_raw, route_q, pool_k, pool_v, pool_o, a_log, dt_bias, chunk, pool):
    B, N, H, D = q.shape
    np_ = N + (-N) % chunk
    tok = q.new_empty((B, np_, H, D))
    return (tok, torch.empty_like(tok), q.new_empty((B, np_, H, 2 * D)), torch.empty_like(tok),
            q.new_empty((B, np_, H)), q.new_empty((B, np_, H), dtype=torch.float32),
            q.new_empty((B, H, np_ // chunk, chunk // pool, D)))
