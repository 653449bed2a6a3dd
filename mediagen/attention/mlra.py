"""Multi-head low-rank attention (MLRA, ICLR 2026): MLA whose KV latent is split into 4 latent heads.

Shapes (d = hidden size, H heads, d_h = head dim):
  query:  c_q = RMSNorm(W_dq x) * sqrt(d / d_q);  [q_nope | q_rope] = W_uq c_q       (per head d_h + d_r)
  keys:   [c | k_r] = W_dkv x, c of size d_c split into 4 latent heads c_l of d_c/4;
          c_l <- RMSNorm_l(c_l) * sqrt(4 d / d_c)  (own norm per latent head; variance calibration)
          k_r is ONE rope key shared by every head and every branch.
  MLRA-4: every latent l up-projects to K_nope, V for all H heads; 4 attentions, outputs summed / 2.
  MLRA-2: branch a = latents 0 (heads 0..H/2-1) and 1 (heads H/2..H-1), branch b = latents 2, 3;
          2 attentions, outputs summed / sqrt(2).
  score = (q_nope . k_nope + q_rope . k_r) / sqrt(d_h + d_r); output projection zero-initialised.

Cache per token and layer: the normalised latents c (d_c) and the rotated rope key (d_r); with
d_c = 4 d_h and d_r = d_h / 2 that is 4.5 d_h values, as MLA. Decoding never expands the cache:
the key up-projection is absorbed into the query (q~_l = W_uk_l^T q_nope, scored against c_l directly)
and the value up-projection is applied after the latent-space weighted sum.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.latent_decode import latent_decode
from .cache import DecodeCache
from .masks import sdpa_mask
from .rope import apply_rope_tables, rope_tables

LATENT_HEADS = 4


class MLRAttention(nn.Module):
    """MLRA-2 (``branches=2``) or MLRA-4 (``branches=4``) self-attention on hidden states (B, N, d).

    Args:
        hidden, heads: model width d and number of heads H.
        head_dim: d_h (default d / H), the no-rope query/key width and the value width.
        kv_latent: d_c (default 4 d_h); q_latent: d_q (default d); rope_dim: d_r (default d_h / 2).
        bias: biases on the query up-projection and the output projection (to take BERT weights).
    """

    def __init__(self, hidden: int, heads: int, *, branches: int = 4, head_dim: int | None = None,
                 kv_latent: int | None = None, q_latent: int | None = None, rope_dim: int | None = None,
                 rope_base: float = 10000.0, causal: bool = True, bias: bool = False, eps: float = 1e-6):
        super().__init__()
        if branches not in (2, 4):
            raise ValueError(f"branches={branches} is not allowed: MLRA has 2 or 4 branches")
        head_dim = head_dim or hidden // heads
        kv_latent = kv_latent or LATENT_HEADS * head_dim
        q_latent = q_latent or hidden
        rope_dim = rope_dim if rope_dim is not None else head_dim // 2
        if kv_latent % LATENT_HEADS:
            raise ValueError(f"kv_latent={kv_latent} must be divisible by {LATENT_HEADS} latent heads")
        if branches == 2 and heads % 2:
            raise ValueError(f"MLRA-2 needs an even number of heads; got heads={heads}")
        self.hidden, self.heads, self.head_dim, self.branches = hidden, heads, head_dim, branches
        self.kv_latent, self.q_latent, self.rope_dim = kv_latent, q_latent, rope_dim
        self.latent_dim = kv_latent // LATENT_HEADS
        self.heads_per_latent = heads if branches == 4 else heads // 2
        self.rope_base, self.causal = rope_base, causal
        self.q_scale = math.sqrt(hidden / q_latent)                   # sqrt(d / d_q)
        self.kv_scale = math.sqrt(hidden / self.latent_dim)           # sqrt(4 d / d_c)
        self.branch_scale = 1.0 / math.sqrt(branches)                 # 1/2 (MLRA-4), 1/sqrt2 (MLRA-2)
        self.attn_scale = 1.0 / math.sqrt(head_dim + rope_dim)

        self.q_down = nn.Linear(hidden, q_latent, bias=False)
        self.q_norm = nn.RMSNorm(q_latent, eps=eps)
        self.q_up = nn.Linear(q_latent, heads * (head_dim + rope_dim), bias=bias)
        self.kv_down = nn.Linear(hidden, kv_latent + rope_dim, bias=False)
        self.kv_norms = nn.ModuleList(nn.RMSNorm(self.latent_dim, eps=eps) for _ in range(LATENT_HEADS))
        # kv_up[l]: latent head l -> (K_nope, V) for the heads it serves, laid out (heads, 2, d_h)
        self.kv_up = nn.Parameter(torch.empty(LATENT_HEADS, self.latent_dim, self.heads_per_latent * 2 * head_dim))
        self.out_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        # (4, 1, 4, 1) block-diagonal selector of the decode step; not saved (persistent=False)
        self.register_buffer("_latent_eye", torch.eye(LATENT_HEADS)[:, None, :, None], persistent=False)
        # decode_step's attention over the latent cache: "torch" (the ops below), "triton" (the
        # split-K kernel of kernels.latent_decode, one pass over the cache) or "auto": triton on CUDA
        # tensors (measured 1.7-3.3x faster than the torch ops there, benchmarks/RESULTS.md), else torch
        self.decode_backend = "auto"
        self.reset_parameters()

    def reset_parameters(self):
        for w in (self.q_down.weight, self.q_up.weight, self.kv_down.weight, self.kv_up):
            nn.init.normal_(w, std=0.02)
        nn.init.zeros_(self.out_proj.weight)                          # zero-initialised output projection
        for lin in (self.q_up, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    # ---- pieces shared by the full forward and the decode step ----

    def _rope(self, positions, dtype):
        """RoPE tables (``rope_tables``) for the positions, shaped to broadcast over heads."""
        cos, sin = rope_tables(positions, self.rope_dim, self.rope_base, dtype=dtype)
        return cos[:, None, :], sin[:, None, :]                      # broadcast over heads

    def _queries(self, x, cos, sin):
        c_q = self.q_norm(self.q_down(x)) * self.q_scale
        q = self.q_up(c_q).unflatten(-1, (self.heads, self.head_dim + self.rope_dim))
        q_nope, q_rope = q.split([self.head_dim, self.rope_dim], dim=-1)
        return q_nope, apply_rope_tables(q_rope, cos, sin)

    def _latents(self, x, cos, sin):
        """Normalised latents (B, N, 4, d_c/4) and the rotated shared rope key (B, N, d_r)."""
        c, k_rope = self.kv_down(x).split([self.kv_latent, self.rope_dim], dim=-1)
        c = c.unflatten(-1, (LATENT_HEADS, self.latent_dim))
        # the 4 latent heads' RMSNorms in one call: normalise, then each head's own weight
        weights = torch.stack([norm.weight for norm in self.kv_norms]) * self.kv_scale  # (4, d_l)
        c = F.rms_norm(c, (self.latent_dim,), eps=self.kv_norms[0].eps) * weights
        k_rope = apply_rope_tables(k_rope[:, :, None, :], cos, sin)[:, :, 0]
        return c, k_rope

    def _up_weights(self):
        """kv_up as (4, d_l, heads_per_latent, d_h) key and value maps."""
        w = self.kv_up.unflatten(-1, (self.heads_per_latent, 2, self.head_dim))
        return w[..., 0, :], w[..., 1, :]

    def _to_branches(self, t):
        """(B, N, 4, hp, ...) per-latent tensors -> (branches, B, N, H, ...): MLRA-2 joins latent pairs
        (2b, 2b+1) into the two head halves of branch b; MLRA-4 keeps one latent per branch."""
        t = t.movedim(2, 0)                                           # (4, B, N, hp, ...)
        if self.branches == 2:
            t = torch.cat([t[0::2], t[1::2]], dim=3)                  # (2, B, N, H, ...)
        return t

    # ---- full forward ----

    def forward(self, x, attention_mask=None, positions=None, cache: DecodeCache | None = None):
        """x (B, N, d) -> (B, N, d). With ``cache`` the latents of x are appended (prefill) and, for a
        single new token, attention runs in latent space (``decode_step``)."""
        b, n, _ = x.shape
        if cache is not None and n == 1:
            return self.decode_step(x, cache)
        start = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + n, device=x.device)
        cos, sin = self._rope(positions, x.dtype)
        q_nope, q_rope = self._queries(x, cos, sin)
        c, k_rope = self._latents(x, cos, sin)
        if cache is not None:
            if start:
                raise ValueError("prefill into a non-empty MLRA cache is not supported; decode one token at a time")
            cache.append(latents=c, rope_keys=k_rope)
        w_k, w_v = self._up_weights()
        k_nope = self._to_branches(torch.einsum("bnld,ldhe->bnlhe", c, w_k))
        v = self._to_branches(torch.einsum("bnld,ldhe->bnlhe", c, w_v))
        nb = self.branches
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, k_rope[None, :, :, None, :].expand(nb, b, n, self.heads, self.rope_dim)], -1)
        # all branches in one SDPA call: branches stacked along the batch
        q_all = q.expand(nb, *q.shape).flatten(0, 1)
        mask, is_causal = sdpa_mask(attention_mask, n, self.causal, x.device)
        if mask is not None:
            mask = mask.repeat(nb, 1, 1, 1)
        o = self._attend(q_all, k.flatten(0, 1), v.flatten(0, 1), mask, is_causal)
        o = o.unflatten(0, (nb, b)).sum(0) * self.branch_scale
        return self.out_proj(o.flatten(-2))

    def _attend(self, q, k, v, mask, is_causal):
        # scale is explicit because the rope dims are included. V is zero-padded to the q/k width:
        # flash kernels want one head dim, and without them a 32K-token call falls back to O(N^2) memory
        dv = v.shape[-1]
        if dv != q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - dv))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, is_causal=is_causal, scale=self.attn_scale)
        return o.transpose(1, 2)[..., :dv]

    # ---- decoding with weight absorption and a latent-only cache ----

    def new_cache(self, batch: int, capacity: int, *, dtype=None, device=None) -> DecodeCache:
        p = self.kv_up
        dtype, device = dtype or p.dtype, device or p.device
        positions = torch.arange(int(capacity), device=device)
        cos_full, sin_signed = rope_tables(positions, self.rope_dim, self.rope_base, dtype=dtype)
        return DecodeCache(batch, capacity, {"latents": (LATENT_HEADS, self.latent_dim),
                                             "rope_keys": (self.rope_dim,)},
                           dtype=dtype, device=device, tables={"rope_cos": cos_full, "rope_sin": sin_signed})

    def decode_step(self, x, cache: DecodeCache):
        """One new token x (B, 1, d) against the cached latents; appends its own latents first.

        A decode step is launch-bound (tiny kernels), so it is written for few kernels: RoPE tables
        sliced from the cache, one RMSNorm for the 4 latent heads, and the 4 latent heads' products
        as one matmul each way through a block-diagonal query (4x the FLOPs of 4 separate products,
        which are negligible; the cache is read once, in place). With ``decode_backend = "triton"``
        (what "auto", the default, picks on CUDA) the attention over the cache is one split-K kernel
        instead (kernels.latent_decode)."""
        t = cache.length
        cos, sin = cache.tables["rope_cos"][t:t + 1, None, :], cache.tables["rope_sin"][t:t + 1, None, :]
        q_nope, q_rope = self._queries(x, cos, sin)                  # (B,1,H,d_h), (B,1,H,d_r)
        c_new, k_rope_new = self._latents(x, cos, sin)
        cache.append(latents=c_new, rope_keys=k_rope_new)
        c, k_rope = cache["latents"], cache["rope_keys"]              # (B,T,4,d_l), (B,T,d_r)
        w_k, w_v = self._up_weights()                                 # (4, d_l, hp, d_h)
        # split the heads among latents as the branches do: (B, 4, hp, d_h)
        q_lat = q_nope[:, 0].unflatten(1, (-1, self.heads_per_latent))
        if self.branches == 4:
            q_lat = q_lat.expand(-1, LATENT_HEADS, -1, -1)           # every latent serves all heads
        else:
            q_lat = q_lat.repeat(1, 2, 1, 1)                          # latents 0,2 -> first half; 1,3 -> second
        q_abs = torch.einsum("blhe,ldhe->blhd", q_lat, w_k)          # absorbed query in latent space
        backend = self.decode_backend
        if backend == "auto":
            backend = "triton" if c.is_cuda else "torch"
        if backend == "torch":
            ctx = self._latent_attention_torch(q_abs, q_rope, c, k_rope)
        elif backend == "triton":
            # each latent's rows with the rope query of the head they serve: (B, 4, hp, d_r)
            q_rope_lat = self._branch_heads_to_latent(q_rope[:, 0][:, None].expand(-1, self.branches, -1, -1))
            ctx = latent_decode(q_abs, q_rope_lat, c, k_rope, self.attn_scale, backend="triton")
        else:
            raise ValueError(f"decode_backend={self.decode_backend!r} is not allowed: use 'auto', 'torch' or "
                             "'triton'")
        o = torch.einsum("blhd,ldhe->blhe", ctx, w_v)                 # value up-projection after the sum
        o = self._latent_to_branch_heads(o).sum(1) * self.branch_scale  # (B, H, d_h)
        return self.out_proj(o.flatten(-2))[:, None]

    def _latent_attention_torch(self, q_abs, q_rope, c, k_rope):
        """Softmax attention of the absorbed queries (B, 4, hp, d_l) over the latent cache, in torch ops:
        (B, 4, hp, d_l)."""
        c_flat = c.flatten(2)                                         # (B,T,4 d_l), a view
        q_block = (q_abs[:, :, :, None, :] * self._latent_eye).flatten(3).flatten(1, 2)     # (B, 4hp, 4d_l)
        scores = (q_block @ c_flat.transpose(1, 2)).unflatten(1, (LATENT_HEADS, -1))        # (B, 4, hp, T)
        scores = self._latent_to_branch_heads(scores)                # (B, nb, H, T)
        scores = scores + (q_rope[:, 0] @ k_rope.transpose(1, 2))[:, None]
        p = torch.softmax(scores * self.attn_scale, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        p = self._branch_heads_to_latent(p.to(c.dtype))               # (B, 4, hp, T)
        ctx = (p.flatten(1, 2) @ c_flat).unflatten(1, (LATENT_HEADS, -1)).unflatten(-1, (LATENT_HEADS, -1))
        return torch.diagonal(ctx, dim1=1, dim2=3).movedim(-1, 1)   # latent l's own block: (B, 4, hp, d_l)

    def _latent_to_branch_heads(self, t):
        """(B, 4, hp, ...) -> (B, nb, H, ...)."""
        return t if self.branches == 4 else t.reshape(t.shape[0], 2, self.heads, *t.shape[3:])

    def _branch_heads_to_latent(self, t):
        """(B, nb, H, ...) -> (B, 4, hp, ...)."""
        return t if self.branches == 4 else t.reshape(t.shape[0], LATENT_HEADS, self.heads_per_latent, *t.shape[3:])

    def kv_cache_bytes_per_token(self, dtype=torch.bfloat16, tensor_parallel: int = 1) -> int:
        """Bytes per token and layer: d_c latent values + d_r rope-key values (4.5 d_h by default).
        Under ``tensor_parallel``-way TP (1, 2 or 4) each device holds d_c / tp of the latent and the
        whole rope key: 1.5 d_h per device for MLRA-4 on 4 devices."""
        if tensor_parallel not in (1, 2, 4):
            raise ValueError(f"tensor_parallel={tensor_parallel} is not allowed: use 1, 2 or 4")
        values = self.kv_latent // tensor_parallel + self.rope_dim
        return values * torch.empty((), dtype=dtype).element_size()
