"""MHLA attention module: owns the block-mixing matrix Mc and calls ``mediagen.kernels.mhla``.

Mc starts with the paper's locality bias: m_ij proportional to 1 - dist(i, j) / max_k dist(i, k),
distances Euclidean between block centres on the block grid, each row normalised to sum 1.
Mc is kept in [0, 1] by clipping after each optimizer step (the paper's choice): call
``clip_mix_()`` yourself, or ``register_mix_clipping(optimizer, model)`` once. Clipping rather than
a sigmoid reparametrisation keeps the initial zeros (farthest blocks) representable exactly.

Global linear attention is the M = 1 case of the same code (``LinearAttention``).

Both take an optional ``rope=(cos, sin)``, angle tables (N, D/2) that rotate the features phi(q),
phi(k) of the numerator only (a model's RoPE; the official Wan MHLA code rotates after the feature map
and keeps the denominator un-rotated), fused into the kernels (``mediagen.kernels.mhla.rotation``):
    o_t = R(phi(q_t))^T S~^R_i(t) / (phi(q_t)^T z~_i(t) + eps),   S^R_b = sum_{s in b} R(phi(k_s)) v_s^T

A grid shorter than the trained block count along some axis (a one-frame "video" for an image, a
size smaller than the one trained) is served by ``fit_blocks`` / ``fit_mix``: see ``fit_mix`` for
the rule. Wherever the trained blocks fit, the trained Mc is used as is.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..kernels import mhla
from ..kernels.mhla.checks import FEATURE_MAPS


def block_centres(blocks: Sequence[int]) -> torch.Tensor:
    """Coordinates of every block on the block grid, row-major, shape (M, len(blocks))."""
    axes = [torch.arange(b, dtype=torch.float64) for b in blocks]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(blocks))


def locality_mix(blocks: Sequence[int]) -> torch.Tensor:
    """The paper's locality-biased Mc (M, M), float32; rows sum to 1, entries in [0, 1]."""
    c = block_centres(blocks)
    dist = torch.cdist(c, c)
    far = dist.max(dim=1, keepdim=True).values
    w = torch.where(far > 0, 1.0 - dist / far.clamp_min(1e-12), torch.ones_like(dist))
    return (w / w.sum(dim=1, keepdim=True)).float()


def fit_blocks(blocks: Sequence[int], grid: Sequence[int]) -> tuple[int, ...]:
    """Block counts that fit ``grid``: per axis b' = min(b, L), since every block needs a token."""
    return tuple(min(int(b), int(g)) for b, g in zip(blocks, grid))


def _kept_block_ids(blocks: tuple[int, ...], fitted: tuple[int, ...], device) -> torch.Tensor:
    """Row-major ids, on the trained block grid, of the blocks (j_0, ..., j_k) with j_a < fitted[a]."""
    ids = torch.zeros((), dtype=torch.int64)
    for b, f in zip(blocks, fitted):
        ids = ids[..., None] * b + torch.arange(f)
    return ids.reshape(-1).to(device)


def fit_mix(mix: torch.Tensor, blocks: Sequence[int], fitted: Sequence[int]) -> torch.Tensor:
    """Mc for the fitted block layout ``fitted`` (``fit_blocks``), taken from the trained Mc.

    Rule: along every axis whose block count shrinks from b to b', the grid keeps the trained blocks
    0 .. b'-1 (the first slab: a one-frame clip is the first frame of a clip, whose tokens sit in the
    first temporal block; on a shrunk spatial axis neighbouring tokens stay one block apart, as
    neighbouring blocks were in training). Mc' is the sub-matrix of Mc on those blocks (rows and
    columns), and each row is rescaled to keep its trained row sum: the weight a query block gave
    to blocks that no longer exist is spread over the remaining ones in proportion to their trained
    weights, so every row stays the weight distribution it was (rows of the initial Mc sum to 1).
    With ``normalize=True`` that rescale cancels in numerator / denominator (up to eps); with
    ``normalize=False`` it keeps the output's scale. A row whose kept entries are all zero stays
    zero (nothing left to spread over). Differentiable in ``mix``; (M, M) and (H, M, M) alike.
    """
    blocks, fitted = tuple(int(b) for b in blocks), tuple(int(f) for f in fitted)
    if fitted == blocks:
        return mix
    idx = _kept_block_ids(blocks, fitted, mix.device)
    rows = mix.index_select(-2, idx)
    sub = rows.index_select(-1, idx)
    trained_sum = rows.sum(-1, keepdim=True)
    kept_sum = sub.sum(-1, keepdim=True)
    factor = torch.where(kept_sum > 0, trained_sum / kept_sum.clamp_min(torch.finfo(mix.dtype).tiny),
                         torch.ones_like(kept_sum))
    return sub * factor


