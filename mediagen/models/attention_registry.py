"""The attentions a converted transformer's self-attention layers can run: one entry per name.

An entry (``Attention``) says how a layer of that attention is built and what it supports, and names the
dataclass of its options, whose fields are option names of ``mediagen.convert`` (and keys of the saved
``mediagen_attention`` config) and whose ``__post_init__`` checks their values. Conversion (``convert``,
``AttentionSpec``), the processors, ``mediagen generate``, the app and the attention diagnostics read this
table and nothing else, so a new attention is its module (the core: ``module(q, k, v, grid, rope=None) -> o``
on (B, N, H, D) tensors) plus one ``register(Attention(...))`` here
(docs/DESIGN.md#adding-an-attention-or-a-model-family).

Options are one namespace shared by all attentions: a name two attentions both read (``feature_map``: linear
and MHLA) is one option with one value in a model, which is why a saved config stays one flat dict that older
checkpoints still load from. The layer options (``LayerOptions``: input and output norms, output gate, CPE,
RoPE on the features) belong to the processor that wraps every core, so every attention with a core has them.

Nothing here imports torch at import time: what needs it (the core's class, the dense matrix) is imported
inside the functions an entry names, when a layer is built, so command lines read names and options cheaply.
"""

from __future__ import annotations

import math
import operator
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields
from typing import Any, Callable, Iterator, Sequence

FEATURE_MAPS = ("relu", "elu1")
ROPE_MODES = ("none", "features")
# Conventions where the official MHLA code (DAGroup-PKU/MHLA) differs from the paper's formulas, which are ours
# by default (docs/DESIGN.md#conventions-ours-and-the-official-codes).
DENOMINATORS = ("paper", "official")
MIX_INITS = ("paper", "official")
# keywords of ``mediagen.convert`` itself and the spec's layer list: no option may take these names
RESERVED = ("layers", "grid", "reinit", "attention")


def is_int(x) -> bool:
    """An int or an integer type such as numpy's, not a bool and not a float with an integral value."""
    try:
        operator.index(x)
    except TypeError:
        return False
    return not isinstance(x, bool)


def _is_positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _check_bool(options, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(options, name), bool):
            raise ValueError(f"{name}={getattr(options, name)!r} is not allowed: use True or False")


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


# --- options ---------------------------------------------------------------------------------------------

@dataclass
class LayerOptions:
    """What the processor around any core adds (``models/processors.py``), so every attention with a core has it.

    out_norm: False; True: one RMSNorm over the output of all heads together (a weight per channel);
        "per_head": each head's output RMS-normalised over the head dim, with one weight of head-dim size
        shared by the heads, as the official Wan MHLA layer always does (its ``g_norm``).
    out_gate: multiply the (normed) output by SiLU(Linear(x)), a learned output gate (the official Wan
        MHLA layer's ``is_gated``).
    cpe_kernel: 0 = off; otherwise the kernel size of a depthwise conv on V over the token grid,
        added to the attention output (a conditional positional term; zero-initialised so a freshly
        converted model is unchanged by it): one odd int for every axis, or a list of odd ints, one
        per grid axis ([3, 1, 1]: along time only, a third of the cost of 3 on a 3D grid). It is the
        one term of a linear-attention layer that sees token order locally and asymmetrically: without it a
        video model's MHLA layers tell a clip from its time reversal only through RoPE.
    rope: "none" ignores the rotary embedding in the converted layers; "features" hands the model's rotary
        tables to the core (MHLA: rotates phi(q), phi(k) in the numerator and keeps the denominator
        un-rotated, as the official Wan MHLA code does); Wan only (DiT has no RoPE), and only for attentions
        whose entry says ``rope=True``.
    in_norm: a LayerNorm (weight and bias, eps 1e-5) of the layer's input before its projections and
        gate, as the official DiT MHLA layer has (its ``norm``).
    """

    out_norm: bool | str = False
    out_gate: bool = False
    cpe_kernel: int | list[int] = 0
    rope: str = "none"
    in_norm: bool = False

    def __post_init__(self):
        if self.rope not in ROPE_MODES:
            raise ValueError(f"rope={self.rope!r} is not allowed: use one of {ROPE_MODES}")
        _check_bool(self, "out_gate", "in_norm")
        if not (self.out_norm is False or self.out_norm is True or self.out_norm == "per_head"):
            raise ValueError(f"out_norm={self.out_norm!r} is not allowed: use False, True (one RMSNorm over all "
                             f"heads) or 'per_head' (each head over its own channels)")
        self.cpe_kernel = _cpe_kernel(self.cpe_kernel)


