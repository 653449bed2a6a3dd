"""MHLA in a few whole-tensor PyTorch ops: the fast path where the Triton kernels do not run (CPU).

The same math as ``naive.mhla_reference`` (the oracle, which visits blocks one by one):

    S_b = sum_{s in b} phi(k_s) v_s^T,   z_b = sum_{s in b} phi(k_s)
    S~_i = sum_b mix[i, b] S_b,           z~_i = sum_b mix[i, b] z_b
    o_t = phi(q_t)^T S~_i(t) / (phi(q_t)^T z~_i(t) + eps)     (normalize=False: times scale instead)

Tokens are put once into a block-major (B, H, M, n, D) layout, so every block is handled by one batched
matmul instead of a Python loop with a gather per block and tensor. When every axis splits into equal blocks
(the video model's 16x8x8 grid in 4x2x2 blocks) that layout is a reshape and a permute of the token grid,
one copy; otherwise tokens are gathered into a padded layout (a block smaller than the largest is filled
with zero features, which add nothing to S and z and whose outputs are dropped) and scattered back with an
inverse index.

Short sequences take the quadratic form instead (``form="auto"``, ``quadratic_pays``), the dense form of the
Triton kernel: o_t = sum_s mix[i(t), i(s)] (phi(q_t).phi(k_s)) v_s / (sum_s mix[i(t), i(s)] phi(q_t).phi(k_s) + eps),
two large matmuls over all token pairs in place of many small batched ones.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from .checks import check_mhla_args, feature
from .layout import _block_lists_cpu, kept_on, on_device, token_block_ids
from .rotation import rotate_pairs, split_rope


@lru_cache(maxsize=256)
def _padded_index_cpu(grid: tuple[int, ...], blocks: tuple[int, ...]):
    """(gather index (M * n_max,) into tokens, with N for a padding slot; inverse (N,) into it)."""
    order, offsets, n_max = _block_lists_cpu(grid, blocks)
    n_tokens, m = order.numel(), offsets.numel() - 1
    counts = (offsets[1:] - offsets[:-1]).long()
    slot = torch.arange(n_max)[None, :]                                   # (1, n_max)
    valid = slot < counts[:, None]                                        # (M, n_max)
    gather = torch.full((m, n_max), n_tokens, dtype=torch.long)
    gather[valid] = order.long()
    inverse = torch.empty(n_tokens, dtype=torch.long)
    inverse[order.long()] = (torch.arange(m)[:, None] * n_max + slot)[valid]
    return gather.reshape(-1), inverse, n_max


@torch.compiler.assume_constant_result
def _padded_index(grid: tuple[int, ...], blocks: tuple[int, ...], device: torch.device):
    """``_padded_index_cpu`` on ``device``. Traced code (torch.compile) calls it once and keeps the result as
    constants: traced through, its index building (sort, bincount, nonzero, .item()) broke the graph at every
    layer (image-mhla: 14 graphs per forward)."""
    return on_device(_padded_index_cpu, grid, blocks, device)


FORMS = ("auto", "blocked", "quadratic")


def quadratic_pays(B: int, N: int, H: int, D: int, M: int) -> bool:
    """Whether the quadratic form is the faster one on a CPU. Multiply-adds per head: 2 N^2 D for it, 2 N D^2 +
    M^2 D^2 for the blocked form, whose small batched matmuls (blocks of tens of tokens) run at about a third of
    the rate of the quadratic form's two large ones: the quadratic form pays up to 3x the work. Measured on a
    2-core CPU, fp32, the shipped class-to-image model (196 tokens, D = 64, M = 9, 2.5x the work): its
    transformer's forward at batch 2 23.7 against 25.8 ms, at batch 8 level; the op alone at 784 tokens (11.6x)
    2.6x slower than blocked. Its (B, H, N, N) scores are also kept below 2^24 elements."""
    return 2 * N * N <= 3 * (2 * N * D + M * M * D) and B * H * N * N <= 1 << 24


@lru_cache(maxsize=256)
def _token_ids_cpu(grid: tuple[int, ...], blocks: tuple[int, ...]):
    return (token_block_ids(grid, blocks),)


@torch.compiler.assume_constant_result
def _token_ids(grid: tuple[int, ...], blocks: tuple[int, ...], device: torch.device):
    """Every token's block id (N,) on ``device``, kept as a constant by traced code (``_padded_index``)."""
    return on_device(_token_ids_cpu, grid, blocks, device)[0]


