"""Which attention each self-attention layer of a converted transformer uses, and with what options.

An ``AttentionSpec`` is what ``mediagen.convert`` stores in the model's config (key
``mediagen_attention``), so ``from_pretrained`` can rebuild the same processors before loading weights.
It holds one entry per layer plus the MHLA options shared by all MHLA / linear layers.

Layer entries: ``None`` (not converted: the layer keeps the processor the model has, e.g. SANA's own
ReLU linear attention), ``sdpa`` (the family's stock softmax processor), ``linear`` (global linear
attention, MHLA with one block), ``mhla``. Hybrids: a list of names, one per layer; ``layers=[...]``
(indices that get the chosen attention, the others are left as they are); or ``wan-mhla-h``, the
paper's Wan pattern: softmax in every third layer (0, 3, 6, ...), MHLA in the others.

This module is the one place that names the attentions and the options and checks their values; it
imports nothing heavy, so command lines and apps can read ``ATTENTION_CHOICES`` / ``OPTION_NAMES``
without loading torch.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

LAYER_ATTENTIONS = ("sdpa", "linear", "mhla")
PATTERNS = ("wan-mhla-h",)
ATTENTION_CHOICES = LAYER_ATTENTIONS + PATTERNS
CONVERTED_ATTENTIONS = ("linear", "mhla")   # layers that get a new processor with their own weights
FEATURE_MAPS = ("relu", "elu1")
ROPE_MODES = ("none", "features")
# Conventions where the official MHLA code (DAGroup-PKU/MHLA) differs from the paper's formulas, which are ours
# by default (docs/DESIGN.md#conventions-ours-and-the-official-codes).
DENOMINATORS = ("paper", "official")
MIX_INITS = ("paper", "official")
# options a "linear" layer does not use: with one block Mc is [[1]] whatever its init, and both denominators
# read the token's own query
MHLA_ONLY_OPTIONS = ("blocks", "per_head_mix", "denominator", "mix_init")


def is_int(x) -> bool:
    """An int or an integer type such as numpy's, not a bool and not a float with an integral value."""
    try:
        operator.index(x)
    except TypeError:
        return False
    return not isinstance(x, bool)


def _is_positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _cpe_kernel(k):
    """0, an odd int, or a list of 1 to 3 odd positive ints (not all 1); returned as int or list."""
    if is_int(k) and (operator.index(k) == 0 or (operator.index(k) > 0 and operator.index(k) % 2 == 1)):
        return operator.index(k)
    seq = None if isinstance(k, (str, bytes)) or not hasattr(k, "__iter__") else list(k)
    if seq is not None and 1 <= len(seq) <= 3 and all(is_int(a) and a > 0 and a % 2 == 1 for a in seq) \
            and any(a > 1 for a in seq):
        return [operator.index(a) for a in seq]
    raise ValueError(f"cpe_kernel={k!r} is not allowed: use 0 (off), an odd int such as 3, or one odd int per "
                     f"grid axis such as [3, 1, 1]")


