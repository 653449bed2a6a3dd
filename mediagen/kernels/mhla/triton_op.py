"""MHLA on the Triton kernels.

Two entry points share one implementation (``forward_impl`` / ``backward_impl``):
- eager: a torch.autograd.Function (``_MHLAFunction``), the lowest per-call overhead;
- under torch.compile: torch.library custom ops ``mediagen::mhla_fwd`` / ``mediagen::mhla_bwd`` with
  fake implementations and registered autograd, so compiled models trace through without breaks.

Two forward algorithms (``algorithm``): "chunked" (per-block summaries in memory, mixed by a matmul;
long sequences) and "dense" (summaries recomputed on chip; short sequences); "auto" picks by a cost
model. The backward of a chunked forward runs the chunked kernels on the summaries it kept; after the dense
forward (no RoPE, one process) the dense backward's two kernels make every gradient the same way, dMc included,
from each query's 1 / den and o's bf16 rounding, which that forward keeps when a backward is to come
(triton_dense_grad.py; with RoPE the chunked backward makes the summaries again).
``cos``/``sin`` (N, D/2) angle tables turn on RoPE on the numerator's features (rotation.py).

The chunked forward and the backward are one sequence of steps (``_Plan.forward`` / ``_Plan.backward``)
for the single-process op and for sequence parallelism: given a ``BlockExchange`` (exchange.py), a process
holding some of the blocks calls it where the processes' parts meet (the summaries after ``summary``, the
partial dS after the transposed mix) and mixes only its rows of Mc. Without one, the launches are the
single-process op's and nothing more.

Launch plans. At small shapes (DiT-XL/2 at 256 px: 16 us of GPU work per forward) the host's time per call
decides the speed, so everything a launch needs that follows from the call's shapes, strides, dtypes, options
and launch settings (algorithm, token splits, tile sizes, grids, stride units, index tensors) is worked out
once into a ``_Plan`` and looked up by those keys on later calls (``_plan``). A call then only allocates its
outputs and launches. ``launch_*`` are the same launches for callers outside the op (sequence parallelism,
benchmarks): they read the launch settings in force and cache their launch records the same way.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional

import torch

from .checks import FEATURE_CODES
from .layout import block_token_lists, kept_on, persistent_copy, token_block_ids
from .settings import current_settings, kernel_settings
from .triton_chunked import apply_kernel, key_grad_kernel, query_grad_kernel, summary_kernel
from .triton_dense import dense_forward_kernel
from .triton_dense_grad import dense_key_grad_kernel, dense_query_grad_kernel
from .triton_mix import mix_grad_kernel, mix_kernel, part_sum_kernel
from ..launch import CachedLaunch
from ..switches import empty_output as _empty

ALGORITHMS = ("auto", "chunked", "dense")
# Plans and launch records kept at most (an entry is a few hundred bytes plus, for plans, the small index
# tensors of their grid); past this the cache starts over.
MAX_CACHED = 1024
# Traced code without a backward launches the dense forward from Inductor's own code (``mhla_dense``)
TRACED_DENSE_OP = True
# The dense forward's backward on the dense kernels (False: the chunked backward, making the summaries again;
# kept for A/B measurements)
DENSE_BACKWARD = True
# The dense backward holds each tile's Mc rows and per-block sums in registers ((64, next_pow2(M)) fp32 each); it
# was measured up to 25 blocks, and more than 64 take the chunked backward
DENSE_BACKWARD_MAX_BLOCKS = 64


def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Plain Python: triton.next_power_of_2 and triton.cdiv are
    constexpr functions whose host calls cost microseconds each."""
    return 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _new(shape, like, dtype):
    return _empty(shape, like.device, dtype)


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


# MEDIAGEN_MHLA_SPLITS=J forces J token splits per block where a call leaves ``splits`` to the op; read once, at
# import (the op's plans are keyed without it: an environment lookup cost 0.6 us a call on the host)
FORCED_SPLITS = max(1, int(os.environ["MEDIAGEN_MHLA_SPLITS"])) if os.environ.get("MEDIAGEN_MHLA_SPLITS") else None


def choose_splits(B, H, M, largest_block, D, device) -> int:
    """Token splits per block, only when the chunked kernels would launch fewer programs than
    there are SMs (few heads and blocks, e.g. global linear attention): on the H200 the sweep
    measured splits as slower whenever B*H*M alone fills the GPU (more summaries to write and mix).
    ``FORCED_SPLITS``, when set, instead."""
    if FORCED_SPLITS is not None:
        return FORCED_SPLITS
    if device.type != "cuda":
        return 1
    columns, BT = _apply_program_shape(D)
    programs = B * H * M * columns
    want = math.ceil(_num_sms(device.index or 0) / programs)
    return max(1, min(want, math.ceil(largest_block / (2 * BT))))


# Host seconds per launch charged by ``choose_algorithm``. Eager, the host issues every launch on every call: a
# direct launch took 11-18 us on the H200 machine's host, and the chunked forward also allocates the summaries
# it writes; at the video model's sampling shape (B = 2, 1,024 tokens, 6 x 64, 16 blocks) the dense forward
# made an eager forward pass 1.8 ms faster over 8 layers (median of 10 interleaved rounds) although its GPU time
# was 0.18 ms longer. Traced code (torch.compile, CUDA graphs) launches from generated code or replays a graph,
# so there the GPU time decides.
EAGER_LAUNCH_S, TRACED_LAUNCH_S = 20e-6, 5e-6


def choose_algorithm(B, N, H, D, M, splits, dtype, rope=False, for_backward=True, launch_s=TRACED_LAUNCH_S) -> str:
    """Cost model in seconds on an H200-class GPU: bytes at ~3 TB/s, dense dot work at ~150 TFLOP/s,
    ``launch_s`` per launch (chunked runs summary, mix and apply). With rope the dense kernel does a
    third dot (the un-rotated scores) and both read the angle tables. ``for_backward``: a backward follows, so
    without rope the forward and backward are costed together: the chunked pair moves its summaries about 11
    times (S, S~, dS~, dS written and read; 9 launches), the dense pair does the forward's two token-pair
    products and the backward's seven (three launches) at ~140 TFLOP/s over key tiles of 64 (calibrated on the
    H200, bf16: DiT-XL/2 256 px B = 8 and 64, the image models' 196 tokens at B = 256; benchmarks/RESULTS.md).
    With rope (or over ``DENSE_BACKWARD_MAX_BLOCKS`` blocks) the dense forward's backward is the chunked one, so only
    the forwards are compared."""
    es = 4 if dtype == torch.float32 else 2
    ss = summary_dtype(dtype, for_backward).itemsize
    BD = sum(dense_head_pieces(D, not rope))
    io = (4 + (2 if rope else 0)) * B * N * H * D * es
    summaries = ss * B * H * M * splits * (D * D + D)
    if for_backward and not rope and M <= DENSE_BACKWARD_MAX_BLOCKS:
        padded = _cdiv(N, 64) * 64
        chunked = (2 * io + 11 * summaries) / 3e12 + 9 * launch_s
        dense = 2 * io / 3e12 + 18 * B * H * padded * padded * BD / 140e12 + 3 * launch_s
    else:
        chunked = (io + 4 * summaries) / 3e12 + 3 * launch_s
        dense = io / 3e12 + (6 if rope else 4) * B * H * N * N * BD / 150e12 + launch_s
    return "dense" if dense < chunked else "chunked"


_blk_cache: dict = {}


def _rope_args(cos, sin, like):
    """Kernel arguments for the angle tables: (COS, SIN), their strides, and the ROPE flag."""
    if cos is None:
        return (like, like), (0, 0, 0, 0), False
    return (cos, sin), (*cos.stride(), *sin.stride()), True


def _table_strides(cos, sin):
    """The angle tables' strides as the kernels take them, or None without RoPE (a cache key part)."""
    return None if cos is None else (*cos.stride(), *sin.stride())


