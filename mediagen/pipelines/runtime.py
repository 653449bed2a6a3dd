"""How the pipelines' denoising loop runs the transformer: ``pipe.set_runtime(...)``,
``mediagen generate --runtime``, the app's "runtime" choice.

    eager        the plain module, called as diffusers calls it (the default)
    compile      ``torch.compile(transformer)`` (Inductor, default mode): the first step compiles
                 (seconds on a GPU, up to a minute on a CPU with a cold cache); later steps and runs
                 with the same shapes reuse the compiled code, another output size compiles once more
    cuda-graphs  ``torch.compile(transformer, mode="reduce-overhead")``: Inductor's code recorded as
                 CUDA graphs and replayed every step, which removes the per-kernel launch cost that
                 dominates small models; CUDA devices only

The transformer module is never wrapped or changed: the compiled wrapper lives on the pipeline beside
it. So ``pipe.transformer`` stays the plain module (its weights, parameter names, ``save_pretrained``
and ``mediagen.convert`` work as before), back to "eager" the loop calls that module again, and
pipelines sharing one module (the app's cached transformers) may run it with different runtimes at
once. Torch keeps the compiled code (per model class and configuration, input shapes and mode), so a
fresh pipeline around a model of a kind compiled before does not compile again.
"""

from __future__ import annotations

import torch

from .names import RUNTIMES

__all__ = ["RUNTIMES", "COMPILE_MODES", "RuntimeMixin", "check_runtime"]

# torch.compile mode per compiled runtime
COMPILE_MODES = {"compile": "default", "cuda-graphs": "reduce-overhead"}


def check_runtime(runtime, device=None) -> str:
    """``runtime`` if it is one of RUNTIMES and runs on ``device`` (when given); else a one-line
    ValueError naming the value and what is allowed."""
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise ValueError(f"runtime={runtime!r} is not allowed: use one of {RUNTIMES}")
    if runtime == "cuda-graphs" and device is not None and torch.device(device).type != "cuda":
        raise ValueError(f"runtime='cuda-graphs' is not allowed on device {torch.device(device).type}: CUDA graphs "
                         f"need a CUDA device; use 'compile' or 'eager' there")
    return runtime


def _owned(out):
    """``out`` with its tensors copied out of the CUDA-graph memory pool: the next replay overwrites
    that memory, and multistep schedulers (UniPC, DPM-Solver) keep earlier steps' outputs."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_owned(o) for o in out)
    return out


class RuntimeMixin:
    """``set_runtime`` / ``runtime`` for a diffusers pipeline with a ``transformer``; its denoising
    loop calls the transformer through ``call_transformer`` (with ``return_dict=False``)."""

    _runtime = "eager"
    _compiled = None       # (module, its torch.compile wrapper) for the current compiled runtime

    @property
    def runtime(self) -> str:
        return self._runtime

    def set_runtime(self, runtime: str = "eager"):
        """Run the denoising loop's transformer calls "eager", "compile" (torch.compile) or "cuda-graphs"
        (torch.compile with CUDA graphs, CUDA only); outputs match eager within the dtype's rounding.
        Compilation happens on the next call. Returns the pipeline."""
        self._runtime = check_runtime(runtime, self._execution_device)
        self._compiled = None
        return self

    def call_transformer(self, *args, **kwargs):
        """``self.transformer(*args, **kwargs)`` under the pipeline's runtime."""
        module = self.transformer
        if self._runtime == "eager":
            return module(*args, **kwargs)
        if self._compiled is None or self._compiled[0] is not module:   # compiled for the module it now holds
            self._compiled = (module, torch.compile(module, mode=COMPILE_MODES[self._runtime]))
        compiled = self._compiled[1]
        if self._runtime == "compile":
            return compiled(*args, **kwargs)
        # the pipeline may have moved since set_runtime; the inputs say where it runs now, at no cost
        inputs = (a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        check_runtime(self._runtime, next(inputs).device)
        # each call starts a new CUDA-graph iteration: the previous call's outputs are not read again
        # (they were copied out), so the replay may reuse their memory
        torch.compiler.cudagraph_mark_step_begin()
        return _owned(compiled(*args, **kwargs))