@dataclass
class AttentionSpec:
    """Per-layer attention entries and the MHLA options (shared by every MHLA / linear layer).

    blocks: block count per grid axis, 1 to 3 positive ints (fixed: Mc is M x M with M = prod(blocks));
        None only for models without any MHLA layer.
    feature_map, normalize, eps, scale: as in ``mediagen.kernels.mhla``; eps and scale (when given)
        are finite numbers > 0.
    per_head_mix: one Mc per head (H, M, M) instead of one shared (M, M).
    out_norm: False; True: one RMSNorm over the output of all heads together (a weight per channel);
        "per_head": each head's output RMS-normalised over the head dim, with one weight of head-dim size
        shared by the heads, as the official Wan MHLA layer always does (its ``g_norm``).
    out_gate: multiply the (normed) output by SiLU(Linear(x)), a learned output gate (the official Wan
        MHLA layer's ``is_gated``).
    cpe_kernel: 0 = off; otherwise the kernel size of a depthwise conv on V over the token grid,
        added to the attention output (a conditional positional term; zero-initialised so a freshly
        converted model is unchanged by it): one odd int for every axis, or a list of odd ints, one
        per grid axis ([3, 1, 1]: along time only, a third of the cost of 3 on a 3D grid). It is the
        one term of an MHLA layer that sees token order locally and asymmetrically: without it a
        video model's MHLA layers tell a clip from its time reversal only through RoPE.
    rope: "none" ignores the rotary embedding in MHLA layers; "features" rotates the features
        phi(q), phi(k) in the numerator and keeps the denominator un-rotated, as the official Wan
        MHLA code does (Wan only: DiT has no RoPE).
    denominator: with normalize=True, "paper": o_t's denominator is phi(q_t) . sum_j Mc[i, j] z_j + eps (the
        paper's formula; i the block of token t); "official": sum_j Mc[i, j] phi(q at t's position in block j)
        . z_j + eps, what the official image and video code computes. "official" needs equal blocks (every
        block count divides its axis) and runs slower: the numerator through the MHLA op, the denominator in
        plain PyTorch ops (``mediagen.attention.mhla.official_denominator``).
    feature_eps: added to the feature map, phi(x) = feature_map(x) + feature_eps (the official code's
        relu(x) + 1e-6); 0 (ours) is the plain map. A finite number >= 0; > 0 costs one elementwise pass over
        q and k before the op.
    mix_init: Mc's initialisation. "paper": m_ij = 1 - dist(i, j) / max_k dist(i, k), rows summing to 1;
        "official": 1 - dist(i, j) / max over all pairs, columns summing to 1 (the official code's).
        Loaded or trained weights replace it either way.
    in_norm: a LayerNorm (weight and bias, eps 1e-5) of the layer's input before its projections and
        gate, as the official DiT MHLA layer has (its ``norm``).
    """

    layers: list[str | None] = field(default_factory=list)
    blocks: list[int] | None = None
    feature_map: str = "relu"
    normalize: bool = True
    eps: float = 1e-6
    scale: float | None = None
    per_head_mix: bool = False
    out_norm: bool = False
    out_gate: bool = False
    cpe_kernel: int | list[int] = 0
    rope: str = "none"
    denominator: str = "paper"
    feature_eps: float = 0.0
    mix_init: str = "paper"
    in_norm: bool = False

    def __post_init__(self):
        self.layers = list(self.layers)
        for i, name in enumerate(self.layers):
            if name is not None and name not in LAYER_ATTENTIONS:
                raise ValueError(f"layers[{i}]={name!r} is not an attention name: use one of {LAYER_ATTENTIONS} "
                                 f"or None (not converted)")
        if self.blocks is not None:
            # ints only: a fraction must not be truncated into a different block layout
            seq = None if isinstance(self.blocks, (str, bytes)) or not hasattr(self.blocks, "__iter__") \
                else list(self.blocks)
            if seq is None or not all(is_int(b) for b in seq) or not 1 <= len(seq) <= 3 \
                    or any(operator.index(b) < 1 for b in seq):
                raise ValueError(f"blocks={self.blocks!r} is not allowed: use 1 to 3 positive ints, one per grid axis")
            self.blocks = [operator.index(b) for b in seq]
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map={self.feature_map!r} is not allowed: use one of {FEATURE_MAPS}")
        if self.rope not in ROPE_MODES:
            raise ValueError(f"rope={self.rope!r} is not allowed: use one of {ROPE_MODES}")
        for name in ("normalize", "per_head_mix", "out_gate", "in_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed: use True or False")
        if not (self.out_norm is False or self.out_norm is True or self.out_norm == "per_head"):
            raise ValueError(f"out_norm={self.out_norm!r} is not allowed: use False, True (one RMSNorm over all "
                             f"heads) or 'per_head' (each head over its own channels)")
        if self.denominator not in DENOMINATORS:
            raise ValueError(f"denominator={self.denominator!r} is not allowed: use one of {DENOMINATORS}")
        if self.mix_init not in MIX_INITS:
            raise ValueError(f"mix_init={self.mix_init!r} is not allowed: use one of {MIX_INITS}")
        if not (isinstance(self.feature_eps, (int, float)) and not isinstance(self.feature_eps, bool)
                and math.isfinite(self.feature_eps) and self.feature_eps >= 0):
            raise ValueError(f"feature_eps={self.feature_eps!r} is not allowed: use a finite number >= 0 "
                             f"(0: the plain feature map; 1e-6: the official code's)")
        if not _is_positive_number(self.eps):
            raise ValueError(f"eps={self.eps!r} is not allowed: use a finite number > 0 (e.g. 1e-6; 1e-15 for SANA)")
        if self.scale is not None and not _is_positive_number(self.scale):
            raise ValueError(f"scale={self.scale!r} is not allowed: use a finite number > 0, or None")
        self.cpe_kernel = _cpe_kernel(self.cpe_kernel)
        if self.normalize and self.scale is not None:
            raise ValueError(f"scale={self.scale!r} applies only with normalize=False; leave it None")
        if not self.normalize and self.denominator != "paper":
            raise ValueError(f"denominator={self.denominator!r} applies only with normalize=True (normalize=False "
                             f"has no denominator); leave it 'paper'")
        if "mhla" in self.layers and self.blocks is None:
            raise ValueError("blocks is required when a layer uses 'mhla'")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AttentionSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"mediagen_attention has unknown keys {unknown}; allowed: {sorted(known)}")
        return cls(**d)

    def options(self) -> dict:
        """The MHLA options (every field but ``layers``)."""
        return {name: getattr(self, name) for name in OPTION_NAMES}

    def layer_setup(self, i: int) -> tuple:
        """What decides layer ``i``'s processor: its entry plus, for linear / MHLA layers, the options
        that layer uses. Two specs build the same processor for layer ``i`` iff these are equal."""
        kind = self.layers[i]
        if kind not in CONVERTED_ATTENTIONS:
            return (kind,)
        used = {k: v for k, v in self.options().items() if kind == "mhla" or k not in MHLA_ONLY_OPTIONS}
        return (kind, used)


