"""What the text kernels' dispatchers share: the check of an asked backend, "reference" (plain PyTorch) or
"triton", and whether an "auto" choice may take the kernels for a tensor."""

from __future__ import annotations

import torch

BACKENDS = ("reference", "triton")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_backend(backend: str, dtype: torch.dtype, kernel) -> str:
    """``backend`` when it is allowed for tensors of ``dtype`` (``kernel`` is None where triton is missing);
    else a ValueError that names it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not allowed: use one of {BACKENDS}")
    if backend == "triton":
        if kernel is None:
            raise ValueError("backend='triton' needs the triton package, which is not installed here")
        if dtype not in TRITON_DTYPES:
            raise ValueError(f"backend='triton' takes {', '.join(map(str, TRITON_DTYPES))}; got {dtype}")
    return backend


def kernels_serve(x: torch.Tensor) -> bool:
    """Whether an "auto" dispatcher may send ``x`` to the Triton kernels: a CUDA tensor of a dtype they take
    (a float64 layer keeps its torch ops)."""
    return x.is_cuda and x.dtype in TRITON_DTYPES