class MHLAttention(nn.Module):
    """Token-level multi-head linear attention over a (F, H, W), (H, W) or (N,) token grid.

    Args:
        blocks: block count per grid axis; fixed, so Mc has a fixed size M = prod(blocks). A grid
            shorter than that along an axis runs with ``fit_blocks``/``fit_mix`` (module docstring).
        heads: when given, each head gets its own Mc (H, M, M); otherwise one Mc is shared.
        feature_map: "relu" or "elu1", applied to q and k inside the kernel.
        normalize: divide by q~ . z~ + eps (True) or multiply by ``scale`` (False).
    """

    def __init__(self, blocks: Sequence[int], *, heads: int | None = None, feature_map: str = "relu",
                 normalize: bool = True, eps: float = 1e-6, scale: float | None = None):
        super().__init__()
        blocks = tuple(int(b) for b in blocks)
        if not blocks or any(b < 1 for b in blocks) or len(blocks) > 3:
            raise ValueError(f"blocks must be 1 to 3 positive ints; got {blocks}")
        if feature_map not in FEATURE_MAPS or feature_map is None:
            raise ValueError(f"feature_map={feature_map!r} is not allowed: use 'relu' or 'elu1'")
        self.blocks = blocks
        self.feature_map = feature_map
        self.normalize = normalize
        self.eps = eps
        self.scale = scale
        mix = locality_mix(blocks)
        if heads is not None:
            mix = mix.expand(heads, -1, -1).clone()
        self.mix = nn.Parameter(mix)

    @property
    def num_blocks(self) -> int:
        return math.prod(self.blocks)

    def forward(self, q, k, v, grid: Sequence[int], rope=None, cpe=None):
        """q, k, v: (B, N, H, D) with N = prod(grid); returns (B, N, H, D). ``rope``: (cos, sin) tables
        of shape (N, D/2), see the module docstring (None: plain MHLA). ``cpe``: (weight, bias) of a CPE over
        ``grid`` to add to the output, on the Triton path without gradients (``kernels.mhla.mhla``)."""
        grid = tuple(int(g) for g in grid)
        if len(grid) != len(self.blocks):
            raise ValueError(f"grid={grid} has {len(grid)} axes but this layer's blocks={self.blocks} "
                             f"has {len(self.blocks)}")
        blocks = fit_blocks(self.blocks, grid)
        return self._attend(q, k, v, fit_mix(self.mix, self.blocks, blocks), grid, blocks, rope, cpe)

    def _attend(self, q, k, v, mix, grid, blocks, rope, cpe=None):
        scale = self.scale if not self.normalize else None
        return mhla(q, k, v, mix, grid, blocks, normalize=self.normalize, eps=self.eps,
                    feature_map=self.feature_map, scale=scale, rope=rope, cpe=cpe)

    @torch.no_grad()
    def clip_mix_(self):
        """Keep Mc in [0, 1] (call after each optimizer step)."""
        self.mix.clamp_(0.0, 1.0)

    def extra_repr(self) -> str:
        return (f"blocks={self.blocks}, mix={tuple(self.mix.shape)}, feature_map={self.feature_map!r}, "
                f"normalize={self.normalize}")


class LinearAttention(MHLAttention):
    """Plain global linear attention: MHLA with one block (M = 1, Mc = [[1]], frozen)."""

    def __init__(self, ndim: int = 1, **kwargs):
        super().__init__((1,) * ndim, **kwargs)
        self.mix.requires_grad_(False)

    def forward(self, q, k, v, grid: Sequence[int] | None = None, rope=None):
        return self._attend(q, k, v, self.mix.to(q.device), (q.shape[1],), (1,), rope)


def clip_mixes_(model: nn.Module) -> None:
    """Clip every MHLA mixing matrix inside ``model`` to [0, 1]."""
    for m in model.modules():
        if isinstance(m, MHLAttention) and m.mix.requires_grad:
            m.clip_mix_()


def register_mix_clipping(optimizer: torch.optim.Optimizer, model: nn.Module):
    """Clip the model's Mc matrices after every ``optimizer.step()``; returns the hook handle."""
    return optimizer.register_step_post_hook(lambda *_: clip_mixes_(model))