def _token_blocks_int32(grid, blocks, device):
    key = (tuple(grid), tuple(blocks), str(device))
    hit = _blk_cache.get(key)
    if hit is None:
        hit = _blk_cache[key] = persistent_copy(token_block_ids(grid, blocks).to(torch.int32), device)
    return hit


def _stride_unit_of(*strides) -> int:
    """``stride_unit`` of tensors given by their strides."""
    g = 0
    for st in strides:
        for s in st[:3]:
            if s >= 2**31:
                return 1
            g = math.gcd(g, s)
    return 16 if g == 0 else min(16, g & -g)


def stride_unit(*tensors) -> int:
    """The largest power of two up to 16 that divides every batch, token and head stride of these
    (B, N, H, D) tensors. The kernels take those strides divided by it (``row_strides``) and multiply them
    back by it as a compile-time constant (AL), so the compiler knows where rows may start: Triton marks a
    run-time int only as 16-divisible or not, and DiT's head stride 72 is not (triton_chunked.py).
    1 when a stride needs 64 bits: divided, it could arrive as a 32-bit int and overflow when multiplied back."""
    return _stride_unit_of(*(t.stride() for t in tensors))


def _row_strides_of(stride, unit):
    b, n, h, d = stride
    return b // unit, n // unit, h // unit, d


def row_strides(t, unit):
    """(batch, token, head strides divided by ``unit``, head-dim stride) of a (B, N, H, D) tensor."""
    return _row_strides_of(t.stride(), unit)


def _contiguous(shape) -> tuple:
    """Strides of a contiguous tensor of ``shape`` (the outputs the launchers allocate)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _tokens_per_program(largest, J, dtype):
    """The most tokens one program walks (blocks of at most ``largest`` in J splits), for ``_config``'s
    one_step settings; None for fp32 inputs, whose wider tiles those settings were not measured with (and
    with RoPE spill registers, `benchmarks/kernel_resources.py`)."""
    return None if largest is None or dtype == torch.float32 else -(-largest // J)


def _cached(cache: dict, key, build):
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= MAX_CACHED:
            cache.clear()
        hit = cache[key] = build()
    return hit


# ---- launch records: pure functions of shapes, strides, dtypes, options and one settings table -----------

def _summary_launch(settings, shape, dtype, k_stride, v_stride, tstrides, M, J, fcode, largest) -> CachedLaunch:
    B, N, H, D = shape
    fp32 = dtype == torch.float32
    rope = tstrides is not None
    BD, TILE, BT, warps, stages = _chunked_tiles(settings["summary"], D, rope and fp32,
                                                 _tokens_per_program(largest, J, dtype), fp32=fp32)
    X = D * D + D
    al = _stride_unit_of(k_stride, v_stride)
    return CachedLaunch(
        (B * H, M * J, _cdiv(D, TILE)),
        (*_row_strides_of(k_stride, al), *_row_strides_of(v_stride, al), *(tstrides or (0, 0, 0, 0)),
         H, M * J, J, D, X),
        dict(BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, DOT_F32=fp32 or _interpreting(), IEEE=fp32, ROPE=rope, AL=al,
             PREFETCH=settings["summary"].prefetch, num_warps=warps, num_stages=stages))


def _mix_launch(settings, a_shape, a_stride, src_shape, src_dtype, J, ieee, transpose, column_programs,
                device) -> tuple:
    """(launch, (B, H, rows, X)) of mix_kernel: A is Mc (``a_shape``, fp32 with strides ``a_stride``) or its
    transpose."""
    B, H, K, X = src_shape
    M = a_shape[-1] if transpose else a_shape[-2]  # A's rows
    sah = a_stride[0] if len(a_shape) == 3 else 0
    sai, saj = a_stride[-2], a_stride[-1]
    if transpose:
        sai, saj = saj, sai
    c = settings["mix"].for_inputs(fp32=ieee)
    BM = min(64, max(16, _next_pow2(M)))
    one_k = K <= 64
    BK = max(16, _next_pow2(K)) if one_k else c.BK
    BX = c.BX or min(256, max(64, c.acc // BM))  # (an explicit BX: fp32's, or the sweep's)
    row_tiles, col_tiles = _cdiv(M, BM), _cdiv(X, BX)
    if column_programs is None:
        sms = _num_sms(device.index or 0) if device.type == "cuda" else 1
        column_programs = _cdiv(c.per_sm * sms, B * H * row_tiles)
    P = min(column_programs, col_tiles)
    launch = CachedLaunch(
        (B * H, P, row_tiles), (sah, sai, saj, H, M, K, J, P, X),
        dict(BM=BM, BK=BK, BX=BX, ONE_K=one_k, IEEE=ieee, LOWP=_lowp("mix", src_dtype, settings) and not ieee,
             num_warps=c.warps, num_stages=c.stages))
    return launch, (B, H, M, X)


class _MixGradLaunch(NamedTuple):
    products: CachedLaunch
    part_shape: tuple
    torch_sum: Optional[tuple]  # the part axes summed by torch, or None: part_sum_kernel adds them
    sum_launch: Optional[CachedLaunch]
    out_shape: tuple


def _mix_grad_launch(settings, shape, per_head, ieee) -> _MixGradLaunch:
    B, H, M, X = shape
    c = settings["mix_grad"]
    XT = c.XT
    NT = _cdiv(X, XT)
    BM = min(64, max(16, _next_pow2(M)))
    products = CachedLaunch((B * H, NT, _cdiv(M, BM) ** 2), (M, X, NT, XT),
                       dict(BM=BM, BK=c.BK, IEEE=ieee, num_warps=c.warps, num_stages=c.stages))
    groups, rows, heads = (B, NT, H) if per_head else (1, B * H * NT, 1)
    grid = (_cdiv(M * M, c.BY), heads)
    out_shape = (H, M, M) if per_head else (M, M)
    if c.sum == "torch" or (c.sum == "auto" and grid[0] * heads < c.sum_programs):
        return _MixGradLaunch(products, (B, H, NT, M, M), (0, 2) if per_head else (0, 1, 2), None, out_shape)
    total = CachedLaunch(grid, (groups, rows, H * NT, NT if per_head else 0, M * M), dict(BR=c.BR, BY=c.BY))
    return _MixGradLaunch(products, (B, H, NT, M, M), None, total, out_shape)


def _apply_launch(settings, shape, dtype, q_stride, tstrides, M, J, normalize, eps, scale, fcode,
                  fp32_out=False) -> CachedLaunch:
    """``fp32_out``: o in fp32 from fp32 products of fp32 copies (tf32 on the GPU) whatever the input dtype,
    with the fp32 tiles (for the backward, ``_query_grad_launch``)."""
    B, N, H, D = shape
    fp32 = dtype == torch.float32 or fp32_out
    rope = tstrides is not None
    BD, TILE, BT, warps, stages = _chunked_tiles(settings["apply"], D, rope and fp32, fp32=fp32)
    o_stride = _contiguous(shape)
    al = _stride_unit_of(q_stride, o_stride)
    return CachedLaunch(
        (B * H, M * J, _cdiv(D, TILE)),
        (*_row_strides_of(q_stride, al), *_row_strides_of(o_stride, al), *(tstrides or (0, 0, 0, 0)), H, M, J, D,
         D * D + D, eps, scale),
        dict(BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=dtype == torch.float32,
             LOWP=_lowp("apply", dtype, settings) and not fp32_out, ROPE=rope, AL=al,
             PREFETCH=settings["apply"].prefetch, num_warps=warps, num_stages=stages))


def fill_rows(BT: int, warps: int, BH: int, N: int, sms: Optional[int]) -> tuple[int, int]:
    """The dense forward's query rows per program and warps for a launch of ``BH`` batch x heads over ``N``
    tokens: while it has fewer programs than half the SMs, halve the rows (to 16 at the least; halved below 128
    rows, 4 warps at most; a launch that fills the GPU as set keeps its rows and warps). At a small batch the set tiles leave most SMs idle: image-mhla's sampling (B = 2, 196 tokens, 3
    heads) ran 12 programs of 128 rows in 7.7 us, 78 programs of 16 rows take 6.1 (cuDNN 7.4); at B = 8 96 of 64
    rows 7.4 against 7.9 (H200, ``benchmarks.sweep_mhla --dense --shipped``). ``sms`` None (no GPU): as set."""
    if sms is None:
        return BT, warps
    rows = BT
    while rows > 16 and BH * _cdiv(N, rows) < sms // 2:
        rows //= 2
    return (BT, warps) if rows == BT else (rows, min(warps, 4) if rows < 128 else warps)


def _sms_of(device) -> Optional[int]:
    return _num_sms(device.index or 0) if device.type == "cuda" and not _interpreting() else None


def _dense_launch(settings, shape, dtype, strides, tstrides, M, per_head, normalize, eps, scale, fcode,
                  sms: Optional[int] = None, save: bool = False, cpe: Optional[tuple] = None) -> CachedLaunch:
    """``strides``: those of q, k, v. ``sms``: the GPU's SM count, for ``fill_rows`` (with the dense settings'
    ``fill``). ``save``: the launch keeps what the dense backward reads (``_run_dense``). ``cpe``: None, or
    ((G0, G1, G2), (K0, K1, K2), has_bias) to add the layer's CPE to o (``cpe_form``)."""
    B, N, H, D = shape
    rope = tstrides is not None
    tiles = _dense_tiles(settings, D, dtype, rope, normalize, N)
    warps, stages = tiles.pop("warps"), tiles.pop("stages")
    if settings["dense"].fill:
        tiles["BT"], warps = fill_rows(tiles["BT"], warps, B * H, N, sms)
    ieee = dtype == torch.float32
    o_stride = _contiguous(shape)
    al = _stride_unit_of(*strides, o_stride)
    rows = tuple(s for st in (*strides, o_stride) for s in _row_strides_of(st, al))
    (_, G1, G2), (K0, K1, K2), bias = cpe or ((1, 1, 1), (0, 1, 1), False)
    tiles["TAIL"] = dense_tail(N, tiles["BS"], tiles["BD"] + tiles["BD2"], dtype == torch.float32)
    return CachedLaunch(
        (B * H, _cdiv(N, tiles["BT"])),
        (*rows, *(tstrides or (0, 0, 0, 0)), N, H, D, M, M * M if per_head else 0, eps, scale, G1, G2),
        dict(**tiles, BM=max(16, _next_pow2(M)), ONEHOT=settings["dense"].onehot and M <= 128, FEATURE=fcode,
             NORMALIZE=normalize, DOT_F32=ieee or _interpreting(), IEEE=ieee, ROPE=rope, AL=al, SAVE=save,
             LO_PART=save and not ieee, CK0=K0, CK1=K1, CK2=K2, CPE_BIAS=bias, num_warps=warps, num_stages=stages))