@dataclass
class LinearOptions:
    """Global linear attention's options (``mediagen.attention.LinearAttention``; the kernels' meaning).

    feature_map, normalize, eps, scale: as in ``mediagen.kernels.mhla``; eps and scale (when given) are
        finite numbers > 0, scale only with normalize=False.
    feature_eps: added to the feature map, phi(x) = feature_map(x) + feature_eps (the official code's
        relu(x) + 1e-6); 0 (ours) is the plain map. A finite number >= 0; > 0 costs one elementwise pass over
        q and k before the op.
    """

    feature_map: str = "relu"
    normalize: bool = True
    eps: float = 1e-6
    scale: float | None = None
    feature_eps: float = 0.0

    def __post_init__(self):
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map={self.feature_map!r} is not allowed: use one of {FEATURE_MAPS}")
        _check_bool(self, "normalize")
        if not (isinstance(self.feature_eps, (int, float)) and not isinstance(self.feature_eps, bool)
                and math.isfinite(self.feature_eps) and self.feature_eps >= 0):
            raise ValueError(f"feature_eps={self.feature_eps!r} is not allowed: use a finite number >= 0 "
                             f"(0: the plain feature map; 1e-6: the official code's)")
        if not _is_positive_number(self.eps):
            raise ValueError(f"eps={self.eps!r} is not allowed: use a finite number > 0 (e.g. 1e-6; 1e-15 for SANA)")
        if self.scale is not None and not _is_positive_number(self.scale):
            raise ValueError(f"scale={self.scale!r} is not allowed: use a finite number > 0, or None")
        if self.normalize and self.scale is not None:
            raise ValueError(f"scale={self.scale!r} applies only with normalize=False; leave it None")


