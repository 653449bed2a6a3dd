"""Attention diagnostics: the dense attention matrix of a layer from its q and k, and that matrix's rank and
entropy (the paper: on DeiT-T, rank 58 linear / 233 MHLA / 255 softmax).

A layer's matrix is its attention's ``dense`` form (``models.attention_registry``; softmax, linear and MHLA in
``models.dense_attention``, re-exported here), so every registered attention with one is measured the same way.
q, k are (B, N, H, D); matrices come back (B, H, N, N) in float64. Softmax, linear and MHLA rows sum to 1,
except with RoPE on the features, where entries can be negative (entropy is then not reported).
Rank is numerical: singular values above ``rtol`` times the largest (default N * eps of float64,
numpy's rule; pass e.g. 1e-6 to ignore numerically negligible directions). Entropy is the mean
over rows of -sum_s A log A, in nats (log N for uniform attention, 0 for one-hot).
"""

from __future__ import annotations

import torch

from ..models import attention_registry
from ..models.dense_attention import linear_attention_matrix, mhla_attention_matrix, softmax_attention_matrix

__all__ = ["attention_matrix", "softmax_attention_matrix", "linear_attention_matrix", "mhla_attention_matrix",
           "attention_rank", "attention_entropy", "attention_stats", "AttentionRecorder"]


def attention_matrix(module, q, k, grid=None, rope=None) -> torch.Tensor:
    """The dense attention matrix of a core module of a registered attention on q, k (``rope``: as the
    module's forward got it): its entry's ``dense`` (``models.attention_registry``)."""
    entry = attention_registry.entry_of_module(module)
    if entry is None or entry.dense is None:
        known = [e.name for e in attention_registry.entries() if e.dense is not None and e.module is not None]
        raise ValueError(f"no attention matrix for module type {type(module).__name__}: use the core module of "
                         f"an attention with a dense form ({', '.join(known)})")
    return entry.dense(module, q, k, grid, rope)


def attention_rank(A: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """Numerical rank of each (N, N) matrix in A (..., N, N), as int64 (...)."""
    return torch.linalg.matrix_rank(A.double(), rtol=rtol)


def attention_entropy(A: torch.Tensor) -> torch.Tensor:
    """Mean row entropy (nats) of each matrix in A (..., N, N)."""
    A = A.double()
    return -(A * torch.log(A.clamp_min(1e-300))).sum(-1).mean(-1)


def attention_stats(A: torch.Tensor, rtol: float | None = None) -> dict:
    """Rank and entropy of (B, H, N, N) attention, per head and averaged. Entropy is None when A
    has negative entries (RoPE-rotated linear attention): its rows are then no distributions."""
    rank = attention_rank(A, rtol)
    ent = attention_entropy(A) if bool((A >= 0).all()) else None
    return {"rank_mean": rank.double().mean().item(), "rank_per_head": rank.tolist(),
            "entropy_mean": None if ent is None else ent.mean().item(),
            "entropy_per_head": None if ent is None else ent.tolist(), "tokens": A.shape[-1]}


class AttentionRecorder:
    """Record q, k (and grid) of the self-attention layers of a model during a forward:

        with AttentionRecorder(model) as rec:
            model(inputs)
        stats = rec.stats()   # {layer name: attention_stats(...)}

    Layers are the core modules of registered attentions (``attention_registry.module_types()``: the
    MHLA / linear cores of converted diffusers models included) and diffusers ``Attention`` modules
    that run softmax through torch's ``scaled_dot_product_attention`` (recorded while the call is inside
    such a module, patched only inside the ``with`` block; cross-attention, masked and causal calls are
    skipped). Layers with
    more than ``max_tokens`` tokens are skipped: their dense N x N matrix would not fit. Layers
    with rope="features" are recorded with their rotation tables (``rope``).
    """

    def __init__(self, model, max_tokens: int = 4096):
        self.model, self.max_tokens = model, max_tokens
        cores = attention_registry.module_types()
        self.targets = {n: m for n, m in model.named_modules() if isinstance(m, cores)}
        self.containers = {n: m for n, m in model.named_modules()
                           if hasattr(m, "processor") and n not in self.targets}
        self.records: dict = {}
        self._handles = []
        self._current: list[str] = []

    def _record_module(self, name):
        def hook(module, args, kwargs):
            q, k = args[0], args[1]
            grid = args[3] if len(args) > 3 else kwargs.get("grid")
            rope = args[4] if len(args) > 4 else kwargs.get("rope")
            if q.shape[1] <= self.max_tokens:
                self.records[name] = (module, q.detach(), k.detach(), grid, rope)
        return hook

    def _enter_layer(self, name):
        def hook(*_):
            self._current.append(name)  # returns None: a hook's return value would replace the inputs
        return hook

    def _leave_layer(self, *_):
        self._current.pop()

    def _sdpa_wrapper(self, sdpa):
        def wrapped(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
            plain = attn_mask is None and not is_causal and query.shape == key.shape
            if self._current and plain and query.shape[-2] <= self.max_tokens:
                # torch's layout is (B, H, N, D); ours is (B, N, H, D)
                self.records[self._current[-1]] = ("softmax", query.detach().transpose(1, 2),
                                                   key.detach().transpose(1, 2), scale)
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, **kwargs)
        return wrapped

    def __enter__(self):
        import torch.nn.functional as F

        for name, mod in self.targets.items():
            self._handles.append(mod.register_forward_pre_hook(self._record_module(name), with_kwargs=True))
        for name, mod in self.containers.items():
            self._handles.append(mod.register_forward_pre_hook(self._enter_layer(name)))
            self._handles.append(mod.register_forward_hook(self._leave_layer))
        self._sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._sdpa_wrapper(self._sdpa)
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._sdpa
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._current.clear()

    def stats(self, rtol: float | None = None) -> dict:
        out = {}
        for name, rec in self.records.items():
            if rec[0] == "softmax":
                _, q, k, scale = rec
                A, kind = softmax_attention_matrix(q, k, scale), "softmax"
            else:
                mod, q, k, grid, rope = rec
                A = attention_matrix(mod, q, k, grid, rope)
                kind = type(mod).__name__ + ("+rope" if rope is not None else "")
            out[name] = {"kind": kind, **attention_stats(A, rtol)}
        return out