def dense_tail(N: int, BS: int, width: int, fp32: bool) -> int:
    """The keys (the dense backward: rows) of the dense kernels' last step when fewer than BS: N % BS rounded up to
    a power of two (16 at least; 0 when that is BS or N is a multiple of BS). The full steps then stop at the last
    multiple of BS. Half-precision inputs with head-dim tiles of at most 128 columns (``width``, both pieces), where
    it was measured; other inputs keep whole steps. At image-mhla's 196 tokens (64-key steps) the last step reads 16
    keys instead of 64: the forward 32.2 against 34.6 us at B = 128, 10.7 against 11.8 at B = 32, 7.0 against 7.8 at
    B = 8 (H200, bf16, CUDA graph; benchmarks/RESULTS.md, kernel launch settings)."""
    rest = N % BS
    if fp32 or width > 128 or not rest:
        return 0
    tail = max(16, _next_pow2(rest))
    return tail if tail < BS else 0


def _cpe_pays(grid: tuple, sms: Optional[int]) -> bool:
    """Whether the dense forward adds the CPE itself: while its launch has no more programs than the GPU has SMs.
    Such a launch is bound by each program's latency and the taps' loads hide in it; a launch of several waves
    pays their L2 traffic (nine re-reads of v per tile). H200, image-mhla's 196 tokens, bf16: at B = 2 and 8 the
    dense forward with the taps took 8.27 / 11.29 us against 8.92 / 11.13 for it and the CPE kernel, at B = 128
    (384 programs) 66.2 against 54.9. Without a GPU (the interpreter) always."""
    return sms is None or grid[0] * grid[1] <= sms


def cpe_form(weight, bias, grid, channels: int) -> tuple:
    """((G0, G1, G2), (K0, K1, K2), has_bias) of a CPE that the dense forward adds to o: a depthwise kernel
    ``weight`` (channels, 1, *k) with one odd size per axis of ``grid``, ``bias`` (channels,) or None. Raises
    ValueError naming what is not allowed."""
    from ..cpe import check_cpe_args

    n = math.prod(grid)
    like = torch.empty((1, n, channels), device="meta")
    g3, k3 = check_cpe_args(like, like, weight, bias, grid)
    return g3, k3, bias is not None


def dense_grad_tiles(settings, D: int, dtype, N: Optional[int] = None) -> dict:
    """The dense backward's tile constants: the head-dim pieces as the forward's (no padding column), BT rows
    per program and BS per step (at most 32 each for fp32 inputs, whose tiles are twice as wide), warps and
    stages. ``N`` (None: a long sequence): a sequence shorter than a tile takes tiles of N rounded up to a power
    of two (16 at least), so that each walk is one whole step, without a tail step or a loop that runs no
    step, and with no software pipelining (one stage: a single step has nothing to prefetch). The set tiles
    there gave wrong gradients in half precision on the H200 (triton 3.6; N = 29, D = 96, BT = 128, a 32-key
    tail after a loop of no steps, 3 stages: dq 0.47 off fp64, dMc 0.2 and once garbage) while Triton's
    interpreter computed the same launch right."""
    c = settings["dense_grad"]
    fp32 = dtype == torch.float32
    BD, BD2 = dense_head_pieces(D, False) if not fp32 else (max(16, _next_pow2(D)), 0)
    BT, BS = (min(c.BT, 32), min(c.BS, 32)) if fp32 or BD > 128 else (c.BT, c.BS)
    stages = c.stages
    if fp32 and BD > 128:
        # fp32 tiles of 256 columns (head dims 129-256): 32 rows and 32 per step with 3 stages ask for 237,824 bytes
        # of shared memory (the H200 has 232,448) and spill 15 KB; 16 and 16 with 2 stages take 85,056 and spill
        # 416-648 bytes (benchmarks/kernel_resources.py's compile, sm_90a)
        BT, BS, stages = min(BT, 16), min(BS, 16), min(stages, 2)
    warps = c.warps
    if N is not None and N < max(BT, BS):
        short = max(16, _next_pow2(N))
        BT, BS = min(BT, short), min(BS, short)
        if BS >= N:
            stages = 1
        if BT < 128:  # (as the dense forward's fill rule: 4 warps at most below 128 rows)
            warps = min(warps, 4)
    return dict(BD=BD, BD2=BD2, BT=BT, BS=BS, warps=warps, stages=stages)


def _dense_backward(keep: bool, rope: bool, M: int) -> bool:
    """Whether a dense forward's backward is the dense one (else the chunked kernels, the summaries made again):
    with a backward to come, without RoPE, up to ``DENSE_BACKWARD_MAX_BLOCKS`` blocks, ``DENSE_BACKWARD`` on. Its
    forward then keeps what it reads (``_run_dense``, when normalised)."""
    return keep and DENSE_BACKWARD and not rope and M <= DENSE_BACKWARD_MAX_BLOCKS


