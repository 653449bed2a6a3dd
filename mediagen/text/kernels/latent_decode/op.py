"""``latent_decode``: single-token attention over a shared latent cache (see reference.py), and
``decode_prepare``: the norms and rotation of a decode step around it (prepare_reference.py).

Backends: "reference" (plain PyTorch, the default) and "triton" (triton_kernel.py, triton_prepare.py);
choose with ``backend=`` or MEDIAGEN_DECODE_BACKEND (MLRA's decode step picks the kernels itself on
CUDA tensors). With TRITON_INTERPRET=1 the Triton path runs on CPU tensors too, which is how the
tests check it without a GPU.
"""

from __future__ import annotations

import os

import torch

from ..backends import BACKENDS, check_backend
from .prepare_reference import decode_prepare_reference
from .reference import latent_decode_reference

try:
    from .triton_kernel import latent_decode_triton
    from .triton_prepare import decode_prepare_triton
except ImportError:  # pragma: no cover - platform without triton
    latent_decode_triton = decode_prepare_triton = None

DECODE_BACKENDS = BACKENDS


def _check(q_lat, q_rope, latents, rope_keys, rope_rotation):
    if q_lat.dim() != 4 or latents.dim() != 4:
        raise ValueError(f"q_lat must be (B, L, R, d_l) and latents (B, T, L, d_l); got q_lat "
                         f"{tuple(q_lat.shape)}, latents {tuple(latents.shape)}")
    B, L, R, D = q_lat.shape
    if latents.shape[0] != B or latents.shape[2:] != (L, D):
        raise ValueError(f"latents has shape {tuple(latents.shape)}; q_lat {tuple(q_lat.shape)} needs "
                         f"({B}, T, {L}, {D})")
    T = latents.shape[1]
    if T < 1:
        raise ValueError("latents holds T=0 tokens: decode attends over at least one cached token")
    G = q_rope.shape[1] if q_rope.dim() == 4 else 0
    if (q_rope.dim() != 4 or q_rope.shape[0] != B or q_rope.shape[2] != R or G < 1 or L % G
            or tuple(rope_keys.shape) != (B, T, q_rope.shape[3])):
        raise ValueError(f"q_rope must be ({B}, G, {R}, d_r) with G dividing {L} and rope_keys ({B}, {T}, d_r); "
                         f"got {tuple(q_rope.shape)} and {tuple(rope_keys.shape)}")
    tensors = (q_lat, q_rope, latents, rope_keys)
    if rope_rotation is not None:
        E = q_rope.shape[3]
        if len(rope_rotation) != 2 or any(t.shape != (E,) for t in rope_rotation) or E % 2:
            raise ValueError(f"rope_rotation must be (cos_full, sin_signed), each of shape ({E},) with d_r even; got "
                             f"{[tuple(t.shape) for t in rope_rotation]}")
        tensors = tensors + tuple(rope_rotation)
    if len({t.dtype for t in tensors}) != 1 or len({t.device for t in tensors}) != 1:
        raise ValueError("q_lat, q_rope, latents, rope_keys (and rope_rotation) must share one dtype and one "
                         "device; got "
                         f"{[str(t.dtype) for t in tensors]} on {[str(t.device) for t in tensors]}")


def _backend(backend, dtype, kernel):
    return check_backend(backend or os.environ.get("MEDIAGEN_DECODE_BACKEND") or "reference", dtype, kernel)


def latent_decode(q_lat, q_rope, latents, rope_keys, scale: float, *, backend: str | None = None,
                  splits: int | None = None, rope_rotation=None) -> torch.Tensor:
    """q_lat (B, L, R, d_l), q_rope (B, G, R, d_r) (latent l uses group l % G), latents (B, T, L, d_l),
    rope_keys (B, T, d_r); returns (B, L, R, d_l) in q_lat's dtype. ``rope_rotation``: optional
    (cos_full, sin_signed) rows (d_r,) that rotate the rope query first (reference.py).
    ``splits``: the Triton path's context splits (default: chosen from the GPU's size)."""
    _check(q_lat, q_rope, latents, rope_keys, rope_rotation)
    if _backend(backend, q_lat.dtype, latent_decode_triton) == "reference":
        return latent_decode_reference(q_lat, q_rope, latents, rope_keys, scale, rope_rotation)
    if rope_rotation is not None:
        rope_rotation = tuple(t.contiguous() for t in rope_rotation)
    return latent_decode_triton(q_lat, q_rope, latents, rope_keys, scale, splits, rope_rotation)


def decode_prepare(h, q_weight, kv_weight, rope_rotation, latent_slot, rope_slot, *, eps_q: float, eps_kv: float,
                   backend: str | None = None) -> torch.Tensor:
    """The elementwise work of an MLRA decode step (prepare_reference.py has the math): returns the
    normalised query latent c_q (B, d_q) and writes the new token's normalised latents into
    ``latent_slot`` (B, L, d_l) and its rotated rope key into ``rope_slot`` (B, d_r).
    h (B, d_q + L d_l + d_r); q_weight (d_q,); kv_weight (L, d_l); rope_rotation (cos_full, sin_signed)."""
    if h.dim() != 2 or kv_weight.dim() != 2 or q_weight.dim() != 1:
        raise ValueError(f"h must be (B, X), q_weight (d_q,) and kv_weight (L, d_l); got {tuple(h.shape)}, "
                         f"{tuple(q_weight.shape)}, {tuple(kv_weight.shape)}")
    B, (L, d_l), d_q, d_r = h.shape[0], kv_weight.shape, q_weight.shape[0], rope_slot.shape[-1]
    if h.shape[1] != d_q + L * d_l + d_r:
        raise ValueError(f"h has {h.shape[1]} columns; d_q + L d_l + d_r = {d_q} + {L}*{d_l} + {d_r} needs "
                         f"{d_q + L * d_l + d_r}")
    if tuple(latent_slot.shape) != (B, L, d_l) or rope_slot.dim() != 2 or rope_slot.shape[0] != B or d_r % 2:
        raise ValueError(f"latent_slot must be ({B}, {L}, {d_l}) and rope_slot ({B}, d_r) with d_r even; got "
                         f"{tuple(latent_slot.shape)} and {tuple(rope_slot.shape)}")
    if any(t.shape != (d_r,) for t in rope_rotation):
        raise ValueError(f"rope_rotation must be two rows of shape ({d_r},); got "
                         f"{[tuple(t.shape) for t in rope_rotation]}")
    tensors = (h, q_weight, kv_weight, *rope_rotation, latent_slot, rope_slot)
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"decode_prepare's tensors must share one device; got {[str(t.device) for t in tensors]}")
    if _backend(backend, h.dtype, decode_prepare_triton) == "reference":
        return decode_prepare_reference(h, q_weight, kv_weight, rope_rotation, latent_slot, rope_slot, eps_q, eps_kv)
    return decode_prepare_triton(h, q_weight, kv_weight, rope_rotation, latent_slot, rope_slot, eps_q, eps_kv)
