"""RMSNorm that keeps torch's fused kernel under mixed precision.

Under bf16 autocast a Wan block's query and key norms (diffusers' ``WanAttention.norm_q`` / ``norm_k``,
``torch.nn.RMSNorm``) receive the bf16 output of a linear layer while their weights stay fp32 master
weights. torch's fused RMSNorm needs input and weight of one dtype; otherwise it warns ("Mismatch dtype
between input and weight ... Cannot dispatch to fused implementation") and runs the composite one, several
elementwise kernels forward and backward over every token. ``CastRMSNorm`` casts the weight to the
input's dtype, as autocast casts a linear layer's weight; the statistics are still accumulated in fp32 and
the gradient reaches the fp32 weight through the cast. Both attentions' models are patched alike, so a
softmax / MHLA comparison stays fair."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class CastRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` with its weight cast to the input's dtype (same parameters and state-dict keys)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


def cast_rms_norms(model: torch.nn.Module) -> int:
    """Make every ``torch.nn.RMSNorm`` in ``model`` a ``CastRMSNorm`` in place (its parameter objects kept,
    so optimizers, EMA and checkpoints see the same tensors under the same names); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.RMSNorm:
            module.__class__ = CastRMSNorm
            count += 1
    return count
