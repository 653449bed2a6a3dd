"""Fused HLA readout for inference: the chunk gates computed on chip and the walk over past chunks,
in one Triton kernel (forward only).

The plain-PyTorch path (``router.chunk_gates`` then ``chunk.hla_walk``) writes every token's gate for
every past chunk to memory (B·H·N·nC values, each from nb bucket scores) and walks in nC − 1 batched
GEMM steps, each a round trip of all effective queries r through memory. Here program
(b·h, query chunk c, token tile) keeps its tile of r (BT × K) and of the output (BT × V) in
registers and visits the past chunks j = c−1, ..., 0 (or a listed subset, newest first):

    g   = sigmoid(log mean_p exp(q_route · rep_{j,p} / sqrt(D)) + bias)      one gate per token
    out += g · (r b_j),      r <- r + g · r (A_j − I)                          (A^ = g A + (1−g) I)

so nothing of size N × nC reaches memory. The wrapper hands the kernel A − I rather than A (one
product per step, and A − I keeps its small entries' precision when rounded) and, for half-precision
layers on a GPU, the maps in that half dtype: each step's two products then run on bf16/fp16 tensor
cores with r rounded to the same dtype as their operand, while r and the output accumulate in fp32
registers (``map_dtype`` chooses; fp32 maps give tf32 products, ``ieee`` exact fp32 ones).
Programs of the last chunks walk longest; they are launched first (chunk index descending along
grid axis 0, the fastest-varying one, so the programs in flight at once share a batch·head). No
gradients: training, and the paper's gate regularisers (which need every gate), use the PyTorch path.

``hla_readout_tokens`` is the layer's entry point, a torch.library custom op (with a fake
implementation) so that torch.compile traces an HLA layer through it without a graph break.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import triton
import triton.language as tl

from ....kernels.switches import kernel_switches
from ....kernels.triton_dot import dot as _dot  # the shared dot of mediagen/kernels



@dataclass(frozen=True)
class ReadoutSettings:
    """The readout kernel's launch: BT tokens per program at padded head dims up to 64 (``BT64``) and up to 128
    (``BT128``), warps, pipeline stages. ``python -m benchmarks text_encoders --readout FIELD=V1,V2`` measures the
    choices inside a whole encoder (benchmarks/RESULTS.md, HLA kernels)."""

    BT64: int = 64
    BT128: int = 32
    warps: int = 4
    stages: int = 3


_readout: contextvars.ContextVar[ReadoutSettings] = contextvars.ContextVar("hla_readout_settings",
                                                                           default=ReadoutSettings())


def readout_settings() -> ReadoutSettings:
    """The readout's launch settings in force here and now (this thread's)."""
    return _readout.get()


@contextlib.contextmanager
def use_readout_settings(**fields) -> Iterator[ReadoutSettings]:
    """Launch the readout with these fields replaced, in this thread, for the block; yields the settings in
    force. An unknown field raises ValueError naming the allowed ones."""
    names = [f.name for f in dataclasses.fields(ReadoutSettings)]
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ValueError(f"the HLA readout has no launch setting {', '.join(map(repr, unknown))}: its settings are "
                         f"{', '.join(names)}")
    token = _readout.set(dataclasses.replace(_readout.get(), **fields))
    try:
        yield _readout.get()
    finally:
        _readout.reset(token)

_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def hla_readout_kernel(OUT, OI, R, A, BM, QR, REPS, ORDER, NW,
                       so_b, so_h, so_c, so_l, so_v,
                       si_b, si_h, si_c, si_l, si_v,
                       sr_b, sr_h, sr_c, sr_l, sr_k,
                       sa_b, sa_h, sa_c, sa_i, sa_j,
                       sb_b, sb_h, sb_c, sb_k, sb_v,
                       sq_b, sq_n, sq_h, sq_d,
                       sp_b, sp_h, sp_c, sp_p, sp_d,
                       sd_b, sd_h, sd_c, sd_m,
                       H, NC, C, K, V, D, NB, STEPS, TILES, score_scale_log2, bias_lme, norm_eps,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
                       BNB: tl.constexpr, INDEXED: tl.constexpr, IEEE: tl.constexpr, NORM: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    ct = tl.program_id(0)
    c = NC - 1 - ct // TILES                     # longest walks first
    ll = (ct % TILES) * BT + tl.arange(0, BT)
    kk = tl.arange(0, BK)
    vv = tl.arange(0, BV)
    dd = tl.arange(0, BD)
    pp = tl.arange(0, BNB)
    lmask = ll < C
    kmask = kk < K
    vmask = vv < V
    dmask = dd < D
    pmask = pp < NB

    r = tl.load(R + b * sr_b + h * sr_h + c * sr_c + ll[:, None] * sr_l + kk[None, :] * sr_k,
                mask=lmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
    acc = tl.load(OI + b * si_b + h * si_h + c * si_c + ll[:, None] * si_l + vv[None, :] * si_v,
                  mask=lmask[:, None] & vmask[None, :], other=0.0).to(tl.float32)
    qr = tl.load(QR + b * sq_b + (c * C + ll[:, None]) * sq_n + h * sq_h + dd[None, :] * sq_d,
                 mask=lmask[:, None] & dmask[None, :], other=0.0)
    if IEEE:
        qr = qr.to(tl.float32)

    if INDEXED:
        n_steps = STEPS
    else:
        n_steps = c
    for m in range(0, n_steps):
        if INDEXED:
            j = tl.load(ORDER + b * sd_b + h * sd_h + c * sd_c + m * sd_m)
            on = (j >= 0).to(tl.float32)
            j = tl.maximum(j, 0)
        else:
            j = c - 1 - m
            on = 1.0
        # the gate: log-mean-exp over the chunk's bucket representatives, in base 2 on chip
        reps = tl.load(REPS + b * sp_b + h * sp_h + j * sp_c + pp[:, None] * sp_p + dd[None, :] * sp_d,
                       mask=pmask[:, None] & dmask[None, :], other=0.0)
        if IEEE:
            reps = reps.to(tl.float32)
        s = _dot(qr, tl.trans(reps), IEEE) * score_scale_log2          # (BT, BNB), log2 units
        s = tl.where(pmask[None, :], s, float("-inf"))
        top = tl.max(s, axis=1)
        lme = (top + tl.log2(tl.sum(tl.exp2(s - top[:, None]), axis=1))) * _LN2 + bias_lme
        g = on / (1.0 + tl.exp(-lme))
        # the chunk's affine map as ``step_maps`` wrote it (A holds A_j - I), products in the maps' dtype
        # with fp32 accumulation; padded rows/columns load as 0 and stay 0 in r
        a = tl.load(A + b * sa_b + h * sa_h + j * sa_c + kk[:, None] * sa_i + kk[None, :] * sa_j,
                    mask=kmask[:, None] & kmask[None, :], other=0.0)
        bm = tl.load(BM + b * sb_b + h * sb_h + j * sb_c + kk[:, None] * sb_k + vv[None, :] * sb_v,
                     mask=kmask[:, None] & vmask[None, :], other=0.0)
        if IEEE:
            a = a.to(tl.float32)
            bm = bm.to(tl.float32)
        r_op = r.to(a.dtype)
        yb = _dot(r_op, bm, IEEE)
        ya = _dot(r_op, a, IEEE)
        acc += g[:, None] * yb
        r += g[:, None] * ya

    if NORM:  # the layer's per-head RMSNorm, on the fp32 row (padded columns are 0)
        w = tl.load(NW + vv, mask=vmask, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(acc * acc, axis=1) / V + norm_eps)
        acc = acc * inv[:, None] * w[None, :]
    out_off = b * so_b + h * so_h + c * so_c + ll[:, None] * so_l + vv[None, :] * so_v
    tl.store(OUT + out_off, acc.to(OUT.dtype.element_ty), mask=lmask[:, None] & vmask[None, :])


def _check(o_intra, r, a, b, q_route, reps, order):
    if o_intra.dim() != 5:
        raise ValueError(f"o_intra must be (B, H, nC, C, V); got shape {tuple(o_intra.shape)}")
    B, H, NC, C, V = o_intra.shape
    K = r.shape[-1]
    want = {"r": (r, (B, H, NC, C, K)), "a": (a, (B, H, NC, K, K)), "b": (b, (B, H, NC, K, V))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; o_intra {tuple(o_intra.shape)} needs {shape}")
    if q_route.dim() != 4 or tuple(q_route.shape[:3]) != (B, NC * C, H):
        raise ValueError(f"q_route must be (B, nC*C, H, D) = ({B}, {NC * C}, {H}, D); got {tuple(q_route.shape)}")
    D = q_route.shape[-1]
    if reps.dim() != 5 or tuple(reps.shape[:3]) != (B, H, NC) or reps.shape[-1] != D:
        raise ValueError(f"reps must be (B, H, nC, nb, D) = ({B}, {H}, {NC}, nb, {D}); got {tuple(reps.shape)}")
    if reps.dtype != q_route.dtype:
        raise ValueError(f"reps ({reps.dtype}) and q_route ({q_route.dtype}) must share one dtype")
    if order is not None:
        if order.dim() != 4 or tuple(order.shape[:3]) != (B, H, NC):
            raise ValueError(f"order must be (B, H, nC, k) = ({B}, {H}, {NC}, k); got {tuple(order.shape)}")
        if order.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"order must hold integer chunk indices; got {order.dtype}")
    devices = {t.device for t in (o_intra, r, a, b, q_route, reps)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device; got {sorted(map(str, devices))}")
    if max(K, V, D) > 128:
        raise ValueError(f"head dims up to 128 are supported by the fused readout; got K={K}, V={V}, D={D}")


def step_maps(a, b, dtype):
    """The maps the kernel walks with: (A - I, b) in ``dtype``, A - I formed before the rounding."""
    eye = torch.eye(a.shape[-1], device=a.device, dtype=torch.float32)
    return (a.float() - eye).to(dtype).contiguous(), b.to(dtype).contiguous()


def hla_readout_triton(o_intra, r, a, b, q_route, reps, bias: float, order=None, *, ieee: bool | None = None,
                       block_tokens: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                       norm_weight=None, norm_eps: float = 1e-6, out=None, map_dtype: torch.dtype | None = None):
    """HLA output per chunk (B, H, nC, C, V) in fp32: the current chunk's ``o_intra`` plus the gated walk
    over past chunks, with the gates computed from ``q_route`` (B, nC·C, H, D) and the chunks' bucket
    representatives ``reps`` (B, H, nC, nb, D) exactly as ``router.chunk_gates`` does.

    order (B, H, nC, k): visit only these past chunks (newest first, −1 = none), as
    ``chunk.hla_walk_indexed`` does; None visits every past chunk. ``ieee``: exact fp32 products
    (default: on the CPU interpreter and for fp64 inputs' callers; tf32 / bf16 tensor cores otherwise).
    ``norm_weight`` (V,): apply RMSNorm over V with this weight before the store (as ``nn.RMSNorm``).
    ``out``: write into this (B, H, nC, C, V) tensor or strided view instead (any float dtype; a
    permuted view of a (B, nC·C, H, V) buffer gives the layer's token-major layout directly).
    ``map_dtype``: the dtype of the walk's products (see the module docstring); default q_route's dtype
    when that is fp16/bf16 and the products are not ``ieee``, else fp32.
    """
    _check(o_intra, r, a, b, q_route, reps, order)
    B, H, NC, C, V = o_intra.shape
    K, D, NB = r.shape[-1], q_route.shape[-1], reps.shape[3]
    if ieee is None:
        ieee = not o_intra.is_cuda
    if map_dtype is None:
        half = q_route.dtype in (torch.float16, torch.bfloat16)
        map_dtype = q_route.dtype if half and not ieee else torch.float32
    elif map_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"map_dtype={map_dtype} is not allowed: use torch.float32, torch.float16 or torch.bfloat16")
    a, b = step_maps(a, b, map_dtype)
    bk, bv, bd = (max(16, triton.next_power_of_2(x)) for x in (K, V, D))
    bnb = max(16, triton.next_power_of_2(NB))
    launch = _readout.get()
    bt = block_tokens or min(launch.BT64 if max(bk, bv) <= 64 else launch.BT128,
                             max(16, triton.next_power_of_2(C)))
    tiles = triton.cdiv(C, bt)
    if out is None:
        out = torch.empty(B, H, NC, C, V, device=o_intra.device, dtype=torch.float32)
    elif tuple(out.shape) != (B, H, NC, C, V) or out.device != o_intra.device:
        raise ValueError(f"out must be ({B}, {H}, {NC}, {C}, {V}) on {o_intra.device}; got {tuple(out.shape)} "
                         f"on {out.device}")
    if norm_weight is not None and tuple(norm_weight.shape) != (V,):
        raise ValueError(f"norm_weight must have shape ({V},); got {tuple(norm_weight.shape)}")
    if B * H > 65535:
        raise ValueError(f"batch x heads = {B * H} is above the 65,535 programs of the launch grid's second axis; "
                         "split the batch")
    if kernel_switches().poison_outputs:
        out.fill_(float("nan"))
    if order is None:
        order_t, steps, indexed = torch.zeros(1, 1, 1, 1, dtype=torch.int32, device=o_intra.device), 0, False
    else:
        order_t, steps, indexed = order.to(torch.int32), order.shape[-1], True
    # chunk tiles along axis 0 (launched first): the programs in flight share one (batch, head) and so
    # its maps, which stay in L2 (across batch·heads the maps of a batch of 16 are ~100 MB, beyond it)
    grid = (NC * tiles, B * H)
    hla_readout_kernel[grid](
        out, o_intra, r, a, b, q_route, reps, order_t, out if norm_weight is None else norm_weight,
        *out.stride(), *o_intra.stride(), *r.stride(), *a.stride(), *b.stride(), *q_route.stride(), *reps.stride(),
        *order_t.stride(),
        H, NC, C, K, V, D, NB, steps, tiles, _LOG2E / math.sqrt(D), float(bias) - math.log(NB),
        float(norm_eps), BT=bt, BK=bk, BV=bv, BD=bd, BNB=bnb, INDEXED=indexed, IEEE=ieee, NORM=norm_weight is not None,
        num_warps=num_warps or launch.warps, num_stages=num_stages or launch.stages)
    return out


@torch.library.custom_op("mediagen::hla_readout_tokens", mutates_args=())
def hla_readout_tokens(o_intra: torch.Tensor, r: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       q_route: torch.Tensor, reps: torch.Tensor, order: Optional[torch.Tensor],
                       norm_weight: Optional[torch.Tensor], bias: float, norm_eps: float) -> torch.Tensor:
    """The readout (optionally RMS-normalised) as a token-major (B, nC·C, H, V) tensor in q_route's dtype."""
    B, H, NC, C, V = o_intra.shape
    out = torch.empty(B, NC * C, H, V, device=o_intra.device, dtype=q_route.dtype)
    hla_readout_triton(o_intra, r, a, b, q_route, reps, bias, order, norm_weight=norm_weight, norm_eps=norm_eps,
                       out=out.view(B, NC, C, H, V).permute(0, 3, 1, 2, 4))
    return out


@hla_readout_tokens.register_fake
def _(o_intra, r, a, b, q_route, reps, order, norm_weight, bias, norm_eps):
    B, H, NC, C, V = o_intra.shape
    return q_route.new_empty((B, NC * C, H, V))
