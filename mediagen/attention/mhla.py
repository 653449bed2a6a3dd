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

Three conventions of the official MHLA code (DAGroup-PKU/MHLA) are options here, ours (the paper's) by default
(docs/DESIGN.md#conventions-ours-and-the-official-codes):
- ``feature_eps``: phi(x) = feature_map(x) + feature_eps (the official relu(x) + 1e-6);
- ``denominator="official"``: a token at position p of block i is divided by
  sum_j Mc[i, j] phi(q at position p of block j) . z_j + eps instead of phi(q_t) . sum_j Mc[i, j] z_j + eps
  (``official_denominator``);
- ``mix_init="official"``: Mc starts at ``official_locality_mix`` instead of ``locality_mix``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..kernels import mhla
from ..kernels.mhla.blocked import mhla_blocked
from ..kernels.mhla.checks import FEATURE_MAPS, feature
from ..kernels.mhla.naive import mhla_reference

DENOMINATORS = ("paper", "official")
MIX_INITS = ("paper", "official")


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


def official_locality_mix(blocks: Sequence[int]) -> torch.Tensor:
    """The official code's locality init of Mc (M, M), float32: m_ij = 1 - dist(i, j) / D with D the largest
    distance between any two blocks (one number for the whole matrix, where ``locality_mix`` takes each row's
    own), then each column scaled to sum 1 (where ``locality_mix`` scales rows). Row i is still what query
    block i reads of every key block. With one block it is [[1]] (the official formula divides 0 by 0 there)."""
    c = block_centres(blocks)
    dist = torch.cdist(c, c)
    far = dist.max()
    if far == 0:
        return torch.ones_like(dist).float()
    w = 1.0 - dist / far
    return (w / w.sum(dim=0, keepdim=True)).float()


def _equal_block_sizes(grid: Sequence[int], blocks: Sequence[int]) -> tuple[int, ...]:
    """Tokens per block along each axis when every block count divides its axis; else a one-line ValueError."""
    if len(grid) != len(blocks) or any(int(g) % int(b) for g, b in zip(grid, blocks)):
        raise ValueError(f"denominator='official' needs blocks that divide the grid (every block the same size, "
                         f"as the official code requires); got grid={tuple(grid)} and blocks={tuple(blocks)}: "
                         f"use denominator='paper', or blocks that divide each axis")
    return tuple(int(g) // int(b) for g, b in zip(grid, blocks))


def _block_major(x: torch.Tensor, grid: Sequence[int], blocks: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """(B, N, *rest) tokens in row-major grid order -> (B, M, n, *rest): block j's tokens in row-major order
    within the block, blocks in row-major order over the block grid (the layout of the kernels' block ids)."""
    B, rest, a = x.shape[0], x.shape[2:], len(grid)
    split = [B] + [d for b, s in zip(blocks, sizes) for d in (b, s)] + list(rest)
    order = [0] + [1 + 2 * i for i in range(a)] + [2 + 2 * i for i in range(a)] \
        + [1 + 2 * a + i for i in range(len(rest))]
    return x.reshape(split).permute(order).reshape(B, math.prod(blocks), math.prod(sizes), *rest)


def _token_major(x: torch.Tensor, grid: Sequence[int], blocks: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """The inverse of ``_block_major``: (B, M, n, *rest) -> (B, N, *rest)."""
    B, rest, a = x.shape[0], x.shape[3:], len(grid)
    x = x.reshape([B] + list(blocks) + list(sizes) + list(rest))
    order = [0] + [d for i in range(a) for d in (1 + i, 1 + a + i)] + [1 + 2 * a + i for i in range(len(rest))]
    return x.permute(order).reshape(B, math.prod(grid), *rest)


def official_denominator(qf: torch.Tensor, kf: torch.Tensor, mix: torch.Tensor, grid: Sequence[int],
                         blocks: Sequence[int], eps: float) -> torch.Tensor:
    """The official code's denominator for features qf, kf (B, N, H, D): (B, N, H) in fp32 (fp64 for fp64).

    For a token at position p of block i (positions row-major within a block):
        den = sum_j Mc[i, j] qf(position p of block j) . z_j + eps,    z_j = sum_{s in j} kf_s,
    the query of the same position in every block, where the paper's formula takes the token's own query
    for every j. It needs every block the same size (each block count divides its axis). Cost O(N * D): the
    per-position products qf . z_j are mixed over blocks like the summaries are. Differentiable in qf, kf, mix.
    """
    grid, blocks = tuple(int(g) for g in grid), tuple(int(b) for b in blocks)
    sizes = _equal_block_sizes(grid, blocks)
    acc = torch.float64 if qf.dtype == torch.float64 else torch.float32
    qb = _block_major(qf.to(acc), grid, blocks, sizes)                      # (B, M, n, H, D)
    z = _block_major(kf.to(acc), grid, blocks, sizes).sum(2)                # (B, M, H, D)
    own = torch.einsum("bjphd,bjhd->bjph", qb, z)                           # qf(p of block j) . z_j
    eq = "ij,bjph->biph" if mix.dim() == 2 else "hij,bjph->biph"
    den = torch.einsum(eq, mix.to(acc), own) + eps                          # (B, M, n, H)
    return _token_major(den, grid, blocks, sizes)


def mhla_attend(q, k, v, mix, grid, blocks, *, feature_map="relu", normalize=True, eps=1e-6, scale=None,
                feature_eps=0.0, denominator="paper", rope=None, cpe=None, backend=None):
    """What an MHLA layer computes, with the official code's conventions as options: ``mediagen.kernels.mhla.mhla``
    (the op) on features feature_map(x) + ``feature_eps``, divided by the paper's or the official denominator.

    q, k, v: (B, N, H, D); returns (B, N, H, D) in q's dtype. The paper's denominator is the op's own (one
    call, any path). ``denominator="official"`` (with normalize=True and more than one block) takes the op's
    numerator (normalize=False, so the Triton kernels on a GPU) and divides it by ``official_denominator``,
    plain PyTorch ops over the tokens in block-major order: slower than the op alone, and it needs equal
    blocks. ``feature_eps > 0`` applies the feature map and the eps in PyTorch (one pass over q and k in their
    dtype) and hands the op features (feature_map=None). fp64 inputs run the plain-PyTorch paths ("blocked",
    or "reference" when asked), which the kernels do not take. ``cpe`` goes to the op, which adds it on the
    Triton path; not with the official denominator, whose division comes after the op.
    """
    if denominator not in DENOMINATORS:
        raise ValueError(f"denominator={denominator!r} is not allowed: use one of {DENOMINATORS}")
    if not (isinstance(feature_eps, (int, float)) and math.isfinite(feature_eps) and feature_eps >= 0):
        raise ValueError(f"feature_eps={feature_eps!r} is not allowed: use a finite number >= 0")
    official = denominator == "official" and normalize and math.prod(int(b) for b in blocks) > 1
    if cpe is not None and official:
        raise ValueError("cpe= cannot be added inside the op with denominator='official' (the division comes after "
                         "the op): add the CPE to the output")
    fm = feature_map
    if feature_eps:
        q, k, fm = feature(q, feature_map) + feature_eps, feature(k, feature_map) + feature_eps, None
    if not official:
        return _op(q, k, v, mix, grid, blocks, normalize=normalize, eps=eps, feature_map=fm, scale=scale, rope=rope,
                   cpe=cpe, backend=backend)
    grid, blocks = tuple(int(g) for g in grid), tuple(int(b) for b in blocks)
    n = math.prod(_equal_block_sizes(grid, blocks))
    # Numerator and denominator both times 2^-ceil(log2 n), which cancels exactly (a power of two), so that a
    # half-precision numerator, a sum over whole blocks, stays in range.
    s = 2.0 ** -math.ceil(math.log2(n)) if n > 1 else 1.0
    num = _op(q, k, v, mix, grid, blocks, normalize=False, eps=eps, feature_map=fm, scale=s, rope=rope,
              backend=backend)
    den = official_denominator(feature(q, fm), feature(k, fm), mix, grid, blocks, eps) * s
    return (num / den[..., None]).to(q.dtype)


def _op(q, k, v, mix, grid, blocks, *, backend=None, cpe=None, **options):
    """The MHLA op; fp64 (which the kernels and their checks refuse) on the plain-PyTorch paths."""
    if q.dtype == torch.float64 and backend in (None, "auto", "blocked", "reference") and cpe is None:
        return (mhla_reference if backend == "reference" else mhla_blocked)(q, k, v, mix, grid, blocks, **options)
    return mhla(q, k, v, mix, grid, blocks, backend=backend, cpe=cpe, **options)


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
        feature_eps, denominator: the official code's conventions, as in ``mhla_attend`` (defaults: ours).
        mix_init: "paper" (``locality_mix``) or "official" (``official_locality_mix``).
    """

    def __init__(self, blocks: Sequence[int], *, heads: int | None = None, feature_map: str = "relu",
                 normalize: bool = True, eps: float = 1e-6, scale: float | None = None, feature_eps: float = 0.0,
                 denominator: str = "paper", mix_init: str = "paper"):
        super().__init__()
        blocks = tuple(int(b) for b in blocks)
        if not blocks or any(b < 1 for b in blocks) or len(blocks) > 3:
            raise ValueError(f"blocks must be 1 to 3 positive ints; got {blocks}")
        if feature_map not in FEATURE_MAPS or feature_map is None:
            raise ValueError(f"feature_map={feature_map!r} is not allowed: use 'relu' or 'elu1'")
        if denominator not in DENOMINATORS:
            raise ValueError(f"denominator={denominator!r} is not allowed: use one of {DENOMINATORS}")
        if mix_init not in MIX_INITS:
            raise ValueError(f"mix_init={mix_init!r} is not allowed: use one of {MIX_INITS}")
        if not (isinstance(feature_eps, (int, float)) and math.isfinite(feature_eps) and feature_eps >= 0):
            raise ValueError(f"feature_eps={feature_eps!r} is not allowed: use a finite number >= 0")
        self.blocks = blocks
        self.feature_map = feature_map
        self.normalize = normalize
        self.eps = eps
        self.scale = scale
        self.feature_eps = feature_eps
        self.denominator = denominator
        self.mix_init = mix_init
        mix = (locality_mix if mix_init == "paper" else official_locality_mix)(blocks)
        if heads is not None:
            mix = mix.expand(heads, -1, -1).clone()
        self.mix = nn.Parameter(mix)

    @property
    def num_blocks(self) -> int:
        return math.prod(self.blocks)

    @property
    def takes_cpe(self) -> bool:
        """Whether ``forward`` can hand a CPE to the op (not with the official denominator, divided after it)."""
        return not (self.denominator == "official" and self.normalize and self.num_blocks > 1)

    def forward(self, q, k, v, grid: Sequence[int], rope=None, cpe=None, backend=None):
        """q, k, v: (B, N, H, D) with N = prod(grid); returns (B, N, H, D). ``rope``: (cos, sin) tables
        of shape (N, D/2), see the module docstring (None: plain MHLA). ``cpe``: (weight, bias) of a CPE over
        ``grid`` to add to the output, on the Triton path without gradients (``kernels.mhla.mhla``).
        ``backend``: as the op's (None: by device)."""
        grid = (int(grid),) if isinstance(grid, int) else tuple(int(g) for g in grid)  # an int: a 1-D grid, as the op takes
        if len(grid) != len(self.blocks):
            raise ValueError(f"grid={grid} has {len(grid)} axes but this layer's blocks={self.blocks} "
                             f"has {len(self.blocks)}")
        blocks = fit_blocks(self.blocks, grid)
        return self._attend(q, k, v, fit_mix(self.mix, self.blocks, blocks), grid, blocks, rope, cpe, backend)

    def _attend(self, q, k, v, mix, grid, blocks, rope, cpe=None, backend=None):
        scale = self.scale if not self.normalize else None
        if not self.feature_eps and self.denominator == "paper":  # the op alone (no conventions to apply)
            return _op(q, k, v, mix, grid, blocks, normalize=self.normalize, eps=self.eps,
                       feature_map=self.feature_map, scale=scale, rope=rope, cpe=cpe, backend=backend)
        return mhla_attend(q, k, v, mix, grid, blocks, normalize=self.normalize, eps=self.eps,
                           feature_map=self.feature_map, scale=scale, feature_eps=self.feature_eps,
                           denominator=self.denominator, rope=rope, cpe=cpe, backend=backend)

    @torch.no_grad()
    def clip_mix_(self):
        """Keep Mc in [0, 1] (call after each optimizer step)."""
        self.mix.clamp_(0.0, 1.0)

    def extra_repr(self) -> str:
        extra = "".join(f", {name}={getattr(self, name)!r}" for name, ours in
                        (("feature_eps", 0.0), ("denominator", "paper"), ("mix_init", "paper"))
                        if getattr(self, name) != ours)
        return (f"blocks={self.blocks}, mix={tuple(self.mix.shape)}, feature_map={self.feature_map!r}, "
                f"normalize={self.normalize}{extra}")


class LinearAttention(MHLAttention):
    """Plain global linear attention: MHLA with one block (M = 1, Mc = [[1]], frozen)."""

    def __init__(self, ndim: int = 1, **kwargs):
        super().__init__((1,) * ndim, **kwargs)
        self.mix.requires_grad_(False)

    def forward(self, q, k, v, grid: Sequence[int] | None = None, rope=None, backend=None):
        return self._attend(q, k, v, self.mix.to(q.device), (q.shape[1],), (1,), rope, backend=backend)


def clip_mixes_(model: nn.Module) -> None:
    """Clip every MHLA mixing matrix inside ``model`` to [0, 1]."""
    for m in model.modules():
        if isinstance(m, MHLAttention) and m.mix.requires_grad:
            m.clip_mix_()


def register_mix_clipping(optimizer: torch.optim.Optimizer, model: nn.Module):
    """Clip the model's Mc matrices after every ``optimizer.step()``; returns the hook handle."""
    return optimizer.register_step_post_hook(lambda *_: clip_mixes_(model))
