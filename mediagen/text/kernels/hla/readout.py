"""HLA's readout (gates + walk over past chunks) behind one function, and the whole inference forward
that uses it: the plain-PyTorch reference composes ``router`` and ``chunk``; the Triton path fuses
both (``triton_readout``, forward only)."""

from __future__ import annotations

import torch.nn.functional as F

from .chunk import _unchunked, chunk_summaries, hla_walk, hla_walk_indexed, pad_to_chunks
from .router import chunk_gates, listed_chunk_gates

try:  # the fused kernel (importing it registers the custom op mediagen::hla_readout_tokens)
    from .triton_readout import hla_readout_tokens, hla_readout_triton
except ImportError:  # pragma: no cover - platform without triton
    hla_readout_tokens = hla_readout_triton = None

READOUT_BACKENDS = ("torch", "triton")


def hla_readout_reference(o_intra, r, a, b, q_route, reps, bias: float, order=None):
    """What ``triton_readout.hla_readout_triton`` computes, from the unfused pieces, in the summaries'
    dtype (fp64 in tests). Returns (B, H, nC, C, V)."""
    chunk = o_intra.shape[3]
    dtype = r.dtype
    o_intra, a, b = (t.to(dtype) for t in (o_intra, a, b))
    if order is None:
        gates = chunk_gates(q_route.to(dtype), reps.to(dtype), chunk, bias)
        return hla_walk(o_intra, r, a, b, gates)
    gates = listed_chunk_gates(q_route.to(dtype), reps.to(dtype), order, chunk, bias)
    return hla_walk_indexed(o_intra, r, a, b, order, gates)


def hla_readout(o_intra, r, a, b, q_route, reps, bias: float, order=None, *, backend: str = "triton",
                **triton_options):
    """Dispatch the readout: ``backend`` "torch" (reference) or "triton" (fused; CUDA, or any device
    under TRITON_INTERPRET=1; ``triton_options`` go to ``hla_readout_triton``). Triton returns fp32
    (or fills ``out=``); the reference returns r's dtype."""
    if backend == "torch":
        return hla_readout_reference(o_intra, r, a, b, q_route, reps, bias, order)
    if backend == "triton":
        if hla_readout_triton is None:
            raise ValueError("backend='triton' needs the triton package, which is not installed here")
        return hla_readout_triton(o_intra, r, a, b, q_route, reps, bias, order, **triton_options)
    raise ValueError(f"backend={backend!r} is not allowed: use one of {READOUT_BACKENDS}")


def hla_fused_forward(q, k, v, log_alpha, beta, q_route, reps, bias: float, *, chunk: int, order=None,
                      summaries: str = "torch", readout: str = "triton", norm_weight=None, norm_eps: float = 1e-6,
                      v_pad=None):
    """HLA output (B, N, H, V) in q's dtype without materialising the gates: chunk summaries, then the
    fused readout. Inputs are already padded to whole chunks (q_route and reps too).
    ``norm_weight`` (V,): the per-head RMSNorm of the output too, in the kernel's epilogue.
    ``v_pad``: [v | 0], for fla's summaries, when the caller has it."""
    scale = q.shape[-1] ** -0.5
    q, k, v, log_alpha, beta, n = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
    o_intra, r, a, b = chunk_summaries(q, k, v, log_alpha, beta, scale, chunk, summaries, v_pad)
    if readout == "triton":
        if hla_readout_tokens is None:
            raise ValueError("readout='triton' needs the triton package, which is not installed here")
        out = hla_readout_tokens(o_intra, r, a, b, q_route, reps, order, norm_weight, float(bias), float(norm_eps))
        return out[:, :n].to(q.dtype)
    o = _unchunked(hla_readout(o_intra, r, a, b, q_route, reps, bias, order, backend=readout))[:, :n]
    if norm_weight is not None:
        o = F.rms_norm(o, (o.shape[-1],), norm_weight.to(o.dtype), norm_eps)
    return o.to(q.dtype)
