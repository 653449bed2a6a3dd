"""MHLA on the Triton kernels.

Two entry points share one implementation (``forward_impl`` / ``backward_impl``):
- eager: a torch.autograd.Function (``_MHLAFunction``), the lowest per-call overhead;
- under torch.compile: torch.library custom ops ``mediagen::mhla_fwd`` / ``mediagen::mhla_bwd`` with
  fake implementations and registered autograd, so compiled models trace through without breaks.

Two forward algorithms (``algorithm``): "chunked" (per-block summaries in memory, mixed by a matmul;
long sequences) and "dense" (summaries recomputed on chip; short sequences); "auto" picks by a cost
model. The backward always runs the chunked kernels (for dMc it needs the block summaries).
``cos``/``sin`` (N, D/2) angle tables turn on RoPE on the numerator's features (rotation.py).
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
import triton

from .layout import block_token_lists, token_block_ids
from .settings import current_settings, kernel_settings, use_settings
from .triton_chunked import apply_kernel, key_grad_kernel, query_grad_kernel, summary_kernel
from .triton_dense import dense_forward_kernel
from .triton_mix import mix_grad_kernel, mix_kernel, part_sum_kernel

FEATURE_CODES = {"none": 0, "relu": 1, "elu1": 2}
ALGORITHMS = ("auto", "chunked", "dense")
# Tests set this to fill every output buffer with NaN before the kernels run, so an element a
# kernel forgets to write shows up.
POISON_OUTPUTS = False


def _new(shape, like, dtype):
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), device=like.device, dtype=dtype)
    return torch.empty(shape, device=like.device, dtype=dtype)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@torch.compiler.assume_constant_result
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def summary_dtype(dtype):
    """Storage dtype of the per-block summaries: bf16 for bf16 inputs (the kernels' products round
    them to bf16 anyway), fp32 for fp32 and fp16 (whose range is too small for sums over a block)."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def _lowp(name: str, dtype) -> bool:
    """Whether kernel ``name`` multiplies half-precision inputs in their own dtype (never fp32, nor in
    the CPU interpreter, whose half-precision dot is wrong)."""
    return getattr(kernel_settings(name), "lowp", False) and dtype != torch.float32 and not _interpreting()


def _prefetch(name: str) -> bool:
    """Whether chunked kernel ``name`` loads the next token step's ids during this step (``prefetch``)."""
    return kernel_settings(name).prefetch


