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

Sequences of at most ``short_max_tokens`` tokens (default two chunks) take a short path
(``_forward_short``) that computes the same function in about twenty ops: GDN from the zero state
written as one (N x N) lower-triangular system, and for a second chunk the gate as a per-token blend of
the output with and without the first chunk's state. On CUDA tensors without gradients a sequence of one
chunk runs everything between the two projections as two Triton launches (``kernels.hla.short``,
``short_backend``), blocks of 32 tokens in place of the (N x N) solve. ``backend`` and ``readout`` choose the kernels of the long path only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.backends import TRITON_DTYPES, auto_takes_kernels, kernels_serve, records_gradients
from ..kernels.hla import (bucket_representatives, chunk_gates, chunk_summaries, fla_available, gate_regularisers,
                           hla_chunked)
from ..kernels.hla.chunk import _unchunked, gated_delta_rule_chunked, hla_chunked_indexed, pad_to_chunks, select_chunks
from ..kernels.hla.readout import hla_fused_forward
from ..kernels.hla.router import chunk_routed_gates, chunk_routing_order
from ..kernels.hla.short import hla_short, triton_serves
from .derived import DerivedWeights, strictly_upper

try:  # the fused input pass (importing it registers the custom op mediagen::hla_prepare)
    from ..kernels.hla.triton_prepare import hla_prepare
except ImportError:  # pragma: no cover - platform without triton
    hla_prepare = None

READOUTS = ("auto", "torch", "triton")

# The short path reads at most one past chunk: the second chunk's tokens blend the GDN output with and
# without the first chunk's state by their gate, and a third chunk would need the walk's compositions.
SHORT_MAX_CHUNKS = 2