@dataclass
class MHLAOptions(LinearOptions):
    """MHLA's options: linear attention's, plus the block layout and Mc (``mediagen.attention.MHLAttention``).

    blocks: block count per grid axis, 1 to 3 positive ints (fixed: Mc is M x M with M = prod(blocks));
        None until a layer uses MHLA (conversion then picks them from the token grid).
    per_head_mix: one Mc per head (H, M, M) instead of one shared (M, M).
    denominator: with normalize=True, "paper": o_t's denominator is phi(q_t) . sum_j Mc[i, j] z_j + eps (the
        paper's formula; i the block of token t); "official": sum_j Mc[i, j] phi(q at t's position in block j)
        . z_j + eps, what the official image and video code computes. "official" needs equal blocks (every
        block count divides its axis) and runs slower: the numerator through the MHLA op, the denominator in
        plain PyTorch ops (``mediagen.attention.mhla.official_denominator``).
    mix_init: Mc's initialisation. "paper": m_ij = 1 - dist(i, j) / max_k dist(i, k), rows summing to 1;
        "official": 1 - dist(i, j) / max over all pairs, columns summing to 1 (the official code's).
        Loaded or trained weights replace it either way.
    """

    blocks: list[int] | None = None
    per_head_mix: bool = False
    denominator: str = "paper"
    mix_init: str = "paper"

    def __post_init__(self):
        super().__post_init__()
        if self.blocks is not None:
            # ints only: a fraction must not be truncated into a different block layout
            seq = None if isinstance(self.blocks, (str, bytes)) or not hasattr(self.blocks, "__iter__") \
                else list(self.blocks)
            if seq is None or not all(is_int(b) for b in seq) or not 1 <= len(seq) <= 3 \
                    or any(operator.index(b) < 1 for b in seq):
                raise ValueError(f"blocks={self.blocks!r} is not allowed: use 1 to 3 positive ints, one per grid axis")
            self.blocks = [operator.index(b) for b in seq]
        _check_bool(self, "per_head_mix")
        if self.denominator not in DENOMINATORS:
            raise ValueError(f"denominator={self.denominator!r} is not allowed: use one of {DENOMINATORS}")
        if self.mix_init not in MIX_INITS:
            raise ValueError(f"mix_init={self.mix_init!r} is not allowed: use one of {MIX_INITS}")
        if not self.normalize and self.denominator != "paper":
            raise ValueError(f"denominator={self.denominator!r} applies only with normalize=True (normalize=False "
                             f"has no denominator); leave it 'paper'")

    def check_grid(self, grid: Sequence[int]) -> None:
        """The official denominator reads the query at the same position of every block, so it needs blocks of
        one size: with denominator='official' (and normalize) every block count must divide its grid axis."""
        if self.blocks is None or not self.normalize or self.denominator != "official":
            return
        if any(int(g) % b for g, b in zip(grid, self.blocks)):
            raise ValueError(f"denominator='official' needs blocks that divide the grid (every block the same size, "
                             f"as the official code requires); got grid={tuple(int(g) for g in grid)} and "
                             f"blocks={tuple(self.blocks)}: use denominator='paper', or blocks that divide each axis")


# --- entries ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Attention:
    """One attention a self-attention layer can run.

    name: what ``mediagen.convert(model, name)``, ``--attention`` and the app's choices call it, and the
        label of its shipped checkpoints (``<family>-<name>/``).
    options: the dataclass of the options its core reads (None: it reads none). Its fields are option names;
        ``__post_init__`` checks the values; an optional ``check_grid(grid)`` checks them against the token
        grid a conversion is given.
    module: () -> the class of its core module (imported on first use). Diagnostics recognise its layers by it.
    build: (options, *, heads, ndim) -> the core module of one layer (heads: the layer's head count; ndim: the
        token grid's axes); None: ``module()(**options)``.
    dense: (core module, q, k, grid, rope) -> its dense (B, H, N, N) float64 attention matrix, what
        ``eval.attention_maps`` reports rank and entropy of; None: no diagnostics.
    stock: the layer keeps the model family's own softmax processor (no core, no weights of its own).
    blocks: its options hold ``blocks``, one count per grid axis, chosen from the token grid when a
        conversion does not give them (``auto_blocks``) and fixed once trained.
    rope: its core takes the model's rotary tables (``rope=(cos, sin)``, (N, D/2)), so rope="features" applies.
    fused_cpe: its core adds a CPE itself (``cpe=(weight, bias)`` in its forward, when ``core.takes_cpe``),
        which the processor then hands it instead of adding it after.
    head_dims: () -> (smallest, largest) head dim its kernels take; None: any.
    """

    name: str
    options: type | None = None
    module: Callable[[], type] | None = None
    build: Callable[..., Any] | None = None
    dense: Callable[..., Any] | None = None
    stock: bool = False
    blocks: bool = False
    rope: bool = False
    fused_cpe: bool = False
    head_dims: Callable[[], tuple[int, int]] | None = None

    def option_names(self) -> tuple[str, ...]:
        """The options a layer of this attention uses: its own, then the layer options (none when stock)."""
        if self.stock:
            return ()
        own = tuple(f.name for f in fields(self.options)) if self.options is not None else ()
        return own + tuple(f.name for f in fields(LayerOptions))

    def make_options(self, values: dict):
        """Its options dataclass filled from ``values`` (every option name -> value); None without options."""
        if self.options is None:
            return None
        return self.options(**{f.name: values[f.name] for f in fields(self.options)})

    def build_core(self, values: dict, *, heads: int, ndim: int):
        """The core module of one layer, with this attention's options taken from ``values``."""
        options = self.make_options(values)
        if self.build is not None:
            return self.build(options, heads=heads, ndim=ndim)
        kwargs = {} if options is None else {f.name: getattr(options, f.name) for f in fields(options)}
        return self.module()(**kwargs)


