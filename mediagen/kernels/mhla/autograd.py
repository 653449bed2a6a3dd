"""The MHLA Triton op's plans, its autograd Function (eager) and its torch.library custom ops (compiled).

Two entry points share one implementation (``forward_impl`` / ``backward_impl``):
- eager: a torch.autograd.Function (``_MHLAFunction``), the lowest per-call overhead;
- under torch.compile: torch.library custom ops ``mediagen::mhla_fwd`` / ``mediagen::mhla_bwd`` with
  fake implementations and registered autograd, so compiled models trace through without breaks.

Two forward algorithms (``algorithm``): "chunked" (per-block summaries in memory, mixed by a matmul;
long sequences) and "dense" (summaries recomputed on chip; short sequences); "auto" picks by a cost
model. The backward of a chunked forward runs the chunked kernels on the summaries it kept; after the dense
forward (no RoPE, one process) the dense backward's two kernels make every gradient the same way, dMc included,
from each query's 1 / den and o's bf16 rounding, which that forward keeps when a backward is to come
(triton_dense_grad.py; with RoPE the chunked backward makes the summaries again).
``cos``/``sin`` (N, D/2) angle tables turn on RoPE on the numerator's features (rotation.py).

The chunked forward and the backward are one sequence of steps (``_Plan.forward`` / ``_Plan.backward``)
for the single-process op and for sequence parallelism: given a ``BlockExchange`` (exchange.py), a process
holding some of the blocks calls it where the processes' parts meet (the summaries after ``summary``, the
partial dS after the transposed mix) and mixes only its rows of Mc. Without one, the launches are the
single-process op's and nothing more.

Launch plans. At small shapes (DiT-XL/2 at 256 px: 16 us of GPU work per forward) the host's time per call
decides the speed, so everything a launch needs that follows from the call's shapes, strides, dtypes, options
and launch settings (algorithm, token splits, tile sizes, grids, stride units, index tensors) is worked out
once into a ``_Plan`` and looked up by those keys on later calls (``_plan``). A call then only allocates its
outputs and launches (launches.py).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from .checks import FEATURE_CODES
from .layout import block_token_lists, kept_on
from .settings import current_settings
from .triton_dense import dense_forward_kernel
from . import tiles  # (its switches and the SM count read through the module, where tests replace them)
from .tiles import EAGER_LAUNCH_S, _cpe_pays, _dense_backward, summary_dtype
from .launches import (_apply_launch, _cached, _contiguous, _dense_grad_launch, _dense_launch, _key_grad_launch,
                       _mix_grad_launch, _mix_launch, _query_grad_launch, _run_apply, _run_dense, _run_dense_grad,
                       _run_key_grad, _run_mix, _run_mix_grad, _run_query_grad, _run_summary, _summary_launch,
                       _table_strides, _token_blocks_int32, cpe_form)


# ---- the op's plans ------------------------------------------------------------------------------------

class _Plan:
    """Everything the op's launches need that follows from its cache key (``_plan``): the algorithm and
    token splits, the block index tensors, and one launch record per kernel; the backward's records per
    stride pattern of the incoming gradient, made on its first use. Launches take the settings the plan was
    made with, so a backward launches with its forward's settings on whatever thread autograd runs it."""

    def __init__(self, settings, q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
                 cos, sin, keep, exchange=None, cpe=None):
        B, N, H, D = shape = q.shape
        self.grid = grid
        # the CPE the forward adds to o (no gradients only): in the dense kernel (cpe_in_kernel), else a launch of
        # its own after the forward
        self.cpe = None if cpe is None else cpe_form(*cpe, grid, H * D)
        self.cpe_in_kernel = False
        dtype, device = q.dtype, q.device
        M = math.prod(blocks)
        if splits is None:
            largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
            splits = tiles.choose_splits(B, H, M, largest, D, device)
        if algorithm == "auto":
            algorithm = tiles.choose_algorithm(B, N, H, D, M, splits, dtype, cos is not None, keep, EAGER_LAUNCH_S)
        # M: the blocks this process holds, whose tokens q, k, v are (all of them without an exchange);
        # M_all: the blocks of Mc, whose summaries the mix reads
        self.M_all = M
        if exchange is None:
            self.rows = None
            self.order, self.offsets, self.largest = block_token_lists(grid, blocks, device)
        else:
            self.rows = exchange.rows
            self.order, self.offsets = exchange.order, exchange.offsets
            M = self.rows.stop - self.rows.start
            # the largest block of the grid bounds the held ones (it picks the one-step launch settings)
            self.largest = block_token_lists(grid, blocks, torch.device("cpu"))[2]
        self.settings, self.algorithm, self.M, self.J = settings, algorithm, M, int(splits)
        self.sz_dtype = summary_dtype(dtype, keep)  # the forward's summaries
        self.per_head = mix.dim() == 3
        self.ieee = dtype == torch.float32
        self.fcode = fcode = FEATURE_CODES[feature_map]
        self.tstrides = tstrides = _table_strides(cos, sin)
        self.args = (shape, dtype, tstrides, normalize, eps, scale, fcode)
        self.k_stride, self.v_stride = k.stride(), v.stride()
        self.q_stride = q.stride()
        # Mc as the kernels read it: fp32 (the dense kernel: contiguous too); the mix kernels take any strides
        contiguous = mix.stride() == _contiguous(mix.shape)
        self.mix_copy = mix.dtype != torch.float32 or (algorithm == "dense" and not contiguous)
        mix_stride = _contiguous(mix.shape) if self.mix_copy else mix.stride()
        self.mix_shape, self.mix_stride = mix.shape, mix_stride
        # the mix kernels read the held rows of Mc (a view with Mc's strides): all of it without an exchange
        self.rows_shape = mix.shape if exchange is None else (*mix.shape[:-2], M, self.M_all)
        self.backward_plans: dict = {}
        self.dense_backward = (algorithm == "dense" and exchange is None
                               and _dense_backward(keep, cos is not None, M, settings))
        if algorithm == "dense":
            self.blk = _token_blocks_int32(grid, blocks, device)
            dense = lambda cpe: _dense_launch(  # noqa: E731
                settings, shape, dtype, (q.stride(), k.stride(), v.stride()), tstrides, M, self.per_head, normalize,
                eps, scale, fcode, tiles._sms_of(device), self.dense_backward and normalize, cpe)
            self.dense = dense(self.cpe)
            self.cpe_in_kernel = self.cpe is not None and _cpe_pays(self.dense.grid, tiles._sms_of(device))
            if self.cpe is not None and not self.cpe_in_kernel:
                self.dense = dense(None)
        else:
            self._summary_and_mix(shape, dtype, device)
            self.apply = _apply_launch(settings, shape, dtype, q.stride(), tstrides, M, self.J, normalize, eps,
                                       scale, fcode)

    def _summary_and_mix(self, shape, dtype, device):
        B, N, H, D = shape
        M, J, settings = self.M, self.J, self.settings
        self.summary = _summary_launch(settings, shape, dtype, self.k_stride, self.v_stride, self.tstrides, M, J,
                                       self.fcode, self.largest)
        self.mix = _mix_launch(settings, self.rows_shape, self.mix_stride, (B, H, self.M_all * J, D * D + D),
                               self.sz_dtype, J, self.ieee, False, None, device)

    def mix_operand(self, mix):
        """Mc as the kernels read it; with an exchange, the held rows only."""
        m = _fp32_mix(mix) if self.mix_copy else mix
        return m if self.rows is None else m[..., self.rows, :]

    def forward(self, q, k, v, mix, cos, sin, exchange=None, cpe=None):
        """(o, sz, mixed); after the dense algorithm, which keeps no summaries, (o, inv, lo) ahead of the dense
        backward (``_run_dense``), else (o, None, None).
        ``exchange``: the ``BlockExchange`` this plan was made with, or None; sz is then all blocks'
        summaries, gathered (exchange.py: the steps). ``cpe``: (weight, bias) of the CPE the plan was made
        with, added to o."""
        m = self.mix_operand(mix)
        if self.algorithm == "dense":
            if cpe is None:
                return _run_dense(self.dense, q, k, v, m, self.blk, cos, sin)
            if self.cpe_in_kernel:
                weight, bias = cpe
                return _run_dense(self.dense, q, k, v, m, self.blk, cos, sin,
                                  weight if weight.is_contiguous() else weight.contiguous(), bias)
            return self._cpe_after(_run_dense(self.dense, q, k, v, m, self.blk, cos, sin)[0], v, cpe), None, None
        sz = _run_summary(self.summary, k, v, self.order, self.offsets, cos, sin, self.sz_dtype)
        if exchange is not None:
            sz = exchange.gather_summaries(sz)
        mixed = _run_mix(*self.mix, m, sz, sz.dtype)
        o = _run_apply(self.apply, q, mixed, self.order, self.offsets, cos, sin)
        return (o if cpe is None else self._cpe_after(o, v, cpe)), sz, mixed

    def _cpe_after(self, o, v, cpe):
        """o + the CPE as a launch of its own (``kernels.cpe``)."""
        from ..cpe import cpe_add

        B, N, H, D = o.shape
        return cpe_add(o.view(B, N, H * D), v.reshape(B, N, H * D), *cpe, self.grid).view(B, N, H, D)

    def backward(self, g, q, k, v, mix, o, sz, mixed, cos, sin, exchange=None):
        """The gradients of q, k, v and mix. Every summary is fp32 here (``summary_dtype``); after the dense
        forward sz and mixed are its inv and lo (``forward``). ``exchange``: as in ``forward``; dMc is then this
        process's share (its rows), which the processes' shares sum to."""
        dq, dk, dv, dmix = self._gradients(g, q, k, v, mix, o, sz, mixed, cos, sin, exchange)
        # Mc cancels when the whole grid is one block (op.mix_gradient_cancels): exact zero. M_all, not the held
        # blocks M: a process of a sequence-parallel group may hold one block of several, whose Mc does not cancel
        if self.M_all == 1 and self.args[3]:
            dmix = torch.zeros_like(dmix)
        return dq, dk, dv, dmix

    def _gradients(self, g, q, k, v, mix, o, sz, mixed, cos, sin, exchange):
        g_stride = g.stride()
        # (a forward that kept no inv, under other switches than now, is followed by the chunked backward)
        dense = self.dense_backward and (sz is not None or not self.args[3])
        bp = self.backward_plans.get((g_stride, dense))
        if bp is None:
            if len(self.backward_plans) >= 16:
                self.backward_plans.clear()
            bp = self.backward_plans[g_stride, dense] = _BackwardPlan(self, g_stride, q.device, dense)
        if dense:
            dq, dk, dv, dmix = _run_dense_grad(bp.dense, q, k, v, g, o, sz, mixed, self.mix_operand(mix), self.blk,
                                               self.per_head)
            return dq, dk, dv, dmix if dmix.dtype == mix.dtype else dmix.to(mix.dtype)
        B, N, H, D = q.shape
        M, J, X = self.M, self.J, D * D + D
        order, offsets = self.order, self.offsets
        m = self.mix_operand(mix)
        if self.algorithm == "dense" or sz is None or sz.numel() == 0:  # the forward kept no summaries
            sz = _run_summary(bp.summary, k, v, order, offsets, cos, sin, torch.float32)
            mixed = _run_mix(*bp.mix, m, sz, sz.dtype)
        dq, dsz_part = _run_query_grad(bp.query_grad, q, g, o, mixed, order, offsets, cos, sin, M, J)
        # Each summary-sized fp32 buffer (B * H * M * (D^2 + D) values; 113 MiB at Wan2.1-1.3B's 720p) is dropped
        # once read for the last time, so the key gradients' launch, beside dq, dk and dv, finds only dS alive
        # rather than four (made here they are this frame's own; kept by the forward, the caller holds them)
        del mixed
        # dS~ per query block (split parts summed in fp32)
        dmixed = dsz_part.view(B, H, M, J, X).sum(3, dtype=torch.float32) if J > 1 else dsz_part
        part_dtype = dsz_part.dtype
        del dsz_part
        if exchange is None:
            block_sz = sz.view(B, H, M, J, X).sum(3) if J > 1 else sz
            del sz
            dmix = _run_mix_grad(bp.mix_grad, dmixed, block_sz)  # dMc_ib = <dS~_i, S_b>
            del block_sz
            dsz = _run_mix(*bp.mix_transposed, m, dmixed, part_dtype)  # dS_b = Mc^T dS~
        else:  # (one split per block: the exchanged summaries are whole blocks')
            dsz = exchange.sum_summary_grads(_run_mix(*bp.mix_transposed, m, dmixed, part_dtype))
            dmix = _held_rows_mix_grad(dmixed, sz, mix.shape, self.rows)
            del sz
        del dmixed
        dk, dv = _run_key_grad(bp.key_grad, k, v, dsz, order, offsets, cos, sin)
        return dq, dk, dv, dmix if dmix.dtype == mix.dtype else dmix.to(mix.dtype)


