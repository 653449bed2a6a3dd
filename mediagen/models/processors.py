"""Diffusers attention processors that run a self-attention layer on a registered attention's core (MHLA,
global linear attention, ...).

A processor here is an ``nn.Module``, so diffusers registers it as a submodule of its attention
layer and its parameters (the core's, e.g. Mc, and the optional norm, gate and CPE weights) are saved
with the model. The core comes from the attention's registry entry (``attention_registry``), built
with that attention's options; the norms, gate, CPE and RoPE around it are the layer options, the same
for every attention. The projections, q/k norms and output projection stay those of the pretrained layer. The
latent grid comes from the transformer's pre-hook (``latent_grid.LatentGrids``), looked up by the
sequence length.

Per layer, with x the layer's input and q, k, v (B, N, H, D) from the layer's own projections:

    x = LayerNorm(x)                           if in_norm              (then the projections and gate read it)
    o = core(q, k, v, grid, rope)                                     (MHLA: attention.mhla, the op with options)
    o = RMSNorm(o)                             if out_norm=True        (over all heads together)
    o_h = RMSNorm(o_h) for each head h         if out_norm="per_head"  (one weight of head-dim size)
    o = o * SiLU(W_g x + b_g)                  if out_gate
    o = o + DWConv(v over the grid)            if cpe_kernel
    out = to_out(o)

With gradients on and nothing between the norm and to_out (no gate, no CPE), the norm and to_out[0] run as one
autograd function that recomputes the norm's output in backward instead of saving it (``models.norm_linear``;
``GridSelfAttnProcessor.fuse_out_norm_linear``).

The official Wan MHLA layer is out_norm="per_head" (+ out_gate when gated); the official DiT MHLA layer is
in_norm=True with cpe_kernel=3 (``models.official`` loads their checkpoints).

With rope="features" (Wan only) the numerator uses rotated features and the denominator does not,
as the official Wan MHLA code does (the core gets Wan's angle tables as its ``rope``, fused into the
MHLA kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.mhla.op import resolve_backend
from . import attention_registry as registry
from .attention_spec import AttentionSpec
from .norm_linear import FLOAT_DTYPES, rms_norm_linear
from .norms import CastRMSNorm

try:  # triton ships with CUDA builds of torch on Linux; elsewhere the CPE is the conv
    from ..kernels.cpe import cpe_add
except ImportError:  # pragma: no cover - platform without triton
    cpe_add = None

_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def fused_cpe_device(t: torch.Tensor) -> bool:
    """Whether the CPE runs as one Triton launch on ``t``'s device (a GPU; CPUs keep oneDNN's conv)."""
    return cpe_add is not None and t.is_cuda


def wan_rope_tables(rotary_emb) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' Wan rotary tables (freqs_cos, freqs_sin), each (1, N, 1, D) with every angle
    repeated for its channel pair (2j, 2j+1), as the (N, D/2) tables ``mediagen.kernels.mhla`` takes.

    Copied to contiguous fp32 (two small copies per layer): the kernels read the tables once per
    head and block, and a unit stride lets those loads vectorise, where the strided views of the
    interleaved tables (stride 2, often bf16 or fp64) load element by element. The op benchmark
    measured RoPE at +0.13 ms on Wan 480p with such tables; the model-level gain of the copy itself
    is not measured yet (benchmarks/RESULTS.md)."""
    cos, sin = rotary_emb
    if cos.dim() != 4 or cos.shape[0] != 1 or cos.shape[2] != 1:
        raise ValueError(f"expected Wan rotary tables of shape (1, N, 1, D); got {tuple(cos.shape)}")
    global _last_rope_tables
    cached = not torch.compiler.is_compiling()  # (traced once; under torch.compile the cache would only add guards)
    hit = _last_rope_tables if cached else None
    if hit is not None and hit[0] is cos and hit[1] is sin and hit[2] == (cos._version, sin._version):
        return hit[3]  # the previous layer's tables: every layer of a forward gets the same tensors
    tables = cos[0, :, 0, 0::2].float().contiguous(), sin[0, :, 0, 1::2].float().contiguous()
    if cached:
        _last_rope_tables = (cos, sin, (cos._version, sin._version), tables)
    return tables


# (the last rotary tables wan_rope_tables converted, by identity and version, and the result): the transformer
# computes its tables once per forward and hands the same tensors to every layer, so one entry serves them all
# (7 of 8 layers' conversions, 14 ops each, in the video models)
_last_rope_tables = None


