"""RMSNorm followed by a linear layer as one autograd function that recomputes the norm's output in backward.

Written apart, ``F.linear(F.rms_norm(x, w), W, b)`` keeps two activations of the layer's full size for
backward: the norm's input x (the norm's own backward needs it) and the norm's output y (the linear needs it
for W's gradient). y is a cheap function of x and the per-row rstd, so ``rms_norm_linear`` saves x, rstd (one
fp32 value per row), the norm weight, W and b, and recomputes y in backward: one (rows, C) tensor less held
from forward to backward. In an MHLA layer that is the output norm and ``to_out[0]`` (``models.processors``).

The values and gradients are those of the unfused ops, dtype for dtype, because the same computation runs:

* the norm is torch's own RMSNorm, in the implementation ``F.rms_norm`` picks: on a CUDA device with input
  and weight of one dtype its fused kernels (``aten._fused_rms_norm`` and its backward; the dispatch that
  ``models.norms`` relies on), elsewhere (a CPU, or mixed dtypes) its composite ops, whose forward and autograd
  backward are written out here op for op (on a CPU the results are bit for bit the unfused ones; should torch
  pick otherwise on some device, the two forms differ by rounding only); the recomputed y is bit-identical to
  the forward's (the same kernel, or the same ops on the saved rstd);
* casts between the norm and the linear (``linear_input_dtype``, as ``o.type_as(q)`` in a processor) and
  autocast's casts for the linear (its input, W and b to the autocast dtype, as autocast casts
  ``F.linear``'s arguments) are made as the unfused code makes them; W and b are cast outside the function,
  so their gradients reach the fp32 parameters through the casts' own backward, as under autocast;
* the linear's gradients are the products ``aten::linear``'s backward computes (``grad @ W``,
  ``grad^T @ y``, ``grad.sum(0)`` on the rows flattened).

Inside the function autocast is off: every tensor already has the dtype the unfused op would have run in,
and the backward must not be cast again where it runs with autocast on.

Under torch.compile the composite form is traced and Inductor fuses it. There AOTAutograd's partitioner, not
this function, chooses what the joint graph saves, and left alone it keeps the norm's output for the linear's
weight gradient; so traced, the norm runs inside a non-reentrant checkpoint, whose ops the partitioner must
recompute in backward (``_traced_rms_norm_linear``): the compiled layer saves what the eager function does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

_HALF = (torch.float16, torch.bfloat16)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's RMSNorm accumulates in (its "opmath" type): fp32 for fp16/bf16, else the input's."""
    return torch.float32 if dtype in _HALF else dtype