def _fp32_mix(mix):
    """Mc as fp32 and contiguous, kept on ``mix`` until it changes (``layout.kept_on``): a copy on every call of a
    bf16 model is host time every eager step pays (benchmarks/RESULTS.md, Alternatives)."""
    return kept_on(mix, "_mediagen_fp32", lambda: mix.detach().float().contiguous())


class _BackwardPlan:
    """The backward's launch records for one stride pattern of the incoming gradient; ``dense``: the dense
    backward's (after a dense forward without RoPE), else the chunked one's."""

    def __init__(self, plan: _Plan, g_stride, device, dense: bool):
        shape, dtype, tstrides, normalize, eps, scale, fcode = plan.args
        B, N, H, D = shape
        M, J, settings = plan.M, plan.J, plan.settings
        if dense:
            self.dense = _dense_grad_launch(settings, shape, dtype, (plan.q_stride, plan.k_stride, plan.v_stride,
                                                                     g_stride), M, plan.per_head, normalize, eps,
                                            scale, fcode)
            return
        # the summaries, made again here where the forward kept none (``_Plan._gradients``)
        self.summary = _summary_launch(settings, shape, dtype, plan.k_stride, plan.v_stride, tstrides, M, J, fcode,
                                       plan.largest)
        self.mix = _mix_launch(settings, plan.rows_shape, plan.mix_stride, (B, H, M * J, D * D + D), torch.float32,
                               J, plan.ieee, False, None, device)
        self.query_grad = _query_grad_launch(settings, shape, dtype, plan.q_stride, g_stride, tstrides, M, J,
                                             normalize, eps, scale, fcode)
        self.mix_transposed = _mix_launch(settings, plan.rows_shape, plan.mix_stride, (B, H, M, D * D + D),
                                          torch.float32, 1, plan.ieee, True, None, device)
        self.mix_grad = (_mix_grad_launch(settings, (B, H, M, D * D + D), plan.per_head, plan.ieee)
                         if plan.rows is None else None)
        self.key_grad = _key_grad_launch(settings, shape, dtype, plan.k_stride, plan.v_stride, tstrides, M, J,
                                         fcode, plan.largest)