def _pair_weights(mix, ids, dtype):
    """mix[i(t), i(s)] for every token pair, (N, N) or (H, N, N) in ``dtype``. Where nothing differentiates mix it
    is kept on ``mix`` until mix or the token ids change (``layout.kept_on``): sampling gathered the same N^2
    entries in every layer at every step, 97 us a layer at the class-to-image model's 196 tokens (2-core CPU)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and mix.requires_grad):
        return mix.to(dtype)[..., ids[:, None], ids[None, :]]
    return kept_on(mix, "_mediagen_pairs", lambda: mix.detach().to(dtype)[..., ids[:, None], ids[None, :]], ids,
                   dtype)


def _quadratic(qf, kf, qn, kn, v, mix, ids, normalize, eps, scale):
    """The quadratic form on (B, N, H, E) features (``qn``, ``kn``: the numerator's, rotated with RoPE); ``mix``
    as given (``_pair_weights`` casts its pairs to the features' dtype)."""
    w = _pair_weights(mix, ids, qf.dtype)                                 # (N, N) or (H, N, N): mix[i(t), i(s)]
    # in place where nothing is differentiated (sampling): the (B, H, N, N) temporaries are the form's main cost
    # besides its two matmuls (2-core CPU, 196 tokens, 3 x 64, interleaved: 388-526 against 418-768 us at B = 2,
    # 3.4 against 3.9-4.1 ms at B = 8, faster in 47 of 48 rounds)
    inplace = not (torch.is_grad_enabled() and any(t.requires_grad for t in (qf, kf, qn, kn, v, w)))

    def weighted_scores(a, b):
        p = a.transpose(1, 2) @ b.permute(0, 2, 3, 1)                     # (B, H, N, N)
        return p.mul_(w) if inplace else p * w

    p = weighted_scores(qn, kn)
    o = p @ v.transpose(1, 2)                                             # (B, H, N, D)
    if normalize:
        if qn is not qf:  # RoPE rotates the numerator's features only
            p = weighted_scores(qf, kf)
        den = p.sum(-1, keepdim=True)
        o = o.div_(den.add_(eps)) if inplace else o / (den + eps)
    elif scale is not None:
        o = o.mul_(scale) if inplace else o * scale
    return o.transpose(1, 2)


def _sampling(*tensors) -> bool:
    """Whether the even-blocks form may write into buffers it owns (``out=``): nothing is differentiated and
    nothing is traced."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def _even_blocks_sampling(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, cos, sin, acc):
    """The blocked form where every axis splits into equal blocks and nothing is differentiated (sampling), with
    each full-size pass over the tokens fused into the next where PyTorch's ``out=`` allows it:

    - the feature map writes the block-major copy of q and of k directly (the block layout is a permuted view of
      the tokens: one pass each, where the generic form took the feature map, then the copy);
    - RoPE is one complex multiply on the block-major features with the tables put in block order (a (M, n, D/2)
      copy of (N, D/2) tables), where ``rotate_pairs`` takes six passes and a stack per tensor;
    - the division by the denominator writes o back in token order, in q's dtype (the inverse permute, one pass).

    Same math and the same fp32 (fp64 for fp64) accumulation as the generic form; rounding may differ in the
    last bit (complex multiply). 2-core CPU, fp32, the video models' shape (B = 2, 32x16x16 tokens, 6 x 64,
    blocks 4x2x2, relu, RoPE): see benchmarks/RESULTS.md ("Shipped video models on a CPU")."""
    B, N, H, D = q.shape
    M, n = math.prod(blocks), N // math.prod(blocks)
    nd = len(grid)
    split = [d for g, b in zip(grid, blocks) for d in (b, g // b)]
    order = (0, 2 * nd + 1, *range(1, 2 * nd, 2), *range(2, 2 * nd + 1, 2), 2 * nd + 2)
    permuted = (B, H, *blocks, *(g // b for g, b in zip(grid, blocks)))

    def view(x):  # (B, N, H, E) tokens -> (B, H, *blocks, *block sizes, E), a permuted view (no copy)
        return x.reshape(B, *split, H, x.shape[-1]).permute(order)

    def blocked_features(x):  # phi(x) in block-major order (B, H, M, n, D), fp32 / fp64, one pass
        out = torch.empty(permuted + (D,), dtype=acc, device=x.device)
        if feature_map == "relu" and x.dtype == acc:  # (clamp_min's out= takes its input's dtype only)
            torch.clamp_min(view(x), 0, out=out)
        else:
            out.copy_(view(x))
            if feature_map == "relu":
                out.relu_()
            elif feature_map is not None:  # elu1: elu(x) + 1, in place
                F.elu_(out).add_(1.0)
        return out.view(B, H, M, n, D)

    qf, kf = blocked_features(q), blocked_features(k)
    if cos is None:
        qn, kn = qf, kf
    else:
        rot = torch.complex(cos.to(acc), sin.to(acc)).reshape(1, *split, 1, D // 2).permute(order)
        rot = rot.reshape(M, n, D // 2)                                   # the tables in block order

        def rotated(x):  # R_t x_t on (B, H, M, n, D) features: channel pairs (2j, 2j+1) as complex numbers
            return torch.view_as_real(torch.view_as_complex(x.view(B, H, M, n, D // 2, 2)) * rot).view(x.shape)

        qn, kn = rotated(qf), rotated(kf)
    V = torch.empty((B, H, M, n, D), dtype=acc, device=v.device)
    V.view(permuted + (D,)).copy_(view(v))
    S = kn.transpose(-1, -2) @ V                                          # (B, H, M, D, D): S_b
    del V
    m = mix.detach().to(acc).expand(B, H, M, M)
    S = (m @ S.reshape(B, H, M, D * D)).view(B, H, M, D, D)               # S~_i = sum_b mix[i, b] S_b
    o = qn @ S                                                            # (B, H, M, n, D)
    out = torch.empty((B, N, H, D), dtype=q.dtype, device=q.device)
    if normalize:
        z = m @ kf.sum(3)                                                 # (B, H, M, D): z~
        den = (qf @ z[..., None]).add_(eps)                               # (B, H, M, n, 1)
        torch.div(o.view(permuted + (D,)), den.view(permuted + (1,)), out=view(out))
    elif scale is not None:
        torch.mul(o.view(permuted + (D,)), scale, out=view(out))
    else:
        view(out).copy_(o.view(permuted + (D,)))
    return out


def mhla_blocked(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                 rope=None, form="auto"):
    """MHLA with the arguments of ``mhla``; accumulation in fp32 (fp64 for fp64 inputs). ``form``: "blocked",
    "quadratic" (module docstring) or "auto" (``quadratic_pays``)."""
    if form not in FORMS:
        raise ValueError(f"form={form!r} is not allowed: use one of {FORMS}")
    grid, blocks = check_mhla_args(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference=True)
    cos, sin = split_rope(rope, q)
    B, N, H, D = q.shape
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    # (traced code keeps the blocked form: compiled by Inductor on a CPU the quadratic one was the slower, image-mhla's
    # 8-step sampling 189 / 663 ms at batch 1 / 4 against 176 / 571 blocked, sdpa 130-135 / 429-448)
    quadratic = form == "quadratic" or (form == "auto" and not torch.compiler.is_compiling()
                                        and quadratic_pays(B, N, H, D, math.prod(blocks)))
    if quadratic:
        qf, kf = feature(q.to(acc), feature_map), feature(k.to(acc), feature_map)
        qn, kn = (qf, kf) if cos is None else (rotate_pairs(qf, cos, sin), rotate_pairs(kf, cos, sin))
        o = _quadratic(qf, kf, qn, kn, v.to(acc), mix, _token_ids(grid, blocks, q.device), normalize, eps, scale)
        return o.to(q.dtype)
    if all(g % b == 0 for g, b in zip(grid, blocks)):
        if _sampling(q, k, v, mix, cos, sin):
            return _even_blocks_sampling(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, cos, sin, acc)
        M, n_max = math.prod(blocks), N // math.prod(blocks)
        # (B, N, H, E) as (B, b0, g0/b0, b1, g1/b1, ..., H, E), permuted to heads, block axes, in-block axes
        split = [d for g, b in zip(grid, blocks) for d in (b, g // b)]
        nd = len(grid)
        order = (0, 2 * nd + 1, *range(1, 2 * nd, 2), *range(2, 2 * nd + 1, 2), 2 * nd + 2)
        inverse_order = tuple(sorted(range(len(order)), key=order.__getitem__))
        permuted = [B, H, *blocks, *(g // b for g, b in zip(grid, blocks))]

        def blocked(x):  # (B, N, H, E) -> (B, H, M, n, E), one copy
            return x.reshape(B, *split, H, x.shape[-1]).permute(order).reshape(B, H, M, n_max, x.shape[-1])

        def unblocked(o):  # the inverse of ``blocked``
            return o.reshape(*permuted, o.shape[-1]).permute(inverse_order).reshape(B, N, H, o.shape[-1])
    else:
        gather, inverse, n_max = _padded_index(grid, blocks, q.device)
        M = gather.numel() // n_max

        def blocked(x):  # (B, N, H, E) -> (B, H, M, n_max, E), padding slots zero
            return F.pad(x.transpose(1, 2), (0, 0, 0, 1))[:, :, gather].view(B, H, M, n_max, x.shape[-1])

        def unblocked(o):
            return o.reshape(B, H, M * n_max, o.shape[-1])[:, :, inverse].transpose(1, 2)

    # Layout (B, H, M, n, E): every product below is a batched matmul over it with no operand copied, and Mc
    # (shared (M, M) or per head (H, M, M)) mixes the (B, H, M, ...) summaries broadcast over (B, H).
    qf, kf = feature(q.to(acc), feature_map), feature(k.to(acc), feature_map)
    qn, kn = (qf, kf) if cos is None else (rotate_pairs(qf, cos, sin), rotate_pairs(kf, cos, sin))
    Kn, V = blocked(kn), blocked(v.to(acc))
    S = Kn.transpose(-1, -2) @ V                                          # (B, H, M, D, D): S_b
    # Mc broadcast explicitly to (B, H, M, M): given a 2-D Mc that requires grad (a parameter, even under
    # no_grad), torch.matmul instead folds the summaries into one matrix by a transposed copy. 2-core CPU,
    # fp32: the op 2.36 -> 1.78 ms at DiT-MNIST's sampling shape (B = 8), 45 -> 35 ms at the video model's B = 16.
    m = mix.to(acc).expand(B, H, M, M)
    S = (m @ S.reshape(B, H, M, D * D)).view(B, H, M, D, D)               # S~_i = sum_b mix[i, b] S_b
    Qn = blocked(qn)
    o = Qn @ S                                                            # (B, H, M, n, D)
    if normalize:
        Kf = Kn if kf is kn else blocked(kf)
        z = m @ Kf.sum(3)                                                 # (B, H, M, D): z~
        Qf = Qn if qf is qn else blocked(qf)
        o = o / (Qf @ z[..., None] + eps)
    elif scale is not None:
        o = o * scale
    return unblocked(o).to(q.dtype)
