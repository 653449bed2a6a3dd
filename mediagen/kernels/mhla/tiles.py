"""The MHLA Triton op's cost model and tiles: which forward algorithm (``choose_algorithm``), how many token
splits per block (``choose_splits``), and each kernel's tile constants from the launch settings in force
(settings.py). Pure functions of shapes, dtypes and settings: nothing here allocates or launches.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

from .settings import current_settings, kernel_settings



def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Plain Python: triton.next_power_of_2 and triton.cdiv are
    constexpr functions whose host calls cost microseconds each."""
    return 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@torch.compiler.assume_constant_result
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def summary_dtype(dtype, for_backward=True):
    """Storage dtype of the per-block summaries: S, z, the mixed S~, z~, and the backward's dS~, dz~, dS, dz.
    fp32 whenever a backward uses them. The gradients subtract nearly equal terms made of them (dq: S~ g and
    z~ (g.o); dMc: <dS~, S> and <dz~, z>; with non-negative v, S~ is close to z~ times the block's mean value),
    so their rounding comes back magnified: stored in bf16 they made dq errors of 4e-2 to 8e-2 and dMc errors
    over 3e-2 against fp64 with positive q, k and v. A bf16 forward that nothing differentiates
    (``for_backward=False``) stores bf16, half the bytes: the apply rounds S~ to bf16 for its products anyway.
    fp16 inputs store fp32 either way (fp16's range is too small for sums over a block)."""
    return torch.bfloat16 if dtype == torch.bfloat16 and not for_backward else torch.float32


def _lowp(name: str, dtype, settings=None) -> bool:
    """Whether kernel ``name`` multiplies half-precision inputs in their own dtype (never fp32, nor bf16 in
    the CPU interpreter, whose bf16 dot is wrong; its fp16 dot is exact products summed in fp32, as on the
    GPU). ``settings``: the table to read (default: the settings in force)."""
    c = kernel_settings(name) if settings is None else settings[name]
    return (getattr(c, "lowp", False) and dtype != torch.float32
            and not (dtype == torch.bfloat16 and _interpreting()))


def _prefetch(name: str) -> bool:
    """Whether chunked kernel ``name`` loads the next token step's ids during this step (``prefetch``)."""
    return kernel_settings(name).prefetch