def _config(name: str, D: int, fp32_rope: bool = False, tokens: Optional[int] = None, fp32: bool = False):
    """(BD, TILE, BT, warps, stages) of a chunked kernel for head dim D (settings.py: its launch settings).
    ``fp32``: fp32 inputs, which take the kernel's ``fp32`` settings where it has them. ``fp32_rope``: fp32
    inputs with RoPE, whose rotated copies of the tiles need more shared memory (32-token steps from D=128,
    16 at D=256: key_grad's 32-token steps need 256 KiB there, `benchmarks/kernel_resources.py`).
    ``tokens``: the most tokens one program walks, when known; when that is one token step, the kernel's
    ``one_step`` warps and stages apply."""
    c = kernel_settings(name).for_inputs(fp32=fp32 or fp32_rope)
    BD = max(16, triton.next_power_of_2(D))
    if BD < 128 or (BD == 128 and not fp32_rope):
        BT = c.BT
    else:
        BT = min(c.BT, 16 if BD > 128 and fp32_rope else 32)
    # keep each program's D x TILE fp32 tiles within 128 x 128 (D = 256: 64 columns per program);
    # wider ones run out of shared memory on the H200 in fp32
    TILE = min(BD, c.TILE, 16384 // BD)
    warps, stages = c.one_step_launch() if tokens is not None and tokens <= BT else (c.warps, c.stages)
    return BD, TILE, BT, warps, stages


def choose_splits(B, H, M, largest_block, D, device) -> int:
    """Token splits per block, only when the chunked kernels would launch fewer programs than
    there are SMs (few heads and blocks, e.g. global linear attention): on the H200 the sweep
    measured splits as slower whenever B*H*M alone fills the GPU (more summaries to write and mix)."""
    forced = os.environ.get("MEDIAGEN_MHLA_SPLITS")
    if forced:
        return max(1, int(forced))
    if device.type != "cuda":
        return 1
    BD, TILE, BT, _, _ = _config("apply", D)
    programs = B * H * M * (BD // TILE)
    want = math.ceil(_num_sms(device.index or 0) / programs)
    return max(1, min(want, math.ceil(largest_block / (2 * BT))))


def choose_algorithm(B, N, H, D, M, splits, dtype, rope=False) -> str:
    """Cost model in seconds on an H200-class GPU: bytes at ~3 TB/s, dense dot work at ~150 TFLOP/s,
    ~5 us per launch (chunked runs summary, mix and apply). With rope the dense kernel does a
    third dot (the un-rotated scores) and both read the angle tables."""
    es = 4 if dtype == torch.float32 else 2
    ss = summary_dtype(dtype).itemsize
    BD = sum(dense_head_pieces(D, not rope))
    io = (4 + (2 if rope else 0)) * B * N * H * D * es
    chunked = (io + 4 * ss * B * H * M * splits * (D * D + D)) / 3e12 + 3 * 5e-6
    dense = io / 3e12 + (6 if rope else 4) * B * H * N * N * BD / 150e12 + 5e-6
    return "dense" if dense < chunked else "chunked"


_blk_cache: dict = {}


def _rope_args(cos, sin, like):
    """Kernel arguments for the angle tables: (COS, SIN), their strides, and the ROPE flag."""
    if cos is None:
        return (like, like), (0, 0, 0, 0), False
    return (cos, sin), (*cos.stride(), *sin.stride()), True


def _token_blocks_int32(grid, blocks, device):
    key = (tuple(grid), tuple(blocks), str(device))
    hit = _blk_cache.get(key)
    if hit is None:
        hit = _blk_cache[key] = token_block_ids(grid, blocks, device).to(torch.int32)
    return hit


def stride_unit(*tensors) -> int:
    """The largest power of two up to 16 that divides every batch, token and head stride of these
    (B, N, H, D) tensors. The kernels take those strides divided by it (``row_strides``) and multiply them
    back by it as a compile-time constant (AL), so the compiler knows where rows may start: Triton marks a
    run-time int only as 16-divisible or not, and DiT's head stride 72 is not (triton_chunked.py).
    1 when a stride needs 64 bits: divided, it could arrive as a 32-bit int and overflow when multiplied back."""
    g = 0
    for t in tensors:
        for s in t.stride()[:3]:
            if s >= 2**31:
                return 1
            g = math.gcd(g, s)
    return 16 if g == 0 else min(16, g & -g)


def row_strides(t, unit):
    """(batch, token, head strides divided by ``unit``, head-dim stride) of a (B, N, H, D) tensor."""
    b, n, h, d = t.stride()
    return b // unit, n // unit, h // unit, d


def _tokens_per_program(largest, J, dtype):
    """The most tokens one program walks (blocks of at most ``largest`` in J splits), for ``_config``'s
    one_step settings; None for fp32 inputs, whose wider tiles those settings were not measured with (and
    with RoPE spill registers, `benchmarks/kernel_resources.py`)."""
    return None if largest is None or dtype == torch.float32 else -(-largest // J)


def launch_summary(k, v, order, offsets, M, J, fcode, cos=None, sin=None, largest=None):
    """``largest``: the most tokens in one block, when known (it picks the ``one_step`` settings)."""
    B, N, H, D = k.shape
    fp32 = k.dtype == torch.float32
    BD, TILE, BT, warps, stages = _config("summary", D, cos is not None and fp32,
                                          _tokens_per_program(largest, J, k.dtype), fp32=fp32)
    X = D * D + D
    sz = _new((B, H, M * J, X), k, summary_dtype(k.dtype))
    tables, tstrides, rope = _rope_args(cos, sin, k)
    al = stride_unit(k, v)
    summary_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        k, v, sz, order, offsets, *tables, *row_strides(k, al), *row_strides(v, al), *tstrides, H, M * J, J, D, X,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, DOT_F32=k.dtype == torch.float32 or _interpreting(),
        IEEE=k.dtype == torch.float32, ROPE=rope, AL=al, PREFETCH=_prefetch("summary"), num_warps=warps,
        num_stages=stages)
    return sz


def launch_mix(mix, src, J, ieee, transpose=False, out_dtype=torch.float32, column_programs=None):
    """(B, H, R, X) in ``out_dtype`` = A @ src (B, H, C*J, X), where A (R rows, C columns) is Mc, or Mc^T
    when ``transpose``. Mc is (M, M) or (H, M, M), or a slab of its rows (a strided view is fine, the
    kernel reads it through its strides): sequence parallelism mixes only the query blocks a rank holds.
    ``column_programs``: programs per (batch, head, row tile), each walking every such-th column tile;
    by default enough for the mix settings' ``per_sm`` programs per SM in all (off the GPU, as for one SM)."""
    B, H, K, X = src.shape
    M, C = (mix.shape[-1], mix.shape[-2]) if transpose else (mix.shape[-2], mix.shape[-1])  # A's rows, columns
    if K != C * J or not src.is_contiguous():
        raise ValueError(f"src must be contiguous with C * J = {C} * {J} rows per head (C: the mix's "
                         f"{'rows' if transpose else 'columns'}), not {tuple(src.shape)}")
    m = mix.float()
    sah = m.stride(0) if m.dim() == 3 else 0
    sai, saj = m.stride(-2), m.stride(-1)
    if transpose:
        sai, saj = saj, sai
    out = _new((B, H, M, X), src, out_dtype)
    c = kernel_settings("mix").for_inputs(fp32=ieee)
    BM = min(64, max(16, triton.next_power_of_2(M)))
    one_k = K <= 64
    BK = max(16, triton.next_power_of_2(K)) if one_k else c.BK
    BX = c.BX or min(256, max(64, c.acc // BM))  # (an explicit BX: fp32's, or the sweep's)
    row_tiles, col_tiles = triton.cdiv(M, BM), triton.cdiv(X, BX)
    if column_programs is None:
        sms = _num_sms(src.device.index or 0) if src.device.type == "cuda" else 1
        column_programs = triton.cdiv(c.per_sm * sms, B * H * row_tiles)
    elif column_programs < 1:
        raise ValueError(f"column_programs={column_programs} must be at least 1")
    P = min(column_programs, col_tiles)
    mix_kernel[(B * H, P, row_tiles)](
        m, src, out, sah, sai, saj, H, M, K, J, P, X, BM=BM, BK=BK, BX=BX, ONE_K=one_k, IEEE=ieee,
        LOWP=_lowp("mix", src.dtype) and not ieee, num_warps=c.warps, num_stages=c.stages)
    return out


def launch_mix_grad(dmixed, block_sz, per_head, ieee):
    """dMc: (H, M, M) per head or (M, M) shared, = sum over batch (and heads) of dS~ @ S^T."""
    B, H, M, X = dmixed.shape
    c = kernel_settings("mix_grad")
    XT = c.XT
    NT = triton.cdiv(X, XT)
    BM = min(64, max(16, triton.next_power_of_2(M)))
    part = torch.empty((B, H, NT, M, M), device=dmixed.device, dtype=torch.float32)
    mix_grad_kernel[(B * H, NT, triton.cdiv(M, BM) ** 2)](
        dmixed, block_sz, part, M, X, NT, XT, BM=BM, BK=c.BK, IEEE=ieee, num_warps=c.warps,
        num_stages=c.stages)
    groups, rows, heads = (B, NT, H) if per_head else (1, B * H * NT, 1)
    grid = (triton.cdiv(M * M, c.BY), heads)
    if c.sum == "torch" or (c.sum == "auto" and grid[0] * heads < c.sum_programs):
        return part.sum(dim=(0, 2)) if per_head else part.sum(dim=(0, 1, 2))
    out = _new((H, M, M) if per_head else (M, M), dmixed, torch.float32)
    part_sum_kernel[grid](
        part, out, groups, rows, H * NT, NT if per_head else 0, M * M, BR=c.BR, BY=c.BY)
    return out


def launch_apply(q, mixed, order, offsets, M, J, normalize, eps, scale, fcode, cos=None, sin=None):
    B, N, H, D = q.shape
    BD, TILE, BT, warps, stages = _config("apply", D, cos is not None and q.dtype == torch.float32,
                                          fp32=q.dtype == torch.float32)
    o = _new((B, N, H, D), q, q.dtype)
    tables, tstrides, rope = _rope_args(cos, sin, q)
    al = stride_unit(q, o)
    apply_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        q, mixed, o, order, offsets, *tables, *row_strides(q, al), *row_strides(o, al), *tstrides, H, M, J, D,
        D * D + D, eps, scale, BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize,
        IEEE=q.dtype == torch.float32, LOWP=_lowp("apply", q.dtype), ROPE=rope, AL=al, PREFETCH=_prefetch("apply"),
        num_warps=warps, num_stages=stages)
    return o


def dense_head_pieces(D: int, den_col: bool) -> tuple[int, int]:
    """(BD, BD2): the dense kernel's head-dim tiles. One power-of-two tile of next_pow2(D) columns, or
    two (BD = the largest power of two below D, BD2 the rest rounded up) when the two are narrower:
    72 with a denominator column as 64 + 16 instead of 128. ``den_col``: one padding column is needed."""
    width = max(16, triton.next_power_of_2(D))
    if D <= 16 or D == width or width > 128:  # (wider: the 32-query tiles of BD = 256 stay as they are)
        return width, 0
    first = max(16, triton.next_power_of_2(D) // 2)
    rest = max(16, triton.next_power_of_2(D - first + den_col))
    return (first, rest) if first + rest < width else (width, 0)


def dense_settings(D: int, dtype, rope: bool, normalize: bool) -> dict:
    """The dense kernel's tile constants for these inputs: the head-dim tiles BD (+ BD2), queries BT and
    keys BS per step, DEN_COL (the denominator as a padding column of v, where there is one), and the
    launch's warps and stages."""
    c = kernel_settings("dense")
    den_col = normalize and not rope
    fp32 = dtype == torch.float32
    # two head-dim tiles for half-precision inputs only: fp32 tiles in two pieces spill registers
    # (`benchmarks/kernel_resources.py --head-dim 72 --dense-variants`), and fp32 is not the fast path
    BD, BD2 = dense_head_pieces(D, den_col) if not fp32 else (max(16, triton.next_power_of_2(D)), 0)
    BT = 32 if BD > 128 else (min(c.BT, 64) if fp32 else c.BT)
    # fp32 with rope keeps rotated and plain copies of both tiles: 64-key steps overflow shared memory at D=128
    # and 32-key steps at D=256 (234 KiB; 16 keys: 150 KiB, `benchmarks/kernel_resources.py --dense-variants`)
    if BD < 128 or (BD == 128 and not (rope and fp32)):
        BS = c.BS
    else:
        BS = 16 if BD > 128 and rope and fp32 else 32
    warps, stages = c.warps, c.stages
    if BD2:  # both pieces below 128 columns: settings of their own
        split = kernel_settings("dense_split")
        BT, BS, warps, stages = split.BT, split.BS, split.warps, split.stages
        if rope:  # its rotated copies: 64-key steps spill 264 bytes at D = 72 (32: 8; kernel_resources.py)
            BS = min(BS, 32)
    return dict(BD=BD, BD2=BD2, BT=BT, BS=BS, DEN_COL=den_col and D < BD + BD2,
                warps=warps, stages=stages)


def launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode, cos=None, sin=None):
    B, N, H, D = q.shape
    M = math.prod(blocks)
    onehot = kernel_settings("dense").onehot
    tiles = dense_settings(D, q.dtype, cos is not None, normalize)
    warps, stages = tiles.pop("warps"), tiles.pop("stages")
    BM = max(16, triton.next_power_of_2(M))
    ieee = q.dtype == torch.float32
    o = _new((B, N, H, D), q, q.dtype)
    mixf = mix.float().contiguous()
    tables, tstrides, rope = _rope_args(cos, sin, q)
    al = stride_unit(q, k, v, o)
    dense_forward_kernel[(B * H, triton.cdiv(N, tiles["BT"]))](
        q, k, v, mixf, _token_blocks_int32(grid, blocks, q.device), o, *tables,
        *row_strides(q, al), *row_strides(k, al), *row_strides(v, al), *row_strides(o, al), *tstrides,
        N, H, D, M, M * M if mix.dim() == 3 else 0, eps, scale, **tiles, BM=BM, ONEHOT=onehot and M <= 128,
        FEATURE=fcode, NORMALIZE=normalize,
        DOT_F32=ieee or _interpreting(), IEEE=ieee, ROPE=rope, AL=al, num_warps=warps, num_stages=stages)
    return o


def launch_query_grad(q, g, o, mixed, order, offsets, M, J, normalize, eps, scale, fcode, cos=None, sin=None):
    B, N, H, D = q.shape
    BD, TILE, BT, warps, stages = _config("query_grad", D, cos is not None and q.dtype == torch.float32,
                                          fp32=q.dtype == torch.float32)
    X = D * D + D
    dq = _new((B, N, H, D), q, q.dtype)
    dsz_part = _new((B, H, M * J, X), q, summary_dtype(q.dtype))
    tables, tstrides, rope = _rope_args(cos, sin, q)
    al = stride_unit(q, g, o, dq)
    query_grad_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        q, g, o, mixed, dq, dsz_part, order, offsets, *tables, *row_strides(q, al), *row_strides(g, al),
        *row_strides(o, al), *row_strides(dq, al), *tstrides, H, M, J, D, X, eps, scale,
        BD=BD, TILE=TILE, BT=BT, FEATURE=fcode, NORMALIZE=normalize, IEEE=q.dtype == torch.float32,
        ROPE=rope, LOWP=_lowp("query_grad", q.dtype), AL=al, PREFETCH=_prefetch("query_grad"),
        num_warps=warps, num_stages=stages)
    return dq, dsz_part


def launch_key_grad(k, v, dsz, order, offsets, M, J, fcode, cos=None, sin=None, largest=None):
    B, N, H, D = k.shape
    fp32 = k.dtype == torch.float32
    BD, TILE, BT, warps, stages = _config("key_grad", D, cos is not None and fp32,
                                          _tokens_per_program(largest, J, k.dtype), fp32=fp32)
    dk = _new((B, N, H, D), k, k.dtype)
    dv = _new((B, N, H, D), v, v.dtype)
    tables, tstrides, rope = _rope_args(cos, sin, k)
    al = stride_unit(k, v, dk, dv)
    key_grad_kernel[(B * H, M * J, triton.cdiv(D, TILE))](
        k, v, dsz, dk, dv, order, offsets, *tables, *row_strides(k, al), *row_strides(v, al), *row_strides(dk, al),
        *row_strides(dv, al), *tstrides, H, M, J, D, D * D + D, BD=BD, TILE=TILE, BT=BT, FEATURE=fcode,
        IEEE=k.dtype == torch.float32, ROPE=rope, LOWP=_lowp("key_grad", k.dtype), AL=al,
        PREFETCH=_prefetch("key_grad"), num_warps=warps, num_stages=stages)
    return dk, dv


def forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits,
                 cos=None, sin=None):
    """Returns (o, sz, mixed): the per-block (per-split) summaries and the mixed ones S~, z~, kept for the
    backward; both empty after the dense algorithm, which keeps nothing."""
    M = math.prod(blocks)
    fcode = FEATURE_CODES[feature_map]
    if algorithm == "dense":
        o = launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode, cos, sin)
        return o, q.new_empty((0,), dtype=torch.float32), q.new_empty((0,), dtype=torch.float32)
    order, offsets, largest = block_token_lists(grid, blocks, q.device)
    sz = launch_summary(k, v, order, offsets, M, splits, fcode, cos, sin, largest)
    # the apply rounds S~ to the input dtype for its products, so S~ is stored as the summaries are
    mixed = launch_mix(mix, sz, splits, ieee=q.dtype == torch.float32, out_dtype=sz.dtype)
    o = launch_apply(q, mixed, order, offsets, M, splits, normalize, eps, scale, fcode, cos, sin)
    return o, sz, mixed