class _DenseGradLaunch(NamedTuple):
    query: CachedLaunch  # dq, each row's g.o, and the dMc parts
    key: CachedLaunch  # dk and dv
    parts: tuple  # the dMc parts' shape (B, H, query tiles, M, M)


def _dense_grad_launch(settings, shape, dtype, strides, M, per_head, normalize, eps, scale,
                       fcode) -> _DenseGradLaunch:
    """``strides``: those of q, k, v and the incoming gradient."""
    B, N, H, D = shape
    tiles = dense_grad_tiles(settings, D, dtype, N)
    warps, stages, BT = tiles.pop("warps"), tiles.pop("stages"), tiles["BT"]
    ieee = dtype == torch.float32
    own = _contiguous(shape)  # dq, dk, dv
    al = _stride_unit_of(*strides, own)
    rows = tuple(s for st in (*strides, own) for s in _row_strides_of(st, al))
    consts = dict(**tiles, BM=max(16, _next_pow2(M)), FEATURE=fcode, NORMALIZE=normalize,
                  DOT_F32=ieee or _interpreting(), IEEE=ieee, AL=al,
                  TAIL=dense_tail(N, tiles["BS"], tiles["BD"] + tiles["BD2"], ieee),
                  num_warps=warps, num_stages=stages)
    head = M * M if per_head else 0
    return _DenseGradLaunch(
        CachedLaunch((B * H, _cdiv(N, BT)), (*rows, N, H, D, M, head, scale),
                     dict(consts, LO_PART=normalize and not ieee)),
        CachedLaunch((B * H, _cdiv(N, BT)), (*rows, N, H, D, M, head, scale), consts),
        (B, H, _cdiv(N, BT), M, M))


class _QueryGradLaunch(NamedTuple):
    main: CachedLaunch
    o_fp32: Optional[CachedLaunch]  # an apply that makes o again in fp32 first, or None: the forward's o serves


def _query_grad_launch(settings, shape, dtype, q_stride, g_stride, tstrides, M, J, normalize, eps, scale,
                       fcode) -> _QueryGradLaunch:
    """When the head dim spans several column tiles, query_grad reads o for delta_t = g_t.o_t, the term that
    cancels against S~ g in dq. A bf16 o rounds it by up to 2^-8 relative, which in an fp64 emulation of the
    kernels' roundings came back as dq errors of 3e-2 to 5e-2 with positive inputs (an fp32 o made with tf32
    products: 2e-3 to 5e-3). So for half-precision inputs an apply makes o again in fp32 first: one launch
    more, at head dims over 128 only (one column tile up to 128)."""
    B, N, H, D = shape
    fp32 = dtype == torch.float32
    rope = tstrides is not None
    BD, TILE, BT, warps, stages = _chunked_tiles(settings["query_grad"], D, rope and fp32, fp32=fp32)
    o_fp32 = None
    if normalize and not fp32 and TILE < BD:
        o_fp32 = _apply_launch(settings, shape, dtype, q_stride, tstrides, M, J, normalize, eps, scale, fcode,
                               fp32_out=True)
    own = _contiguous(shape)  # o and dq
    al = _stride_unit_of(q_stride, g_stride, own)
    return _QueryGradLaunch(CachedLaunch(
        (B * H, M * J, _cdiv(D, TILE)),
        (*_row_strides_of(q_stride, al), *_row_strides_of(g_stride, al), *_row_strides_of(own, al),
         *_row_strides_of(own, al), *(tstrides or (0, 0, 0, 0)), H, M, J, D, D * D + D, eps, scale),
        dict(BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=fp32, ROPE=rope,
             LOWP=_lowp("query_grad", dtype, settings), AL=al, PREFETCH=settings["query_grad"].prefetch,
             num_warps=warps, num_stages=stages)), o_fp32)


def _key_grad_launch(settings, shape, dtype, k_stride, v_stride, tstrides, M, J, fcode, largest) -> CachedLaunch:
    B, N, H, D = shape
    fp32 = dtype == torch.float32
    rope = tstrides is not None
    BD, TILE, BT, warps, stages = _chunked_tiles(settings["key_grad"], D, rope and fp32,
                                                 _tokens_per_program(largest, J, dtype), fp32=fp32)
    own = _contiguous(shape)  # dk and dv
    al = _stride_unit_of(k_stride, v_stride, own)
    return CachedLaunch(
        (B * H, M * J, _cdiv(D, TILE)),
        (*_row_strides_of(k_stride, al), *_row_strides_of(v_stride, al), *_row_strides_of(own, al),
         *_row_strides_of(own, al), *(tstrides or (0, 0, 0, 0)), H, M, J, D, D * D + D),
        dict(BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, IEEE=fp32, ROPE=rope, LOWP=_lowp("key_grad", dtype, settings),
             AL=al, PREFETCH=settings["key_grad"].prefetch, num_warps=warps, num_stages=stages))


# ---- launches: allocate the outputs, launch with a record ------------------------------------------------

def _run_summary(launch, k, v, order, offsets, cos, sin, out_dtype):
    B, N, H, D = k.shape
    sz = _empty((B, H, launch.grid[1], D * D + D), k.device, out_dtype)  # (grid[1]: M * J)
    launch(summary_kernel, k, v, sz, order, offsets, k if cos is None else cos, k if sin is None else sin)
    return sz


def _run_mix(launch, out_shape, m, src, out_dtype):
    out = _empty(out_shape, src.device, out_dtype)
    launch(mix_kernel, m, src, out)
    return out


def _run_mix_grad(launch: _MixGradLaunch, dmixed, block_sz):
    part = torch.empty(launch.part_shape, device=dmixed.device, dtype=torch.float32)
    launch.products(mix_grad_kernel, dmixed, block_sz, part)
    if launch.torch_sum is not None:
        return part.sum(dim=launch.torch_sum)
    out = _empty(launch.out_shape, dmixed.device, torch.float32)
    launch.sum_launch(part_sum_kernel, part, out)
    return out


def _run_apply(launch, q, mixed, order, offsets, cos, sin, out_dtype=None):
    o = _empty(q.shape, q.device, q.dtype if out_dtype is None else out_dtype)
    launch(apply_kernel, q, mixed, o, order, offsets, q if cos is None else cos, q if sin is None else sin)
    return o


def _run_dense(launch, q, k, v, mixf, blk, cos, sin, cpe_weight=None, cpe_bias=None):
    """(o, inv, lo); with the launch's SAVE each row's 1 / den (B*H, N) fp32 and o's rounding in bf16 (None for
    fp32 o), for the dense backward; without it (o, None, None). ``cpe_weight``, ``cpe_bias``: the CPE's, for a
    launch that adds it (``_dense_launch``)."""
    o = _empty(q.shape, q.device, q.dtype)
    tables = (q if cos is None else cos, q if sin is None else sin)
    if not launch.consts["SAVE"]:
        cw = q if cpe_weight is None else cpe_weight
        launch(dense_forward_kernel, q, k, v, mixf, blk, o, *tables, q, q, cw, cw if cpe_bias is None else cpe_bias)
        return o, None, None
    B, N, H, D = q.shape
    inv = _empty((B * H, N), q.device, torch.float32)
    lo = _empty(q.shape, q.device, torch.bfloat16) if launch.consts["LO_PART"] else None
    launch(dense_forward_kernel, q, k, v, mixf, blk, o, *tables, inv, q if lo is None else lo, q, q)
    return o, inv, lo