def check_denominator_grid(spec: AttentionSpec, grid: Sequence[int]) -> None:
    """The official denominator reads the query at the same position of every block, so it needs blocks of
    one size: with denominator='official' (and normalize) every block count must divide its grid axis."""
    if spec.blocks is None or not spec.normalize or spec.denominator != "official" or "mhla" not in spec.layers:
        return
    if any(int(g) % b for g, b in zip(grid, spec.blocks)):
        raise ValueError(f"denominator='official' needs blocks that divide the grid (every block the same size, as "
                         f"the official code requires); got grid={tuple(int(g) for g in grid)} and "
                         f"blocks={tuple(spec.blocks)}: use denominator='paper', or blocks that divide each axis")


OPTION_NAMES = tuple(f.name for f in fields(AttentionSpec) if f.name != "layers")
OPTION_DEFAULTS = {f.name: f.default for f in fields(AttentionSpec) if f.name != "layers"}


def layer_attentions(attention: str | Sequence[str | None], num_layers: int,
                     layers: Sequence[int] | None = None) -> list[str | None]:
    """Resolve ``attention`` (+ optional ``layers``) into one entry per layer; ``None`` marks a layer
    the request does not name (it keeps what it has)."""
    if not isinstance(attention, str):  # an explicit per-layer list
        names = list(attention)
        if layers is not None:
            raise ValueError("layers must be None when attention is a per-layer list of names")
        if len(names) != num_layers:
            raise ValueError(f"attention lists {len(names)} names but the model has {num_layers} layers")
        for i, n in enumerate(names):
            if n is not None and n not in LAYER_ATTENTIONS:
                raise ValueError(f"attention[{i}]={n!r} is not allowed: use one of {LAYER_ATTENTIONS} "
                                 f"or None (leave the layer as it is)")
        return names
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention={attention!r} is not allowed: use one of {ATTENTION_CHOICES} "
                         f"or a list of {LAYER_ATTENTIONS}, one per layer")
    if attention == "wan-mhla-h":
        if layers is not None:
            raise ValueError("layers must be None with attention='wan-mhla-h' (the pattern fixes every layer)")
        return ["sdpa" if i % 3 == 0 else "mhla" for i in range(num_layers)]
    if layers is None:
        return [attention] * num_layers
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise ValueError(f"layers={layers!r} is not allowed: use a list of layer indices from 0 to {num_layers - 1}")
    layers = list(layers)
    if not layers:
        raise ValueError(f"layers=[] names no layer, so nothing would be converted: give indices from 0 to "
                         f"{num_layers - 1}, or layers=None for every layer")
    chosen = set()
    for idx in layers:
        if not is_int(idx) or not 0 <= idx < num_layers:
            raise ValueError(f"layers contains {idx!r}: layer indices must be ints from 0 to {num_layers - 1}")
        chosen.add(operator.index(idx))
    return [attention if i in chosen else None for i in range(num_layers)]


def auto_blocks(grid: Sequence[int]) -> list[int]:
    """Block counts for a token grid: many blocks (M^2 <= N) of nearly cubic token extent.

    Every block layout with M = prod(blocks) <= sqrt(N) is scored log(M) - log(max extent / min
    extent), extents being tokens per block along each axis; the best score wins. For Wan's
    21x30x50 grid that is 4x5x8 (M=160, blocks of about 5x6x6 tokens); for 16x16 it is 4x4.
    """
    grid = [int(g) for g in grid]
    limit = math.isqrt(math.prod(grid))
    best, best_score = [1] * len(grid), -math.inf
    for blocks in itertools.product(*(range(1, min(g, limit) + 1) for g in grid)):
        m = math.prod(blocks)
        if m > limit:
            continue
        extents = [g / b for g, b in zip(grid, blocks)]
        score = math.log(m) - math.log(max(extents) / min(extents))
        if score > best_score + 1e-12:
            best, best_score = list(blocks), score
    return best
