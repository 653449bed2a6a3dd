"""Multi-head softmax self-attention on hidden states (B, N, C): projections + SDPA, with a KV cache
for token-by-token decoding. The text encoder's ``sdpa`` path and the MHA baseline for MLRA."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .cache import DecodeCache
from .masks import sdpa_mask
from ...attention.sdpa import SDPAttention


class MultiHeadSelfAttention(nn.Module):
    """Standard MHA (BERT-shaped: q, k, v, out projections with bias); causal or bidirectional."""

    def __init__(self, hidden: int, heads: int, *, causal: bool = True, bias: bool = True):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
        self.heads, self.head_dim, self.causal = heads, hidden // heads, causal
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, hidden, bias=bias)
        self.v_proj = nn.Linear(hidden, hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.attend = SDPAttention()

    def _split(self, x):
        return x.unflatten(-1, (self.heads, self.head_dim))

    def forward(self, x, attention_mask=None, cache: DecodeCache | None = None):
        """x (B, N, C); attention_mask (B, N) of 1 = real token. With ``cache``, the keys and values of
        x are appended and x attends to everything cached (x is the newest tokens)."""
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))
        if cache is not None:
            start = cache.length
            cache.append(k=k, v=v)
            k, v = cache["k"], cache["v"]
            if q.shape[1] == 1:
                # every step has a new key length; cuDNN's SDPA builds an execution plan per shape, so
                # decode steps use the flash / memory-efficient kernels (measured: benchmarks/RESULTS.md,
                # Decode: MLRA with a latent cache against MHA with a KV cache)
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                    o = self.attend(q, k, v)
            else:                                   # prefill: causal over the whole cache
                n_all = k.shape[1]
                mask = torch.ones(q.shape[1], n_all, dtype=torch.bool, device=x.device).tril(start)
                o = self.attend(q, k, v, attn_mask=mask)
            return self.out_proj(o.flatten(-2))
        mask, is_causal = sdpa_mask(attention_mask, x.shape[1], self.causal, x.device)
        o = self.attend(q, k, v, attn_mask=mask, is_causal=is_causal)
        return self.out_proj(o.flatten(-2))

    def new_cache(self, batch: int, capacity: int, *, dtype=None, device=None) -> DecodeCache:
        p = self.q_proj.weight
        shape = (self.heads, self.head_dim)
        return DecodeCache(batch, capacity, {"k": shape, "v": shape}, dtype=dtype or p.dtype,
                           device=device or p.device)

    def kv_cache_bytes_per_token(self, dtype=torch.bfloat16) -> int:
        return 2 * self.heads * self.head_dim * torch.empty((), dtype=dtype).element_size()