def _run_dense_grad(launch: _DenseGradLaunch, q, k, v, g, o, inv, lo, mixf, blk, per_head):
    """dq, dk, dv in q's dtype and dMc in fp32: (H, M, M) with ``per_head``, else (M, M). ``o``, ``inv`` and
    ``lo``: the dense forward's (``_run_dense``; inv and lo None when not normalised, lo None for fp32)."""
    B, N, H, D = q.shape
    dq, dk, dv = (_empty(q.shape, q.device, q.dtype) for _ in range(3))
    go = q if inv is None else _empty((B * H, N), q.device, torch.float32)  # g.o per query
    inv = q if inv is None else inv
    parts = _empty(launch.parts, q.device, torch.float32)
    launch.query(dense_query_grad_kernel, q, k, v, g, o, o if lo is None else lo, mixf, blk, inv, dq, go, parts)
    launch.key(dense_key_grad_kernel, q, k, v, g, mixf, blk, inv, go, dk, dv)
    return dq, dk, dv, parts.sum((0, 2)) if per_head else parts.sum((0, 1, 2))


def _run_query_grad(launch: _QueryGradLaunch, q, g, o, mixed, order, offsets, cos, sin, M, J):
    B, N, H, D = q.shape
    if launch.o_fp32 is not None:
        o = _run_apply(launch.o_fp32, q, mixed, order, offsets, cos, sin, torch.float32)
    dq = _empty(q.shape, q.device, q.dtype)
    dsz_part = _empty((B, H, M * J, D * D + D), q.device, summary_dtype(q.dtype))
    main = launch.main
    main(query_grad_kernel, q, g, o, mixed, dq, dsz_part, order, offsets, q if cos is None else cos,
         q if sin is None else sin)
    return dq, dsz_part


def _run_key_grad(launch, k, v, dsz, order, offsets, cos, sin):
    dk = _empty(k.shape, k.device, k.dtype)
    dv = _empty(v.shape, v.device, v.dtype)
    launch(key_grad_kernel, k, v, dsz, dk, dv, order, offsets, k if cos is None else cos, k if sin is None else sin)
    return dk, dv


# ---- the launchers for callers outside the op: the settings in force, records cached ---------------------

_launches: dict = {}


def launch_summary(k, v, order, offsets, M, J, fcode, cos=None, sin=None, largest=None, out_dtype=None):
    """``largest``: the most tokens in one block, when known (it picks the ``one_step`` settings). ``out_dtype``:
    the summaries' storage dtype, by default ``summary_dtype`` for a backward (fp32)."""
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    key = ("summary", id(settings), k.shape, k.dtype, k.stride(), v.stride(), tstrides, M, J, fcode, largest)
    launch = _cached(_launches, key, lambda: (settings, _summary_launch(
        settings, k.shape, k.dtype, k.stride(), v.stride(), tstrides, M, J, fcode, largest)))[1]
    return _run_summary(launch, k, v, order, offsets, cos, sin,
                        summary_dtype(k.dtype) if out_dtype is None else out_dtype)


def launch_mix(mix, src, J, ieee, transpose=False, out_dtype=torch.float32, column_programs=None):
    """(B, H, R, X) in ``out_dtype`` = A @ src (B, H, C*J, X), where A (R rows, C columns) is Mc, or Mc^T
    when ``transpose``. Mc is (M, M) or (H, M, M), or a slab of its rows (a strided view is fine, the
    kernel reads it through its strides): sequence parallelism mixes only the query blocks a rank holds.
    ``column_programs``: programs per (batch, head, row tile), each walking every such-th column tile;
    by default enough for the mix settings' ``per_sm`` programs per SM in all (off the GPU, as for one SM)."""
    B, H, K, X = src.shape
    C = mix.shape[-2] if transpose else mix.shape[-1]  # A's columns
    if K != C * J or not src.is_contiguous():
        raise ValueError(f"src must be contiguous with C * J = {C} * {J} rows per head (C: the mix's "
                         f"{'rows' if transpose else 'columns'}), not {tuple(src.shape)}")
    if column_programs is not None and column_programs < 1:
        raise ValueError(f"column_programs={column_programs} must be at least 1")
    m = mix.float()
    settings = current_settings()
    key = ("mix", id(settings), m.shape, m.stride(), src.shape, src.dtype, J, ieee, transpose, column_programs,
           src.device)
    launch, out_shape = _cached(_launches, key, lambda: (settings, _mix_launch(
        settings, m.shape, m.stride(), src.shape, src.dtype, J, ieee, transpose, column_programs, src.device)))[1]
    return _run_mix(launch, out_shape, m, src, out_dtype)


def launch_mix_grad(dmixed, block_sz, per_head, ieee):
    """dMc: (H, M, M) per head or (M, M) shared, = sum over batch (and heads) of dS~ @ S^T."""
    settings = current_settings()
    key = ("mix_grad", id(settings), dmixed.shape, per_head, ieee)
    launch = _cached(_launches, key, lambda: (settings, _mix_grad_launch(settings, dmixed.shape, per_head,
                                                                         ieee)))[1]
    return _run_mix_grad(launch, dmixed, block_sz)


def launch_apply(q, mixed, order, offsets, M, J, normalize, eps, scale, fcode, cos=None, sin=None):
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    key = ("apply", id(settings), q.shape, q.dtype, q.stride(), tstrides, M, J, normalize, eps, scale, fcode)
    launch = _cached(_launches, key, lambda: (settings, _apply_launch(
        settings, q.shape, q.dtype, q.stride(), tstrides, M, J, normalize, eps, scale, fcode)))[1]
    return _run_apply(launch, q, mixed, order, offsets, cos, sin)


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
    # (the short tiles were measured without RoPE, whose rotated copies double a tile's registers)
    c = settings["dense"].for_tokens(None if rope else N)
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


def launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode, cos=None, sin=None):
    M = math.prod(blocks)
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    strides = (q.stride(), k.stride(), v.stride())
    key = ("dense", id(settings), q.shape, q.dtype, strides, tstrides, M, mix.dim() == 3, normalize, eps, scale,
           fcode)
    launch = _cached(_launches, key, lambda: (settings, _dense_launch(
        settings, q.shape, q.dtype, strides, tstrides, M, mix.dim() == 3, normalize, eps, scale, fcode,
        _sms_of(q.device))))[1]
    return _run_dense(launch, q, k, v, mix.float().contiguous(), _token_blocks_int32(grid, blocks, q.device), cos,
                      sin)[0]


def launch_query_grad(q, g, o, mixed, order, offsets, M, J, normalize, eps, scale, fcode, cos=None, sin=None):
    """dq and the per-(block, split) dS~, dz~. ``o`` must be contiguous, as the forward's is."""
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    key = ("query_grad", id(settings), q.shape, q.dtype, q.stride(), g.stride(), tstrides, M, J, normalize, eps,
           scale, fcode)
    launch = _cached(_launches, key, lambda: (settings, _query_grad_launch(
        settings, q.shape, q.dtype, q.stride(), g.stride(), tstrides, M, J, normalize, eps, scale, fcode)))[1]
    return _run_query_grad(launch, q, g, o, mixed, order, offsets, cos, sin, M, J)


def launch_key_grad(k, v, dsz, order, offsets, M, J, fcode, cos=None, sin=None, largest=None):
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    key = ("key_grad", id(settings), k.shape, k.dtype, k.stride(), v.stride(), tstrides, M, J, fcode, largest)
    launch = _cached(_launches, key, lambda: (settings, _key_grad_launch(
        settings, k.shape, k.dtype, k.stride(), v.stride(), tstrides, M, J, fcode, largest)))[1]
    return _run_key_grad(launch, k, v, dsz, order, offsets, cos, sin)


# ---- the op's plans ------------------------------------------------------------------------------------