def _held_rows_mix_grad(dmixed, sz, mix_shape, rows):
    """dMc when a process holds the query blocks ``rows`` only: dMc[i, b] = <dS~_i, S_b> summed over batch
    (and heads for a shared Mc) in those rows, zero in the others, so the processes' parts sum to the whole.
    dmixed (B, H, held, X) and sz (B, H, M, X) are fp32; a matmul makes the slab (the mix_grad kernel fills
    square Mc only)."""
    held = torch.matmul(dmixed, sz.transpose(-1, -2)).sum(0)  # (H, held, M)
    dmix = torch.zeros(mix_shape, device=dmixed.device, dtype=torch.float32)
    if len(mix_shape) == 3:
        dmix[:, rows] = held
    else:
        dmix[rows] = held.sum(0)
    return dmix


_plans: dict = {}


def _plan(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin,
          keep, exchange=None, cpe=None) -> _Plan:
    """The plan for these arguments under the launch settings in force, made on first use. The key holds the
    settings table's id; a plan keeps its table alive, so while a plan is cached no other table has that id.
    ``keep``: the forward's summaries are kept for a backward. ``exchange``: a ``BlockExchange`` or None; its
    held block range is part of the key (it decides the token lists the plan keeps). ``cpe``: (weight, bias) or
    None; its kernel's shape and whether it has a bias are part of the key."""
    settings = current_settings()
    key = (id(settings), q.shape, q.dtype, q.device, q.stride(), k.stride(), v.stride(), mix.shape, mix.dtype,
           mix.stride(), grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
           _table_strides(cos, sin), keep, None if exchange is None else (exchange.rows.start, exchange.rows.stop),
           None if cpe is None else (cpe[0].shape, cpe[1] is None))
    plan = _plans.get(key)
    if plan is None:
        plan = _cached(_plans, key, lambda: _Plan(settings, q, k, v, mix, grid, blocks, normalize, eps, feature_map,
                                                  scale, algorithm, splits, cos, sin, keep, exchange, cpe))
    return plan


