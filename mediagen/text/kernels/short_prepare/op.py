"""``short_prepare`` and ``rope_columns``: the elementwise work of MLRA's short path around its GEMMs
(reference.py has the math). Backends: "reference" (plain PyTorch) and "triton" (triton_kernel.py), chosen
with ``backend=``; MLRA's short path picks the kernels itself for CUDA tensors when no gradient is
recorded. With TRITON_INTERPRET=1 the Triton path runs on CPU tensors too, which is how the tests check
it without a GPU.
"""

from __future__ import annotations

import torch

from ..backends import BACKENDS, check_backend
from .reference import rope_columns_reference, short_prepare_reference

try:
    from .triton_kernel import rope_columns_triton, short_prepare_triton
except ImportError:  # pragma: no cover - platform without triton
    rope_columns_triton = short_prepare_triton = None

SHORT_BACKENDS = BACKENDS


def _check_tables(cos, sin, n: int, like: torch.Tensor):
    d_r = cos.shape[-1]
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != n or d_r % 2 or d_r < 2:
        raise ValueError(f"cos and sin must be ({n}, d_r) with d_r even; got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.device != like.device or sin.device != like.device:
        raise ValueError(f"cos and sin must be on {like.device}; got {cos.device} and {sin.device}")


def short_prepare(h, d_q: int, latents: int, d_l: int, cos, sin, *, eps_q: float, eps_kv: float,
                  backend: str = "reference"):
    """h (B, N, d_q + latents d_l + d_r), cos and sin (N, d_r) (``rope_tables``' cos_full, sin_signed).
    Returns the normalised query latent (B, N, d_q) and the keys (B, N, latents, d_l + d_r)."""
    if h.dim() != 3:
        raise ValueError(f"h must be (B, N, d_q + L d_l + d_r); got shape {tuple(h.shape)}")
    _check_tables(cos, sin, h.shape[1], h)
    d_r = cos.shape[-1]
    if h.shape[-1] != d_q + latents * d_l + d_r:
        raise ValueError(f"h has {h.shape[-1]} columns; d_q + L d_l + d_r = {d_q} + {latents}*{d_l} + {d_r} needs "
                         f"{d_q + latents * d_l + d_r}")
    if check_backend(backend, h.dtype, short_prepare_triton) == "reference":
        return short_prepare_reference(h, d_q, latents, d_l, cos, sin, eps_q, eps_kv)
    return short_prepare_triton(h, d_q, latents, d_l, cos, sin, eps_q, eps_kv)


def rope_columns(q, start: int, cos, sin, *, backend: str = "reference"):
    """q (B, N, H, W) whose columns [start, start + d_r) hold each head's rope query; cos, sin (N, d_r).
    "reference" returns a rotated copy, "triton" rotates q in place and returns it."""
    if q.dim() != 4:
        raise ValueError(f"q must be (B, N, H, W); got shape {tuple(q.shape)}")
    _check_tables(cos, sin, q.shape[1], q)
    if not 0 <= start <= q.shape[-1] - cos.shape[-1]:
        raise ValueError(f"start={start} is not allowed: the rope columns must fit in W={q.shape[-1]}")
    if check_backend(backend, q.dtype, rope_columns_triton) == "reference":
        return rope_columns_reference(q, start, cos, sin)
    if q.shape[0] > 1 and q.stride(0) != q.shape[1] * q.stride(1):
        raise ValueError(f"backend='triton' rotates q in place and needs its batch and token axes to merge; got "
                         f"strides {q.stride()}")
    return rope_columns_triton(q, start, cos, sin)
