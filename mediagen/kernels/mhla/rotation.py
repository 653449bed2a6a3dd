"""RoPE on the features of MHLA's numerator (the official Wan MHLA code's variant).

With ``rope=(cos, sin)`` the numerator uses rotated features and the denominator does not:
    o_t = R_t(phi(q_t))^T S~^R_i(t) / (phi(q_t)^T z~_i(t) + eps),
    S^R_b = sum_{s in b} R_s(phi(k_s)) v_s^T,   z_b = sum_{s in b} phi(k_s)   (un-rotated).
R_t rotates channel pairs (2j, 2j+1) of token t by the angle whose cosine and sine are cos[t, j] and
sin[t, j] (diffusers' Wan convention: its (1, N, 1, D) tables repeat each angle twice, so
cos[t, j] = freqs_cos[0, t, 0, 2j] and sin[t, j] = freqs_sin[0, t, 0, 2j + 1]).
"""

from __future__ import annotations

import torch


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_t(x_t) for x (B, N, H, D) and tables (N, D/2), in x's dtype."""
    c, s = cos.to(x.dtype)[None, :, None, :], sin.to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


def split_rope(rope, q: torch.Tensor):
    """Validate ``rope`` against q (B, N, H, D); return (cos, sin) or (None, None)."""
    if rope is None:
        return None, None
    if not isinstance(rope, (tuple, list)) or len(rope) != 2:
        raise ValueError(f"rope must be None or a pair (cos, sin) of tensors; got {type(rope).__name__}")
    N, D = q.shape[1], q.shape[3]
    if D % 2:
        raise ValueError(f"rope needs an even head dim (channel pairs); got D={D}")
    for name, t in zip(("cos", "sin"), rope):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != (N, D // 2):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"rope {name} must be a floating-point tensor of shape (N, D/2)=({N}, {D // 2}); "
                             f"got {shape}")
        if t.device != q.device:
            raise ValueError(f"rope {name} is on {t.device} but q is on {q.device}")
    return rope[0], rope[1]