class _Plan:
    """Everything the op's launches need that follows from its cache key (``_plan``): the algorithm and
    token splits, the block index tensors, and one launch record per kernel; the backward's records per
    stride pattern of the incoming gradient, made on its first use. Launches take the settings the plan was
    made with, so a backward launches with its forward's settings on whatever thread autograd runs it."""

    def __init__(self, settings, q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
                 cos, sin, keep, exchange=None, cpe=None):
        B, N, H, D = shape = q.shape
        self.grid = grid
        # the CPE the forward adds to o (no gradients only): in the dense kernel (cpe_in_kernel), else a launch of
        # its own after the forward
        self.cpe = None if cpe is None else cpe_form(*cpe, grid, H * D)
        self.cpe_in_kernel = False
        dtype, device = q.dtype, q.device
        M = math.prod(blocks)
        if splits is None:
            largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
            splits = choose_splits(B, H, M, largest, D, device)
        if algorithm == "auto":
            algorithm = choose_algorithm(B, N, H, D, M, splits, dtype, cos is not None, keep, EAGER_LAUNCH_S)
        # M: the blocks this process holds, whose tokens q, k, v are (all of them without an exchange);
        # M_all: the blocks of Mc, whose summaries the mix reads
        self.M_all = M
        if exchange is None:
            self.rows = None
            self.order, self.offsets, self.largest = block_token_lists(grid, blocks, device)
        else:
            self.rows = exchange.rows
            self.order, self.offsets = exchange.order, exchange.offsets
            M = self.rows.stop - self.rows.start
            # the largest block of the grid bounds the held ones (it picks the one-step launch settings)
            self.largest = block_token_lists(grid, blocks, torch.device("cpu"))[2]
        self.settings, self.algorithm, self.M, self.J = settings, algorithm, M, int(splits)
        self.sz_dtype = summary_dtype(dtype, keep)  # the forward's summaries
        self.per_head = mix.dim() == 3
        self.ieee = dtype == torch.float32
        self.fcode = fcode = FEATURE_CODES[feature_map]
        self.tstrides = tstrides = _table_strides(cos, sin)
        self.args = (shape, dtype, tstrides, normalize, eps, scale, fcode)
        self.k_stride, self.v_stride = k.stride(), v.stride()
        self.q_stride = q.stride()
        # Mc as the kernels read it: fp32 (the dense kernel: contiguous too); the mix kernels take any strides
        contiguous = mix.stride() == _contiguous(mix.shape)
        self.mix_copy = mix.dtype != torch.float32 or (algorithm == "dense" and not contiguous)
        mix_stride = _contiguous(mix.shape) if self.mix_copy else mix.stride()
        self.mix_shape, self.mix_stride = mix.shape, mix_stride
        # the mix kernels read the held rows of Mc (a view with Mc's strides): all of it without an exchange
        self.rows_shape = mix.shape if exchange is None else (*mix.shape[:-2], M, self.M_all)
        self.backward_plans: dict = {}
        self.dense_backward = algorithm == "dense" and exchange is None and _dense_backward(keep, cos is not None, M)
        if algorithm == "dense":
            self.blk = _token_blocks_int32(grid, blocks, device)
            dense = lambda cpe: _dense_launch(  # noqa: E731
                settings, shape, dtype, (q.stride(), k.stride(), v.stride()), tstrides, M, self.per_head, normalize,
                eps, scale, fcode, _sms_of(device), self.dense_backward and normalize, cpe)
            self.dense = dense(self.cpe)
            self.cpe_in_kernel = self.cpe is not None and _cpe_pays(self.dense.grid, _sms_of(device))
            if self.cpe is not None and not self.cpe_in_kernel:
                self.dense = dense(None)
        else:
            self._summary_and_mix(shape, dtype, device)
            self.apply = _apply_launch(settings, shape, dtype, q.stride(), tstrides, M, self.J, normalize, eps,
                                       scale, fcode)

    def _summary_and_mix(self, shape, dtype, device):
        B, N, H, D = shape
        M, J, settings = self.M, self.J, self.settings
        self.summary = _summary_launch(settings, shape, dtype, self.k_stride, self.v_stride, self.tstrides, M, J,
                                       self.fcode, self.largest)
        self.mix = _mix_launch(settings, self.rows_shape, self.mix_stride, (B, H, self.M_all * J, D * D + D),
                               self.sz_dtype, J, self.ieee, False, None, device)

    def mix_operand(self, mix):
        """Mc as the kernels read it; with an exchange, the held rows only."""
        m = _fp32_mix(mix) if self.mix_copy else mix
        return m if self.rows is None else m[..., self.rows, :]

    def forward(self, q, k, v, mix, cos, sin, exchange=None, cpe=None):
        """(o, sz, mixed); after the dense algorithm, which keeps no summaries, (o, inv, lo) ahead of the dense
        backward (``_run_dense``), else (o, None, None).
        ``exchange``: the ``BlockExchange`` this plan was made with, or None; sz is then all blocks'
        summaries, gathered (exchange.py: the steps). ``cpe``: (weight, bias) of the CPE the plan was made
        with, added to o."""
        m = self.mix_operand(mix)
        if self.algorithm == "dense":
            if cpe is None:
                return _run_dense(self.dense, q, k, v, m, self.blk, cos, sin)
            if self.cpe_in_kernel:
                weight, bias = cpe
                return _run_dense(self.dense, q, k, v, m, self.blk, cos, sin,
                                  weight if weight.is_contiguous() else weight.contiguous(), bias)
            return self._cpe_after(_run_dense(self.dense, q, k, v, m, self.blk, cos, sin)[0], v, cpe), None, None
        sz = _run_summary(self.summary, k, v, self.order, self.offsets, cos, sin, self.sz_dtype)
        if exchange is not None:
            sz = exchange.gather_summaries(sz)
        mixed = _run_mix(*self.mix, m, sz, sz.dtype)
        o = _run_apply(self.apply, q, mixed, self.order, self.offsets, cos, sin)
        return (o if cpe is None else self._cpe_after(o, v, cpe)), sz, mixed

    def _cpe_after(self, o, v, cpe):
        """o + the CPE as a launch of its own (``kernels.cpe``)."""
        from ..cpe import cpe_add

        B, N, H, D = o.shape
        return cpe_add(o.view(B, N, H * D), v.reshape(B, N, H * D), *cpe, self.grid).view(B, N, H, D)

    def backward(self, g, q, k, v, mix, o, sz, mixed, cos, sin, exchange=None):
        """The gradients of q, k, v and mix. Every summary is fp32 here (``summary_dtype``); after the dense
        forward sz and mixed are its inv and lo (``forward``). ``exchange``: as in ``forward``; dMc is then this
        process's share (its rows), which the processes' shares sum to."""
        dq, dk, dv, dmix = self._gradients(g, q, k, v, mix, o, sz, mixed, cos, sin, exchange)
        if self.M == 1 and self.args[3]:  # Mc cancels: exact zero (op.mix_gradient_cancels)
            dmix = torch.zeros_like(dmix)
        return dq, dk, dv, dmix

    def _gradients(self, g, q, k, v, mix, o, sz, mixed, cos, sin, exchange):
        g_stride = g.stride()
        # (a forward that kept no inv, under other switches than now, is followed by the chunked backward)
        dense = self.dense_backward and (sz is not None or not self.args[3])
        bp = self.backward_plans.get((g_stride, dense))
        if bp is None:
            if len(self.backward_plans) >= 16:
                self.backward_plans.clear()
            bp = self.backward_plans[g_stride, dense] = _BackwardPlan(self, g_stride, q.device, dense)
        if dense:
            dq, dk, dv, dmix = _run_dense_grad(bp.dense, q, k, v, g, o, sz, mixed, self.mix_operand(mix), self.blk,
                                               self.per_head)
            return dq, dk, dv, dmix if dmix.dtype == mix.dtype else dmix.to(mix.dtype)
        B, N, H, D = q.shape
        M, J, X = self.M, self.J, D * D + D
        order, offsets = self.order, self.offsets
        m = self.mix_operand(mix)
        if self.algorithm == "dense":  # the dense forward kept no summaries
            sz = _run_summary(bp.summary, k, v, order, offsets, cos, sin, torch.float32)
            mixed = _run_mix(*bp.mix, m, sz, sz.dtype)
        dq, dsz_part = _run_query_grad(bp.query_grad, q, g, o, mixed, order, offsets, cos, sin, M, J)
        # dS~ per query block (split parts summed in fp32)
        dmixed = dsz_part.view(B, H, M, J, X).sum(3, dtype=torch.float32) if J > 1 else dsz_part
        dsz = _run_mix(*bp.mix_transposed, m, dmixed, dsz_part.dtype)  # dS_b = Mc^T dS~
        if exchange is None:
            block_sz = sz.view(B, H, M, J, X).sum(3) if J > 1 else sz
            dmix = _run_mix_grad(bp.mix_grad, dmixed, block_sz)  # dMc_ib = <dS~_i, S_b>
        else:  # (one split per block: the exchanged summaries are whole blocks')
            dsz = exchange.sum_summary_grads(dsz)
            dmix = _held_rows_mix_grad(dmixed, sz, mix.shape, self.rows)
        dk, dv = _run_key_grad(bp.key_grad, k, v, dsz, order, offsets, cos, sin)
        return dq, dk, dv, dmix if dmix.dtype == mix.dtype else dmix.to(mix.dtype)