def _needs_grad(q, k, v, mix) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or mix.requires_grad)


def forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
                 cos=None, sin=None, keep=True):
    """Returns (o, sz, mixed): the per-block (per-split) summaries (B, H, M * J, D * D + D) and the mixed ones
    S~, z~, kept for the backward. After the dense algorithm, which keeps no summaries: each row's 1 / den
    (B * H, N) and o's rounding (bf16, o's shape) ahead of the dense backward, empty where it keeps none
    (``_Plan.forward``). ``keep``: a backward will use them (their dtype, ``summary_dtype``)."""
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, eps, feature_map, scale, algorithm, splits,
                 cos, sin, keep)
    o, sz, mixed = plan.forward(q, k, v, mix, cos, sin)
    return (o, q.new_empty((0,), dtype=torch.float32) if sz is None else sz,  # (two tensors: outputs may not alias)
            q.new_empty((0,), dtype=torch.float32) if mixed is None else mixed)


def backward_impl(g, q, k, v, mix, o, sz, mixed, grid, blocks, normalize, eps, feature_map, scale, splits,
                  cos=None, sin=None):
    """The gradients of q, k, v and mix (``_Plan.backward``); ``sz`` has fewer than four dims after the dense
    forward (``forward_impl``)."""
    dense = sz.dim() < 4
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, eps, feature_map, scale,
                 "dense" if dense else "chunked", splits, cos, sin, True)
    if dense:
        sz, mixed = (None if t.numel() == 0 else t for t in (sz, mixed))
    return plan.backward(g, q, k, v, mix, o, sz, mixed, cos, sin)


