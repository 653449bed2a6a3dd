"""Which attention each self-attention layer of a converted transformer uses, and with what options.

An ``AttentionSpec`` is what ``mediagen.convert`` stores in the model's config (key
``mediagen_attention``), so ``from_pretrained`` can rebuild the same processors before loading weights.
It holds one entry per layer plus the option values shared by the layers that read them.

Layer entries: ``None`` (not converted: the layer keeps the processor the model has, e.g. SANA's own
ReLU linear attention) or the name of a registered attention (``attention_registry``: ``sdpa``, the
family's stock softmax processor; ``linear``, global linear attention, MHLA with one block; ``mhla``).
Hybrids: a list of names, one per layer; ``layers=[...]`` (indices that get the chosen attention, the
others are left as they are); or a pattern (``PATTERNS``): ``wan-mhla-h``, the paper's Wan pattern,
softmax in every third layer (0, 3, 6, ...), MHLA in the others.

The attentions, their options and the checks of their values are the registry's; this module is the spec
built from them, the patterns and ``auto_blocks``. It imports nothing heavy, so command lines and apps can
read ``ATTENTION_CHOICES`` / ``OPTION_NAMES`` without loading torch. Those names (with ``LAYER_ATTENTIONS``,
``CONVERTED_ATTENTIONS`` and ``OPTION_DEFAULTS``) are read from the registry when asked for, so they include
every attention registered by then.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Sequence

from . import attention_registry as registry
from .attention_registry import DENOMINATORS, FEATURE_MAPS, MIX_INITS, ROPE_MODES, is_int  # noqa: F401  (their names)

# A pattern gives every layer an attention by its index: layer i gets cycle[i % len(cycle)].
PATTERNS = {"wan-mhla-h": ("sdpa", "mhla", "mhla")}


def layer_attention_names() -> tuple[str, ...]:
    return registry.names()


def attention_choices() -> tuple[str, ...]:
    """What ``convert`` takes as one name: every layer attention, then the patterns."""
    return registry.names() + tuple(PATTERNS)


def attentions_of(attention: str) -> tuple[str, ...]:
    """The layer attentions a choice (a name or a pattern) puts into a model."""
    return tuple(dict.fromkeys(PATTERNS[attention])) if attention in PATTERNS else (attention,)


def uses_blocks(attention: str) -> bool:
    """Whether a choice has layers that need ``blocks`` (chosen per token grid when not given)."""
    return any(registry.get(name).blocks for name in attentions_of(attention))


def __getattr__(name):
    # the registry's current names, so an attention registered after this module loaded is among them
    computed = {"LAYER_ATTENTIONS": registry.names, "ATTENTION_CHOICES": attention_choices,
                "CONVERTED_ATTENTIONS": registry.converted_names, "OPTION_NAMES": registry.option_names,
                "OPTION_DEFAULTS": registry.option_defaults}
    if name in computed:
        return computed[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AttentionSpec:
    """Per-layer attention entries and the option values, one attribute per option name.

    ``AttentionSpec(layers=[...], blocks=[2, 2], rope="features")``: options left out take their defaults;
    every value is checked by the options dataclasses of the registry (``LayerOptions``, and each attention's,
    e.g. ``MHLAOptions``, which documents what MHLA's options mean), and a layer whose attention needs
    ``blocks`` needs them given.
    """

    def __init__(self, layers: Sequence[str | None] = (), **options):
        allowed = registry.option_names()
        unknown = [k for k in options if k not in allowed]
        if unknown:
            raise TypeError(f"AttentionSpec got unknown option(s) {unknown}; allowed: {list(allowed)}")
        known = registry.names()
        self.layers = list(layers)
        for i, name in enumerate(self.layers):
            if name is not None and name not in known:
                raise ValueError(f"layers[{i}]={name!r} is not an attention name: use one of {known} "
                                 f"or None (not converted)")
        for key, value in registry.checked_options({**registry.option_defaults(), **options}).items():
            setattr(self, key, value)
        for name in dict.fromkeys(n for n in self.layers if n is not None):
            if registry.get(name).blocks and self.blocks is None:
                raise ValueError(f"blocks is required when a layer uses {name!r}")

    def __eq__(self, other) -> bool:
        return isinstance(other, AttentionSpec) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return "AttentionSpec(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), **self.options()}

    @classmethod
    def from_dict(cls, d: dict) -> "AttentionSpec":
        known = {"layers", *registry.option_names()}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"mediagen_attention has unknown keys {unknown}; allowed: {sorted(known)}")
        return cls(**d)

    def options(self) -> dict:
        """Every option's value (every attribute but ``layers``)."""
        return {name: getattr(self, name) for name in registry.option_names()}

    def options_of(self, name: str):
        """The options dataclass of attention ``name`` filled with this spec's values (None without options)."""
        return registry.get(name).make_options(self.options())

    def used(self) -> tuple[str, ...]:
        """The attentions the layers use, in registration order."""
        return tuple(n for n in registry.names() if n in self.layers)

    def layer_setup(self, i: int) -> tuple:
        """What decides layer ``i``'s processor: its entry plus, for an attention with a core, the options
        that layer uses. Two specs build the same processor for layer ``i`` iff these are equal."""
        kind = self.layers[i]
        if kind is None or registry.get(kind).stock:
            return (kind,)
        return (kind, {name: getattr(self, name) for name in registry.get(kind).option_names()})

    def check_grid(self, grid: Sequence[int]) -> None:
        """The used attentions' options against the token grid (their ``check_grid``, where they have one)."""
        for name in self.used():
            options = self.options_of(name)
            if hasattr(options, "check_grid"):
                options.check_grid(grid)


def layer_attentions(attention: str | Sequence[str | None], num_layers: int,
                     layers: Sequence[int] | None = None) -> list[str | None]:
    """Resolve ``attention`` (+ optional ``layers``) into one entry per layer; ``None`` marks a layer
    the request does not name (it keeps what it has)."""
    if not isinstance(attention, str):  # an explicit per-layer list
        # a list of names, one per layer: bytes and mappings iterate over bytes / keys, not names, and
        # anything else is not a sequence at all
        if isinstance(attention, (bytes, bytearray, dict)) or not hasattr(attention, "__iter__"):
            raise ValueError(f"attention={attention!r} is not allowed: use one of {attention_choices()} "
                             f"or a list of {registry.names()} (or None), one per layer")
        names = list(attention)
        if layers is not None:
            raise ValueError("layers must be None when attention is a per-layer list of names")
        if len(names) != num_layers:
            raise ValueError(f"attention lists {len(names)} names but the model has {num_layers} layers")
        known = registry.names()
        for i, n in enumerate(names):
            if n is not None and n not in known:
                raise ValueError(f"attention[{i}]={n!r} is not allowed: use one of {known} "
                                 f"or None (leave the layer as it is)")
        return names
    if attention not in attention_choices():
        raise ValueError(f"attention={attention!r} is not allowed: use one of {attention_choices()} "
                         f"or a list of {registry.names()}, one per layer")
    if attention in PATTERNS:
        if layers is not None:
            raise ValueError(f"layers must be None with attention={attention!r} (the pattern fixes every layer)")
        cycle = PATTERNS[attention]
        return [cycle[i % len(cycle)] for i in range(num_layers)]
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
