"""Launch settings of the MHLA Triton kernels: one frozen record per kernel, and one way to change them.

``kernel_settings(name)`` is what a launcher reads; ``launch_settings(name, **fields)`` replaces fields for
the duration of a ``with`` block (the sweeps in benchmarks/, attention_bench's tf32 rows, the tests):

    with launch_settings("mix", lowp=False, warps=8):
        ...   # every mix launched here, in this thread, uses them

Overrides live in a ContextVar, so they nest, unwind when the block exits (also by an exception), and a
thread or asyncio task sees only its own. A forward's autograd backward launches with the settings that
were in force when the forward ran, since autograd may run it on another thread (its GPU worker threads);
under torch.compile the backward reads those of the thread that runs it.

The defaults are the fastest settings measured on an H200 at the shapes of
mediagen/eval/attention_bench.py (benchmarks/RESULTS.md, kernel launch settings; ``python -m benchmarks attention
--sweep KERNEL FIELD=V1,V2`` measures them).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, Mapping, Optional, Union


def _replaced(settings, variant):
    """``settings`` with the fields that ``variant`` sets (not None)."""
    changes = {f.name: getattr(variant, f.name) for f in dataclasses.fields(variant)}
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class ChunkedVariant:
    """Fields that replace a chunked kernel's settings in one case; None keeps the kernel's own."""

    TILE: Optional[int] = None
    BT: Optional[int] = None
    warps: Optional[int] = None
    stages: Optional[int] = None


@dataclass(frozen=True)
class OneStepVariant:
    """Warps and stages that replace a chunked kernel's when every program walks one token step; None keeps
    the kernel's own."""

    warps: Optional[int] = None
    stages: Optional[int] = None


@dataclass(frozen=True)
class ChunkedSettings:
    """summary, apply, query_grad and key_grad (triton_chunked.py).

    TILE: output columns per program; BT: tokens per loop step (both capped by the padded head dim, and
    smaller for fp32 with RoPE: tiles._config); warps and pipeline stages of the launch.
    lowp: bf16/fp16 inputs multiply in their own dtype with fp32 accumulation instead of as tf32 copies.
    prefetch: the next token step's ids are loaded during this step.
    one_step: replaces warps and stages when every program walks a single token step (half-precision inputs).
    fp32: replaces fields for fp32 inputs (with or without RoPE)."""

    TILE: int
    BT: int
    warps: int
    stages: int
    lowp: bool = False
    prefetch: bool = False
    one_step: OneStepVariant = OneStepVariant()
    fp32: ChunkedVariant = ChunkedVariant()

    def for_inputs(self, fp32: bool = False) -> "ChunkedSettings":
        """These settings, with the ``fp32`` replacements for fp32 inputs."""
        return _replaced(self, self.fp32) if fp32 else self

    def one_step_launch(self) -> tuple[int, int]:
        """(warps, stages) when every program walks one token step."""
        s = _replaced(self, self.one_step)
        return s.warps, s.stages


@dataclass(frozen=True)
class DenseVariant:
    """Fields that replace the dense forward's tiles in one case; None keeps the kernel's own."""

    BT: Optional[int] = None
    BS: Optional[int] = None
    warps: Optional[int] = None
    stages: Optional[int] = None


@dataclass(frozen=True)
class DenseSettings:
    """The dense forward with its head dim in one tile (triton_dense.py): BT queries and BS keys per step
    (both smaller for wide or fp32 tiles: tiles.dense_settings), warps, stages. onehot: block weights
    picked by a one-hot product (up to 128 blocks) instead of gathered. fill: fewer query rows per program
    (with the split head dim too) where a launch would leave most SMs idle (tiles.fill_rows); a sweep of
    BT sets it False. short: replaces fields for sequences of at most short_tokens tokens without RoPE (a few key
    steps per program, where a 128-row program has too little to pipeline)."""

    BT: int
    BS: int
    warps: int
    stages: int
    onehot: bool = True
    fill: bool = True
    short: DenseVariant = DenseVariant()
    short_tokens: int = 0

    def for_tokens(self, N: Optional[int]) -> "DenseSettings":
        """These settings for a sequence of ``N`` tokens (None: a long one), with ``short`` where it applies."""
        return _replaced(self, self.short) if N is not None and N <= self.short_tokens else self


@dataclass(frozen=True)
class DenseSplitSettings:
    """The dense forward with its head dim in two power-of-two pieces (tiles.dense_head_pieces)."""

    BT: int
    BS: int
    warps: int
    stages: int


