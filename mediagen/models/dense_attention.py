"""Dense attention matrices of the registered attentions, from a layer's q and k: what each entry's ``dense``
computes (``attention_registry``) and ``mediagen.eval.attention_maps`` reports rank and entropy of.

All q, k are (B, N, H, D); matrices come back (B, H, N, N) in float64, each row summing to 1:
- softmax: A = softmax(q k^T * scale), scale = D^-1/2 by default.
- linear:  A[t, s] = phi(q_t).phi(k_s) / (sum_s' phi(q_t).phi(k_s') + eps). Its rank is at most D,
  since A is diag(1/den) times the product of an (N, D) and a (D, N) matrix.
- MHLA:    A[t, s] = m_{i(t), i(s)} phi(q_t).phi(k_s) / (sum_s' of the same + eps), i(t) the block
  of token t (the dense form of the MHLA kernel). Rank at most M * D: each block of key columns
  contributes a factor of rank <= D.
- With RoPE on the features (``rope=(cos, sin)`` tables (N, D/2), Wan's rope="features") the numerator's
  phi(q_t).phi(k_s) becomes R(phi(q_t)).R(phi(k_s)) and the denominator stays un-rotated: rows no longer sum
  to 1 and entries can be negative (rank bounds unchanged).
"""

from __future__ import annotations

import torch

from ..kernels import token_block_ids
from ..kernels.mhla.checks import feature
from ..kernels.mhla.rotation import rotate_pairs


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"q and k must be (B, N, H, D); got shape {tuple(x.shape)}")
    return x.transpose(1, 2).double()


def softmax_attention_matrix(q, k, scale: float | None = None) -> torch.Tensor:
    qh, kh = _heads_first(q), _heads_first(k)
    scale = qh.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax(qh @ kh.transpose(-1, -2) * scale, dim=-1)


def _scores(q, k, feature_map: str, rope=None):
    """(numerator, denominator) scores phi(q_t).phi(k_s), each (B, H, N, N) float64; with ``rope``
    (a layer's RoPE tables (cos, sin)) the numerator's features are rotated."""
    qf, kf = feature(q.double(), feature_map), feature(k.double(), feature_map)
    den = _heads_first(qf) @ _heads_first(kf).transpose(-1, -2)
    if rope is None:
        return den, den
    cos, sin = (t.double() for t in rope)
    qr, kr = rotate_pairs(qf, cos, sin), rotate_pairs(kf, cos, sin)
    return _heads_first(qr) @ _heads_first(kr).transpose(-1, -2), den


def linear_attention_matrix(q, k, feature_map: str = "relu", eps: float = 1e-6, rope=None) -> torch.Tensor:
    num, den = _scores(q, k, feature_map, rope)
    return num / (den.sum(dim=-1, keepdim=True) + eps)


def mhla_attention_matrix(q, k, mix, grid, blocks, feature_map: str = "relu", eps: float = 1e-6,
                          rope=None) -> torch.Tensor:
    num, den = _scores(q, k, feature_map, rope)
    ids = token_block_ids(tuple(grid), tuple(blocks), q.device)
    if ids.numel() != num.shape[2]:
        raise ValueError(f"grid={tuple(grid)} holds {ids.numel()} tokens but q has N={num.shape[2]}")
    m = mix.detach().double().to(q.device)
    # token-pair mixing weights m_{i(t), i(s)}: (N, N) for a shared Mc, (H, N, N) per head
    pair = m[ids][:, ids] if m.dim() == 2 else m[:, ids][:, :, ids]
    return pair * num / ((pair * den).sum(dim=-1, keepdim=True) + eps)
