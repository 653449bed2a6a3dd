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

Short sequences (up to ``short_max_tokens``, no cache) take the same absorbed form for the whole
sequence (``_forward_short``): one softmax attention whose query heads are the (latent l, head) pairs
and whose key and value heads are the 4 latent heads [c_l | rope(k_r)], so about a dozen ops instead
of forty. In exact arithmetic it is the same function (only products are reassociated). On CUDA
tensors without gradients its norms and rotations run as two Triton launches (``kernels.short_prepare``,
``short_backend``), about six kernels per layer in all.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.backends import auto_takes_kernels, kernels_serve
from ..kernels.latent_decode import decode_prepare, latent_decode
from ..kernels.short_prepare import rope_columns, short_prepare
from .cache import DecodeCache
from .derived import DerivedWeights, arange_rope_views
from .masks import sdpa_mask
from .rope import apply_rope_tables, rope_tables

LATENT_HEADS = 4

# Sequences of at most this many tokens take the short path (``MLRAttention.short_max_tokens``). At prompt
# lengths the layer's time is the host's, issuing ops (measured: benchmarks/RESULTS.md, Encoding latency, the
# per-branch path ``mlra2-long``), so there the form with the fewest ops wins. From a few thousand tokens
# on, the attention kernel's time dominates and the per-branch form, the one measured at 4K-32K tokens,
# is kept. 1024 covers the prompt lengths (64, 77, 512) and leaves the measured long lengths as they were.
SHORT_MAX_TOKENS = 1024


