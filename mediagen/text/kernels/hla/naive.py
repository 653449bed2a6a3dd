"""Token-by-token references for Gated DeltaNet (GDN) and HLA. Slow, obvious, used as test oracles.

Layout: q, k (B, N, H, K); v (B, N, H, V); log_alpha, beta (B, N, H). The state h is (K, V) per head.

GDN step:   h_t = alpha_t (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T,   o_t = scale * h_t^T q_t

HLA keeps the history as one affine map per chunk c of C tokens, h <- A_c h + b_c, and a token t of
chunk c reads a gated composition of the earlier chunks' maps: with g = gates[t, j] in [0, 1],
A^_j = g A_j + (1 - g) I and b^_j = g b_j, its start-of-chunk state is
    h~ = A^_{c-1}( ... A^_1 (A^_0 0 + b^_0) + b^_1 ...) + b^_{c-1},
and inside its own chunk it runs the ordinary GDN recurrence from h~ (the current chunk's gate is 1).
"""

from __future__ import annotations

import torch


def gdn_recurrent(q, k, v, log_alpha, beta, scale: float, initial_state=None):
    """Gated delta rule one token at a time. Returns (o (B, N, H, V), final state (B, H, K, V))."""
    b, n, h, dk = q.shape
    dv = v.shape[-1]
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.clone()
    eye = torch.eye(dk, dtype=q.dtype, device=q.device)
    out = []
    for t in range(n):
        kt, vt, qt = k[:, t], v[:, t], q[:, t]                       # (B, H, K|V)
        a, bt = log_alpha[:, t].exp()[..., None, None], beta[:, t][..., None, None]
        transition = a * (eye - bt * kt[..., :, None] * kt[..., None, :])
        state = transition @ state + bt * kt[..., :, None] * vt[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", qt, state))
    return torch.stack(out, dim=1), state


def chunk_maps_recurrent(k, v, log_alpha, beta, chunk: int):
    """Each chunk's exact affine map (A_c (B,H,nC,K,K), b_c (B,H,nC,K,V)), token by token.
    N must be a multiple of ``chunk``."""
    b, n, h, dk = k.shape
    eye = torch.eye(dk, dtype=k.dtype, device=k.device)
    maps_a, maps_b = [], []
    for c0 in range(0, n, chunk):
        sl = slice(c0, c0 + chunk)
        init = torch.cat([k.new_zeros(b, h, dk, v.shape[-1]), eye.expand(b, h, dk, dk)], dim=-1)
        vpad = torch.cat([v[:, sl], v.new_zeros(b, chunk, h, dk)], dim=-1)
        # the map is linear in the state, so running from [0 | I] with values [v | 0] yields [b_c | A_c]
        _, final = gdn_recurrent(k[:, sl], k[:, sl], vpad, log_alpha[:, sl], beta[:, sl], 1.0, init)
        maps_b.append(final[..., : v.shape[-1]])
        maps_a.append(final[..., v.shape[-1]:])
    return torch.stack(maps_a, dim=2), torch.stack(maps_b, dim=2)


def hla_recurrent(q, k, v, log_alpha, beta, gates, scale: float, chunk: int):
    """HLA by its definition: for every token, build its gated start-of-chunk state, then run GDN.

    gates: (B, N, H, nC) with gates[..., t, j] used for past chunks j < chunk(t) (others ignored).
    N must be a multiple of ``chunk``. Quadratic in N; for tests only.
    """
    b, n, h, dk = q.shape
    dv = v.shape[-1]
    maps_a, maps_b = chunk_maps_recurrent(k, v, log_alpha, beta, chunk)
    eye = torch.eye(dk, dtype=q.dtype, device=q.device)
    out = q.new_zeros(b, n, h, dv)
    for t in range(n):
        c = t // chunk
        state = q.new_zeros(b, h, dk, dv)
        for j in range(c):                                           # oldest -> newest
            g = gates[:, t, :, j][..., None, None]
            state = (g * maps_a[:, :, j] + (1 - g) * eye) @ state + g * maps_b[:, :, j]
        c0 = c * chunk
        o, _ = gdn_recurrent(q[:, c0:t + 1], k[:, c0:t + 1], v[:, c0:t + 1], log_alpha[:, c0:t + 1],
                             beta[:, c0:t + 1], scale, state)
        out[:, t] = o[:, -1]
    return out
