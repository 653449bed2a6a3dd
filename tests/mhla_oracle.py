"""Dense O(N^2) MHLA oracle: A[t, s] = mix[i(t), i(s)] * phi(q_t).phi(k_s), row-normalised
(docs/DESIGN.md#dense-form-the-test-oracle). With ``rope=(cos, sin)`` the numerator's scores use rotated
features and the denominator's do not (docs/DESIGN.md#rope-on-the-features)."""

import torch

from mediagen.kernels import token_block_ids
from mediagen.kernels.mhla.checks import feature
from mediagen.kernels.mhla.rotation import rotate_pairs


def mhla_dense(q, k, v, mix, grid, blocks, normalize=True, eps=1e-6, feature_map=None, scale=None, rope=None):
    ids = token_block_ids(grid, blocks, q.device)
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