def backward_impl(g, q, k, v, mix, o, sz, mixed, grid, blocks, normalize, eps, feature_map, scale, splits,
                  cos=None, sin=None):
    """The gradients of q, k, v and mix. The backward's own summaries (dS~ per query block, dS per key
    block) are stored as the forward's are (``summary_dtype``): key_grad rounds dS to the input dtype
    for its products anyway, and the sums that make dMc and dS run in fp32."""
    B, N, H, D = q.shape
    M, J, X = math.prod(blocks), splits, D * D + D
    fcode = FEATURE_CODES[feature_map]
    ieee = q.dtype == torch.float32
    order, offsets, largest = block_token_lists(grid, blocks, q.device)
    if sz.numel() == 0:  # the dense forward kept no summaries
        sz = launch_summary(k, v, order, offsets, M, J, fcode, cos, sin, largest)
        mixed = launch_mix(mix, sz, J, ieee, out_dtype=sz.dtype)
    dq, dsz_part = launch_query_grad(q, g, o, mixed, order, offsets, M, J, normalize, eps, scale, fcode, cos, sin)
    # dS~ per query block (split parts summed in fp32)
    dmixed = dsz_part.view(B, H, M, J, X).sum(3, dtype=torch.float32) if J > 1 else dsz_part
    dsz = launch_mix(mix, dmixed, 1, ieee, transpose=True, out_dtype=dsz_part.dtype)  # dS_b = Mc^T dS~
    block_sz = sz.view(B, H, M, J, X).sum(3) if J > 1 else sz
    dmix = launch_mix_grad(dmixed, block_sz, mix.dim() == 3, ieee)       # dMc_ib = <dS~_i, S_b>
    dk, dv = launch_key_grad(k, v, dsz, order, offsets, M, J, fcode, cos, sin, largest)
    return dq, dk, dv, dmix.to(mix.dtype)