_ENTRIES: dict[str, Attention] = {}


def register(entry: Attention) -> Attention:
    """Add ``entry``; its option names join the shared namespace. Raises where the entry would be ambiguous:
    a name taken, an option without a default (a saved config must be able to leave it out), or an option
    another attention has with another default (one name is one option)."""
    if not isinstance(entry, Attention):
        raise TypeError(f"register() takes an Attention; got {type(entry).__name__}")
    if not isinstance(entry.name, str) or not entry.name or entry.name in _ENTRIES:
        raise ValueError(f"attention name {entry.name!r} is not allowed: use a new non-empty name (taken: "
                         f"{list(_ENTRIES)})")
    if entry.stock and (entry.options is not None or entry.build is not None):
        raise ValueError(f"attention {entry.name!r}: a stock attention keeps the family's processor, so it has no "
                         f"options and builds no core")
    if not entry.stock and entry.module is None and entry.build is None:
        raise ValueError(f"attention {entry.name!r} needs module or build: what its layers run")
    if entry.blocks and (entry.options is None or "blocks" not in {f.name for f in fields(entry.options)}):
        raise ValueError(f"attention {entry.name!r} says blocks=True, so its options need a 'blocks' field")
    known = _option_fields()
    for f in fields(entry.options) if entry.options is not None else ():
        if f.default is MISSING:
            raise ValueError(f"option {f.name!r} of attention {entry.name!r} needs a default")
        if f.name in RESERVED:
            raise ValueError(f"option {f.name!r} of attention {entry.name!r} is not allowed: {RESERVED} are "
                             f"convert()'s own arguments")
        if f.name in known and known[f.name].default != f.default:
            raise ValueError(f"option {f.name!r} of attention {entry.name!r} defaults to {f.default!r}, but another "
                             f"attention's option of that name defaults to {known[f.name].default!r}: one name "
                             f"is one option, shared by the attentions that read it")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> Attention:
    """Remove the attention ``name`` (experiments and tests); returns its entry."""
    return _ENTRIES.pop(get(name).name)


@contextmanager
def registered(entry: Attention) -> Iterator[Attention]:
    """``entry`` registered inside the ``with`` block only."""
    register(entry)
    try:
        yield entry
    finally:
        _ENTRIES.pop(entry.name, None)


def get(name: str) -> Attention:
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"attention {name!r} is not known: use one of {list(_ENTRIES)}") from None


def entries() -> tuple[Attention, ...]:
    return tuple(_ENTRIES.values())


def names() -> tuple[str, ...]:
    """Every layer attention's name, in registration order."""
    return tuple(_ENTRIES)


def converted_names() -> tuple[str, ...]:
    """The attentions whose layers get a processor with a core of their own (not the stock one)."""
    return tuple(e.name for e in _ENTRIES.values() if not e.stock)


def _option_fields() -> dict:
    """Every option's dataclass field: the attentions' own in registration order, then the layer options."""
    out = {}
    for entry in _ENTRIES.values():
        for f in fields(entry.options) if entry.options is not None else ():
            out.setdefault(f.name, f)
    for f in fields(LayerOptions):
        out.setdefault(f.name, f)
    return out


def option_names() -> tuple[str, ...]:
    return tuple(_option_fields())


def option_defaults() -> dict:
    return {name: f.default for name, f in _option_fields().items()}