# ---- eager path ---------------------------------------------------------------------------------

def _keeps_summaries(algorithm: str, exchange) -> bool:
    """Whether the backward gets the chunked forward's summaries (sz, mixed) saved, or makes them again.

    Kept from forward to backward they are 2 * B * H * M * J * (D^2 + D) fp32 values a layer (at Wan2.1-1.3B's
    720p, 12 heads of 128 and 150 blocks, about 119 MB per split each), held through the rest of the
    forward and the backward of the layers after it (under gradient checkpointing, of the recomputed block);
    made again they cost one summary pass and one mix in the layer's backward, next to its four kernels. The
    same launches on the same inputs give the same values, so the gradients do not change. Kept: the dense
    forward's outputs (its row denominators, not summaries) and a sequence-parallel forward's (their gather
    is a collective)."""
    return algorithm == "dense" or exchange is not None


class _MHLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mix, plan, cos, sin, exchange):
        o, sz, mixed = plan.forward(q, k, v, mix, cos, sin, exchange)
        if not _keeps_summaries(plan.algorithm, exchange):
            sz = mixed = None
        # (saved tensors, not ctx attributes, for the op's own intermediates too: autograd frees saved tensors after
        # the backward, while a ctx attribute would keep a step's summaries alive as long as its graph)
        ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
        # the backward may run on another thread (autograd's GPU workers): the plan holds the forward's settings
        ctx.plan, ctx.exchange = plan, exchange
        return o

    @staticmethod
    @once_differentiable  # the kernels' gradients carry no graph: a second differentiation must fail, not drop terms
    def backward(ctx, g):
        q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
        return (*ctx.plan.backward(g, q, k, v, mix, o, sz, mixed, cos, sin, ctx.exchange), None, None, None, None)


# ---- torch.compile path: custom ops -------------------------------------------------------------

@torch.library.custom_op("mediagen::mhla_fwd", mutates_args=())
def mhla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, grid: list[int],
             blocks: list[int], normalize: bool, eps: float, feature_map: str, scale: float, algorithm: str,
             splits: int, cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None, keep: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin,
                        keep)