def _fp32_mix(mix):
    """Mc as fp32 and contiguous, kept on ``mix`` until it changes (``layout.kept_on``): a bf16 model's Mc was copied
    on every call, 12 us of host time a call (H200 machine, one layer of a class-to-image DiT)."""
    return kept_on(mix, "_mediagen_fp32", lambda: mix.detach().float().contiguous())


class _BackwardPlan:
    """The backward's launch records for one stride pattern of the incoming gradient; ``dense``: the dense
    backward's (after a dense forward without RoPE), else the chunked one's."""

    def __init__(self, plan: _Plan, g_stride, device, dense: bool):
        shape, dtype, tstrides, normalize, eps, scale, fcode = plan.args
        B, N, H, D = shape
        M, J, settings = plan.M, plan.J, plan.settings
        if dense:
            self.dense = _dense_grad_launch(settings, shape, dtype, (plan.q_stride, plan.k_stride, plan.v_stride,
                                                                     g_stride), M, plan.per_head, normalize, eps,
                                            scale, fcode)
            return
        if plan.algorithm == "dense":  # the summaries are made again here
            self.summary = _summary_launch(settings, shape, dtype, plan.k_stride, plan.v_stride, tstrides, M, J,
                                           fcode, plan.largest)
            self.mix = _mix_launch(settings, plan.rows_shape, plan.mix_stride, (B, H, M * J, D * D + D),
                                   torch.float32, J, plan.ieee, False, None, device)
        self.query_grad = _query_grad_launch(settings, shape, dtype, plan.q_stride, g_stride, tstrides, M, J,
                                             normalize, eps, scale, fcode)
        self.mix_transposed = _mix_launch(settings, plan.rows_shape, plan.mix_stride, (B, H, M, D * D + D),
                                          torch.float32, 1, plan.ieee, True, None, device)
        self.mix_grad = (_mix_grad_launch(settings, (B, H, M, D * D + D), plan.per_head, plan.ieee)
                         if plan.rows is None else None)
        self.key_grad = _key_grad_launch(settings, shape, dtype, plan.k_stride, plan.v_stride, tstrides, M, J,
                                         fcode, plan.largest)


def _held_rows_mix_grad(dmixed, sz, mix_shape, rows):
    """dMc when a process holds the query blocks ``rows`` only: dMc[i, b] = <dS~_i, S_b> summed over batch
    (and heads for a shared Mc) in those rows, zero in the others, so the processes' parts sum to the whole.
    dmixed (B, H, held, X) and sz (B, H, M, X) are fp32; a matmul makes the slab (the mix_grad kernel fills
    square Mc only)."""
    held = torch.matmul(dmixed, sz.transpose(-1, -2)).sum(0)  # (H, held, M)
    dmix = torch.zeros(mix_shape, device=dmixed.device, dtype=torch.float32)
    if len(mix_shape) == 3:
        dmix[:, rows] = held
    else:
        dmix[rows] = held.sum(0)
    return dmix


_plans: dict = {}


def _plan(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin,
          keep, exchange=None, cpe=None) -> _Plan:
    """The plan for these arguments under the launch settings in force, made on first use. The key holds the
    settings table's id; a plan keeps its table alive, so while a plan is cached no other table has that id.
    ``keep``: the forward's summaries are kept for a backward. ``exchange``: a ``BlockExchange`` or None; its
    held block range is part of the key (it decides the token lists the plan keeps). ``cpe``: (weight, bias) or
    None; its kernel's shape and whether it has a bias are part of the key."""
    settings = current_settings()
    key = (id(settings), q.shape, q.dtype, q.device, q.stride(), k.stride(), v.stride(), mix.shape, mix.dtype,
           mix.stride(), grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
           _table_strides(cos, sin), keep, None if exchange is None else (exchange.rows.start, exchange.rows.stop),
           DENSE_BACKWARD, DENSE_BACKWARD_MAX_BLOCKS, None if cpe is None else (cpe[0].shape, cpe[1] is None))
    plan = _plans.get(key)
    if plan is None:
        plan = _cached(_plans, key, lambda: _Plan(settings, q, k, v, mix, grid, blocks, normalize, eps, feature_map,
                                                  scale, algorithm, splits, cos, sin, keep, exchange, cpe))
    return plan


def _needs_grad(q, k, v, mix) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or mix.requires_grad)


def forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
                 cos=None, sin=None, keep=True):
    """Returns (o, sz, mixed): the per-block (per-split) summaries (B, H, M * J, D * D + D) and the mixed ones
    S~, z~, kept for the backward. After the dense algorithm, which keeps no summaries: each row's 1 / den
    (B * H, N) and o's rounding (bf16, o's shape) ahead of the dense backward, empty where it keeps none
    (``_Plan.forward``). ``keep``: a backward will use them (their dtype, ``summary_dtype``)."""
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, eps, feature_map, scale, algorithm, splits,
                 cos, sin, keep)
    o, sz, mixed = plan.forward(q, k, v, mix, cos, sin)
    return (o, q.new_empty((0,), dtype=torch.float32) if sz is None else sz,  # (two tensors: outputs may not alias)
            q.new_empty((0,), dtype=torch.float32) if mixed is None else mixed)


def backward_impl(g, q, k, v, mix, o, sz, mixed, grid, blocks, normalize, eps, feature_map, scale, splits,
                  cos=None, sin=None):
    """The gradients of q, k, v and mix (``_Plan.backward``); ``sz`` has fewer than four dims after the dense
    forward (``forward_impl``)."""
    dense = sz.dim() < 4
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, eps, feature_map, scale,
                 "dense" if dense else "chunked", splits, cos, sin, True)
    if dense:
        sz, mixed = (None if t.numel() == 0 else t for t in (sz, mixed))
    return plan.backward(g, q, k, v, mix, o, sz, mixed, cos, sin)


# ---- eager path ---------------------------------------------------------------------------------

class _MHLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mix, plan, cos, sin, exchange):
        o, sz, mixed = plan.forward(q, k, v, mix, cos, sin, exchange)
        # (saved tensors, not ctx attributes, for the op's own intermediates too: autograd frees saved tensors after
        # the backward, while a ctx attribute would keep a step's summaries alive as long as its graph)
        ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
        # the backward may run on another thread (autograd's GPU workers): the plan holds the forward's settings
        ctx.plan, ctx.exchange = plan, exchange
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
        return (*ctx.plan.backward(g, q, k, v, mix, o, sz, mixed, cos, sin, ctx.exchange), None, None, None, None)


# ---- torch.compile path: custom ops -------------------------------------------------------------

@torch.library.custom_op("mediagen::mhla_fwd", mutates_args=())
def mhla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, grid: list[int],
             blocks: list[int], normalize: bool, eps: float, feature_map: str, scale: float, algorithm: str,
             splits: int, cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None, keep: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin,
                        keep)


