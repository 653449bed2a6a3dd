"""Plain-PyTorch reference of ``decode_prepare``: the elementwise work of one MLRA decode step between
its fused down-projection and its query projection.

h = x @ [W_dq; W_dkv]^T holds, per batch row, [c_q (d_q) | c (L latent heads of d_l) | k_rope (d_r)]:
    c_q  <- c_q / rms(c_q) * q_weight                     (the query RMSNorm, its scale folded in)
    c_l  <- c_l / rms(c_l) * kv_weight[l]                 (each latent head's own RMSNorm)
    k_rope <- k_rope * cos_full + [k2, k1] * sin_signed   (the new token's rotation, rope.apply_rope_tables)
rms(x) = sqrt(mean(x^2) + eps). The latents and the rotated key are written into the cache's slot for
the new token; c_q is returned.
"""

from __future__ import annotations

import torch

from .reference import rotate_with_tables


def decode_prepare_reference(h, q_weight, kv_weight, rope_rotation, latent_slot, rope_slot,
                             eps_q: float, eps_kv: float) -> torch.Tensor:
    """h (B, d_q + L d_l + d_r); q_weight (d_q,); kv_weight (L, d_l); rope_rotation (cos_full,
    sin_signed), each (d_r,); latent_slot (B, L, d_l) and rope_slot (B, d_r) are written.
    Returns c_q (B, d_q) in h's dtype. Computed in fp32 (fp64 stays fp64)."""
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    (L, d_l), d_q, d_r = kv_weight.shape, q_weight.shape[0], rope_slot.shape[-1]
    c_q, c, k = h.to(acc).split([d_q, L * d_l, d_r], dim=-1)
    c_q = c_q * torch.rsqrt(c_q.pow(2).mean(-1, keepdim=True) + eps_q) * q_weight.to(acc)
    c = c.unflatten(-1, (L, d_l))
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps_kv) * kv_weight.to(acc)
    k = rotate_with_tables(k, *(t.to(acc) for t in rope_rotation))
    latent_slot.copy_(c)
    rope_slot.copy_(k)
    return c_q.to(h.dtype)
