"""Plain-PyTorch latent decode attention, the reference of the Triton kernel.

For each batch b, latent head l and query row r (the heads that latent serves):

    s_t  = scale * (q_lat[b, l, r] . c[b, t, l] + q_rope[b, l, r] . k_rope[b, t])     t < T
    out  = sum_t softmax(s)_t c[b, t, l]                                               (d_l)

The keys of latent l are its cached latents c_l (the key up-projection is absorbed into q_lat) plus
one rope key shared by all latents; the values are the same latents (the value up-projection comes
after the sum). Every latent's rows share one cache, as multi-query attention shares its K and V.

q_rope may hold G groups (B, G, R, d_r) with G dividing L: latent l uses group l % G (MLRA-4's latents
all serve the same heads, G = 1; MLRA-2's alternate between two head halves, G = 2). With
``rope_rotation`` = (cos_full, sin_signed), each (d_r,), the rope query is first rotated by the new
token's angles (rope.apply_rope_tables' convention: x * cos_full + [x2, x1] * sin_signed).
"""

from __future__ import annotations

import torch


def rotate_with_tables(x, cos_full, sin_signed):
    """x * cos_full + [x2, x1] * sin_signed over the last dim (rope.apply_rope_tables' convention)."""
    half = x.shape[-1] // 2
    return x * cos_full + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin_signed


def latent_decode_reference(q_lat, q_rope, latents, rope_keys, scale: float, rope_rotation=None) -> torch.Tensor:
    """q_lat (B, L, R, d_l), q_rope (B, G, R, d_r), latents (B, T, L, d_l), rope_keys (B, T, d_r)
    -> (B, L, R, d_l) in q_lat's dtype; computed in fp32 (fp64 stays fp64)."""
    acc = torch.float64 if q_lat.dtype == torch.float64 else torch.float32
    L, G = q_lat.shape[1], q_rope.shape[1]
    if rope_rotation is not None:
        q_rope = rotate_with_tables(q_rope.to(acc), *(t.to(acc) for t in rope_rotation)).to(q_rope.dtype)
    q_rope = q_rope[:, torch.arange(L, device=q_rope.device) % G]
    c = latents.to(acc)
    scores = torch.einsum("blrd,btld->blrt", q_lat.to(acc), c)
    scores = scores + torch.einsum("blre,bte->blrt", q_rope.to(acc), rope_keys.to(acc))
    p = torch.softmax(scores * scale, dim=-1)
    return torch.einsum("blrt,btld->blrd", p, c).to(q_lat.dtype)
