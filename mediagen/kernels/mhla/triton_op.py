"""MHLA on the Triton kernels: ``mhla_triton``, the entry point behind ``mhla(..., backend="triton")``.

The op is four modules, by what changes together:
- tiles.py: the cost model (``choose_algorithm``, ``choose_splits``) and each kernel's tiles;
- launches.py: the launch records, the runs that allocate outputs and launch, ``launch_*`` for other callers;
- autograd.py: the op's plans (worked out once per shape, looked up per call), the autograd Function (eager)
  and the custom ops (torch.compile), both over ``forward_impl`` / ``backward_impl``;
- this module: the entry point, and the names above that callers import from here.
"""

from __future__ import annotations

import math

import torch

from . import tiles
from .autograd import _MHLAFunction, _needs_grad, _plan, _traced_token_blocks
from .autograd import backward_impl, forward_impl  # noqa: F401 (names callers import from here)
from .launches import (launch_apply, launch_dense, launch_key_grad, launch_mix, launch_mix_grad,  # noqa: F401
                       launch_query_grad, launch_summary, row_strides, stride_unit)
from .tiles import _interpreting
from .tiles import (choose_algorithm, choose_splits, dense_grad_tiles, dense_head_pieces, dense_settings,  # noqa: F401
                    dense_tail, fill_rows, summary_dtype)

ALGORITHMS = ("auto", "chunked", "dense")
# Traced code without a backward launches the dense forward from Inductor's own code (``mhla_dense``)
TRACED_DENSE_OP = True


def mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                algorithm="auto", splits=None, rope=None, exchange=None, cpe=None):
    """Arguments already validated by ``mhla``. Returns o (B, N, H, D) in q's dtype.

    ``exchange``: None, or a ``BlockExchange`` (exchange.py) when this process holds only the blocks
    ``exchange.rows`` of ``grid``: q, k, v (and the rope tables) are then those blocks' tokens, numbered as
    ``exchange.order`` numbers them, and o is theirs. It runs the chunked steps with one split per block, the
    summaries that travel being whole blocks' (more splits would multiply what is sent).

    ``cpe``: None, or (weight, bias) of a conditional positional encoding to add to o, o + bias + a depthwise
    convolution of v over ``grid`` (channel h * D + d; weight (H * D, 1, *k), odd sizes, bias (H * D,) or
    None), for sampling: nothing may be differentiated. The dense forward adds it before it stores o where its
    launch fits in one wave (``_cpe_pays``); otherwise, and after the chunked forward, ``kernels.cpe.cpe_add``
    does."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    cos, sin = rope if rope is not None else (None, None)
    if cos is not None and torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        # the kernels differentiate q, k, v and Mc only: a table's gradient would be silently missing
        raise ValueError("rope tables that require grad are not differentiated by the Triton kernels: detach them "
                         "(fixed angles), or use backend='blocked' to learn them")
    if cpe is not None and (exchange is not None or torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, mix, *cpe)))):
        raise ValueError("cpe= is taken only by an eager forward that nothing differentiates, without an exchange: "
                         "add the CPE after the op otherwise")
    if exchange is not None:
        if algorithm == "dense":
            raise ValueError("algorithm='dense' is not allowed with an exchange (the dense kernel keeps no block "
                             "summaries to exchange): use 'auto' or 'chunked'")
        if splits not in (None, 1):
            raise ValueError(f"splits={splits} is not allowed with an exchange: use None or 1")
        plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, float(eps), feature_map or "none",
                     1.0 if scale is None else float(scale), "chunked", 1, cos, sin, _needs_grad(q, k, v, mix),
                     exchange)
        return _MHLAFunction.apply(q, k, v, mix, plan, cos, sin, exchange)
    if torch.compiler.is_compiling():  # traced: no plan cache (the custom op's body makes its own plans)
        B, N, H, D = q.shape
        M = math.prod(blocks)
        if splits is None:
            largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
            splits = tiles.choose_splits(B, H, M, largest, D, q.device)
        keep = _needs_grad(q, k, v, mix)
        if algorithm == "auto":
            algorithm = tiles.choose_algorithm(B, N, H, D, M, splits, q.dtype, rope is not None, keep)
        # Mc as the kernels read it (fp32, contiguous) made in the graph, where inductor fuses the cast,
        # rather than inside the op as one more eager copy per call
        mixf = mix.float().contiguous()
        if algorithm == "dense" and not keep and q.is_cuda and not _interpreting() and TRACED_DENSE_OP:
            blk = _traced_token_blocks(tuple(grid), tuple(blocks), q.device)
            return torch.ops.mediagen.mhla_dense(q, k, v, mixf, blk, normalize, float(eps), feature_map or "none",
                                                 1.0 if scale is None else float(scale), cos, sin)
        args = (list(grid), list(blocks), normalize, float(eps), feature_map or "none",
                1.0 if scale is None else float(scale), algorithm, int(splits), cos, sin, keep)
        return torch.ops.mediagen.mhla_fwd(q, k, v, mixf, *args)[0]
    keep = _needs_grad(q, k, v, mix)
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, float(eps), feature_map or "none",
                 1.0 if scale is None else float(scale), algorithm, None if splits is None else int(splits), cos, sin,
                 keep, None, cpe)
    if not keep:  # nothing to differentiate (sampling): no autograd node, nothing saved
        return plan.forward(q, k, v, mix, cos, sin, None, cpe)[0]
    return _MHLAFunction.apply(q, k, v, mix, plan, cos, sin, None)
