"""Which attention each self-attention layer of a converted transformer uses, and with what options.

An ``AttentionSpec`` is what ``mediagen.convert`` stores in the model's config (key
``mediagen_attention``), so ``from_pretrained`` can rebuild the same processors before loading weights.
It holds one attention name per layer plus the MHLA options shared by all MHLA layers.

Names: ``sdpa`` (the model's stock softmax processor), ``linear`` (global linear attention, MHLA with
one block), ``mhla``. Hybrids: a list of names, one per layer; ``layers=[...]`` (indices that get
the chosen attention, the rest keep sdpa); or ``wan-mhla-h``, the paper's Wan pattern: softmax in
every third layer (0, 3, 6, ...), MHLA in the others.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

LAYER_ATTENTIONS = ("sdpa", "linear", "mhla")
PATTERNS = ("wan-mhla-h",)
ATTENTION_CHOICES = LAYER_ATTENTIONS + PATTERNS
FEATURE_MAPS = ("relu", "elu1")
ROPE_MODES = ("none", "features")


@dataclass
class AttentionSpec:
    """Per-layer attention names and the MHLA options (shared by every MHLA layer).

    blocks: block count per grid axis (fixed: Mc is M x M with M = prod(blocks)); None only for
        models without any MHLA layer.
    feature_map, normalize, eps, scale: as in ``mediagen.kernels.mhla``.
    per_head_mix: one Mc per head (H, M, M) instead of one shared (M, M).
    out_norm: RMSNorm over the attention output (all heads), the Wan recipe's ``rms_output``.
    out_gate: multiply the (normed) output by SiLU(Linear(x)), a learned output gate.
    cpe_kernel: 0 = off; otherwise the kernel size of a depthwise conv on V over the token grid,
        added to the attention output (a conditional positional term; zero-initialised so a freshly
        converted model is unchanged by it).
    rope: "none" ignores the rotary embedding in MHLA layers; "features" rotates the features
        phi(q), phi(k) in the numerator and keeps the denominator un-rotated, as the official Wan
        MHLA code does (Wan only: DiT has no RoPE).
    """

    layers: list[str] = field(default_factory=list)
    blocks: list[int] | None = None
    feature_map: str = "relu"
    normalize: bool = True
    eps: float = 1e-6
    scale: float | None = None
    per_head_mix: bool = False
    out_norm: bool = False
    out_gate: bool = False
    cpe_kernel: int = 0
    rope: str = "none"

    def __post_init__(self):
        self.layers = list(self.layers)
        for i, name in enumerate(self.layers):
            if name not in LAYER_ATTENTIONS:
                raise ValueError(f"layers[{i}]={name!r} is not an attention name: use one of {LAYER_ATTENTIONS}")
        if self.blocks is not None:
            self.blocks = [int(b) for b in self.blocks]
            if not 1 <= len(self.blocks) <= 3 or any(b < 1 for b in self.blocks):
                raise ValueError(f"blocks={self.blocks} is not allowed: use 1 to 3 positive ints, one per grid axis")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map={self.feature_map!r} is not allowed: use one of {FEATURE_MAPS}")
        if self.rope not in ROPE_MODES:
            raise ValueError(f"rope={self.rope!r} is not allowed: use one of {ROPE_MODES}")
        if not isinstance(self.cpe_kernel, int) or self.cpe_kernel < 0 or (self.cpe_kernel and self.cpe_kernel % 2 == 0):
            raise ValueError(f"cpe_kernel={self.cpe_kernel!r} is not allowed: use 0 (off) or an odd int such as 3 or 5")
        if self.normalize and self.scale is not None:
            raise ValueError(f"scale={self.scale!r} applies only with normalize=False; leave it None")
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


def layer_attentions(attention: str | Sequence[str], num_layers: int, layers: Sequence[int] | None = None) -> list[str]:
    """Resolve ``attention`` (+ optional ``layers``) into one attention name per layer."""
    if not isinstance(attention, str):  # an explicit per-layer list
        names = list(attention)
        if layers is not None:
            raise ValueError("layers must be None when attention is a per-layer list of names")
        if len(names) != num_layers:
            raise ValueError(f"attention lists {len(names)} names but the model has {num_layers} layers")
        for i, n in enumerate(names):
            if n not in LAYER_ATTENTIONS:
                raise ValueError(f"attention[{i}]={n!r} is not allowed: use one of {LAYER_ATTENTIONS}")
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
    chosen = set()
    for idx in layers:
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < num_layers:
            raise ValueError(f"layers contains {idx!r}: layer indices must be ints from 0 to {num_layers - 1}")
        chosen.add(idx)
    return [attention if i in chosen else "sdpa" for i in range(num_layers)]


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