def checked_options(values: dict) -> dict:
    """``values`` (every option name -> value) checked by every options dataclass that reads them, with the
    values those normalise (``blocks`` as a list of ints, ...). Every value is checked, used or not, so a
    bad value fails when given rather than when a later conversion first uses it."""
    out = dict(values)
    classes = [LayerOptions] + [e.options for e in _ENTRIES.values() if e.options is not None]
    for cls in dict.fromkeys(classes):
        checked = cls(**{f.name: out[f.name] for f in fields(cls)})
        out.update({f.name: getattr(checked, f.name) for f in fields(cls)})
    return out


def entry_of_module(module) -> Attention | None:
    """The attention whose core class ``module`` is an instance of, the most derived one when several match
    (``LinearAttention`` is an ``MHLAttention``); None for other modules."""
    mro = type(module).__mro__
    best, depth = None, len(mro)
    for entry in _ENTRIES.values():
        cls = entry.module() if entry.module is not None else None
        if cls in mro and mro.index(cls) < depth:
            best, depth = entry, mro.index(cls)
    return best


def module_types() -> tuple[type, ...]:
    """The core classes of every attention that names one."""
    return tuple(dict.fromkeys(e.module() for e in _ENTRIES.values() if e.module is not None))


# --- the attentions --------------------------------------------------------------------------------------
# The functions below import torch-side modules when called, never at import (module docstring).

def _sdpa_module():
    from ..attention import SDPAttention
    return SDPAttention


def _linear_module():
    from ..attention import LinearAttention
    return LinearAttention


def _mhla_module():
    from ..attention import MHLAttention
    return MHLAttention


def _feature_kwargs(o: LinearOptions) -> dict:
    return dict(feature_map=o.feature_map, normalize=o.normalize, eps=o.eps, scale=o.scale, feature_eps=o.feature_eps)


def _linear_core(o: LinearOptions, *, heads: int, ndim: int):
    return _linear_module()(ndim, **_feature_kwargs(o))


def _mhla_core(o: MHLAOptions, *, heads: int, ndim: int):
    if len(o.blocks) != ndim:
        raise ValueError(f"blocks={o.blocks} has {len(o.blocks)} axes but this model's latent grid has {ndim}")
    return _mhla_module()(o.blocks, heads=heads if o.per_head_mix else None, denominator=o.denominator,
                          mix_init=o.mix_init, **_feature_kwargs(o))


def _mhla_kernel_head_dims() -> tuple[int, int]:
    from ..kernels.mhla.checks import MAX_HEAD_DIM, MIN_HEAD_DIM
    return MIN_HEAD_DIM, MAX_HEAD_DIM


def _softmax_dense(module, q, k, grid=None, rope=None):
    from .dense_attention import softmax_attention_matrix
    return softmax_attention_matrix(q, k)


def _linear_dense(module, q, k, grid=None, rope=None):
    from .dense_attention import linear_attention_matrix
    return linear_attention_matrix(q, k, module.feature_map, module.eps, rope)


def _mhla_dense(module, q, k, grid=None, rope=None):
    from .dense_attention import mhla_attention_matrix
    if grid is None:
        raise ValueError("an MHLA layer needs the token grid to build its attention matrix; got grid=None")
    return mhla_attention_matrix(q, k, module.mix, grid, module.blocks, module.feature_map, module.eps, rope)


# softmax: the family's own processor (a converted model with every layer "sdpa" computes what the original did)
register(Attention("sdpa", module=_sdpa_module, dense=_softmax_dense, stock=True))
# global linear attention: MHLA with one block, Mc = [[1]] frozen (the kernels' M = 1 case)
register(Attention("linear", options=LinearOptions, module=_linear_module, build=_linear_core, dense=_linear_dense,
                   rope=True, head_dims=_mhla_kernel_head_dims))
# MHLA: blocks over the token grid mixed by a learned Mc (docs/DESIGN.md#mhla)
register(Attention("mhla", options=MHLAOptions, module=_mhla_module, build=_mhla_core, dense=_mhla_dense,
                   blocks=True, rope=True, fused_cpe=True, head_dims=_mhla_kernel_head_dims))