@dataclass(frozen=True)
class DenseGradSettings:
    """The dense backward (triton_dense_grad.py), both kernels: BT rows (queries for dq, keys for dk and dv) per
    program, BS of the others per step, warps, stages; fp32 inputs take at most 32 of each
    (tiles.dense_grad_tiles). fit_short: a sequence shorter than a tile takes tiles fitted to it (one whole step,
    one stage); tail: the last keys (rows) in a narrower step (tiles.dense_tail), off: the last step is a whole
    masked one. Every launch with a tail step that gave wrong half-precision gradients on the H200 (triton 3.6)
    had one (29 tokens after a loop of no steps: out-of-range shared-memory addresses in the tail step's dot;
    80 tokens, one full step and a 16-row tail, 1 stage: dq 0.57 off fp64), while every launch that ends in a
    whole masked step was right; so the backward keeps whole steps (benchmarks/dense_grad_cases.py;
    benchmarks/RESULTS.md, The dense backward at 29 tokens). fit_short off and tail on reproduce the first
    launch found wrong. enabled: a dense forward's backward runs these kernels (off: the chunked backward, making
    the summaries again; for A/B measurements); max_blocks: more blocks than this take the chunked backward (each
    tile holds its Mc rows and per-block sums in registers, (64, next_pow2(M)) fp32 each; measured up to 25)."""

    BT: int
    BS: int
    warps: int
    stages: int
    fit_short: bool = True
    tail: bool = False
    enabled: bool = True
    max_blocks: int = 64


@dataclass(frozen=True)
class MixVariant:
    """Fields that replace the mix kernel's settings for fp32 summaries; None keeps the kernel's own."""

    BX: Optional[int] = None
    warps: Optional[int] = None
    stages: Optional[int] = None


@dataclass(frozen=True)
class MixSettings:
    """mix_kernel (triton_mix.py). Each program walks every P-th column tile of its row tile, P chosen for
    per_sm programs per SM in all; BX summary columns per tile, acc // BM (the padded block count) clamped
    to 64 .. 256 unless BX is given; BK blocks per step when K = M*J > 64 (up to 64, K is one step).
    lowp: bf16 summaries (a bf16 forward that nothing differentiates) multiplied in bf16 (Mc rounded to bf16).
    fp32: replaces fields for fp32 summaries with exact products (fp32 inputs)."""

    acc: int
    BK: int
    per_sm: int
    warps: int
    stages: int
    lowp: bool = False
    BX: Optional[int] = None
    fp32: MixVariant = MixVariant()

    def for_inputs(self, fp32: bool = False) -> "MixSettings":
        return _replaced(self, self.fp32) if fp32 else self


SUM_METHODS = ("torch", "triton", "auto")


@dataclass(frozen=True)
class MixGradSettings:
    """mix_grad_kernel and part_sum_kernel (triton_mix.py): XT summary columns per program, BK per step.
    sum: how the per-program parts are added, "torch" (a reduction over the part axes), "triton"
    (part_sum_kernel, BR parts a step, BY outputs per program) or "auto" (triton when its launch has at
    least sum_programs programs)."""

    XT: int
    BK: int
    warps: int
    stages: int
    sum: str = "auto"
    sum_programs: int = 32
    BR: int = 16
    BY: int = 64

    def __post_init__(self):
        if self.sum not in SUM_METHODS:
            raise ValueError(f"mix_grad sum={self.sum!r} is not allowed: use one of {', '.join(SUM_METHODS)}")


Settings = Union[ChunkedSettings, DenseSettings, DenseSplitSettings, DenseGradSettings, MixSettings,
                 MixGradSettings]