def _chunked_tiles(c, D: int, fp32_rope: bool = False, tokens: Optional[int] = None, fp32: bool = False):
    """``_config`` for the settings record ``c`` of a chunked kernel."""
    c = c.for_inputs(fp32=fp32 or fp32_rope)
    BD = max(16, _next_pow2(D))
    if BD < 128 or (BD == 128 and not fp32_rope):
        BT = c.BT
    else:
        BT = min(c.BT, 16 if BD > 128 and fp32_rope else 32)
    # keep each program's D x TILE fp32 tiles within 128 x 128 (D = 256: 64 columns per program);
    # wider ones run out of shared memory on the H200 in fp32
    TILE = min(BD, c.TILE, 16384 // BD)
    warps, stages = c.one_step_launch() if tokens is not None and tokens <= BT else (c.warps, c.stages)
    return BD, TILE, BT, warps, stages


def _config(name: str, D: int, fp32_rope: bool = False, tokens: Optional[int] = None, fp32: bool = False):
    """(BD, TILE, BT, warps, stages) of a chunked kernel for head dim D (settings.py: its launch settings).
    ``fp32``: fp32 inputs, which take the kernel's ``fp32`` settings where it has them. ``fp32_rope``: fp32
    inputs with RoPE, whose rotated copies of the tiles need more shared memory (32-token steps from D=128,
    16 at D=256: key_grad's 32-token steps need 256 KiB there, `benchmarks/kernel_resources.py`).
    ``tokens``: the most tokens one program walks, when known; when that is one token step, the kernel's
    ``one_step`` warps and stages apply."""
    return _chunked_tiles(kernel_settings(name), D, fp32_rope, tokens, fp32)


@torch.compiler.assume_constant_result
def _apply_program_shape(D: int) -> tuple[int, int]:
    """(column tiles per block and head, tokens per step) of the apply kernel at head dim D under the settings in
    force. Traced code (torch.compile) calls it once and keeps the result: the settings live in a ContextVar,
    which Dynamo in torch 2.11 cannot read, and a read in traced code broke the graph at every MHLA layer
    (eight graphs and 43 CUDA-graph launches per forward of the video model under torch 2.11)."""
    BD, TILE, BT, _, _ = _config("apply", D)
    return BD // TILE, BT


@torch.compiler.assume_constant_result
def _dense_grad_max_blocks() -> int:
    """``DenseGradSettings.max_blocks`` in force, for ``choose_algorithm``, which traced code calls: kept as a
    constant there, as ``_apply_program_shape`` (Dynamo in torch 2.11 cannot read the settings' ContextVar)."""
    return kernel_settings("dense_grad").max_blocks


# MEDIAGEN_MHLA_SPLITS=J forces J token splits per block where a call leaves ``splits`` to the op; read once, at
# import (the op's plans are keyed without it: an environment lookup cost 0.6 us a call on the host)
FORCED_SPLITS = max(1, int(os.environ["MEDIAGEN_MHLA_SPLITS"])) if os.environ.get("MEDIAGEN_MHLA_SPLITS") else None


def choose_splits(B, H, M, largest_block, D, device) -> int:
    """Token splits per block, only when the chunked kernels would launch fewer programs than
    there are SMs (few heads and blocks, e.g. global linear attention): splits are slower whenever B*H*M alone
    fills the GPU, more summaries to write and mix (measured: benchmarks/RESULTS.md, Kernel launch settings,
    dropped).
    ``FORCED_SPLITS``, when set, instead."""
    if FORCED_SPLITS is not None:
        return FORCED_SPLITS
    if device.type != "cuda":
        return 1
    columns, BT = _apply_program_shape(D)
    programs = B * H * M * columns
    want = math.ceil(_num_sms(device.index or 0) / programs)
    return max(1, min(want, math.ceil(largest_block / (2 * BT))))


# Host seconds per launch charged by ``choose_algorithm``. Eager, the host issues every launch on every call, and
# the chunked forward also allocates the summaries it writes; at the video model's sampling shape the dense forward
# made an eager forward pass faster although its GPU time was longer (measured: benchmarks/RESULTS.md, Alternatives
# behind the defaults and rules). Traced code (torch.compile, CUDA graphs) launches from generated code or replays a
# graph, so there the GPU time decides.
EAGER_LAUNCH_S, TRACED_LAUNCH_S = 20e-6, 5e-6


def choose_algorithm(B, N, H, D, M, splits, dtype, rope=False, for_backward=True, launch_s=TRACED_LAUNCH_S) -> str:
    """Cost model in seconds on an H200-class GPU: bytes at ~3 TB/s, dense dot work at ~150 TFLOP/s,
    ``launch_s`` per launch (chunked runs summary, mix and apply). With rope the dense kernel does a
    third dot (the un-rotated scores) and both read the angle tables. ``for_backward``: a backward follows, so
    without rope the forward and backward are costed together: the chunked pair moves its summaries about 11
    times (S, S~, dS~, dS written and read; 9 launches), the dense pair does the forward's two token-pair
    products and the backward's seven (three launches) at ~140 TFLOP/s over key tiles of 64 (calibrated on the
    H200 rows of benchmarks/RESULTS.md, Forward + backward at training shapes: the dense backward).
    With rope (or over ``DenseGradSettings.max_blocks`` blocks) the dense forward's backward is the chunked one, so
    only the forwards are compared."""
    es = 4 if dtype == torch.float32 else 2
    ss = summary_dtype(dtype, for_backward).itemsize
    BD = sum(dense_head_pieces(D, not rope))
    io = (4 + (2 if rope else 0)) * B * N * H * D * es
    summaries = ss * B * H * M * splits * (D * D + D)
    if for_backward and not rope and M <= _dense_grad_max_blocks():
        padded = _cdiv(N, 64) * 64
        chunked = (2 * io + 11 * summaries) / 3e12 + 9 * launch_s
        dense = 2 * io / 3e12 + 18 * B * H * padded * padded * BD / 140e12 + 3 * launch_s
    else:
        chunked = (io + 4 * summaries) / 3e12 + 3 * launch_s
        dense = io / 3e12 + (6 if rope else 4) * B * H * N * N * BD / 150e12 + launch_s
    return "dense" if dense < chunked else "chunked"


def _tokens_per_program(largest, J, dtype):
    """The most tokens one program walks (blocks of at most ``largest`` in J splits), for ``_config``'s
    one_step settings; None for fp32 inputs, whose wider tiles those settings were not measured with (and
    with RoPE spill registers, `benchmarks/kernel_resources.py`)."""
    return None if largest is None or dtype == torch.float32 else -(-largest // J)


def fill_rows(BT: int, warps: int, BH: int, N: int, sms: Optional[int]) -> tuple[int, int]:
    """The dense forward's query rows per program and warps for a launch of ``BH`` batch x heads over ``N``
    tokens: while it has fewer programs than half the SMs, halve the rows (to 16 at the least; halved below 128
    rows, 4 warps at most; a launch that fills the GPU as set keeps its rows and warps). At a small batch the set
    tiles leave most SMs idle: at image-mhla's sampling (B = 2, 196 tokens, 3 heads) 78 programs of 16 rows are
    faster than 12 of 128 (measured: benchmarks/RESULTS.md, Kernel launch settings, the dense forward fills the
    GPU). ``sms`` None (no GPU): as set."""
    if sms is None:
        return BT, warps
    rows = BT
    while rows > 16 and BH * _cdiv(N, rows) < sms // 2:
        rows //= 2
    return (BT, warps) if rows == BT else (rows, min(warps, 4) if rows < 128 else warps)


def _sms_of(device) -> Optional[int]:
    return _num_sms(device.index or 0) if device.type == "cuda" and not _interpreting() else None


def dense_tail(N: int, BS: int, width: int, fp32: bool) -> int:
    """The keys (the dense backward: rows) of the dense kernels' last step when fewer than BS: N % BS rounded up to
    a power of two (16 at least; 0 when that is BS or N is a multiple of BS). The full steps then stop at the last
    multiple of BS. Half-precision inputs with head-dim tiles of at most 128 columns (``width``, both pieces), where
    it was measured; other inputs keep whole steps. At image-mhla's 196 tokens (64-key steps) the last step reads 16
    keys instead of 64, which is faster at every batch measured (benchmarks/RESULTS.md, Kernel launch settings, the
    last keys in a narrower step)."""
    rest = N % BS
    if fp32 or width > 128 or not rest:
        return 0
    tail = max(16, _next_pow2(rest))
    return tail if tail < BS else 0


def _cpe_pays(grid: tuple, sms: Optional[int]) -> bool:
    """Whether the dense forward adds the CPE itself: while its launch has no more programs than the GPU has SMs.
    Such a launch is bound by each program's latency and the taps' loads hide in it; a launch of several waves
    pays their L2 traffic (nine re-reads of v per tile); measured at image-mhla's 196 tokens: benchmarks/RESULTS.md,
    Kernel launch settings, the CPE in the dense forward's epilogue. Without a GPU (the interpreter) always."""
    return sms is None or grid[0] * grid[1] <= sms


def dense_grad_tiles(settings, D: int, dtype, N: Optional[int] = None) -> dict:
    """The dense backward's tile constants: the head-dim pieces as the forward's (no padding column), BT rows
    per program and BS per step (at most 32 each for fp32 inputs, whose tiles are twice as wide), warps and
    stages. ``N`` (None: a long sequence): a sequence shorter than a tile takes tiles of N rounded up to a power
    of two (16 at least), so that each walk is one whole step, without a tail step or a loop that runs no
    step, and with no software pipelining (one stage: a single step has nothing to prefetch). The last step of a
    longer walk is a whole masked one unless the ``tail`` setting is on (settings.DenseGradSettings says why)."""
    c = settings["dense_grad"]
    fp32 = dtype == torch.float32
    BD, BD2 = dense_head_pieces(D, False) if not fp32 else (max(16, _next_pow2(D)), 0)
    BT, BS = (min(c.BT, 32), min(c.BS, 32)) if fp32 or BD > 128 else (c.BT, c.BS)
    stages = c.stages
    if fp32 and BD > 128:
        # fp32 tiles of 256 columns (head dims 129-256): 32 rows and 32 per step with 3 stages ask for more shared
        # memory than the H200 has, and spill; 16 and 16 with 2 stages fit (benchmarks/kernel_resources.py's
        # compile, sm_90a; benchmarks/RESULTS.md, Kernel launch settings, dense_grad fp32)
        BT, BS, stages = min(BT, 16), min(BS, 16), min(stages, 2)
    warps = c.warps
    if c.fit_short and N is not None and N < max(BT, BS):
        short = max(16, _next_pow2(N))
        BT, BS = min(BT, short), min(BS, short)
        if BS >= N:
            stages = 1
        if BT < 128:  # (as the dense forward's fill rule: 4 warps at most below 128 rows)
            warps = min(warps, 4)
    return dict(BD=BD, BD2=BD2, BT=BT, BS=BS, warps=warps, stages=stages)


def _dense_backward(keep: bool, rope: bool, M: int, settings=None) -> bool:
    """Whether a dense forward's backward is the dense one (else the chunked kernels, the summaries made again):
    with a backward to come, without RoPE, the dense backward ``enabled`` and up to its ``max_blocks`` blocks in
    ``settings`` (a table from ``current_settings``; default: the one in force). Its forward then keeps what it
    reads (``_run_dense``, when normalised)."""
    grad = (settings or current_settings())["dense_grad"]
    return keep and grad.enabled and not rope and M <= grad.max_blocks


def dense_head_pieces(D: int, den_col: bool) -> tuple[int, int]:
    """(BD, BD2): the dense kernel's head-dim tiles. One power-of-two tile of next_pow2(D) columns, or
    two (BD = the largest power of two below D, BD2 the rest rounded up) when the two are narrower:
    72 with a denominator column as 64 + 16 instead of 128. ``den_col``: one padding column is needed."""
    width = max(16, _next_pow2(D))
    if D <= 16 or D == width or width > 128:  # (wider: the 32-query tiles of BD = 256 stay as they are)
        return width, 0
    first = max(16, _next_pow2(D) // 2)
    rest = max(16, _next_pow2(D - first + den_col))
    return (first, rest) if first + rest < width else (width, 0)


def _dense_tiles(settings, D: int, dtype, rope: bool, normalize: bool, N: Optional[int] = None) -> dict:
    """``dense_settings`` for the settings table ``settings``."""
    # the short tiles were measured in half precision without RoPE: rotated copies double a tile's registers, and
    # three stages of fp32 tiles ask for more shared memory than an H100 or H200 has (238,080 bytes at D = 72)
    c = settings["dense"].for_tokens(None if rope or dtype == torch.float32 else N)
    den_col = normalize and not rope
    fp32 = dtype == torch.float32
    # two head-dim tiles for half-precision inputs only: fp32 tiles in two pieces spill registers
    # (`benchmarks/kernel_resources.py --head-dim 72 --dense-variants`), and fp32 is not the fast path
    BD, BD2 = dense_head_pieces(D, den_col) if not fp32 else (max(16, _next_pow2(D)), 0)
    BT = 32 if BD > 128 else (min(c.BT, 64) if fp32 else c.BT)
    # fp32 with rope keeps rotated and plain copies of both tiles: 64-key steps overflow shared memory at D=128
    # and 32-key steps at D=256 (234 KiB; 16 keys: 150 KiB, `benchmarks/kernel_resources.py --dense-variants`)
    if BD < 128 or (BD == 128 and not (rope and fp32)):
        BS = c.BS
    else:
        BS = 16 if BD > 128 and rope and fp32 else 32
    warps, stages = c.warps, c.stages
    if BD2:  # both pieces below 128 columns: settings of their own
        split = settings["dense_split"]
        BT, BS, warps, stages = split.BT, split.BS, split.warps, split.stages
        if rope:  # its rotated copies: 64-key steps spill 264 bytes at D = 72 (32: 8; kernel_resources.py)
            BS = min(BS, 32)
    return dict(BD=BD, BD2=BD2, BT=BT, BS=BS, DEN_COL=den_col and D < BD + BD2,
                warps=warps, stages=stages)


def dense_settings(D: int, dtype, rope: bool, normalize: bool, N: Optional[int] = None) -> dict:
    """The dense kernel's tile constants for these inputs (``N`` tokens; None: a long sequence): the head-dim
    tiles BD (+ BD2), queries BT and keys BS per step, DEN_COL (the denominator as a padding column of v, where
    there is one), and the launch's warps and stages."""
    return _dense_tiles(current_settings(), D, dtype, rope, normalize, N)
