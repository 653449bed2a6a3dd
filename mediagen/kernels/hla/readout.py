"""HLA's readout (gates + walk over past chunks) behind one function, and the whole inference forward
that uses it: the plain-PyTorch reference composes ``router`` and ``chunk``; the Triton path fuses
both (``triton_readout``, forward only, imported lazily)."""

from __future__ import annotations

from .chunk import _unchunked, chunk_summaries, hla_walk, hla_walk_indexed, pad_to_chunks
from .router import chunk_gates, listed_chunk_gates

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


def hla_readout(o_intra, r, a, b, q_route, reps, bias: float, order=None, *, backend: str = "triton"):
    """Dispatch the readout: ``backend`` "torch" (reference) or "triton" (fused; CUDA, or any device
    under TRITON_INTERPRET=1). Triton returns fp32; the reference returns r's dtype."""
    if backend == "torch":
        return hla_readout_reference(o_intra, r, a, b, q_route, reps, bias, order)
    if backend == "triton":
        from .triton_readout import hla_readout_triton
        return hla_readout_triton(o_intra, r, a, b, q_route, reps, bias, order)
    raise ValueError(f"backend={backend!r} is not allowed: use one of {READOUT_BACKENDS}")


def hla_fused_forward(q, k, v, log_alpha, beta, q_route, reps, bias: float, *, chunk: int, order=None,
                      summaries: str = "torch", readout: str = "triton"):
    """HLA output (B, N, H, V) in q's dtype without materialising the gates: chunk summaries (fp32),
    then the fused readout. Inputs are already padded to whole chunks (q_route and reps too)."""
    scale = q.shape[-1] ** -0.5
    q, k, v, log_alpha, beta, n = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
    o_intra, r, a, b = chunk_summaries(q, k, v, log_alpha, beta, scale, chunk, summaries)
    o = hla_readout(o_intra, r, a, b, q_route, reps, bias, order, backend=readout)
    return _unchunked(o)[:, :n].to(q.dtype)