@mhla_fwd.register_fake
def _(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos=None, sin=None,
      keep=True):
    B, N, H, D = q.shape
    o = q.new_empty((B, N, H, D))
    M = math.prod(blocks)
    if algorithm == "dense":
        if not (normalize and _dense_backward(keep, cos is not None, M)):
            return o, q.new_empty((0,), dtype=torch.float32), q.new_empty((0,), dtype=torch.float32)
        lo = q.new_empty((B, N, H, D) if q.dtype != torch.float32 else (0,),
                         dtype=torch.bfloat16 if q.dtype != torch.float32 else torch.float32)
        return o, q.new_empty((B * H, N), dtype=torch.float32), lo
    X, dtype = D * D + D, summary_dtype(q.dtype, keep)
    return o, q.new_empty((B, H, M * splits, X), dtype=dtype), q.new_empty((B, H, M, X), dtype=dtype)


@torch.library.custom_op("mediagen::mhla_bwd", mutates_args=())
def mhla_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor,
             o: torch.Tensor, sz: torch.Tensor, mixed: torch.Tensor, grid: list[int], blocks: list[int],
             normalize: bool, eps: float, feature_map: str, scale: float, splits: int,
             cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward_impl(g.contiguous() if g.stride(-1) == 0 else g, q, k, v, mix, o, sz, mixed, grid, blocks,
                         normalize, eps, feature_map, scale, splits, cos, sin)


@mhla_bwd.register_fake
def _(g, q, k, v, mix, o, sz, mixed, grid, blocks, normalize, eps, feature_map, scale, splits, cos=None,
      sin=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), mix.new_empty(mix.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin = inputs[:14]
    o, sz, mixed = output
    ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
    ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)


def _backward(ctx, grad_o, grad_sz, grad_mixed):
    q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
    grads = torch.ops.mediagen.mhla_bwd(grad_o, q, k, v, mix, o, sz, mixed, *ctx.args, cos, sin)
    return (*grads,) + (None,) * 11


mhla_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---- torch.compile, sampling on a GPU: the dense forward as a Triton op ----------------------------
# Under Inductor a custom op runs as a Python call at every step (``mhla_fwd``: the dispatcher's wrapper, then
# ``forward_impl``): about 95 µs of host time a call on the H200 against 26-28 for cuDNN's attention, at the
# class-to-image DiT's sampling shape. A ``triton_op`` is traced into the graph instead, so Inductor's own
# generated code launches the dense kernel. Only the forward without a backward takes it (this op registers no
# autograd); training keeps ``mhla_fwd`` and its registered autograd, whose backward after a dense forward is
# the dense backward (triton_dense_grad.py).

@torch.compiler.assume_constant_result
def _traced_token_blocks(grid: tuple[int, ...], blocks: tuple[int, ...], device: torch.device):
    """The dense kernel's block id per token, kept by traced code as a constant (``_token_blocks_int32``)."""
    return _token_blocks_int32(grid, blocks, device)


@torch.library.triton_op("mediagen::mhla_dense", mutates_args=())
def mhla_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, blk: torch.Tensor,
               normalize: bool, eps: float, feature_map: str, scale: float, cos: Optional[torch.Tensor] = None,
               sin: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The dense forward: q, k, v (B, N, H, D) on a GPU, ``mix`` fp32 and contiguous (M, M) or (H, M, M),
    ``blk`` the tokens' block ids (int32)."""
    from torch.library import wrap_triton

    M = mix.shape[-1]
    launch = _dense_launch(current_settings(), q.shape, q.dtype, (q.stride(), k.stride(), v.stride()),
                           _table_strides(cos, sin), M, mix.dim() == 3, normalize, eps, scale,
                           FEATURE_CODES[feature_map], _sms_of(q.device))
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    wrap_triton(dense_forward_kernel)[launch.grid](q, k, v, mix, blk, o, q if cos is None else cos,
                                                    q if sin is None else sin, q, q, q, q, *launch.scalars,
                                                    **launch.consts)
    return o


def mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                algorithm="auto", splits=None, rope=None, exchange=None, cpe=None):
    """Arguments already validated by ``mhla``. Returns o (B, N, H, D) in q's dtype.

    ``exchange``: None, or a ``BlockExchange`` (exchange.py) when this process holds only the blocks
    ``exchange.rows`` of ``grid``: q, k, v (and the rope tables) are then those blocks' tokens, numbered as
    ``exchange.order`` numbers them, and o is theirs. It runs the chunked steps with one split per block, the
    summaries that travel being whole blocks' (more splits would multiply what is sent).

    ``cpe``: None, or (weight, bias) of a conditional positional encoding to add to o, o + bias + a depthwise
    convolution of v over ``grid`` (channel h * D + d; weight (H * D, 1, *k), odd sizes, bias (H * D,) or
    None), for sampling: nothing may be differentiated. The dense forward adds it before it stores o where its
    launch fits in one wave (``_cpe_pays``); otherwise, and after the chunked forward, ``kernels.cpe.cpe_add``
    does."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    cos, sin = rope if rope is not None else (None, None)
    if cpe is not None and (exchange is not None or torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, mix, *cpe)))):
        raise ValueError("cpe= is taken only by an eager forward that nothing differentiates, without an exchange: "
                         "add the CPE after the op otherwise")
    if exchange is not None:
        if algorithm == "dense":
            raise ValueError("algorithm='dense' is not allowed with an exchange (the dense kernel keeps no block "
                             "summaries to exchange): use 'auto' or 'chunked'")
        if splits not in (None, 1):
            raise ValueError(f"splits={splits} is not allowed with an exchange: use None or 1")
        plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, float(eps), feature_map or "none",
                     1.0 if scale is None else float(scale), "chunked", 1, cos, sin, _needs_grad(q, k, v, mix),
                     exchange)
        return _MHLAFunction.apply(q, k, v, mix, plan, cos, sin, exchange)
    if torch.compiler.is_compiling():  # traced: no plan cache (the custom op's body makes its own plans)
        B, N, H, D = q.shape
        M = math.prod(blocks)
        if splits is None:
            largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
            splits = choose_splits(B, H, M, largest, D, q.device)
        keep = _needs_grad(q, k, v, mix)
        if algorithm == "auto":
            algorithm = choose_algorithm(B, N, H, D, M, splits, q.dtype, rope is not None, keep)
        # Mc as the kernels read it (fp32, contiguous) made in the graph, where inductor fuses the cast,
        # rather than inside the op as one more eager copy per call
        mixf = mix.float().contiguous()
        if algorithm == "dense" and not keep and q.is_cuda and not _interpreting() and TRACED_DENSE_OP:
            blk = _traced_token_blocks(tuple(grid), tuple(blocks), q.device)
            return torch.ops.mediagen.mhla_dense(q, k, v, mixf, blk, normalize, float(eps), feature_map or "none",
                                                 1.0 if scale is None else float(scale), cos, sin)
        args = (list(grid), list(blocks), normalize, float(eps), feature_map or "none",
                1.0 if scale is None else float(scale), algorithm, int(splits), cos, sin, keep)
        return torch.ops.mediagen.mhla_fwd(q, k, v, mixf, *args)[0]
    keep = _needs_grad(q, k, v, mix)
    plan = _plan(q, k, v, mix, tuple(grid), tuple(blocks), normalize, float(eps), feature_map or "none",
                 1.0 if scale is None else float(scale), algorithm, None if splits is None else int(splits), cos, sin,
                 keep, None, cpe)
    if not keep:  # nothing to differentiate (sampling): no autograd node, nothing saved
        return plan.forward(q, k, v, mix, cos, sin, None, cpe)[0]
    return _MHLAFunction.apply(q, k, v, mix, plan, cos, sin, None)
