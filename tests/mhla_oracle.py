"""Dense O(N^2) MHLA oracle: A[t, s] = mix[i(t), i(s)] * phi(q_t).phi(k_s), row-normalised
(docs/DESIGN.md#dense-form-the-test-oracle). With ``rope=(cos, sin)`` the numerator's scores use rotated
features and the denominator's do not (docs/DESIGN.md#rope-on-the-features).

The block of every token comes from the documented rule itself (``block_ids`` below), not from the package's
layout code, so a change to the package's layout is a difference from the oracle, not a change of both."""

import functools
import itertools
import math

import torch

from mediagen.kernels.mhla.checks import feature
from mediagen.kernels.mhla.rotation import rotate_pairs


def axis_spans(length: int, n_blocks: int) -> list[range]:
    """The README's rule: along an axis of length L cut into b blocks, block j spans
    [floor(j*L/b), floor((j+1)*L/b))."""
    assert 1 <= n_blocks <= length, (length, n_blocks)
    return [range(j * length // n_blocks, (j + 1) * length // n_blocks) for j in range(n_blocks)]


def block_ids(grid, blocks) -> torch.Tensor:
    """Block id of every token (tokens in row-major grid order), block ids row-major over the block grid:
    each axis's block of each position read off its spans, then the axes combined token by token."""
    return _block_ids(tuple(grid), tuple(blocks)).clone()


@functools.lru_cache(maxsize=None)  # a Python loop over the tokens: the sweeps ask for the same grids again
def _block_ids(grid, blocks) -> torch.Tensor:
    assert len(grid) == len(blocks), (grid, blocks)
    per_axis = []
    for length, n in zip(grid, blocks):
        of = {x: j for j, span in enumerate(axis_spans(length, n)) for x in span}
        assert sorted(of) == list(range(length)), (length, n)  # the spans tile the axis
        per_axis.append(of)
    ids = []
    for token in itertools.product(*(range(g) for g in grid)):
        block = 0
        for x, of, n in zip(token, per_axis, blocks):
            block = block * n + of[x]
        ids.append(block)
    assert len(ids) == math.prod(grid)
    return torch.tensor(ids, dtype=torch.int64)


def mhla_dense(q, k, v, mix, grid, blocks, normalize=True, eps=1e-6, feature_map=None, scale=None, rope=None):
    ids = block_ids(grid, blocks).to(q.device)
    qf, kf = feature(q.double(), feature_map), feature(k.double(), feature_map)
    w = mix.double()[..., ids[:, None], ids[None, :]]  # (N, N) or (H, N, N)
    scores = torch.einsum("bthd,bshd->bhts", qf, kf) * w
    if rope is None:
        numerator = scores
    else:
        cos, sin = (t.double() for t in rope)
        numerator = torch.einsum("bthd,bshd->bhts", rotate_pairs(qf, cos, sin), rotate_pairs(kf, cos, sin)) * w
    out = torch.einsum("bhts,bshd->bthd", numerator, v.double())
    if normalize:
        return out / (scores.sum(-1).transpose(1, 2)[..., None] + eps)
    return out * (1.0 if scale is None else scale)