class GridSelfAttnProcessor(nn.Module):
    """Self-attention processor around a registered attention's core; subclasses say how q, k, v are projected."""

    # Training (gradients on) with an output norm directly before the output projection: the norm and
    # ``attn.to_out[0]`` run as one autograd function (``models.norm_linear``) that saves the norm's input and
    # per-row rstd and recomputes the normalised output in backward, where the two modules apart also keep
    # that output (saved by the linear for its weight gradient): one activation of the layer's (B, N, C) size
    # less per layer, same values and gradients. False on an instance runs the modules apart (an A/B switch).
    fuse_out_norm_linear = True

    def __init__(self, kind: str, spec: AttentionSpec, *, heads: int, head_dim: int, query_dim: int,
                 ndim: int, grids):
        super().__init__()
        entry = registry.get(kind)
        if entry.stock:
            raise ValueError(f"kind={kind!r} is not allowed: {kind!r} layers keep the family's own processor; use "
                             f"one of {registry.converted_names()}")
        self.kind = kind
        self.ndim = ndim
        inner = heads * head_dim
        self.core = entry.build_core(spec.options(), heads=heads, ndim=ndim)
        self.fused_cpe = entry.fused_cpe  # the core's forward takes cpe=(weight, bias) (see _cpe_in_core)
        self.rope_features = spec.rope == "features"
        # out_norm=True: one norm over all heads' channels; "per_head": each head over its own head_dim channels
        # with one weight shared by the heads (the official Wan layer's WanRMSNorm(head_dim)); eps 1e-6 either way
        self.out_norm_per_head = spec.out_norm == "per_head"
        self.out_norm = nn.RMSNorm(head_dim if self.out_norm_per_head else inner, eps=1e-6) if spec.out_norm else None
        self.in_norm = nn.LayerNorm(query_dim) if spec.in_norm else None
        self.out_gate = nn.Linear(query_dim, inner) if spec.out_gate else None
        self.cpe = None
        if spec.cpe_kernel:
            k = spec.cpe_kernel if isinstance(spec.cpe_kernel, list) else [spec.cpe_kernel] * ndim
            if len(k) != ndim:
                raise ValueError(f"cpe_kernel={spec.cpe_kernel} has {len(k)} sizes but this model's latent grid "
                                 f"has {ndim} axes")
            self.cpe = _CONVS[ndim](inner, inner, tuple(k), padding=tuple(a // 2 for a in k), groups=inner)
            nn.init.zeros_(self.cpe.weight)
            nn.init.zeros_(self.cpe.bias)
        self.grids = grids  # shared LatentGrids (plain object, not a submodule)
        self.sequence_parallel = None  # set by models.sequence_parallel.enable_sequence_parallel

    # --- family-specific parts -------------------------------------------------------------
    def project_qkv(self, attn, x):  # -> q, k, v (B, N, H, D)
        raise NotImplementedError

    def finish_out(self, attn, h, residual):  # what follows attn.to_out[0] (h = to_out[0](o))
        raise NotImplementedError

    def project_out(self, attn, o, residual):
        return self.finish_out(attn, attn.to_out[0](o), residual)

    # --- shared -----------------------------------------------------------------------------
    def _cpe(self, v, grid):
        """Depthwise conv of the (B, N, C) tokens over the grid, returned as (B, N, C)."""
        B, N, C = v.shape
        k = tuple(self.cpe.kernel_size)
        axes = [i for i, a in enumerate(k) if a > 1]
        if len(axes) <= 1:
            # A kernel along one axis (e.g. time, [3, 1, 1]) is a sum of k shifted copies of the
            # tokens in their own (B, *grid, C) layout, no transpose: cuDNN's depthwise 3D conv is
            # slower even on a channels-first copy (benchmarks/RESULTS.md, Alternatives).
            x = v.reshape(B, *grid, C)
            w = self.cpe.weight.reshape(C, -1)  # (C, taps)
            axis = axes[0] if axes else 0
            r, length = k[axis] // 2, grid[axis]
            if torch.compiler.is_compiling():
                # Traced: a zero-padded copy and the taps' products summed, which inductor fuses into
                # one pass (the in-place form below makes a compiled training step slower).
                pad = [0, 0] * (len(grid) + 1)
                pad[2 * (len(grid) - axis)] = pad[2 * (len(grid) - axis) + 1] = r  # F.pad lists dims last first
                xp = F.pad(x, pad)
                out = self.cpe.bias + sum(xp.narrow(1 + axis, j, length) * w[:, j] for j in range(k[axis]))
                return out.reshape(B, N, C)
            # Eager: the centre tap plus the bias in one addcmul, then each other tap added in place
            # over the rows it reaches (zero padding without a padded copy): one kernel per tap, where
            # the padded form takes seven for three taps, and launches are what a small model's
            # eager step costs (benchmarks/RESULTS.md, Alternatives).
            out = torch.addcmul(self.cpe.bias, x, w[:, r])
            for j in range(k[axis]):
                s = j - r  # out[t] += w[:, j] * x[t + s] wherever 0 <= t + s < length
                if s == 0 or abs(s) >= length:
                    continue
                n = length - abs(s)
                out.narrow(1 + axis, max(-s, 0), n).addcmul_(x.narrow(1 + axis, max(s, 0), n), w[:, j])
            return out.reshape(B, N, C)
        x = v.reshape(B, *grid, C).movedim(-1, 1)  # (B, C, *grid) viewed with channels-last strides
        if v.device.type == "cpu":
            # The CPU's (oneDNN) depthwise conv takes the channels-last view as it is: no copy either way, and
            # faster than on a contiguous copy (benchmarks/RESULTS.md, Alternatives).
            return self.cpe(x).movedim(1, -1).reshape(B, N, C)
        # Elsewhere channels-first and contiguous: cuDNN's depthwise conv is several times slower on the
        # channels-last view (benchmarks/RESULTS.md, Alternatives).
        return self.cpe(x.contiguous()).flatten(2).transpose(1, 2)

    def forward(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                rotary_emb=None, *args, **kwargs):
        if encoder_hidden_states is not None:
            raise ValueError(f"{type(self).__name__} serves self-attention only; got encoder_hidden_states")
        if attention_mask is not None:
            raise ValueError(f"{type(self).__name__} ({self.kind}) does not take an attention_mask")
        if hidden_states.dim() != 3:
            raise ValueError(f"hidden_states must be (B, N, C); got shape {tuple(hidden_states.shape)}")
        residual = hidden_states
        if self.in_norm is not None:
            hidden_states = self.in_norm(hidden_states)
        q, k, v = self.project_qkv(attn, hidden_states)
        rope = wan_rope_tables(rotary_emb) if self.rope_features and rotary_emb is not None else None
        if self.sequence_parallel is not None:  # q, k, v and the tables hold this rank's slab of whole blocks
            if self.core.feature_eps or self.core.denominator != "paper":
                raise ValueError(f"feature_eps={self.core.feature_eps!r} / denominator={self.core.denominator!r} "
                                 f"are not supported sequence-parallel (its op takes the plain feature map and the "
                                 f"paper's denominator): use feature_eps=0 and denominator='paper'")
            grid = self.sequence_parallel.grid
            o = self.sequence_parallel.attend(self.core, q, k, v, rope=rope)
        else:
            grid = tuple(self.grids.lookup(q.shape[1]))
            if self._cpe_in_core(q, k, v):
                o = self.core(q, k, v, grid, rope=rope, cpe=(self.cpe.weight, self.cpe.bias)).flatten(2)
                return self.project_out(attn, o.type_as(q), residual)
            o = self.core(q, k, v, grid, rope=rope)
        if self._out_norm_linear_fusable(attn, o):  # to_out[0](out_norm(o), flattened, type_as(q)), as below
            x = o if self.out_norm_per_head else o.flatten(2)
            h = rms_norm_linear(x, self._out_norm_weight(x), self.out_norm.eps, attn.to_out[0].weight,
                                attn.to_out[0].bias, flatten_heads=self.out_norm_per_head, linear_input_dtype=q.dtype)
            return self.finish_out(attn, h, residual)
        if self.out_norm is not None and self.out_norm_per_head:
            o = self.out_norm(o)
        o = o.flatten(2)
        if self.out_norm is not None and not self.out_norm_per_head:
            o = self.out_norm(o)
        if self.out_gate is not None:
            o = o * F.silu(self.out_gate(hidden_states))
        if self.cpe is not None:
            o = self._add_cpe(o, v.flatten(2), grid)
        return self.project_out(attn, o.type_as(q), residual)

    def _out_norm_linear_fusable(self, attn, o) -> bool:
        """Whether ``out_norm`` then ``to_out[0]`` may run as ``norm_linear.rms_norm_linear``: only where that is
        the same computation. Gradients are taken (sampling keeps the modules: nothing is saved there); nothing
        sits between the two (no gate, no CPE); the norm is torch's RMSNorm (or the training components'
        ``CastRMSNorm``) with a weight; ``to_out[0]`` is exactly ``nn.Linear`` (a LoRA / PEFT wrapper, a
        parametrised or quantised layer computes something else) and neither module has hooks (they would not
        run); ``project_out`` is this class's (to_out[0] then ``finish_out``); fp16 / bf16 / fp32 tensors."""
        norm, linear = self.out_norm, attn.to_out[0]
        if not self.fuse_out_norm_linear or norm is None or self.out_gate is not None or self.cpe is not None:
            return False
        if type(norm) not in (nn.RMSNorm, CastRMSNorm) or norm.weight is None or type(linear) is not nn.Linear:
            return False
        if type(self).project_out is not GridSelfAttnProcessor.project_out or _has_hooks(norm) or _has_hooks(linear):
            return False
        if any(t.dtype not in FLOAT_DTYPES for t in (o, norm.weight, linear.weight)):
            return False
        return torch.is_grad_enabled() and (o.requires_grad or norm.weight.requires_grad or linear.weight.requires_grad
                                            or (linear.bias is not None and linear.bias.requires_grad))

    def _out_norm_weight(self, x):
        """The weight ``self.out_norm(x)`` multiplies by: ``CastRMSNorm`` casts it to x's dtype (models.norms)."""
        weight = self.out_norm.weight
        if type(self.out_norm) is CastRMSNorm and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return weight

    def _cpe_in_core(self, q, k, v) -> bool:
        """Whether the core adds the CPE itself (MHLA's op: its dense forward then adds it before storing o: one
        launch and one write of o fewer): eager sampling on the Triton path, a core whose entry says
        ``fused_cpe`` (linear attention's grid is its token row, not the CPE's), no norm or gate between the
        attention and the CPE."""
        if self.cpe is None or not self.fused_cpe or self.out_norm is not None or self.out_gate is not None \
                or not self.core.takes_cpe:
            return False
        if torch.compiler.is_compiling() or not fused_cpe_device(v) or resolve_backend(None, v.device) != "triton":
            return False
        return not torch.is_grad_enabled() or not any(
            t.requires_grad for t in (q, k, v, self.core.mix, self.cpe.weight, self.cpe.bias))

    def _add_cpe(self, o, v, grid):
        """o + CPE(v). Sampling on a GPU (nothing to differentiate): one Triton launch that reads the tokens in
        their own layout and adds to o (``kernels.cpe``), where the conv path takes a layout copy, the conv, a
        transpose and the add; traced, as a Triton op that Inductor's code launches itself."""
        cpe = self.cpe
        differentiated = torch.is_grad_enabled() and (o.requires_grad or v.requires_grad or cpe.weight.requires_grad
                                                      or cpe.bias.requires_grad)
        if differentiated or not fused_cpe_device(v):
            return o + self._cpe(v, grid)
        if torch.compiler.is_compiling():
            return torch.ops.mediagen.cpe_add(o, v, cpe.weight, cpe.bias, list(grid))
        return cpe_add(o, v, cpe.weight, cpe.bias, grid)

    def extra_repr(self) -> str:
        per_head = ", out_norm='per_head'" if self.out_norm_per_head else ""
        return f"kind={self.kind!r}, rope_features={self.rope_features}{per_head}"


def _has_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` runs hooks besides its forward (its own or the global module hooks)."""
    m = torch.nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)


class WanMHLAProcessor(GridSelfAttnProcessor):
    """For ``WanAttention`` self-attention (``attn1``): q/k RMSNorm across all heads, RoPE per Wan."""

    def project_qkv(self, attn, x):
        if getattr(attn, "fused_projections", False):
            q, k, v = attn.to_qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(x), attn.to_k(x), attn.to_v(x)
        q, k = attn.norm_q(q), attn.norm_k(k)
        return tuple(t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))

    def finish_out(self, attn, h, residual):
        return attn.to_out[1](h)


class SanaMHLAProcessor(GridSelfAttnProcessor):
    """For SANA's self-attention (``attn1``, diffusers' ``Attention`` that SANA runs with ReLU linear
    attention): optional q/k norms across all heads (``qk_norm``), then heads; no residual."""

    def project_qkv(self, attn, x):
        q, k, v = attn.to_q(x), attn.to_k(x), attn.to_v(x)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        return tuple(t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))

    def finish_out(self, attn, h, residual):
        return attn.to_out[1](h)


class DiTMHLAProcessor(GridSelfAttnProcessor):
    """For diffusers' ``Attention`` (DiT's ``attn1``): optional per-head q/k norms."""

    def project_qkv(self, attn, x):
        if attn.spatial_norm is not None or attn.group_norm is not None:
            raise ValueError("DiTMHLAProcessor does not support spatial_norm or group_norm attention layers")
        B, N, _ = x.shape
        q, k, v = attn.to_q(x), attn.to_k(x), attn.to_v(x)
        q, k, v = (t.view(B, N, attn.heads, -1) for t in (q, k, v))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        return q, k, v

    def finish_out(self, attn, h, residual):
        o = attn.to_out[1](h)
        if attn.residual_connection:
            o = o + residual
        # (a division by 1 is still a launch, and eager sampling of a small DiT is bound by the host's launches)
        return o if attn.rescale_output_factor == 1 else o / attn.rescale_output_factor
