"""What the text kernels' dispatchers share: the check of an asked backend, "reference" (plain PyTorch) or
"triton", and whether an "auto" choice may take the kernels for a tensor and a layer."""

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


def records_gradients(x: torch.Tensor, layer) -> bool:
    """Whether autograd records this call: gradients are on and x or one of ``layer``'s parameters wants one."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in layer.parameters()))


def auto_takes_kernels(x: torch.Tensor, layer) -> bool:
    """The "auto" rule of the layers' inference kernels: ``kernels_serve(x)``, outside torch.compile (which fuses
    the torch ops itself), and no gradient recorded (``records_gradients``: the kernels have none)."""
    if not kernels_serve(x) or torch.compiler.is_compiling():
        return False
    return not records_gradients(x, layer)
