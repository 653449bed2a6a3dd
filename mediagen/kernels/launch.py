"""Launch records that call a Triton kernel's compiled form directly once the JIT has compiled it.

``kernel[grid](*args, **consts)`` (Triton's JIT dispatch) binds every argument, works out each one's
specialisation and the cache key, looks the compiled kernel up, and only then calls its launcher. At the
small shapes where a kernel runs for a few µs (DiT-XL/2 at 256 px, the video models' 1,024 tokens) that
dispatch is most of a launch's host time (benchmarks/RESULTS.md, eager host time).

A ``CachedLaunch`` holds one launch's grid, run-time scalars and compile-time constants. Its first call goes
through the dispatch and keeps the compiled kernel the dispatch returns; later calls launch that compiled
kernel directly when the arguments would have selected it again. The scalars and constants are the record's
own, so they cannot differ; what can is the tensors: their dtypes, whether their data pointers are 16-byte
aligned (Triton's pointer specialisation), whether they are all CUDA tensors, and the current CUDA device
(Triton compiles per device). Any other case, and every call under the CPU interpreter (whose dispatch returns
no compiled kernel), goes through the dispatch as before. A direct launch passes the tensors' data pointers as
ints, which the alignment check reads anyway: given a tensor, Triton's launcher calls its ``data_ptr`` again
and asks the CUDA driver what kind of pointer it is, per argument (measured: benchmarks/RESULTS.md, Alternatives
behind the defaults and rules).

``use_switches(direct_launch=False)`` (switches.py; or MEDIAGEN_DIRECT_LAUNCH=0 in the environment) sends every
launch through the dispatch.
"""

from __future__ import annotations

import inspect

import torch

from .switches import kernel_switches


def _tensor_key(tensors):
    """((device, then each tensor's dtype and whether it is a CUDA tensor), data pointers) of the tensor
    arguments when every data pointer is 16-byte aligned, else (None, None): the record then always dispatches
    (a misaligned pointer compiles its own variant, which is rare). A CPU tensor among CUDA ones changes the
    key, so it reaches the dispatch, which refuses it, and never the launcher as a bare pointer."""
    key = [torch.cuda.current_device() if tensors[0].is_cuda else -1]
    pointers = []
    for t in tensors:
        p = t.data_ptr()
        if p & 15:
            return None, None
        pointers.append(p)
        key.append(t.dtype)
        key.append(t.is_cuda)
    return tuple(key), pointers


def _argument_tail(kernel, positional: int, consts: dict) -> tuple:
    """The kernel's parameters after the first ``positional``, in its order, from ``consts`` or the parameter's
    default: the compiled kernel's launcher takes every parameter (constexprs too), as the dispatch passes them."""
    names = list(inspect.signature(kernel.fn).parameters.items())
    tail = []
    for name, param in names[positional:]:
        if name in consts:
            tail.append(consts[name])
        elif param.default is not inspect.Parameter.empty:
            tail.append(param.default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: no value for parameter {name!r}")
    return tuple(tail)


class CachedLaunch:
    """One kernel launch worked out from shapes and settings: ``grid``, the run-time ``scalars`` that follow
    the tensor arguments, and ``consts`` (compile-time constants and launch options such as num_warps).

    ``record(kernel, *tensors)`` launches ``kernel`` with the tensors, then the scalars, then the constants."""

    __slots__ = ("grid", "scalars", "consts", "_kernel", "_key", "_run", "_tail")

    def __init__(self, grid: tuple, scalars: tuple, consts: dict):
        self.grid, self.scalars, self.consts = tuple(grid), tuple(scalars), dict(consts)
        self._kernel = self._key = self._run = self._tail = None

    def __call__(self, kernel, *tensors):
        if self._kernel is kernel and kernel_switches().direct_launch:
            key, pointers = _tensor_key(tensors)
            if key == self._key:
                self._run(*pointers, *self._tail)
                return
        compiled = kernel[self.grid](*tensors, *self.scalars, **self.consts)
        self._remember(kernel, compiled, tensors)

    def _remember(self, kernel, compiled, tensors):
        """Keep ``compiled`` for direct launches (nothing under the interpreter, or from a stand-in kernel that
        returns no compiled kernel)."""
        self._kernel = None
        key = _tensor_key(tensors)[0]
        if compiled is None or key is None or not hasattr(compiled, "run") or not hasattr(kernel, "fn"):
            return
        grid3 = (*self.grid, *(1,) * (3 - len(self.grid)))
        self._tail = (*self.scalars, *_argument_tail(kernel, len(tensors) + len(self.scalars), self.consts))
        self._run = compiled[grid3]
        self._key, self._kernel = key, kernel

    def __repr__(self):
        return f"CachedLaunch(grid={self.grid}, scalars={self.scalars}, consts={self.consts})"