class HLAttention(nn.Module):
    """HLA on hidden states (B, N, d); causal by construction (a recurrence).

    ``short_max_tokens``: sequences of at most this many tokens take the short path (``_forward_short``);
    0 never takes it; at most ``SHORT_MAX_CHUNKS * chunk`` (the default, 512 tokens). At prompt lengths
    the layer's time is the host's, issuing ops (the chunked path's encoder several times softmax attention's
    there: benchmarks/RESULTS.md, Encoding latency, ``hla-long``), and the short path issues a
    fraction of them; its (N x N) matrices cost O(N^2) memory, small up to two chunks, while longer
    sequences keep the chunked path, linear in memory and the one measured at 32K tokens."""

    def __init__(self, hidden: int, heads: int, *, head_dim: int | None = None, chunk: int = 256,
                 pool: int = 16, gate_bias: float = 2.2, top_k: int | None = None,
                 gate_threshold: float | None = None, route: str = "token", backend: str = "auto",
                 readout: str = "auto", bias: bool = True, eps: float = 1e-6,
                 short_max_tokens: int | None = None):
        super().__init__()
        longest = SHORT_MAX_CHUNKS * chunk
        short_max_tokens = longest if short_max_tokens is None else int(short_max_tokens)
        if not 0 <= short_max_tokens <= longest:
            raise ValueError(f"short_max_tokens={short_max_tokens} is not allowed: use 0 ... {longest} "
                             f"({SHORT_MAX_CHUNKS} chunks of {chunk}: the short path reads one past chunk at most)")
        self.short_max_tokens = short_max_tokens
        # the short path between the projections: "torch" (its torch ops), "triton" (two launches of
        # kernels.hla.short, no autograd) or "auto": triton on CUDA when no gradient is recorded
        self.short_backend = "auto"
        self._short_weights = DerivedWeights(type(self)._build_short_weights)
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
        if records_gradients(x, self):
            blocker = "gradients are needed"
        elif need_aux:
            blocker = "auxiliary losses are asked for"
        elif self.gate_threshold is not None or (self.top_k is not None and self.route == "token"):
            blocker = "chunks are ranked by every token's gate (gate_threshold, or top_k with route='token')"
        elif self.head_dim > 128:
            blocker = f"head_dim={self.head_dim} is above the kernel's 128"
        elif x.dtype not in TRITON_DTYPES:
            blocker = f"the kernel takes {', '.join(map(str, TRITON_DTYPES))}, not {x.dtype}"
        if self.readout == "triton" and blocker:
            raise ValueError(f"readout='triton' is inference-only and cannot serve this call: {blocker}; "
                             "use readout='torch' or 'auto'")
        return blocker is None and (self.readout == "triton" or kernels_serve(x))

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
        (tests use it to check that gates of 1 give GDN). Short sequences take ``_forward_short``
        (``takes_short_path`` says when), the others ``_forward_long``: the same function."""
        need_aux = bool(return_aux or (return_aux is None and self.training))
        if gates_override is None and self.takes_short_path(x.shape[1], need_aux):
            return self._forward_short(x, attention_mask, need_aux)
        return self._forward_long(x, attention_mask, need_aux, gates_override)

    def takes_short_path(self, n: int, need_aux: bool = False) -> bool:
        """Whether ``forward`` runs n tokens through ``_forward_short``: n up to ``short_max_tokens``,
        except where the long path does what the short one does not: a gate threshold (it may drop the
        past chunk), token-routed top_k below 1 (drops it), and the regularisers of two chunks."""
        if n > min(self.short_max_tokens, SHORT_MAX_CHUNKS * self.chunk):
            return False
        if n > self.chunk and (need_aux or self.gate_threshold is not None
                               or (self.top_k is not None and self.top_k < 1 and self.route == "token")):
            return False
        return True

    def _forward_long(self, x, attention_mask=None, need_aux: bool = False, gates_override=None):
        """The chunked path: chunk summaries, then gates and the walk over past chunks (or the fused
        readout on a GPU for inference)."""
        backend = self._resolve_backend(x)
        n = x.shape[1]
        chunk = self.chunk_for(n) if gates_override is None else self.chunk
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

    def _forward_short(self, x, attention_mask=None, need_aux: bool = False):
        """HLA of up to two chunks (n <= 2 C) in closed form, in a few batched ops.

        GDN from the zero state over tokens 0..n-1 is o = scale * P (I + L)^-1 diag(beta) V with
        decay(t, s) = exp(G_t - G_s), G the cumulative log alpha, P_ts = q_t.k_s decay(t, s) for s <= t and
        L_ts = beta_t k_t.k_s decay(t, s) for s < t (the chunk summaries' system, for the whole sequence).
        One chunk (n <= C) is exactly that. With two, a token t of the second chunk reads the first
        chunk's end state b_0 through its gate g_t: o_t = o^in_t + g_t r_t^T b_0, where o^in is GDN of
        the second chunk alone from the zero state; and GDN over everything is o^in_t + r_t^T b_0, so
        o_t = lerp(o^in_t, o^full_t, g_t). o^in comes from the trailing (n - C) block of the same P and
        L, whose decays are the second chunk's own. The gates are the router's, for the first
        chunk's buckets only (``_short_gates``).

        Padding (attention_mask 0) makes a token an identity step: beta = 0 (its row of L and of
        diag(beta) V are 0, so its u is 0 and its key and value reach nobody) and log alpha = 0; its
        key is also zeroed where the router reads it. scale = d^-1/2 is not applied to o: the output
        RMSNorm takes eps / scale^2 instead, which gives the same result. Half-precision layers
        compute between the projections in fp32 (the triangular solve needs it). What lies between the
        projections is ``kernels.hla.short.hla_short``: the (N x N) solve in torch ops (differentiable), or
        on CUDA without gradients two Triton launches (``short_backend``, ``_short_kernels``)."""
        b, n, _ = x.shape
        h, d, c = self.heads, self.head_dim, self.chunk
        if n > SHORT_MAX_CHUNKS * c:
            raise ValueError(f"n={n} tokens is not allowed on the short path: at most {SHORT_MAX_CHUNKS} chunks of {c}")
        inner = h * d
        w = self._short_weights.get(self)
        compute = w["route"].dtype                                     # fp32 for half-precision layers
        proj = F.linear(x, w["proj"], w["bias"])                     # [q | k | v | beta | decay] pre-activations
        gate = None
        if n > c:   # the second chunk's queries against the first chunk's keys
            q2 = F.normalize(proj[:, c:, :inner].to(compute).unflatten(-1, (h, d)), dim=-1).transpose(1, 2)
            k1 = F.normalize(proj[:, :c, inner:2 * inner].to(compute).unflatten(-1, (h, d)), dim=-1).transpose(1, 2)
            gate = self._short_gates(q2, k1, attention_mask, w)[..., 0]                           # (B, H, n - C)
        if need_aux:                              # one chunk: no token has a past chunk (two: the long path)
            zero = proj.new_zeros((), dtype=torch.float32)
            self.aux_losses = {"budget": zero, "support": zero, "binary": zero, "total": zero}
        else:
            self.aux_losses = {}
        eps = self.out_norm.eps if self.out_norm.eps is not None else torch.finfo(x.dtype).eps
        kernels = self._short_kernels(x, n)
        o = hla_short(proj, h, d, w["neg_a"], self.out_norm.weight, eps * d, chunk=c, mask=attention_mask, gate=gate,
                      out_dtype=x.dtype, backend="triton" if kernels else "reference",
                      above=None if kernels else strictly_upper(n, x.device))       # eps / scale^2, see above
        return self.out_proj(o.flatten(-2))

    def _short_kernels(self, x, n: int) -> bool:
        """Whether the short path runs on the Triton kernels of ``kernels.hla.short`` (``short_backend``) for n
        tokens. "auto" takes them for one chunk, and for two in bf16 only: the walk with its second (restarted)
        state is faster than the torch ops' solve when its products take tf32 (a bf16 layer), and slower
        with exact fp32 products (fp32 and fp16 layers) (measured: benchmarks/RESULTS.md, Encoding latency)."""
        backend = self.short_backend
        if backend == "auto":
            fast = n <= self.chunk or x.dtype == torch.bfloat16
            return fast and triton_serves(self.head_dim, self.chunk) and auto_takes_kernels(x, self)
        if backend not in ("torch", "triton"):
            raise ValueError(f"short_backend={backend!r} is not allowed: use 'auto', 'torch' or 'triton'")
        return backend == "triton"

    def _short_gates(self, q, k, attention_mask, w):
        """Gates (B, H, n - C, 1) of the second chunk's queries q (B, H, n - C, D) for the first chunk,
        whose keys are k (B, H, C, D): ``chunk_gates`` of ``router_inputs`` with the routed query and the
        representatives' output map folded into one (D x D) map per head, w["route"] = route_q pool_o^T
        / sqrt(D), so the score of bucket p is (q w["route"]) . pooled_p, pooled_p being the mean of the
        bucket's in-bucket attention (``bucket_representatives`` before pool_o)."""
        if attention_mask is not None:
            k = k * attention_mask[:, None, :k.shape[2], None].to(k.dtype)
        pkv = (k @ w["pool_kv"]).unflatten(2, (-1, self.pool)).flatten(1, 2)   # (B, H nb, pool, 2D): [pk | pv]
        pk, pv = pkv.split(self.head_dim, dim=-1)
        pooled = F.scaled_dot_product_attention(pk, pk, pv).mean(-2).unflatten(1, (self.heads, -1))  # (B, H, nb, D)
        score = torch.logsumexp((q @ w["route"]) @ pooled.transpose(-1, -2), dim=-1, keepdim=True)
        return torch.sigmoid(score + (self.gate_bias - math.log(pooled.shape[2])))  # log-mean-exp + bias

    def _build_short_weights(self) -> dict[str, torch.Tensor]:
        """The short path's weights (differentiable in the parameters): "proj", "bias" the five
        projections as one, with dt_bias as the decay rows' bias; and in the dtype the path computes in
        (fp32 for half-precision layers) "neg_a" = -exp(A_log), "route" = route_q pool_o^T / sqrt(D)
        (H, D, D) and "pool_kv" = [pool_k | pool_v] (H, D, 2D)."""
        lins = (self.q_proj, self.k_proj, self.v_proj, self.beta_proj)
        biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in lins]
        dtype = self.q_proj.weight.dtype
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        route_q, pool_o = self.route_q.to(compute), self.pool_o.to(compute)
        return {"proj": torch.cat([lin.weight for lin in lins] + [self.decay_proj.weight]),
                "bias": torch.cat(biases + [self.dt_bias.to(dtype)]),
                "neg_a": -self.A_log.to(compute).exp(),
                "route": route_q @ pool_o.transpose(-1, -2) / math.sqrt(self.head_dim),
                "pool_kv": torch.cat([self.pool_k, self.pool_v], dim=-1).to(compute)}

    def forward_gdn(self, x, attention_mask=None):
        """The same layer as plain Gated DeltaNet (no gates), through the chunked GDN path."""
        q, k, v, log_alpha, beta = self.gdn_inputs(x, attention_mask)
        o = gated_delta_rule_chunked(q, k, v, log_alpha, beta, chunk=min(self.chunk, 64),
                                     backend=self._resolve_backend(x))
        return self.out_proj(self.out_norm(o).flatten(-2))