# Each default is the fastest setting measured on an H200; the comments give the rule, and the measurements that
# decided it are in benchmarks/RESULTS.md, Kernel launch settings (the defaults' times) and its "Alternatives behind
# the defaults and rules" (what each replaced). lowp (apply, query_grad, key_grad, mix): products in the input
# dtype, faster than tf32 products of fp32 copies and within the bf16 error bound.
DEFAULTS: Mapping[str, Settings] = MappingProxyType({
    # prefetch pays where a step's loads are few (summary; apply and key_grad are slower with it). one_step: a
    # single token step (DiT-XL/2 512 px, 64-token blocks) gains nothing from pipelining the one load, so 1 stage.
    "summary": ChunkedSettings(TILE=128, BT=64, warps=8, stages=3, prefetch=True,
                               one_step=OneStepVariant(stages=1)),
    # fp32: exact products at the bf16 tiles fall back to 32 registers and spill (kernel_resources.py --fp32),
    # far slower than these tiles.
    "apply": ChunkedSettings(TILE=128, BT=64, warps=4, stages=3, lowp=True,
                             fp32=ChunkedVariant(BT=16, warps=8, stages=2)),
    # prefetch with 3 stages (2 without). One launch computes dq and dS~ together: splitting them (dS~ by a
    # second pass over q and g) is slower at every chunked shape.
    "query_grad": ChunkedSettings(TILE=128, BT=16, warps=4, stages=3, lowp=True, prefetch=True),
    # one_step: a single token step takes 8 warps and 1 stage; fp32: as apply's.
    "key_grad": ChunkedSettings(TILE=128, BT=64, warps=4, stages=3, lowp=True,
                                one_step=OneStepVariant(warps=8, stages=1),
                                fp32=ChunkedVariant(BT=16, TILE=32, warps=4, stages=2)),
    # (BT is capped at 64 for fp32 inputs: tiles.dense_settings)
    # short: at the class-to-image models' 196 tokens (D = 64, no gradients, rows filled as shipped) one tile of 256
    # rows, 3 stages, was the best over batches 2 to 128 taken together (geometric mean of time over each batch's
    # best); 1,024 tokens keep 128 rows (video-mhla, B = 2), hence short_tokens = 256.
    "dense": DenseSettings(BT=128, BS=64, warps=8, stages=2, onehot=True,
                           short=DenseVariant(BT=256, BS=64, warps=8, stages=3), short_tokens=256),
    # 256 queries and 64 keys per step: at DiT-XL/2 256 px the sweep's best with 16-byte aligned rows
    "dense_split": DenseSplitSettings(BT=256, BS=64, warps=8, stages=2),
    # 128 rows per program, 64 per step: the best forward + backward at DiT-XL/2 256 px, B = 8 and 64
    "dense_grad": DenseGradSettings(BT=128, BS=64, warps=8, stages=3),
    # Streaming over column tiles with 4 programs per SM (faster than one tile per program at Wan 480p and
    # DiT-XL/2 512 px). lowp: bf16 products in the mix, within the bf16 error bound; 4 stages is Wan 480p's
    # best. fp32: exact products over a one-step K spill registers at 4 warps (none with these).
    "mix": MixSettings(acc=4096, BK=16, per_sm=4, warps=4, stages=4, lowp=True,
                       fp32=MixVariant(BX=64, warps=8, stages=3)),
    # 512 columns and 64 blocks per step (faster than 1,024 and 32 at DiT-XL/2 512 px and SANA 4K).
    # part_sum_kernel beats torch's reduction once it has enough programs (Wan 480p: 57, SANA 4K: 64) and
    # loses with few (DiT-XL/2 512 px: 4), hence "auto" from 32.
    "mix_grad": MixGradSettings(XT=512, BK=64, warps=4, stages=3, sum="auto", sum_programs=32, BR=16, BY=64),
})
KERNELS = tuple(DEFAULTS)

_current: contextvars.ContextVar[Mapping[str, Settings]] = contextvars.ContextVar("mhla_launch_settings",
                                                                                   default=DEFAULTS)


def _check_kernel(kernel: str) -> None:
    if kernel not in DEFAULTS:
        raise ValueError(f"unknown MHLA kernel {kernel!r}: the kernels are {', '.join(KERNELS)}")


def kernel_settings(kernel: str) -> Settings:
    """The settings kernel ``kernel`` launches with here and now (the defaults unless overridden)."""
    _check_kernel(kernel)
    return _current.get()[kernel]


def current_settings() -> Mapping[str, Settings]:
    """Every kernel's settings in force here and now (a read-only mapping; ``use_settings`` restores it)."""
    return _current.get()


def _with_fields(kernel: str, settings, fields: dict):
    names = [f.name for f in dataclasses.fields(settings)]
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ValueError(f"MHLA kernel {kernel!r} has no launch setting {', '.join(map(repr, unknown))}: "
                         f"its settings are {', '.join(names)}")
    changes = {}
    for name, value in fields.items():
        old = getattr(settings, name)
        if dataclasses.is_dataclass(old) and isinstance(value, Mapping):  # a variant given as a dict
            value = _with_fields(f"{kernel}.{name}", type(old)(), dict(value))
        changes[name] = value
    return dataclasses.replace(settings, **changes)


@contextlib.contextmanager
def use_settings(settings: Mapping[str, Settings]) -> Iterator[None]:
    """Install a whole mapping from ``current_settings`` for the block (autograd's backward uses it)."""
    token = _current.set(settings)
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def launch_settings(kernel: str, **fields) -> Iterator[Settings]:
    """Launch ``kernel`` with these fields replaced, in this thread, for the duration of the block; yields the
    settings in force. A variant field (``fp32``, ``one_step``) takes its record or a dict, which replaces the
    whole variant (``one_step={}``: none). Unknown kernels or fields raise ValueError naming the allowed ones."""
    _check_kernel(kernel)
    table = _current.get()
    settings = _with_fields(kernel, table[kernel], fields)
    with use_settings(MappingProxyType({**table, kernel: settings})):
        yield settings
