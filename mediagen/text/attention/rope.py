"""Rotary position embedding (half-split convention: the first and second halves of a vector are
the real and imaginary parts)."""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, dim: int, base: float = 10000.0, dtype=torch.float32):
    """cos, sin of shape (N, dim/2) for integer positions (N,)."""
    if dim % 2:
        raise ValueError(f"rope dim={dim} must be even")
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., N, [heads,] dim) where cos/sin are (N, dim/2); pass cos/sin already shaped to
    broadcast against x's leading dims (e.g. cos[:, None, :] for (B, N, H, dim)). The plain form;
    the models use ``apply_rope_tables``, tested to give the same bits."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rope_tables(positions: torch.Tensor, dim: int, base: float = 10000.0, dtype=torch.float32):
    """(cos_full, sin_signed), each (N, dim): [cos, cos] and [-sin, sin], for ``apply_rope_tables``."""
    cos, sin = rope_cos_sin(positions, dim, base, dtype)
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope_tables(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` with precomputed tables in 4 kernels instead of 7, bit for bit the same result:
    x1*c + x2*(-s) equals x1*c - x2*s exactly in floating point."""
    half = x.shape[-1] // 2
    return x * cos_full + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin_signed
