"""Plain-PyTorch MHLA: the reference every kernel is tested against. Runs on any device, fp64 too.

    S_b = sum_{s in b} phi(k_s) v_s^T,   z_b = sum_{s in b} phi(k_s)
    S~_i = sum_b mix[i, b] S_b,           z~_i = sum_b mix[i, b] z_b
    o_t = phi(q_t)^T S~_i(t) / (phi(q_t)^T z~_i(t) + eps)     (normalize=False: times scale instead)
With ``rope=(cos, sin)`` the numerator's features are rotated and z is not (rotation.py).

Blocks are visited one by one through index lists, so memory stays O(N*H*D + M*H*D^2).
"""

from __future__ import annotations

import torch

from .checks import check_mhla_args, feature
from .layout import block_token_lists
from .rotation import rotate_pairs, split_rope


def mhla_reference(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                   rope=None):
    grid, blocks = check_mhla_args(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference=True)
    cos, sin = split_rope(rope, q)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = feature(q.to(acc), feature_map)
    kf = feature(k.to(acc), feature_map)
    # numerator features: rotated with rope, the same as the denominator's otherwise
    qn, kn = (qf, kf) if cos is None else (rotate_pairs(qf, cos, sin), rotate_pairs(kf, cos, sin))
    vf = v.to(acc)
    order, offsets, _ = block_token_lists(grid, blocks, q.device)
    order = order.long()
    bounds = offsets.tolist()
    M = len(bounds) - 1
    seg = [order[bounds[i] : bounds[i + 1]] for i in range(M)]

    # Per-block summaries, (B, H, M, D, D) and (B, H, M, D).
    S = torch.stack([torch.einsum("bnhd,bnhe->bhde", kn[:, s], vf[:, s]) for s in seg], dim=2)
    z = torch.stack([kf[:, s].sum(1) for s in seg], dim=2)
    m = mix.to(acc)
    eq = "ij,bhjde->bhide" if m.dim() == 2 else "hij,bhjde->bhide"
    S_mixed = torch.einsum(eq, m, S)
    z_mixed = torch.einsum(eq.replace("de", "d"), m, z)

    outs = []
    for i, s in enumerate(seg):
        num = torch.einsum("bnhd,bhde->bnhe", qn[:, s], S_mixed[:, :, i])
        if normalize:
            den = torch.einsum("bnhd,bhd->bnh", qf[:, s], z_mixed[:, :, i]) + eps
            outs.append(num / den[..., None])
        else:
            outs.append(num * (1.0 if scale is None else scale))
    o_sorted = torch.cat(outs, dim=1)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return o_sorted[:, inverse].to(q.dtype)
