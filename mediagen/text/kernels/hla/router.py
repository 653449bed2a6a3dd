"""HLA's query-dependent chunk gates and their regularisers (pure functions; weights are passed in).

Each chunk of C keys is cut into buckets of ``pool`` tokens. A bucket's representative is in-bucket
softmax self-attention of its keys (per-head projections Wk, Wv, Wo), mean-pooled over the bucket.
A query token t scores a past chunk j by the log-mean-exp over j's buckets of q_route_t . rep / sqrt(d),
and its gate is g = sigmoid(score + bias) in (0, 1). Gates exist only for past chunks (j < chunk(t));
the current chunk is always read in full (g = 1).
"""

from __future__ import annotations

import math

import torch


def bucket_representatives(k, w_k, w_v, w_o, chunk: int, pool: int):
    """k (B,N,H,D) with N a multiple of ``chunk``; w_* (H,D,D). Returns (B,H,nC,C/pool,D)."""
    if chunk % pool:
        raise ValueError(f"pool={pool} must divide chunk={chunk}")
    b, n, h, d = k.shape
    kb = k.reshape(b, n // chunk, chunk // pool, pool, h, d).movedim(4, 1)   # (B,H,nC,nb,pool,D)
    pk = torch.einsum("bhcpsd,hde->bhcpse", kb, w_k)
    pv = torch.einsum("bhcpsd,hde->bhcpse", kb, w_v)
    attn = torch.softmax(pk @ pk.transpose(-1, -2) / math.sqrt(d), dim=-1)
    pooled = (attn @ pv).mean(dim=-2)                                        # mean over bucket tokens
    return torch.einsum("bhcpd,hde->bhcpe", pooled, w_o)


def chunk_gates(q_route, reps, chunk: int, bias: float, max_elements: int = 2 ** 27):
    """Gates (B,H,nC,C,nC): sigmoid(log-mean-exp_p(q.rep_p / sqrt d) + bias) for past chunks, else 0.

    q_route (B,N,H,D) with N = nC * C; reps (B,H,nC,nb,D). Scores are formed a block of query chunks
    at a time so the (tokens x chunks x buckets) intermediate stays under ``max_elements``.
    """
    b, n, h, d = q_route.shape
    nc = n // chunk
    block = max(1, max_elements // max(1, b * h * chunk * reps.shape[2] * reps.shape[3]))
    qc = q_route.reshape(b, nc, chunk, h, d).movedim(3, 1)                   # (B,H,nC,C,D)
    keys = reps.flatten(2, 3)                                                # (B,H,nC*nb,D)
    nb = reps.shape[3]
    past = torch.ones(nc, nc, dtype=torch.bool, device=q_route.device).tril(-1)
    out = []
    for c0 in range(0, nc, block):
        qs = qc[:, :, c0:c0 + block]
        s = torch.einsum("bhcld,bhkd->bhclk", qs, keys) / math.sqrt(d)
        s = s.unflatten(-1, (nc, nb))
        score = torch.logsumexp(s, dim=-1) - math.log(nb)                    # log-mean-exp over buckets
        g = torch.sigmoid(score + bias)
        out.append(g * past[c0:c0 + block, None, :].to(g.dtype))
    return torch.cat(out, dim=2)


def gate_regularisers(gates, budget_weight=0.005, budget=3.0, support_weight=0.001, support=2.0,
                      binary_weight=0.001):
    """The paper's regularisers on past-chunk gates (B,H,nC,C,nC); returns a dict with 'total'.

    budget:  w (relu(sum_j g - budget) / budget)^2        (few chunks read per query)
    support: w relu(1 / sum_j p_j^2 - support)^2, p = g / sum g   (effective number of chunks read)
    binary:  w mean g (1 - g)                             (push gates toward 0 or 1)
    Averaged over query tokens that have at least one past chunk.
    """
    nc = gates.shape[2]
    past = torch.ones(nc, nc, dtype=torch.bool, device=gates.device).tril(-1)[:, None, :]
    has_past = past.any(-1).expand(nc, gates.shape[3])                       # (nC, C)
    if not bool(has_past.any()):
        zero = gates.sum() * 0
        return {"budget": zero, "support": zero, "binary": zero, "total": zero}
    total_g = gates.sum(-1)
    p = gates / total_g.clamp_min(1e-6)[..., None]
    # a token that reads no chunk at all (every gate 0) has support 0, not 1/0
    eff = torch.where(total_g > 1e-6, 1.0 / p.pow(2).sum(-1).clamp_min(1e-12), torch.zeros_like(total_g))
    sel = has_past.expand_as(total_g)
    budget_l = budget_weight * (torch.relu(total_g - budget) / budget).pow(2)[sel].mean()
    support_l = support_weight * torch.relu(eff - support).pow(2)[sel].mean()
    binary_l = binary_weight * (gates * (1 - gates))[past.expand_as(gates)].mean()
    return {"budget": budget_l, "support": support_l, "binary": binary_l,
            "total": budget_l + support_l + binary_l}


def chunk_routing_order(q_route, reps, chunk: int, top_k: int):
    """Beyond the paper, a cheap router for top-k reading: each query chunk ranks its past chunks by
    the log-mean-exp score of its *mean* routed query (nC x nC work instead of N x nC) and keeps k.

    Returns order (B,H,nC,k): past-chunk indices, newest first, -1 where fewer than k exist.
    """
    b, n, h, d = q_route.shape
    nc = n // chunk
    k = max(1, min(int(top_k), nc))
    q_mean = q_route.reshape(b, nc, chunk, h, d).mean(dim=2).movedim(2, 1)  # (B,H,nC,D)
    s = torch.einsum("bhcd,bhjpd->bhcjp", q_mean, reps) / math.sqrt(d)
    score = torch.logsumexp(s, dim=-1)                                       # (B,H,nC,nC)
    past = torch.ones(nc, nc, dtype=torch.bool, device=q_route.device).tril(-1)
    score = score.masked_fill(~past, -float("inf"))
    top = score.topk(k, dim=-1)
    order = torch.where(torch.isfinite(top.values), top.indices, -1)
    return order.sort(dim=-1, descending=True).values                       # newest first, -1 last


def listed_chunk_gates(q_route, reps, order, chunk: int, bias: float):
    """Per-token gates (B,H,nC,C,k) for the past chunks listed in ``order`` (B,H,nC,k), computed as
    ``chunk_gates`` computes them; 0 where the entry is -1."""
    b, n, h, d = q_route.shape
    nc, nb, k = n // chunk, reps.shape[3], order.shape[-1]
    qc = q_route.reshape(b, nc, chunk, h, d).movedim(3, 1)                   # (B,H,nC,C,D)
    idx = order.clamp_min(0).reshape(b, h, nc * k)
    sel = torch.gather(reps, 2, idx[..., None, None].expand(-1, -1, -1, nb, d)).reshape(b, h, nc, k, nb, d)
    tok = torch.einsum("bhcld,bhckpd->bhclkp", qc, sel) / math.sqrt(d)
    gates = torch.sigmoid(torch.logsumexp(tok, dim=-1) - math.log(nb) + bias)  # (B,H,nC,C,k)
    return gates * (order >= 0)[:, :, :, None, :].to(gates.dtype)


def chunk_routed_gates(q_route, reps, chunk: int, bias: float, top_k: int):
    """``chunk_routing_order`` then ``listed_chunk_gates``: returns order (B,H,nC,k) and gates (B,H,nC,C,k)."""
    order = chunk_routing_order(q_route, reps, chunk, top_k)
    return order, listed_chunk_gates(q_route, reps, order, chunk, bias)
