"""HLA of up to two chunks between its two projections: ``hla_short``, in plain PyTorch (``hla_short_reference``)
or two Triton launches (``triton_short``).

Per head, from the fused projection's row [q | k | v | beta | decay] of each token (q, k l2-normalised,
beta = sigmoid, log alpha = softplus(decay) * neg_a, both zeroed at padding so that a padded token is an
identity step), Gated DeltaNet from the zero state over tokens 0..n-1 is

    o = P (I + L)^-1 diag(beta) V,  P_ts = q_t.k_s e^(G_t - G_s) (s <= t),  L_ts = beta_t k_t.k_s e^(G_t - G_s) (s < t)

with G the cumulative log alpha (the reference solves that (N x N) triangular system at once). With two
chunks (n > C), a token t of the second reads the first chunk's end state through its gate g_t:
o_t = lerp(o^in_t, o^full_t, g_t), o^in being GDN of the second chunk alone from the zero state. The result
goes through the per-head RMSNorm; ``eps`` is the one it takes (the layer passes eps / scale^2, since the
d^-1/2 output scale is left out, which the RMSNorm cancels). Returns (B, N, H, D) in ``out_dtype``.

The Triton path computes the same thing chunkwise (blocks of BT tokens): ``triton_short`` has the formulas.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..backends import check_backend

try:
    from .triton_short import hla_short_triton
except ImportError:  # pragma: no cover - platform without triton
    hla_short_triton = None

# the Triton path keeps a (D x D) state per head in registers (two, for the second chunk's restart) and
# starts the second chunk on a block of 16 or 32 tokens
TRITON_MAX_HEAD_DIM = 64


def triton_serves(head_dim: int, chunk: int) -> bool:
    """Whether the Triton path takes a layer of this head size and chunk."""
    return head_dim <= TRITON_MAX_HEAD_DIM and chunk % 16 == 0


def hla_short_reference(proj, heads: int, head_dim: int, neg_a, norm_weight, eps: float, *, chunk: int,
                        mask=None, gate=None, out_dtype=None, above=None):
    """``hla_short`` in plain PyTorch (differentiable: the layer trains through it): the whole sequence's
    triangular system in the dtype of ``neg_a`` (fp32 for half-precision layers, or fp64 for a check).
    ``above``: the (N, N) bool mask of s > t (made here when None; the layer passes a cached one)."""
    b, n, _ = proj.shape
    h, d = heads, head_dim
    inner = h * d
    compute = neg_a.dtype
    proj = proj.to(compute)
    qk = F.normalize(proj[..., :2 * inner].unflatten(-1, (2, h, d)), dim=-1)                    # (B, N, 2, H, D)
    # [q; k] stacked along the tokens per head, so that both Gram blocks come out of one product as
    # (B, H, 2, N, N) and each block is a plain batch of matrices (no copy before the next product)
    qk = qk.permute(0, 3, 2, 1, 4).reshape(b, h, 2 * n, d)
    k = qk[:, :, n:]
    v = proj[..., 2 * inner:3 * inner].unflatten(-1, (h, d)).transpose(1, 2)                    # (B, H, N, D)
    beta = torch.sigmoid(proj[..., 3 * inner:3 * inner + h])
    log_alpha = F.softplus(proj[..., 3 * inner + h:3 * inner + 2 * h]) * neg_a
    if mask is not None:
        m = mask.to(compute)[..., None]
        beta, log_alpha = beta * m, log_alpha * m
    beta = beta.transpose(1, 2)[..., None]                                                       # (B, H, N, 1)
    g = log_alpha.transpose(1, 2).cumsum(-1)                                                     # (B, H, N)
    if above is None:
        above = torch.ones(n, n, dtype=torch.bool, device=proj.device).triu(1)
    # masked before exp: above the diagonal G_t - G_s >= 0 could overflow, and inf * 0 poisons gradients
    decay = (g[..., :, None] - g[..., None, :]).masked_fill_(above, -math.inf).exp_()
    s = (qk @ k.transpose(-1, -2)).unflatten(2, (2, n)) * decay[:, :, None]      # [q.k; k.k] * decay
    p, lower = s[:, :, 0], s[:, :, 1] * beta               # solve_triangular reads below the diagonal only
    rhs = v * beta
    o = p @ torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    if n > chunk:
        u_in = torch.linalg.solve_triangular(lower[..., chunk:, chunk:], rhs[:, :, chunk:], upper=False,
                                             unitriangular=True)
        o = torch.cat([o[:, :, :chunk], torch.lerp(p[..., chunk:, chunk:] @ u_in, o[:, :, chunk:],
                                                   gate.to(compute)[..., None])], dim=2)
    o = F.rms_norm(o.transpose(1, 2).to(out_dtype or proj.dtype), (d,), norm_weight, eps)
    return o


def _check(proj, heads: int, head_dim: int, neg_a, norm_weight, chunk: int, mask, gate):
    if proj.dim() != 3 or proj.shape[-1] != heads * (3 * head_dim + 2):
        raise ValueError(f"proj must be (B, N, H (3 D + 2)) = (B, N, {heads * (3 * head_dim + 2)}); got shape "
                         f"{tuple(proj.shape)}")
    b, n, _ = proj.shape
    if not 0 < n <= 2 * chunk:
        raise ValueError(f"n={n} tokens is not allowed: 1 ... {2 * chunk} (two chunks of {chunk})")
    if tuple(neg_a.shape) != (heads,) or tuple(norm_weight.shape) != (head_dim,):
        raise ValueError(f"neg_a must be ({heads},) and norm_weight ({head_dim},); got {tuple(neg_a.shape)} and "
                         f"{tuple(norm_weight.shape)}")
    if mask is not None and tuple(mask.shape) != (b, n):
        raise ValueError(f"mask must be (B, N) = ({b}, {n}); got {tuple(mask.shape)}")
    if n > chunk and (gate is None or tuple(gate.shape) != (b, heads, n - chunk)):
        got = None if gate is None else tuple(gate.shape)
        raise ValueError(f"gate must be (B, H, n - C) = ({b}, {heads}, {n - chunk}) for n={n} > chunk={chunk}; "
                         f"got {got}")


def hla_short(proj, heads: int, head_dim: int, neg_a, norm_weight, eps: float, *, chunk: int, mask=None,
              gate=None, out_dtype=None, backend: str = "reference", above=None):
    """proj (B, N, H (3 D + 2)): the fused projection's output; neg_a (H,) = -exp(A_log); norm_weight (D,);
    mask (B, N) (1 keeps a token) or None; gate (B, H, N - C), needed when N > C. -> (B, N, H, D).
    ``above`` goes to the reference (``hla_short_reference``)."""
    _check(proj, heads, head_dim, neg_a, norm_weight, chunk, mask, gate)
    if check_backend(backend, proj.dtype, hla_short_triton) == "triton":
        if not triton_serves(head_dim, chunk):
            raise ValueError(f"backend='triton' takes head_dim <= {TRITON_MAX_HEAD_DIM} and a chunk that 16 divides; "
                             f"got head_dim={head_dim}, chunk={chunk}")
        return hla_short_triton(proj, heads, head_dim, neg_a, norm_weight, eps, chunk=chunk, mask=mask, gate=gate,
                                out_dtype=out_dtype)
    return hla_short_reference(proj, heads, head_dim, neg_a, norm_weight, eps, chunk=chunk, mask=mask, gate=gate,
                               out_dtype=out_dtype, above=above)