# ---- eager path ---------------------------------------------------------------------------------

class _MHLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mix, *args):
        o, sz, mixed = forward_impl(q, k, v, mix, *args)
        grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin = args
        ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
        ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)
        # the backward may run on another thread (autograd's GPU workers): it takes the forward's settings
        ctx.settings = current_settings()
        return o

    @staticmethod
    def backward(ctx, g):
        q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
        with use_settings(ctx.settings):
            grads = backward_impl(g, q, k, v, mix, o, sz, mixed, *ctx.args, cos, sin)
        return (*grads,) + (None,) * 10


# ---- torch.compile path: custom ops -------------------------------------------------------------

@torch.library.custom_op("mediagen::mhla_fwd", mutates_args=())
def mhla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix: torch.Tensor, grid: list[int],
             blocks: list[int], normalize: bool, eps: float, feature_map: str, scale: float, algorithm: str,
             splits: int, cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward_impl(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin)


@mhla_fwd.register_fake
def _(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos=None, sin=None):
    B, N, H, D = q.shape
    o = q.new_empty((B, N, H, D))
    if algorithm == "dense":
        return o, q.new_empty((0,), dtype=torch.float32), q.new_empty((0,), dtype=torch.float32)
    M, X, dtype = math.prod(blocks), D * D + D, summary_dtype(q.dtype)
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
    q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, algorithm, splits, cos, sin = inputs
    o, sz, mixed = output
    ctx.save_for_backward(q, k, v, mix, o, sz, mixed, cos, sin)
    ctx.args = (grid, blocks, normalize, eps, feature_map, scale, splits)


