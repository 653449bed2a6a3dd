"""Plain-PyTorch chunked Gated DeltaNet and HLA (runs anywhere; fla replaces the summaries on CUDA).

Within one chunk of C tokens, with G_t = sum_{s<=t} log alpha_s (cumulative log decay, so the decay
from s to t is exp(G_t - G_s)) and the "delta" values u_t = beta_t (v_t - alpha_t h_{t-1}^T k_t),

    h_t = exp(G_t) h_0 + sum_{s<=t} exp(G_t - G_s) k_s u_s^T.

Substituting h_{t-1} into u_t gives the unit lower-triangular system (I + L) U = diag(beta)(V - diag(e^G) K h_0),
L_ts = beta_t exp(G_t - G_s) k_t.k_s (s < t), so U = U0 - W h_0 with U0 = T V, W = T diag(e^G) K,
T = (I + L)^-1 diag(beta). Everything a chunk contributes is then affine in its start state h_0:

    o_t   = r_t^T h_0 + (P U0)_t          r = scale e^G Q - P W,  P_ts = scale exp(G_t - G_s) q_t.k_s (s <= t)
    h_end = A h_0 + b                     A = e^{G_C} I - K~^T W,  b = K~^T U0,  K~_s = exp(G_C - G_s) k_s

``chunk_summaries`` returns (o_intra = P U0, r, A, b). GDN chains h <- A h + b over chunks; HLA lets
each query token soften every past chunk with its own gate (``hla_walk``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_to_chunks(q, k, v, log_alpha, beta, chunk: int):
    """Pad N up to a multiple of ``chunk`` with identity tokens (k = v = 0, beta = 0, alpha = 1).
    Padding goes at the end, so causally it never reaches a real token."""
    n = q.shape[1]
    pad = (-n) % chunk
    if pad == 0:
        return q, k, v, log_alpha, beta, n
    p4 = (0, 0, 0, 0, 0, pad)
    p3 = (0, 0, 0, pad)
    return F.pad(q, p4), F.pad(k, p4), F.pad(v, p4), F.pad(log_alpha, p3), F.pad(beta, p3), n


def _chunked(x, chunk):
    """(B, N, H, ...) -> (B, H, nC, C, ...)."""
    b, n, h = x.shape[:3]
    x = x.reshape(b, n // chunk, chunk, h, *x.shape[3:])
    return x.movedim(3, 1)


def _unchunked(x):
    """(B, H, nC, C, ...) -> (B, N, H, ...)."""
    b, h, nc, c = x.shape[:4]
    return x.movedim(1, 3).reshape(b, nc * c, h, *x.shape[4:])


def chunk_summaries_torch(q, k, v, log_alpha, beta, scale: float, chunk: int):
    """Per-chunk affine summaries in plain PyTorch. N must be a multiple of ``chunk``.

    Returns o_intra (B,H,nC,C,V), r (B,H,nC,C,K), A (B,H,nC,K,K), b (B,H,nC,K,V); half-precision
    inputs are computed in fp32 (the triangular solve needs it).
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v, log_alpha, beta = (t.float() for t in (q, k, v, log_alpha, beta))
    qc, kc, vc = _chunked(q, chunk), _chunked(k, chunk), _chunked(v, chunk)
    g = _chunked(log_alpha, chunk).cumsum(-1)                        # G_t, (B,H,nC,C)
    bt = _chunked(beta, chunk)
    causal_incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = causal_incl.clone().fill_diagonal_(False)
    # decay ratios exp(G_t - G_s), masked before exp so the upper triangle cannot overflow
    diff = g[..., :, None] - g[..., None, :]
    decay = torch.where(causal_incl, diff, diff.new_full((), -float("inf"))).exp()
    kk = kc @ kc.transpose(-1, -2)
    lower = torch.where(strict, bt[..., :, None] * decay * kk, kk.new_zeros(()))
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = bt[..., None] * torch.cat([vc, g.exp()[..., None] * kc], dim=-1)
    sol = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    u0, w = sol[..., : v.shape[-1]], sol[..., v.shape[-1]:]
    p = scale * (qc @ kc.transpose(-1, -2)) * decay                  # masked by decay (0 above diagonal)
    o_intra = p @ u0
    r = scale * g.exp()[..., None] * qc - p @ w
    k_tilde = (g[..., -1:] - g).exp()[..., None] * kc
    eye_k = torch.eye(k.shape[-1], dtype=q.dtype, device=q.device)
    a = g[..., -1, None, None].exp() * eye_k - k_tilde.transpose(-1, -2) @ w
    b = k_tilde.transpose(-1, -2) @ u0
    return o_intra, r, a, b


