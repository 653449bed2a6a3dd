"""Attention diagnostics: the dense attention matrix of a softmax, linear or MHLA layer from its
q and k, and that matrix's rank and entropy (the paper: on DeiT-T, rank 58 linear / 233 MHLA /
255 softmax).

All q, k are (B, N, H, D); matrices come back (B, H, N, N) in float64, each row summing to 1:
- softmax: A = softmax(q k^T * scale), scale = D^-1/2 by default.
- linear:  A[t, s] = phi(q_t).phi(k_s) / (sum_s' phi(q_t).phi(k_s') + eps). Its rank is at most D,
  since A is diag(1/den) times the product of an (N, D) and a (D, N) matrix.
- MHLA:    A[t, s] = m_{i(t), i(s)} phi(q_t).phi(k_s) / (sum_s' of the same + eps), i(t) the block
  of token t (the dense form of the MHLA kernel). Rank at most M * D: each block of key columns
  contributes a factor of rank <= D.
Rank is numerical: singular values above ``rtol`` times the largest (default N * eps of float64,
numpy's rule; pass e.g. 1e-6 to ignore numerically negligible directions). Entropy is the mean
over rows of -sum_s A log A, in nats (log N for uniform attention, 0 for one-hot).
"""

from __future__ import annotations

import torch

from ..kernels import token_block_ids
from ..kernels.mhla.checks import feature


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"q and k must be (B, N, H, D); got shape {tuple(x.shape)}")
    return x.transpose(1, 2).double()


def softmax_attention_matrix(q, k, scale: float | None = None) -> torch.Tensor:
    qh, kh = _heads_first(q), _heads_first(k)
    scale = qh.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax(qh @ kh.transpose(-1, -2) * scale, dim=-1)


def _normalise_rows(raw: torch.Tensor, eps: float) -> torch.Tensor:
    return raw / (raw.sum(dim=-1, keepdim=True) + eps)


def linear_attention_matrix(q, k, feature_map: str = "relu", eps: float = 1e-6) -> torch.Tensor:
    qf, kf = feature(_heads_first(q), feature_map), feature(_heads_first(k), feature_map)
    return _normalise_rows(qf @ kf.transpose(-1, -2), eps)


def mhla_attention_matrix(q, k, mix, grid, blocks, feature_map: str = "relu", eps: float = 1e-6) -> torch.Tensor:
    qf, kf = feature(_heads_first(q), feature_map), feature(_heads_first(k), feature_map)
    ids = token_block_ids(tuple(grid), tuple(blocks), q.device)
    if ids.numel() != qf.shape[2]:
        raise ValueError(f"grid={tuple(grid)} holds {ids.numel()} tokens but q has N={qf.shape[2]}")
    m = mix.detach().double().to(q.device)
    # token-pair mixing weights m_{i(t), i(s)}: (N, N) for a shared Mc, (H, N, N) per head
    pair = m[ids][:, ids] if m.dim() == 2 else m[:, ids][:, :, ids]
    return _normalise_rows(pair * (qf @ kf.transpose(-1, -2)), eps)


def attention_matrix(module, q, k, grid=None) -> torch.Tensor:
    """The dense attention matrix of a ``mediagen.attention`` module on q, k."""
    from ..attention import LinearAttention, MHLAttention, SDPAttention

    if isinstance(module, LinearAttention):
        return linear_attention_matrix(q, k, module.feature_map, module.eps)
    if isinstance(module, MHLAttention):
        if grid is None:
            raise ValueError("an MHLA layer needs the token grid to build its attention matrix; got grid=None")
        return mhla_attention_matrix(q, k, module.mix, grid, module.blocks, module.feature_map, module.eps)
    if isinstance(module, SDPAttention):
        return softmax_attention_matrix(q, k)
    raise ValueError(f"no attention matrix for module type {type(module).__name__}: "
                     "use SDPAttention, LinearAttention or MHLAttention")


def attention_rank(A: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """Numerical rank of each (N, N) matrix in A (..., N, N), as int64 (...)."""
    return torch.linalg.matrix_rank(A.double(), rtol=rtol)


def attention_entropy(A: torch.Tensor) -> torch.Tensor:
    """Mean row entropy (nats) of each matrix in A (..., N, N)."""
    A = A.double()
    return -(A * torch.log(A.clamp_min(1e-300))).sum(-1).mean(-1)


def attention_stats(A: torch.Tensor, rtol: float | None = None) -> dict:
    """Rank and entropy of (B, H, N, N) attention, per head and averaged."""
    rank, ent = attention_rank(A, rtol), attention_entropy(A)
    return {"rank_mean": rank.double().mean().item(), "rank_per_head": rank.tolist(),
            "entropy_mean": ent.mean().item(), "entropy_per_head": ent.tolist(), "tokens": A.shape[-1]}


class AttentionRecorder:
    """Record q, k (and grid) of every ``mediagen.attention`` module of a model during a forward:

        with AttentionRecorder(model) as rec:
            model(inputs)
        stats = rec.stats()   # {module name: attention_stats(...)}
    """

    def __init__(self, model, max_tokens: int = 4096):
        from ..attention import MHLAttention, SDPAttention

        self.model, self.max_tokens = model, max_tokens
        self.targets = {n: m for n, m in model.named_modules() if isinstance(m, (MHLAttention, SDPAttention))}
        self.records: dict = {}
        self._handles = []

    def __enter__(self):
        for name, mod in self.targets.items():
            def hook(module, args, kwargs, name=name):
                q, k = args[0], args[1]
                grid = args[3] if len(args) > 3 else kwargs.get("grid")
                if q.shape[1] <= self.max_tokens:
                    self.records[name] = (module, q.detach(), k.detach(), grid)
            self._handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def stats(self, rtol: float | None = None) -> dict:
        return {name: attention_stats(attention_matrix(mod, q, k, grid), rtol)
                for name, (mod, q, k, grid) in self.records.items()}
