"""``latent_decode``: single-token attention over a shared latent cache (see reference.py).

Backends: "reference" (plain PyTorch, the default) and "triton" (split-K kernel, triton_kernel.py);
choose with ``backend=`` or MEDIAGEN_DECODE_BACKEND. The reference stays the default until the
kernel's GPU latency is measured against MLRA's torch decode (benchmarks/text_encoders.py prints
both). With TRITON_INTERPRET=1 the Triton path runs on CPU tensors too, which is how the tests check
it without a GPU.
"""

from __future__ import annotations

import os

import torch

from .reference import latent_decode_reference

try:
    from .triton_kernel import latent_decode_triton
except ImportError:  # pragma: no cover - platform without triton
    latent_decode_triton = None

DECODE_BACKENDS = ("reference", "triton")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(q_lat, q_rope, latents, rope_keys):
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
    if q_rope.shape[:3] != (B, L, R) or q_rope.dim() != 4 or tuple(rope_keys.shape) != (B, T, q_rope.shape[3]):
        raise ValueError(f"q_rope must be ({B}, {L}, {R}, d_r) and rope_keys ({B}, {T}, d_r); got "
                         f"{tuple(q_rope.shape)} and {tuple(rope_keys.shape)}")
    tensors = (q_lat, q_rope, latents, rope_keys)
    if len({t.dtype for t in tensors}) != 1 or len({t.device for t in tensors}) != 1:
        raise ValueError("q_lat, q_rope, latents and rope_keys must share one dtype and one device; got "
                         f"{[str(t.dtype) for t in tensors]} on {[str(t.device) for t in tensors]}")


def latent_decode(q_lat, q_rope, latents, rope_keys, scale: float, *, backend: str | None = None,
                  splits: int | None = None) -> torch.Tensor:
    """q_lat (B, L, R, d_l), q_rope (B, L, R, d_r), latents (B, T, L, d_l), rope_keys (B, T, d_r);
    returns (B, L, R, d_l) in q_lat's dtype. ``splits``: the Triton path's context splits (default:
    chosen from the GPU's size)."""
    _check(q_lat, q_rope, latents, rope_keys)
    backend = backend or os.environ.get("MEDIAGEN_DECODE_BACKEND") or "reference"
    if backend not in DECODE_BACKENDS:
        raise ValueError(f"backend={backend!r} is not allowed: use one of {DECODE_BACKENDS}")
    if backend == "reference":
        return latent_decode_reference(q_lat, q_rope, latents, rope_keys, scale)
    if latent_decode_triton is None:
        raise ValueError("backend='triton' needs the triton package, which is not installed here")
    if q_lat.dtype not in _DTYPES:
        raise ValueError(f"backend='triton' takes {', '.join(map(str, _DTYPES))}; got {q_lat.dtype}")
    return latent_decode_triton(q_lat, q_rope, latents, rope_keys, scale, splits)
