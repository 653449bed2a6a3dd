"""HLA self-attention: Gated DeltaNet whose history is read through query-dependent gated chunk maps.

Per head (q, k l2-normalised, beta = sigmoid(W_b x), log alpha = -exp(A_log) softplus(W_a x + dt_bias)):
GDN keeps h_t = alpha_t (I - beta_t k_t k_t^T) h_{t-1} + beta_t k_t v_t^T and reads o_t = h_t^T q_t / sqrt(d).
HLA summarises each chunk of C tokens as an exact affine map h <- A_c h + b_c and lets every query
token soften each past chunk with its own gate g in (0, 1): A^ = g A + (1-g) I, b^ = g b (the current
chunk is read in full). Gates come from pooled bucket representatives of the past chunk's keys
(see ``mediagen.text.kernels.hla.router``). With all gates at 1 this is exactly GDN.

The walk over all earlier chunks is O((N/C)^2) small GEMMs. Beyond the paper, ``top_k`` (keep the k
past chunks with the largest mean gate per query chunk) or ``gate_threshold`` (drop past chunks no
token of the query chunk gates at >= threshold) skip chunks; a skipped chunk is a chunk with gate 0.
Ranking by mean gate still scores every token against every past bucket (O(N^2 / pool) work);
``route="chunk"`` ranks past chunks by the query chunk's mean routed query instead and computes
per-token gates for the k kept chunks only (inference option: no regularisers in that mode).

Inference (no gradient needed, no auxiliary losses asked for) on a GPU uses the fused readout
(``readout="auto"``): one Triton kernel computes each token's gates on chip while it walks the past
chunks, so the (B, H, N, nC) gate tensor never exists; without a padding mask, a second kernel
(``kernels.hla.triton_prepare``) turns one fused projection's output into every input the summaries
and the readout need (normalised q and k, routed queries, beta, decay, bucket representatives).
``readout="torch"`` forces the unfused path; ``readout="triton"`` forces the kernels (also under
TRITON_INTERPRET=1 on a CPU). Token-routed top-k and the gate threshold rank chunks by every gate, so
they always take the unfused path.

The paper's regularisers (budget, effective support, binary) are left in ``self.aux_losses`` after a
forward with ``return_aux=True`` (or in training mode); add ``aux_losses['total']`` to the loss.
The output goes through a per-head RMSNorm and the output projection (no short convolution here).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.hla import (bucket_representatives, chunk_gates, chunk_summaries, fla_available, gate_regularisers,
                           hla_chunked)
from ..kernels.hla.chunk import _unchunked, gated_delta_rule_chunked, hla_chunked_indexed, pad_to_chunks, select_chunks
from ..kernels.hla.readout import hla_fused_forward
from ..kernels.hla.router import chunk_routed_gates, chunk_routing_order

try:  # the fused input pass (importing it registers the custom op mediagen::hla_prepare)
    from ..kernels.hla.triton_prepare import hla_prepare
except ImportError:  # pragma: no cover - platform without triton
    hla_prepare = None

READOUTS = ("auto", "torch", "triton")


class HLAttention(nn.Module):
    """HLA on hidden states (B, N, d); causal by construction (a recurrence)."""

    def __init__(self, hidden: int, heads: int, *, head_dim: int | None = None, chunk: int = 256,
                 pool: int = 16, gate_bias: float = 2.2, top_k: int | None = None,
                 gate_threshold: float | None = None, route: str = "token", backend: str = "auto",
                 readout: str = "auto", bias: bool = True, eps: float = 1e-6):
        super().__init__()
        if backend not in ("auto", "torch", "fla"):
            raise ValueError(f"backend={backend!r} is not allowed: use 'auto', 'torch' or 'fla'")
        if readout not in READOUTS:
            raise ValueError(f"readout={readout!r} is not allowed: use one of {READOUTS}")
        self.readout = readout
        if chunk % pool:
            raise ValueError(f"pool={pool} must divide chunk={chunk}")
        if route not in ("token", "chunk"):
            raise ValueError(f"route={route!r} is not allowed: use 'token' or 'chunk'")
        self.route = route
        head_dim = head_dim or hidden // heads
        self.heads, self.head_dim, self.chunk, self.pool = heads, head_dim, chunk, pool
        self.gate_bias, self.top_k, self.gate_threshold, self.backend = gate_bias, top_k, gate_threshold, backend
        inner = heads * head_dim
        self.q_proj = nn.Linear(hidden, inner, bias=bias)
        self.k_proj = nn.Linear(hidden, inner, bias=bias)
        self.v_proj = nn.Linear(hidden, inner, bias=bias)
        self.beta_proj = nn.Linear(hidden, heads, bias=True)
        self.decay_proj = nn.Linear(hidden, heads, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.A_log = nn.Parameter(torch.empty(heads))
        # router: per-head query projection and in-bucket attention projections, identity at init
        eye = torch.eye(head_dim).expand(heads, head_dim, head_dim)
        self.route_q = nn.Parameter(eye.clone())
        self.pool_k = nn.Parameter(eye.clone())
        self.pool_v = nn.Parameter(eye.clone())
        self.pool_o = nn.Parameter(eye.clone())
        self.out_norm = nn.RMSNorm(head_dim, eps=eps)
        self.out_proj = nn.Linear(inner, hidden, bias=bias)
        self.aux_losses: dict[str, torch.Tensor] = {}
        self.reset_decay()

    @torch.no_grad()
    def reset_decay(self, min_dt: float = 1e-3, max_dt: float = 0.1):
        """Mamba-2 style: per-head step sizes log-uniform in [min_dt, max_dt], A = 1, small weights."""
        dt = torch.exp(torch.rand(self.heads) * (math.log(max_dt) - math.log(min_dt)) + math.log(min_dt))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))        # inverse softplus
        self.A_log.zero_()
        nn.init.normal_(self.decay_proj.weight, std=0.02)

    def _resolve_backend(self, x) -> str:
        if self.backend != "auto":
            return self.backend
        # fla's kernels take bf16/fp16 only; fp32 on a GPU uses the plain-PyTorch path
        half = x.dtype in (torch.bfloat16, torch.float16)
        return "fla" if x.is_cuda and half and fla_available() else "torch"

    def gdn_inputs(self, x, attention_mask=None):
        """q, k (l2-normalised), v (B,N,H,D); log_alpha, beta (B,N,H). Masked tokens become identity
        steps (beta = 0, alpha = 1, k = v = 0) so they never change the state."""
        split = lambda t: t.unflatten(-1, (self.heads, self.head_dim))  # noqa: E731
        q = F.normalize(split(self.q_proj(x)), dim=-1)
        k = F.normalize(split(self.k_proj(x)), dim=-1)
        v = split(self.v_proj(x))
        beta = torch.sigmoid(self.beta_proj(x))
        log_alpha = -self.A_log.exp() * F.softplus(self.decay_proj(x) + self.dt_bias)
        if attention_mask is not None:
            m = attention_mask.to(x.dtype)
            k, v = k * m[..., None, None], v * m[..., None, None]
            beta, log_alpha = beta * m[..., None], log_alpha * m[..., None]
        return q, k, v, log_alpha, beta

    def chunk_for(self, n: int) -> int:
        """The chunk size used for n tokens: ``chunk``, or for a sequence shorter than one chunk the
        smallest multiple of ``pool`` that holds it (one chunk either way, so the same result, but a
        77-token prompt is not padded to 256)."""
        return self.chunk if n > self.chunk else self.pool * math.ceil(n / self.pool)

    def _fused_readout(self, x, need_aux: bool) -> bool:
        """Whether this forward takes the fused Triton readout (see the module docstring)."""
        if self.readout == "torch":
            return False
        blocker = None
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            blocker = "gradients are needed"
        elif need_aux:
            blocker = "auxiliary losses are asked for"
        elif self.gate_threshold is not None or (self.top_k is not None and self.route == "token"):
            blocker = "chunks are ranked by every token's gate (gate_threshold, or top_k with route='token')"
        elif self.head_dim > 128:
            blocker = f"head_dim={self.head_dim} is above the kernel's 128"
        if self.readout == "triton" and blocker:
            raise ValueError(f"readout='triton' is inference-only and cannot serve this call: {blocker}; "
                             "use readout='torch' or 'auto'")
        return blocker is None and (self.readout == "triton" or x.is_cuda)

    def router_inputs(self, q, k, chunk: int):
        """The router's routed queries (B, N, H, D) and bucket representatives (B, H, nC, C/pool, D)
        for q, k already padded to whole chunks."""
        q_route = torch.einsum("bnhd,hde->bnhe", q, self.route_q)
        return q_route, bucket_representatives(k, self.pool_k, self.pool_v, self.pool_o, chunk, self.pool)

    def gates(self, q, k, chunk: int | None = None):
        """Past-chunk gates (B, H, nC, C, nC) for q, k already padded to whole chunks."""
        chunk = chunk or self.chunk
        return chunk_gates(*self.router_inputs(q, k, chunk), chunk, self.gate_bias)

    def fused_projection(self, x):
        """Raw q, k, v (B, N, H, D) and beta/decay pre-activations (B, N, H) from one GEMM over the
        five projections' concatenated weights (strided views of its output)."""
        lins = (self.q_proj, self.k_proj, self.v_proj, self.beta_proj, self.decay_proj)
        weight = torch.cat([lin.weight for lin in lins])
        bias = torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
                          for lin in lins])
        proj = F.linear(x, weight, bias)
        inner, h = self.heads * self.head_dim, self.heads
        q, k, v = (proj[..., i * inner:(i + 1) * inner].unflatten(-1, (h, self.head_dim)) for i in range(3))
        return q, k, v, proj[..., 3 * inner:3 * inner + h], proj[..., 3 * inner + h:]

    def forward(self, x, attention_mask=None, return_aux: bool | None = None, gates_override=None):
        """x (B, N, d) -> (B, N, d). ``gates_override`` (B,H,nC,C,nC) replaces the learned gates
        (tests use it to check that gates of 1 give GDN)."""
        backend = self._resolve_backend(x)
        n = x.shape[1]
        chunk = self.chunk_for(n) if gates_override is None else self.chunk
        need_aux = bool(return_aux or (return_aux is None and self.training))
        fused = gates_override is None and n > chunk and self._fused_readout(x, need_aux)
        if fused and attention_mask is None and self.pool <= 128:  # the fused input pass, then the readout
            qp, kp, v_pad, q_route, bp, lap, reps = hla_prepare(
                *self.fused_projection(x), self.route_q, self.pool_k, self.pool_v, self.pool_o, self.A_log,
                self.dt_bias, chunk, self.pool)
            return self._fused(qp, kp, v_pad[..., :self.head_dim], lap, bp, q_route, reps, chunk, backend, n, v_pad)
        q, k, v, log_alpha, beta = self.gdn_inputs(x, attention_mask)
        qp, kp, vp, lap, bp, _ = pad_to_chunks(q, k, v, log_alpha, beta, chunk)
        if gates_override is None and qp.shape[1] == chunk:
            return self._one_chunk(qp, kp, vp, lap, bp, chunk, backend, n, need_aux)
        if fused:
            q_route, reps = self.router_inputs(qp, kp, chunk)
            return self._fused(qp, kp, vp, lap, bp, q_route, reps, chunk, backend, n)
        if self.route == "chunk" and self.top_k is not None and gates_override is None:
            q_route, reps = self.router_inputs(qp, kp, chunk)
            order, g_sel = chunk_routed_gates(q_route, reps, chunk, self.gate_bias, self.top_k)
            o = hla_chunked_indexed(qp, kp, vp, lap, bp, order, g_sel.to(q.dtype), chunk=chunk,
                                    backend=backend)[:, :n]
            self.aux_losses = {}
            return self.out_proj(self.out_norm(o).flatten(-2))
        gates = self.gates(qp, kp, chunk) if gates_override is None else gates_override
        gates = gates.to(q.dtype)
        keep = None
        if self.top_k is not None or self.gate_threshold is not None:
            keep = select_chunks(gates, top_k=self.top_k, threshold=self.gate_threshold)
        o = hla_chunked(qp, kp, vp, lap, bp, gates, chunk=chunk, backend=backend, keep=keep)[:, :n]
        if need_aux:
            self.aux_losses = gate_regularisers(gates.float())
        o = self.out_norm(o)
        return self.out_proj(o.flatten(-2))

    def _fused(self, q, k, v, log_alpha, beta, q_route, reps, chunk, backend, n, v_pad=None):
        """Inference through the fused readout (inputs padded to whole chunks)."""
        order = chunk_routing_order(q_route, reps, chunk, self.top_k) if self.top_k is not None else None
        norm_eps = self.out_norm.eps if self.out_norm.eps is not None else torch.finfo(q.dtype).eps
        o = hla_fused_forward(q, k, v, log_alpha, beta, q_route, reps, self.gate_bias, chunk=chunk, order=order,
                              summaries=backend, norm_weight=self.out_norm.weight, norm_eps=norm_eps,
                              v_pad=v_pad)[:, :n]
        self.aux_losses = {}
        return self.out_proj(o.flatten(-2))     # out_norm is applied inside the kernel

    def _one_chunk(self, q, k, v, log_alpha, beta, chunk, backend, n, need_aux):
        """A sequence of one chunk (every prompt up to ``chunk`` tokens) has no past chunk: no gates, no
        walk, and HLA is exactly Gated DeltaNet from the zero state, i.e. the chunk's own output. The
        router is skipped; its regularisers are 0 (no query token has a past chunk)."""
        o_intra = chunk_summaries(q, k, v, log_alpha, beta, self.head_dim ** -0.5, chunk, backend)[0]
        o = _unchunked(o_intra)[:, :n].to(q.dtype)
        if need_aux:
            zero = o.new_zeros((), dtype=torch.float32)
            self.aux_losses = {"budget": zero, "support": zero, "binary": zero, "total": zero}
        else:
            self.aux_losses = {}
        return self.out_proj(self.out_norm(o).flatten(-2))

    def forward_gdn(self, x, attention_mask=None):
        """The same layer as plain Gated DeltaNet (no gates), through the chunked GDN path."""
        q, k, v, log_alpha, beta = self.gdn_inputs(x, attention_mask)
        o = gated_delta_rule_chunked(q, k, v, log_alpha, beta, chunk=min(self.chunk, 64),
                                     backend=self._resolve_backend(x))
        return self.out_proj(self.out_norm(o).flatten(-2))