class MLRAttention(nn.Module):
    """MLRA-2 (``branches=2``) or MLRA-4 (``branches=4``) self-attention on hidden states (B, N, d).

    Args:
        hidden, heads: model width d and number of heads H.
        head_dim: d_h (default d / H), the no-rope query/key width and the value width.
        kv_latent: d_c (default 4 d_h); q_latent: d_q (default d); rope_dim: d_r (default d_h / 2).
        bias: biases on the query up-projection and the output projection (to take BERT weights).
        short_max_tokens: sequences of at most this many tokens, without a cache, take the short path
            (``_forward_short``); 0 never takes it. Default ``SHORT_MAX_TOKENS`` (its comment says why).
    """

    def __init__(self, hidden: int, heads: int, *, branches: int = 4, head_dim: int | None = None,
                 kv_latent: int | None = None, q_latent: int | None = None, rope_dim: int | None = None,
                 rope_base: float = 10000.0, causal: bool = True, bias: bool = False, eps: float = 1e-6,
                 short_max_tokens: int = SHORT_MAX_TOKENS):
        super().__init__()
        if branches not in (2, 4):
            raise ValueError(f"branches={branches} is not allowed: MLRA has 2 or 4 branches")
        if short_max_tokens < 0:
            raise ValueError(f"short_max_tokens={short_max_tokens} is not allowed: use 0 (never) or more tokens")
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
        # decode_step's path: "torch" (the torch ops of decode_step), "triton" (absorbed weights and
        # the kernels of kernels.latent_decode: six launches per step, see _decode_step_absorbed) or
        # "auto": triton on CUDA tensors, else torch
        self.decode_backend = "auto"
        self._absorbed = None  # (parameter versions, weights) of _absorbed_weights
        self.short_max_tokens = int(short_max_tokens)
        # the short path's elementwise work: "torch" (the ops of _forward_short), "triton" (the kernels of
        # kernels.short_prepare, no autograd) or "auto": triton on CUDA when no gradient is recorded
        self.short_backend = "auto"
        self._short_weights = DerivedWeights(type(self)._build_short_weights)
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
        single new token, attention runs in latent space (``decode_step``). Without a cache, up to
        ``short_max_tokens`` tokens take ``_forward_short``, more ``_forward_long``: the same function."""
        if cache is not None and x.shape[1] == 1:
            return self.decode_step(x, cache)
        if cache is None and x.shape[1] <= self.short_max_tokens:
            return self._forward_short(x, attention_mask, positions)
        return self._forward_long(x, attention_mask, positions, cache)

    def _forward_long(self, x, attention_mask=None, positions=None, cache: DecodeCache | None = None):
        """Keys and values up-projected per branch and head, all branches in one SDPA call (stacked
        along the batch); with ``cache`` the latents are appended first (prefill)."""
        b, n, _ = x.shape
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

    def _forward_short(self, x, attention_mask=None, positions=None):
        """The absorbed form of the whole layer, for short sequences without a cache.

        Score of head h in branch b: q_nope·(W_k c_l) + rope(q_r)·rope(k_r) = (W_k^T q_nope)·c_l + ..., so
        each (latent l, head r) pair it serves is one query head [W_k^T q_nope | rope(q_r)] against the
        key [c_l | rope(k_r)], shared by the pairs of latent l (grouped-query attention, 4 key heads).
        The value is that key too: its first d_l columns are c_l, whose weighted sum the value
        up-projection, the branch sum and the output projection turn into the output in one GEMM (the
        rope columns' sums are dropped). The latent norms' weights and sqrt(4 d / d_c) move into the
        query and output weights, and the query norm's weight and sqrt(d / d_q) into the query
        up-projection (``_build_short_weights``), so both norms run without a weight. Rope is
        x * cos + swap(x) * sin with swap(x) the half-swapped rows, which the projections output too.
        Ops: one GEMM in, two norms, the query GEMM, four for rope, one concatenation, one SDPA, one
        copy, one GEMM out."""
        b, n, _ = x.shape
        w = self._short_weights.get(self)
        if self._short_kernels(x):
            return self._forward_short_kernels(x, w, attention_mask, positions)
        dq, dc, dr, dl = self.q_latent, self.kv_latent, self.rope_dim, self.latent_dim
        hq = LATENT_HEADS * self.heads_per_latent
        # cos = [1 (d_l) | cos_full], sin = [0 (d_l) | sin_signed]: leave c_l's columns as they are
        if positions is None:
            cos_k, sin_k, cos_q, sin_q = arange_rope_views(n, dr, self.rope_base, x.device, x.dtype, lead=dl)
        else:
            cos, sin = rope_tables(positions, dr, self.rope_base, dtype=x.dtype)
            cos_k, sin_k = cos, sin
            cos_q = torch.cat([cos.new_ones(n, dl), cos], -1)[:, None]
            sin_q = torch.cat([sin.new_zeros(n, dl), sin], -1)[:, None]
        c_q, c, k_r, k_r_swapped = F.linear(x, w["in"]).split([dq, dc, dr, dr], dim=-1)
        k_rope = torch.addcmul(k_r * cos_k, k_r_swapped, sin_k)
        c_q = F.rms_norm(c_q, (dq,), eps=self.q_norm.eps)
        c = F.rms_norm(c.unflatten(-1, (LATENT_HEADS, dl)), (dl,), eps=self.kv_norms[0].eps)
        q = F.linear(c_q, w["q"], w["q_bias"]).unflatten(-1, (hq, dl + 2 * dr))   # [q~ | q_r | swap(q_r)]
        # [q~ | rope(q_r)] = [q~ | q_r] * cos + [anything | swap(q_r)] * sin: sin is 0 on q~'s columns,
        # so the slice that starts d_r columns in supplies swap(q_r) where it is needed and nothing else
        q = torch.addcmul(q[..., :dl + dr] * cos_q, q[..., dr:], sin_q)
        k = torch.cat([c, k_rope.unsqueeze(2).expand(b, n, LATENT_HEADS, dr)], dim=-1)  # (B, N, 4, d_l + d_r)
        o = self._short_attention(q, k, attention_mask)
        o = o.transpose(1, 2)[..., :dl].reshape(b, n, hq * dl)
        return F.linear(o, w["out"], self.out_proj.bias)

    def _short_kernels(self, x) -> bool:
        """Whether the short path runs on the kernels of ``kernels.short_prepare`` (``short_backend``)."""
        backend = self.short_backend
        if backend == "auto":
            return bool(self.rope_dim) and auto_takes_kernels(x, self)
        if backend not in ("torch", "triton"):
            raise ValueError(f"short_backend={backend!r} is not allowed: use 'auto', 'torch' or 'triton'")
        if backend == "triton" and not self.rope_dim:
            raise ValueError("short_backend='triton' needs a rope part; this layer has rope_dim=0")
        return backend == "triton"

    def _forward_short_kernels(self, x, w, attention_mask, positions):
        """``_forward_short`` with its elementwise work in two launches, for inference: the norms, the rope
        key's rotation and the keys' concatenation in one (``short_prepare``), the rope query's rotation in
        place in the other (``rope_columns``); the query GEMM leaves out the swapped rope rows the torch
        ops need, and the output GEMM reads the attention output as SDPA wrote it, its rope columns met
        by zero weights, where the torch ops copy the latent columns out first. No autograd: the rotation
        is in place."""
        b, n, _ = x.shape
        dq, dr, dl = self.q_latent, self.rope_dim, self.latent_dim
        hq = LATENT_HEADS * self.heads_per_latent
        if positions is None:
            cos, sin, _, _ = arange_rope_views(n, dr, self.rope_base, x.device, x.dtype, lead=dl)
        else:
            cos, sin = rope_tables(positions, dr, self.rope_base, dtype=x.dtype)
        c_q, k = short_prepare(F.linear(x, w["in_kernels"]), dq, LATENT_HEADS, dl, cos, sin,
                               eps_q=self.q_norm.eps, eps_kv=self.kv_norms[0].eps, backend="triton")
        q = rope_columns(F.linear(c_q, w["q_kernels"], w["q_bias_kernels"]).unflatten(-1, (hq, dl + dr)), dl,
                         cos, sin, backend="triton")
        o = self._short_attention(q, k, attention_mask)
        return F.linear(o.transpose(1, 2).reshape(b, n, hq * (dl + dr)), w["out_kernels"], self.out_proj.bias)

    def _short_attention(self, q, k, attention_mask):
        """The short path's one SDPA: q (B, N, hq, W) against the latent heads k (B, N, 4, W), which are also
        the values; returns (B, hq, N, W)."""
        mask, is_causal = sdpa_mask(attention_mask, q.shape[1], self.causal, q.device)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if mask is None:
            return F.scaled_dot_product_attention(q, k, k, is_causal=is_causal, scale=self.attn_scale, enable_gqa=True)
        # flash takes no mask, and not every kernel that does takes grouped heads: repeat them
        k = k.repeat_interleave(self.heads_per_latent, dim=1)
        return F.scaled_dot_product_attention(q, k, k, attn_mask=mask, scale=self.attn_scale)

    def _build_short_weights(self) -> dict[str, torch.Tensor]:
        """The short path's weights (differentiable in the parameters). With head(l, r) the head that
        row r of latent l serves and w_l = latent l's norm weight * sqrt(4 d / d_c):
          "in":  [W_dq; W_dkv; swap rows of W_kr], one GEMM for c_q, the latents, k_r and swap(k_r);
          "q":   per pair (l, r): rows w_l * (W_k[l, :, r, :] @ W_uq_nope[head]), W_uq_rope[head] and its
                 swapped rows, all times the query norm's weight * sqrt(d / d_q) along d_q; "q_bias" alike;
          "out": columns (l, r, :) = branch_scale * W_o[:, head] @ W_v[l, :, r, :]^T * w_l.
        Products in fp32 (fp64 for fp64 weights), rounded once to the weights' dtype."""
        dtype = self.kv_up.dtype
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        dh, dr, dc = self.head_dim, self.rope_dim, self.kv_latent
        device = self.kv_up.device
        swap = torch.cat([torch.arange(dr // 2, dr, device=device), torch.arange(dr // 2, device=device)])
        heads = self._latent_rows(torch.arange(self.heads, device=device)[None])[0]        # (4, hp)
        w_k, w_v = (t.to(acc) for t in self._up_weights())                                # (4, d_l, hp, d_h)
        latent_w = torch.stack([norm.weight for norm in self.kv_norms]).to(acc) * self.kv_scale  # (4, d_l)
        q_in = self.q_norm.weight.to(acc) * self.q_scale                                  # (d_q,)
        w_uq = self.q_up.weight.to(acc).unflatten(0, (self.heads, dh + dr))[heads] * q_in  # (4, hp, d_h+d_r, d_q)
        absorbed = torch.einsum("ldre,lreq->lrdq", w_k, w_uq[:, :, :dh]) * latent_w[:, None, :, None]
        rope = w_uq[:, :, dh:]
        w_q = torch.cat([absorbed, rope, rope[:, :, swap]], dim=2).flatten(0, 2)
        q_bias = None
        if self.q_up.bias is not None:
            b_uq = self.q_up.bias.to(acc).unflatten(0, (self.heads, dh + dr))[heads]        # (4, hp, d_h + d_r)
            b_abs = torch.einsum("ldre,lre->lrd", w_k, b_uq[:, :, :dh]) * latent_w[:, None, :]
            q_bias = torch.cat([b_abs, b_uq[:, :, dh:], b_uq[:, :, dh:][:, :, swap]], dim=2).flatten().to(dtype)
        w_o = self.out_proj.weight.to(acc).unflatten(1, (self.heads, dh))[:, heads]       # (d, 4, hp, d_h)
        out = torch.einsum("clre,ldre->clrd", w_o, w_v) * (latent_w[None, :, None, :] * self.branch_scale)
        kv = self.kv_down.weight
        # the kernels' forms (_forward_short_kernels): the query without the swapped rope rows, the output
        # with zero columns where the attention output holds its rope columns
        per_pair = w_q.unflatten(0, (-1, w_q.shape[0] // (LATENT_HEADS * w_uq.shape[1])))
        out = out.flatten(1)
        out_padded = torch.cat([out.unflatten(1, (-1, self.latent_dim)),
                                out.new_zeros(out.shape[0], out.shape[1] // self.latent_dim, dr)], -1)
        w_in = torch.cat([self.q_down.weight, kv, kv[dc:][swap]])
        unswapped = self.latent_dim + dr
        q_bias_kernels = None if q_bias is None else q_bias.unflatten(0, (-1, per_pair.shape[1]))[:, :unswapped]
        return {"in": w_in, "q": w_q.to(dtype), "q_bias": q_bias, "out": out.to(dtype),
                "in_kernels": w_in[:w_in.shape[0] - dr],
                "q_kernels": per_pair[:, :unswapped].flatten(0, 1).to(dtype),
                "q_bias_kernels": None if q_bias is None else q_bias_kernels.flatten(),
                "out_kernels": out_padded.flatten(1).to(dtype)}

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

        ``decode_backend`` "torch": the step below in torch ops, written for few kernels (RoPE tables
        sliced from the cache, one RMSNorm for the 4 latent heads, the 4 latent heads' products as one
        matmul each way through a block-diagonal query). "triton" (what "auto" picks on CUDA): the
        absorbed-weight step of ``_decode_step_absorbed``."""
        backend = self.decode_backend
        if backend == "auto":
            backend = "triton" if kernels_serve(x) else "torch"
        if backend == "triton":
            return self._decode_step_absorbed(x, cache)
        if backend != "torch":
            raise ValueError(f"decode_backend={self.decode_backend!r} is not allowed: use 'auto', 'torch' or "
                             "'triton'")
        t = cache.length
        cos, sin = cache.tables["rope_cos"][t:t + 1, None, :], cache.tables["rope_sin"][t:t + 1, None, :]
        q_nope, q_rope = self._queries(x, cos, sin)                  # (B,1,H,d_h), (B,1,H,d_r)
        c_new, k_rope_new = self._latents(x, cos, sin)
        cache.append(latents=c_new, rope_keys=k_rope_new)
        c, k_rope = cache["latents"], cache["rope_keys"]              # (B,T,4,d_l), (B,T,d_r)
        w_k, w_v = self._up_weights()                                 # (4, d_l, hp, d_h)
        q_abs = torch.einsum("blhe,ldhe->blhd", self._latent_rows(q_nope[:, 0]), w_k)  # absorbed query
        ctx = self._latent_attention_torch(q_abs, q_rope, c, k_rope)
        o = torch.einsum("blhd,ldhe->blhe", ctx, w_v)                 # value up-projection after the sum
        o = self._latent_to_branch_heads(o).sum(1) * self.branch_scale  # (B, H, d_h)
        return self.out_proj(o.flatten(-2))[:, None]

    def _latent_rows(self, per_head):
        """(B, H, ...) per-head rows -> (B, 4, hp, ...): latent l's rows are the heads it serves,
        head (l % G) * hp + r with G = 1 (MLRA-4: every latent serves all heads) or 2 (MLRA-2)."""
        t = per_head.unflatten(1, (-1, self.heads_per_latent))
        if self.branches == 4:
            return t.expand(-1, LATENT_HEADS, *t.shape[2:])
        return t.repeat(1, 2, *[1] * (t.dim() - 2))

    def _absorbed_weights(self) -> dict[str, torch.Tensor]:
        """The decode step's weights with the up-projections absorbed, recomputed when a parameter
        changes (in place or replaced). With head(l, r) the head that row r of latent l serves:
          "in":  [W_dq; W_dkv], one GEMM for both down-projections;
          "q":   rows (l, r, :) = W_uk[l, :, r, :] @ W_uq_nope[head(l, r)] (the query already in latent
                 l's space), then W_uq's rope rows; "q_bias" likewise;
          "out": columns (l, r, :) = branch_scale * W_o[:, head(l, r)] @ W_uv[l, :, r, :]^T, so the value
                 up-projection, the branch sum and the output projection are one GEMM;
          "q_norm", "kv_norm": the RMSNorm weights with sqrt(d / d_q), sqrt(4 d / d_c) folded in (fp32).
        Products in fp32 (fp64 for fp64 weights), rounded once to the weights' dtype. No gradient flows
        through them: the absorbed step is for inference."""
        params = [self.q_down.weight, self.kv_down.weight, self.q_norm.weight, self.q_up.weight, self.q_up.bias,
                  self.kv_up, self.out_proj.weight, *(n.weight for n in self.kv_norms)]
        key = tuple(None if p is None else (p.data_ptr(), p._version, p.dtype) for p in params)
        if self._absorbed is not None and self._absorbed[0] == key:
            return self._absorbed[1]
        dtype = self.kv_up.dtype
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        hp, dh, dr = self.heads_per_latent, self.head_dim, self.rope_dim
        with torch.no_grad():
            w_k, w_v = (w.to(acc) for w in self._up_weights())          # (4, d_l, hp, d_h)
            w_uq = self.q_up.weight.to(acc).unflatten(0, (self.heads, dh + dr))  # (H, d_h + d_r, d_q)
            heads = self._latent_rows(torch.arange(self.heads, device=w_uq.device)[None])[0]  # (4, hp)
            q_abs = torch.einsum("ldre,lreq->lrdq", w_k, w_uq[:, :dh][heads]).flatten(0, 2)
            q_rope = w_uq[:, dh:].flatten(0, 1)
            w_o = self.out_proj.weight.to(acc).unflatten(1, (self.heads, dh))  # (d, H, d_h)
            out = torch.einsum("clre,ldre->clrd", w_o[:, heads], w_v).flatten(1) * self.branch_scale
            weights = {"in": torch.cat([self.q_down.weight, self.kv_down.weight]),
                       "q": torch.cat([q_abs, q_rope]).to(dtype), "q_bias": None, "out": out.to(dtype),
                       "q_norm": self.q_norm.weight.to(acc) * self.q_scale,
                       "kv_norm": torch.stack([n.weight for n in self.kv_norms]).to(acc) * self.kv_scale}
            if self.q_up.bias is not None:
                b = self.q_up.bias.to(acc).unflatten(0, (self.heads, dh + dr))
                b_abs = torch.einsum("ldre,lre->lrd", w_k, b[:, :dh][heads]).flatten()
                weights["q_bias"] = torch.cat([b_abs, b[:, dh:].flatten()]).to(dtype)
        self._absorbed = (key, weights)
        return weights

    def _decode_step_absorbed(self, x, cache: DecodeCache):
        """The decode step in six launches: the two down-projections (one GEMM); the query norm, the
        latent norms and the rope key's rotation, written into the cache (``decode_prepare``); the
        absorbed query and the rope query (one GEMM); attention over the latent cache with the rope
        query rotated in the kernel (``latent_decode``, split-K pass and merge); the absorbed value and
        output projections (one GEMM). The torch step launches about forty kernels; a decode step is
        launch-bound, so this is what makes MLRA's smaller cache pay off (benchmarks/RESULTS.md)."""
        w = self._absorbed_weights()
        slots = cache.next_slot()
        t = cache.length
        rotation = (cache.tables["rope_cos"][t], cache.tables["rope_sin"][t])
        B, hp = x.shape[0], self.heads_per_latent
        eps = [n.eps if n.eps is not None else torch.finfo(x.dtype).eps for n in (self.q_norm, self.kv_norms[0])]
        c_q = decode_prepare(F.linear(x[:, 0], w["in"]), w["q_norm"], w["kv_norm"], rotation, slots["latents"],
                             slots["rope_keys"], eps_q=eps[0], eps_kv=eps[1], backend="triton")
        cache.advance()                                                # the new token's slot is written
        q = F.linear(c_q, w["q"], w["q_bias"])
        n_abs = LATENT_HEADS * hp * self.latent_dim
        q_abs = q[:, :n_abs].view(B, LATENT_HEADS, hp, self.latent_dim)
        q_rope = q[:, n_abs:].view(B, self.heads // hp, hp, self.rope_dim)  # group l % G of latent l
        ctx = latent_decode(q_abs, q_rope, cache["latents"], cache["rope_keys"], self.attn_scale, backend="triton",
                            rope_rotation=rotation)
        return F.linear(ctx.flatten(1), w["out"], self.out_proj.bias)[:, None]

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