@mhla_fwd.register_fake
def _(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos=None, sin=None,
      keep=True):
    B, N, H, D = q.shape
    o = q.new_empty((B, N, H, D))
    M = math.prod(blocks)
    if algorithm == "dense":
        if not (normalize and _dense_backward(keep, cos is not None, M)):
            return o, q.new_empty((0,), dtype=torch.float32), q.new_empty((0,), dtype=torch.float32)
        lo = q.new_empty((B, N, H, D) if q.dtype != torch.float32 else (0,),
                         dtype=torch.bfloat16 if q.dtype != torch.float32 else torch.float32)
        return o, q.new_empty((B * H, N), dtype=torch.float32), lo
    X, dtype = D * D + D, summary_dtype(q.dtype, keep)
    return o, q.new_empty((B, H, M * splits, X), dtype=dtype), q.new_empty((B, H, M, X), dtype=dtype)


@torch.library.custom_op("mediagen::mhla_bwd", mutates_args=())
def mhla_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor,
             o: torch.Tensor, sz: torch.Tensor, mixed: torch.Tensor, grid: list[int], blocks: list[int],
             normalize: bool, eps: float, feature_map: str, scale: float, splits: int,
             cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward_impl(g.contiguous() if g.stride(-1) == 0 else g, q, k, v, mix, o, sz, mixed, grid, blocks,
                         normalize, eps, feature_map, scale, splits, cos, sin)


@mhla_bwd.register_fake
def _(g, q, k, v, mix, o, sz, mixed, grid, blocks, normalize, eps, feature_map, scale, splits, cos=None,
      sin=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), mix.new_empty(mix.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin = inputs[:14]
    o, sz, mixed = output
    if sz.dim() == 4:
        # the chunked forward's summaries are made again in the backward (``_keeps_summaries``: this op has no
        # exchange); empty ones of their rank keep the backward op's signature and say "chunked" to it
        sz, mixed = (t.new_empty((*t.shape[:2], 0, t.shape[-1])) for t in (sz, mixed))
    ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
    ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)


def _backward(ctx, grad_o, grad_sz, grad_mixed):
    q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
    grads = torch.ops.mediagen.mhla_bwd(grad_o, q, k, v, mix, o, sz, mixed, *ctx.args, cos, sin)
    return (*grads,) + (None,) * 11


mhla_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---- torch.compile, sampling on a GPU: the dense forward as a Triton op ----------------------------
# Under Inductor a custom op runs as a Python call at every step (``mhla_fwd``: the dispatcher's wrapper, then
# ``forward_impl``), several times cuDNN attention's host time (benchmarks/RESULTS.md, Alternatives). A
# ``triton_op`` is traced into the graph instead, so Inductor's own
# generated code launches the dense kernel. Only the forward without a backward takes it (this op registers no
# autograd); training keeps ``mhla_fwd`` and its registered autograd, whose backward after a dense forward is
# the dense backward (triton_dense_grad.py).

@torch.compiler.assume_constant_result
def _traced_token_blocks(grid: tuple[int, ...], blocks: tuple[int, ...], device: torch.device):
    """The dense kernel's block id per token, kept by traced code as a constant (``_token_blocks_int32``)."""
    return _token_blocks_int32(grid, blocks, device)


@torch.library.triton_op("mediagen::mhla_dense", mutates_args=())
def mhla_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, blk: torch.Tensor,
               normalize: bool, eps: float, feature_map: str, scale: float, cos: Optional[torch.Tensor] = None,
               sin: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The dense forward: q, k, v (B, N, H, D) on a GPU, ``mix`` fp32 and contiguous (M, M) or (H, M, M),
    ``blk`` the tokens' block ids (int32)."""
    from torch.library import wrap_triton

    M = mix.shape[-1]
    launch = _dense_launch(current_settings(), q.shape, q.dtype, (q.stride(), k.stride(), v.stride()),
                           _table_strides(cos, sin), M, mix.dim() == 3, normalize, eps, scale,
                           FEATURE_CODES[feature_map], tiles._sms_of(q.device))
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    wrap_triton(dense_forward_kernel)[launch.grid](q, k, v, mix, blk, o, q if cos is None else cos,
                                                    q if sin is None else sin, q, q, q, q, *launch.scalars,
                                                    **launch.consts)
    return o