def chunk_summaries(q, k, v, log_alpha, beta, scale: float, chunk: int, backend: str = "torch", v_pad=None):
    """Dispatch to the plain-PyTorch summaries or to flash-linear-attention (``backend="fla"``, which
    takes ``v_pad`` = [v | 0] when the caller has it)."""
    if backend == "torch":
        return chunk_summaries_torch(q, k, v, log_alpha, beta, scale, chunk)
    if backend == "fla":
        from .fla_backend import chunk_summaries_fla
        return chunk_summaries_fla(q, k, v, log_alpha, beta, scale, chunk, v_pad)
    raise ValueError(f"backend={backend!r} is not allowed: use 'torch' or 'fla'")


def gdn_from_summaries(o_intra, r, a, b):
    """Plain GDN: chain every chunk's map, h <- A h + b, starting from h = 0. Returns (B,H,nC,C,V)."""
    bsz, h, nc = b.shape[:3]
    state = b.new_zeros(bsz, h, b.shape[-2], b.shape[-1])
    outs = []
    for c in range(nc):
        outs.append(o_intra[:, :, c] + r[:, :, c].to(state.dtype) @ state)
        state = a[:, :, c] @ state + b[:, :, c]
    return torch.stack(outs, dim=2)


def hla_walk(o_intra, r, a, b, gates):
    """HLA readout, all query chunks at once, walking back one chunk per step.

    gates: (B,H,nC,C,nC), gates[..., c, l, j] for past chunks j < c (entries j >= c are ignored).
    For a token with effective query r, past chunks newest to oldest: out += g r^T b_j, then
    r <- (1-g) r + g A_j^T r (row form: r A_j). Step s serves every query chunk c >= s with j = c - s,
    as one batched GEMM over chunks, so nC - 1 steps in all.
    """
    nc, dk = b.shape[2], a.shape[-1]
    out = o_intra.clone()
    step_map = _step_maps(a, b)                                       # [A - I | b], one GEMM per step
    rows = r                                                          # rows[:, :, i] is query chunk s-1+i
    for s in range(1, nc):
        rows = rows[:, :, 1:]                                         # query chunks c = s .. nC-1
        past = torch.arange(nc - s, device=b.device)
        g = gates[:, :, past + s, :, past].movedim(0, 2)[..., None]  # (B,H,nC-s,C,1)
        y = g * (rows @ step_map[:, :, : nc - s])                     # g r(A - I) | g r b
        out[:, :, s:] += y[..., dk:]
        rows = rows + y[..., :dk]
    return out


