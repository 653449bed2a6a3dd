"""Argument checks shared by the MHLA reference and kernels: each error names the parameter,
the value given and what is allowed."""

from __future__ import annotations

import math

import torch

from .layout import check_grid_blocks

FEATURE_MAPS = (None, "relu", "elu1")
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_mhla_args(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, *, reference=False):
    """Validate the arguments of ``mhla``/``mhla_reference``; return (grid, blocks) as tuples."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, N, H, D); got {shape}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must have one shape (B, N, H, D); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    allowed = KERNEL_DTYPES + ((torch.float64,) if reference else ())
    if q.dtype not in allowed:
        raise ValueError(f"q has dtype {q.dtype}; allowed: {', '.join(map(str, allowed))}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device == getattr(mix, "device", q.device)):
        raise ValueError(
            f"q, k, v and mix must be on one device; got q {q.device}, k {k.device}, v {v.device}, "
            f"mix {getattr(mix, 'device', None)}"
        )
    B, N, H, D = q.shape
    if not reference and not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported: allowed {MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    grid, blocks = check_grid_blocks(grid, blocks, N)
    M = math.prod(blocks)
    if not isinstance(mix, torch.Tensor) or not mix.is_floating_point():
        raise ValueError(f"mix must be a floating-point tensor of shape ({M}, {M}) or ({H}, {M}, {M})")
    if tuple(mix.shape) not in ((M, M), (H, M, M)):
        raise ValueError(
            f"mix has shape {tuple(mix.shape)}; with blocks={blocks} (M={M}) and H={H} heads it must be "
            f"({M}, {M}) or ({H}, {M}, {M})"
        )
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"feature_map={feature_map!r} is not allowed: use one of {FEATURE_MAPS}")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be True or False; got {normalize!r}")
    if normalize and scale is not None:
        raise ValueError(f"scale={scale!r} applies only with normalize=False; leave it None when normalizing")
    if not (isinstance(eps, (int, float)) and eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None; got {scale!r}")
    return grid, blocks


def feature(x: torch.Tensor, feature_map: str | None) -> torch.Tensor:
    """phi(x): the non-negative feature map (identity when the inputs already are features)."""
    if feature_map is None:
        return x
    if feature_map == "relu":
        return torch.relu(x)
    return torch.nn.functional.elu(x) + 1.0
