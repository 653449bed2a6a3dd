"""The check shared by the text kernels' dispatchers: "reference" (plain PyTorch) or "triton"."""

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