def _step_maps(a, b):
    """[A - I | b] per chunk (B,H,nC,K,K+V): r (A^ - I) = g r (A - I) and r b^ = g r b in one product."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return torch.cat([a - eye, b], dim=-1)


def select_chunks(gates, *, top_k: int | None = None, threshold: float | None = None):
    """Beyond the paper: which past chunks each query chunk keeps. Returns keep (B,H,nC,nC) bool.

    top_k keeps the k past chunks with the largest mean gate over the query chunk's tokens;
    threshold keeps a past chunk when some token of the query chunk gives it a gate >= threshold.
    """
    nc = gates.shape[2]
    past = torch.ones(nc, nc, dtype=torch.bool, device=gates.device).tril(-1)
    keep = past.expand(*gates.shape[:2], nc, nc).clone()
    if threshold is not None:
        keep &= gates.amax(dim=3) >= threshold
    if top_k is not None:
        score = gates.mean(dim=3).masked_fill(~keep, -1.0)
        k = min(int(top_k), nc)
        idx = score.topk(k, dim=-1).indices
        top = torch.zeros_like(keep).scatter_(-1, idx, True)
        keep &= top
    return keep


def hla_walk_sparse(o_intra, r, a, b, gates, keep):
    """HLA readout that visits only the kept (query chunk, past chunk) pairs, newest first.

    A skipped chunk is exactly a chunk whose gate is 0 (r passes unchanged, no output), so with
    keep = all past pairs this equals ``hla_walk``. Steps = the largest kept count per query chunk.
    """
    nc = b.shape[2]
    j = torch.arange(nc, device=b.device)
    order = torch.where(keep, j, -1).sort(dim=-1, descending=True).values  # kept chunks first, newest first
    steps = int(keep.sum(-1).max().item()) if keep.numel() else 0
    order = order[..., :steps]
    g_sel = torch.gather(gates, 4, order.clamp_min(0)[..., None, :].expand(-1, -1, -1, gates.shape[3], -1))
    return hla_walk_indexed(o_intra, r, a, b, order, g_sel)


def hla_walk_indexed(o_intra, r, a, b, order, g_sel):
    """The walk over an explicit list of past chunks per query chunk.

    order (B,H,nC,k): past-chunk indices, newest first, -1 for none; g_sel (B,H,nC,C,k): each query
    token's gate for those chunks. k walk steps, each a batched GEMM over all query chunks.
    """
    dk = a.shape[-1]
    step_map = _step_maps(a, b)
    out = o_intra.clone()
    rows = r
    for m in range(order.shape[-1]):
        idx = order[..., m]                                            # (B,H,nC), -1 = nothing left
        valid = idx >= 0
        idx_c = idx.clamp_min(0)
        m_sel = torch.gather(step_map, 2, idx_c[..., None, None].expand(-1, -1, -1, *step_map.shape[-2:]))
        g = g_sel[..., m, None] * valid[..., None, None]
        y = g * (rows @ m_sel)
        out = out + y[..., dk:]
        rows = rows + y[..., :dk]
    return out


def gated_delta_rule_chunked(q, k, v, log_alpha, beta, scale: float | None = None, chunk: int = 64,
                             backend: str = "torch"):
    """Gated DeltaNet, chunked. q, k (B,N,H,K) (l2-normalised by the caller), v (B,N,H,V)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, log_alpha, beta, n = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
    o = gdn_from_summaries(*chunk_summaries(q, k, v, log_alpha, beta, scale, chunk, backend))
    return _unchunked(o)[:, :n]


def hla_chunked_indexed(q, k, v, log_alpha, beta, order, g_sel, scale: float | None = None,
                        chunk: int = 256, backend: str = "torch", walk_dtype=None):
    """HLA output (B,N,H,V) reading only the listed past chunks (see ``hla_walk_indexed``)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, log_alpha, beta, n = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
    walk_dtype = walk_dtype or q.dtype
    summaries = [t.to(walk_dtype) for t in chunk_summaries(q, k, v, log_alpha, beta, scale, chunk, backend)]
    o = hla_walk_indexed(*summaries, order, g_sel.to(walk_dtype))
    return _unchunked(o)[:, :n].to(q.dtype)


def hla_chunked(q, k, v, log_alpha, beta, gates, scale: float | None = None, chunk: int = 256,
                backend: str = "torch", keep=None, walk_dtype=None):
    """HLA output (B,N,H,V) in q's dtype. gates (B,H,nC,C,nC) over the padded length (see
    ``hla_walk``); ``keep`` (B,H,nC,nC) switches to the sparse walk over kept chunk pairs.
    The walk runs in ``walk_dtype`` (default q's dtype: bf16 GEMMs on a GPU, fp64 in tests)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, log_alpha, beta, n = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
    walk_dtype = walk_dtype or q.dtype
    summaries = [t.to(walk_dtype) for t in chunk_summaries(q, k, v, log_alpha, beta, scale, chunk, backend)]
    gates = gates.to(walk_dtype)
    o = hla_walk(*summaries, gates) if keep is None else hla_walk_sparse(*summaries, gates, keep)
    return _unchunked(o)[:, :n].to(q.dtype)