def _uses_fused_kernel(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether ``F.rms_norm(x, ..., weight)`` runs torch's fused RMSNorm kernels here: on a CUDA device with
    input and weight of one dtype (a CPU's autograd runs the composite ops; torch has no CPU fused backward).
    Traced, the composite form is used: Inductor fuses it into its own kernels."""
    return (x.is_cuda and (weight is None or weight.dtype == x.dtype) and not torch.compiler.is_compiling()
            and hasattr(torch.ops.aten, "_fused_rms_norm_backward"))


def _fused_rms_norm(x, weight, eps):  # torch's fused kernel: (y, rstd)
    return torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)


def _fused_rms_norm_backward(grad_y, x, rstd, weight, output_mask):  # its backward: (grad x, grad weight)
    return torch.ops.aten._fused_rms_norm_backward(grad_y, x, [x.shape[-1]], rstd, weight, output_mask)


def _rms_norm(x, weight, eps, fused, rstd=None):
    """(y, rstd) of RMSNorm over x's last dim. ``rstd`` given (the composite form): y from it, bit-identical to
    the forward's y (the same ops on the same values)."""
    if fused:
        return _fused_rms_norm(x, weight, eps)
    # torch's composite RMSNorm (aten rms_norm without the fused kernel): upcast, rsqrt(mean(x^2) + eps),
    # x * rstd * weight, cast back to the input's dtype
    xf = x.to(_compute_dtype(x.dtype))
    if rstd is None:
        if eps is None:
            eps = torch.finfo(xf.dtype).eps
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add(eps))
    y = xf.mul(rstd)
    if weight is not None:
        y = y.mul(weight)
    return y.to(x.dtype), rstd


def _rms_norm_backward(grad_y, x, rstd, weight, need_x, need_weight):
    """Gradients (x, weight) of the composite RMSNorm, the ops its autograd graph runs in the order it runs
    them (ToCopy, Mul by weight, Mul by rstd, Rsqrt, Add, Mean, Pow, ToCopy), so that they equal the unfused
    backward's."""
    xf = x.to(_compute_dtype(x.dtype))
    t = xf.mul(rstd)                               # x * rstd (the first Mul's output)
    u_dtype = torch.promote_types(t.dtype, weight.dtype) if weight is not None else t.dtype
    g = grad_y.to(u_dtype)                         # ToCopy's backward: to the dtype y was cast from
    grad_w = None
    if weight is not None:
        if need_weight:                            # Mul(t, weight): weight's gradient summed to its shape, cast
            lead = tuple(range(g.dim() - weight.dim()))
            grad_w = g.mul(t).sum(lead, keepdim=True).view(weight.shape).to(weight.dtype)
        g = g.mul(weight)
    if not need_x:
        return None, grad_w
    grad_rstd = g.mul(xf).sum(-1, keepdim=True)    # Mul(xf, rstd): rstd's gradient summed over the row
    grad_ms = (-0.5 * grad_rstd).mul(rstd.pow(3))  # Rsqrt: -0.5 * grad * result^3 (Add passes it on)
    grad_sq = grad_ms / x.shape[-1]                # Mean over the row: grad / D (broadcast over the row)
    grad_xf = g.mul(rstd) + grad_sq * (2.0 * xf)   # Mul's xf gradient + Pow(2)'s: grad * 2 * x
    return grad_xf.to(x.dtype), grad_w


def _linear_input(y, flatten_heads, casts):
    h = y.flatten(-2) if flatten_heads else y
    for dtype in casts:
        h = h.to(dtype)
    return h


class _RMSNormLinear(torch.autograd.Function):
    """``rms_norm_linear`` once its casts are made: saves x, rstd and the weights, recomputes the norm's output."""

    @staticmethod
    def forward(ctx, x, norm_weight, eps, weight, bias, flatten_heads, casts):
        with torch.autocast(x.device.type, enabled=False):
            fused = _uses_fused_kernel(x, norm_weight)
            y, rstd = _rms_norm(x, norm_weight, eps, fused)
            out = F.linear(_linear_input(y, flatten_heads, casts), weight, bias)
        ctx.save_for_backward(x, rstd, norm_weight, weight, bias)
        ctx.eps, ctx.fused, ctx.flatten_heads, ctx.casts = eps, fused, flatten_heads, casts
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, rstd, norm_weight, weight, bias = ctx.saved_tensors
        need_x, need_nw, _, need_w, need_b = ctx.needs_input_grad[:5]
        grad_x = grad_nw = grad_w = grad_b = None
        with torch.autocast(x.device.type, enabled=False):
            g = grad_out.reshape(-1, grad_out.shape[-1])
            if need_w:  # the recomputed norm output, freed before the norm's backward allocates its gradients
                y = _rms_norm(x, norm_weight, ctx.eps, ctx.fused, None if ctx.fused else rstd)[0]
                h = _linear_input(y, ctx.flatten_heads, ctx.casts)
                grad_w = g.t().mm(h.reshape(-1, h.shape[-1]))
                del y, h
            if need_b and bias is not None:
                grad_b = g.sum(0)
            if need_x or need_nw:
                grad_y = g.mm(weight)
                # the casts' backward, last first: back to the dtype of each cast's input
                for dtype in reversed((x.dtype,) + tuple(ctx.casts[:-1])):
                    grad_y = grad_y.to(dtype)
                grad_y = grad_y.view(x.shape)
                if ctx.fused:
                    grad_x, grad_nw = _fused_rms_norm_backward(grad_y, x, rstd, norm_weight,
                                                               [need_x, need_nw and norm_weight is not None])
                else:
                    grad_x, grad_nw = _rms_norm_backward(grad_y, x, rstd, norm_weight, need_x, need_nw)
        return (grad_x if need_x else None, grad_nw if need_nw else None, None, grad_w, grad_b, None, None)


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float | None, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, *, flatten_heads: bool = False,
                    linear_input_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.linear(h, weight, bias)`` with ``y = F.rms_norm(x, (x.shape[-1],), norm_weight, eps)``,
    ``h = y.flatten(-2)`` if ``flatten_heads`` (x (..., H, D) normed per head with a (D,) weight) else ``y``,
    then ``h.to(linear_input_dtype)`` if given; under autocast the linear runs in autocast's dtype as
    ``F.linear`` would. Same values and gradients as those ops written out; saves x and one fp32 rstd per row
    in place of x and the norm's output (module docstring)."""
    casts = [] if linear_input_dtype is None else [linear_input_dtype]
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        # autocast casts F.linear's floating arguments (fp64 excepted) to its dtype; the same casts, made here
        dtype = torch.get_autocast_dtype(device_type)
        eligible = lambda t: t is not None and t.is_floating_point() and t.dtype != torch.float64  # noqa: E731
        if eligible(weight):
            weight = weight.to(dtype)
        if eligible(bias):
            bias = bias.to(dtype)
        if (linear_input_dtype or x.dtype).is_floating_point and (linear_input_dtype or x.dtype) != torch.float64:
            casts.append(dtype)
    if not casts:
        casts = [x.dtype]  # (the norm's output keeps x's dtype: no cast)
    if torch.compiler.is_compiling():
        return _traced_rms_norm_linear(x, norm_weight, eps, weight, bias, flatten_heads, tuple(casts))
    return _RMSNormLinear.apply(x, norm_weight, eps, weight, bias, flatten_heads, tuple(casts))


def _traced_rms_norm_linear(x, norm_weight, eps, weight, bias, flatten_heads, casts):
    """``rms_norm_linear`` as torch.compile traces it: the norm and the casts after it inside a non-reentrant
    checkpoint (the partitioner recomputes them in backward), so the joint graph saves x, not the norm's output,
    as ``_RMSNormLinear`` does eagerly; the casts for the linear are already made, so autocast stays off."""
    def norm(x, norm_weight):
        with torch.autocast(x.device.type, enabled=False):
            return _linear_input(_rms_norm(x, norm_weight, eps, False)[0], flatten_heads, casts)

    h = checkpoint(norm, x, norm_weight, use_reentrant=False)
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(h, weight, bias)
