"""``mhla``: picks the Triton kernels on CUDA tensors and the whole-tensor PyTorch path elsewhere.

``"blocked"`` (blocked.py) is the CPU path: a few batched ops over a padded block-major copy of the
tokens (short sequences, eager: the quadratic form, two large matmuls). ``"reference"`` (naive.py) is the
oracle every path is tested against: it visits the blocks one by one. Force a path with ``backend="triton"`` / ``"blocked"`` / ``"reference"`` or the environment variable
MEDIAGEN_MHLA_BACKEND (the argument wins). With TRITON_INTERPRET=1 set before import, the Triton
path runs on CPU tensors too (slowly), which is how the tests check the kernels without a GPU.
"""

from __future__ import annotations

import math
import os

from .blocked import mhla_blocked
from .checks import check_mhla_args
from .naive import mhla_reference
from .rotation import split_rope

try:  # triton ships with CUDA builds of torch on Linux; elsewhere only the reference runs
    from .tiles import _interpreting
    from .triton_op import mhla_triton
except ImportError:  # pragma: no cover - platform without triton
    mhla_triton = None

BACKENDS = ("auto", "triton", "blocked", "reference")
ALGORITHMS = ("auto", "chunked", "dense")  # the Triton forwards (triton_op.ALGORITHMS)


def resolve_backend(backend, device) -> str:
    backend = backend or os.environ.get("MEDIAGEN_MHLA_BACKEND") or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not allowed: use one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "blocked"
    return backend


def mix_gradient_cancels(normalize: bool, blocks) -> bool:
    """Whether Mc's gradient is zero: with one block and normalize, Mc's one entry (per head) scales the
    numerator and the denominator alike and cancels (up to eps, whose share of the denominator is of order
    1e-6 / den). The computed gradient is then rounding noise, as large as dq's own rounding in half precision,
    which Adam would turn into full-size steps of Mc; the Triton and blocked paths return an exact zero (the
    reference path, the tests' oracle, keeps its own)."""
    return normalize and math.prod(blocks) == 1


def mhla(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None, backend=None,
         algorithm="auto", rope=None, cpe=None):
    """MHLA over a 1D/2D/3D token grid. q, k, v: (B, N, H, D); mix: (M, M) or (H, M, M).

    Returns o (B, N, H, D) in q's dtype. Math: docs/DESIGN.md#mhla; accumulation is fp32.
    ``algorithm`` ("auto", "chunked", "dense") chooses the Triton forward: chunked writes per-block
    summaries and suits long sequences; dense recomputes them on chip and suits short ones.
    ``rope``: None or (cos, sin) angle tables (N, D/2) that rotate the numerator's features, the
    official Wan MHLA variant (rotation.py).
    ``cpe``: None, or (weight, bias) of a conditional positional encoding that the Triton forward adds to o
    while nothing is differentiated (``triton_op.mhla_triton``); the other paths do not take it.
    """
    grid, blocks = check_mhla_args(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale)
    cos, sin = split_rope(rope, q)
    path = resolve_backend(backend, q.device)
    if algorithm not in ALGORITHMS:  # (checked on every path: a misspelt one would otherwise pass until a GPU run)
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    if path == "triton" and q.numel() == 0:
        # no tokens to launch over (an empty batch): the launch settings divide by the programs' count, and the
        # PyTorch path gives the empty output and its gradients (Mc's zero); a CPE of no tokens adds nothing
        path, cpe = "blocked", None
    if cpe is not None and path != "triton":
        raise ValueError(f"cpe= is taken by the Triton path only, not backend={path!r}: add the CPE after the op")
    if path == "blocked" and mix_gradient_cancels(normalize, blocks) and mix.requires_grad:
        mix = mix.detach() + 0 * mix  # the same values, an exact zero gradient (for a finite incoming one)
    if path in ("blocked", "reference"):
        torch_path = mhla_blocked if path == "blocked" else mhla_reference
        return torch_path(q, k, v, mix, grid, blocks, normalize=normalize, eps=eps, feature_map=feature_map,
                          scale=scale, rope=rope)
    if mhla_triton is None:
        raise ValueError("backend='triton' needs the triton package, which is not installed here")
    if not q.is_cuda and not _interpreting():
        # Triton launches on GPU memory; CPU tensors run only in its interpreter (TRITON_INTERPRET=1 set before
        # import), and a launch on them otherwise fails deep inside Triton with a message that names neither
        raise ValueError(f"backend='triton' needs CUDA tensors, not q on {q.device} (or TRITON_INTERPRET=1 set "
                         f"before mediagen is imported): use backend='blocked' or None, or move the tensors")
    return mhla_triton(q, k, v, mix, grid, blocks, normalize=normalize, eps=float(eps),
                       feature_map=feature_map, scale=scale, algorithm=algorithm,
                       rope=None if cos is None else (cos, sin), cpe=cpe)
