"""Plain-PyTorch references of MLRA's short-path kernels (``MLRAttention._forward_short``).

short_prepare: h = x @ [W_dq; W_dkv]^T holds, per token (b, n), [c_q (d_q) | c (L latent heads of d_l) |
k_r (d_r)]; it returns
    c_q <- c_q / rms(c_q)                                   (B, N, d_q)
    k   <- [c_l / rms(c_l) | rope_n(k_r)] for each l        (B, N, L, d_l + d_r)
where rms(x) = sqrt(mean(x^2) + eps) (the norms' weights are folded into the weights after them) and
rope_n(y) = y * cos[n] + [y2, y1] * sin[n] with the tables of ``rope.rope_tables`` (cos_full,
sin_signed), each (N, d_r): one rotated rope key, shared by every latent head's key.

rope_columns: q (B, N, H, W) with the rope query in columns [start, start + d_r) of every head returns q
with those columns rotated by their token's position, rope_n as above, the other columns as they were.
"""

from __future__ import annotations

import torch


def _rotate(y, cos, sin):
    half = y.shape[-1] // 2
    return y * cos + torch.cat([y[..., half:], y[..., :half]], dim=-1) * sin


def short_prepare_reference(h, d_q: int, latents: int, d_l: int, cos, sin, eps_q: float, eps_kv: float):
    """h (B, N, d_q + L d_l + d_r); cos, sin (N, d_r). Returns (c_q, k) in h's dtype, computed in fp32
    (fp64 stays fp64)."""
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    d_r = cos.shape[-1]
    c_q, c, k_r = h.to(acc).split([d_q, latents * d_l, d_r], dim=-1)
    c_q = c_q * torch.rsqrt(c_q.pow(2).mean(-1, keepdim=True) + eps_q)
    c = c.unflatten(-1, (latents, d_l))
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps_kv)
    k_r = _rotate(k_r, cos.to(acc), sin.to(acc))
    k = torch.cat([c, k_r[:, :, None].expand(*c.shape[:3], d_r)], dim=-1)
    return c_q.to(h.dtype), k.to(h.dtype)


def rope_columns_reference(q, start: int, cos, sin):
    """q (B, N, H, W); cos, sin (N, d_r). Returns a rotated copy (fp32 arithmetic, fp64 stays fp64)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    d_r = cos.shape[-1]
    out = q.clone()
    y = q[..., start:start + d_r].to(acc)
    out[..., start:start + d_r] = _rotate(y, cos.to(acc)[:, None], sin.to(acc)[:, None]).to(q.dtype)
    return out