def _backward(ctx, grad_o, grad_sz, grad_mixed):
    q, k, v, mix, o, sz, mixed, cos, sin = ctx.saved_tensors
    grads = torch.ops.mediagen.mhla_bwd(grad_o, q, k, v, mix, o, sz, mixed, *ctx.args, cos, sin)
    return (*grads,) + (None,) * 10


mhla_fwd.register_autograd(_backward, setup_context=_setup_context)


def mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                algorithm="auto", splits=None, rope=None):
    """Arguments already validated by ``mhla``. Returns o (B, N, H, D) in q's dtype."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed: use one of {ALGORITHMS}")
    B, N, H, D = q.shape
    M = math.prod(blocks)
    if splits is None:
        largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])  # ceil(L/b) tokens per axis at most
        splits = choose_splits(B, H, M, largest, D, q.device)
    if algorithm == "auto":
        algorithm = choose_algorithm(B, N, H, D, M, splits, q.dtype, rope is not None)
    cos, sin = rope if rope is not None else (None, None)
    args = (list(grid), list(blocks), normalize, float(eps), feature_map or "none",
            1.0 if scale is None else float(scale), algorithm, int(splits), cos, sin)
    if torch.compiler.is_compiling():
        return torch.ops.mediagen.mhla_fwd(q, k, v, mix, *args)[0]
    return _MHLAFunction.apply(q, k, v, mix, *args)
