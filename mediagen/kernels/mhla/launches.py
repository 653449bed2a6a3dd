"""Launches of the MHLA Triton kernels.

Launch records (``CachedLaunch``) are pure functions of shapes, strides, dtypes, options and one settings table
(``_*_launch``); the runs (``_run_*``) allocate a launch's outputs and launch with its record; ``launch_*`` are the
same launches for callers outside the op (sequence parallelism, benchmarks): they read the launch settings in
force and cache their records. Strides reach the kernels divided by their common power-of-two unit
(``stride_unit``; triton_chunked.py's module doc).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from .layout import persistent_copy, token_block_ids
from .settings import current_settings
from .triton_chunked import apply_kernel, key_grad_kernel, query_grad_kernel, summary_kernel
from .triton_dense import dense_forward_kernel
from .triton_dense_grad import dense_key_grad_kernel, dense_query_grad_kernel
from .triton_mix import mix_grad_kernel, mix_kernel, part_sum_kernel
from ..launch import CachedLaunch
from ..switches import empty_output as _empty
from . import tiles  # (the SM count read through the module, where tests replace it)
from .tiles import (_cdiv, _chunked_tiles, _dense_tiles, _interpreting, _lowp, _next_pow2, _tokens_per_program,
                    dense_grad_tiles, dense_tail, fill_rows, summary_dtype)

# Plans and launch records kept at most (an entry is a few hundred bytes plus, for plans, the small index
# tensors of their grid); past this the cache starts over.
MAX_CACHED = 1024


def _new(shape, like, dtype):
    return _empty(shape, like.device, dtype)


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
        sms = tiles._num_sms(device.index or 0) if device.type == "cuda" else 1
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


def cpe_form(weight, bias, grid, channels: int) -> tuple:
    """((G0, G1, G2), (K0, K1, K2), has_bias) of a CPE that the dense forward adds to o: a depthwise kernel
    ``weight`` (channels, 1, *k) with one odd size per axis of ``grid``, ``bias`` (channels,) or None. Raises
    ValueError naming what is not allowed."""
    from ..cpe import check_cpe_args

    n = math.prod(grid)
    like = torch.empty((1, n, channels), device="meta")
    g3, k3 = check_cpe_args(like, like, weight, bias, grid)
    return g3, k3, bias is not None


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
    tail = dense_tail(N, tiles["BS"], tiles["BD"] + tiles["BD2"], ieee) if settings["dense_grad"].tail else 0
    consts = dict(**tiles, BM=max(16, _next_pow2(M)), FEATURE=fcode, NORMALIZE=normalize,
                  DOT_F32=ieee or _interpreting(), IEEE=ieee, AL=al, TAIL=tail, num_warps=warps, num_stages=stages)
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


def launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode, cos=None, sin=None):
    M = math.prod(blocks)
    settings, tstrides = current_settings(), _table_strides(cos, sin)
    strides = (q.stride(), k.stride(), v.stride())
    key = ("dense", id(settings), q.shape, q.dtype, strides, tstrides, M, mix.dim() == 3, normalize, eps, scale,
           fcode)
    launch = _cached(_launches, key, lambda: (settings, _dense_launch(
        settings, q.shape, q.dtype, strides, tstrides, M, mix.dim() == 3, normalize, eps, scale, fcode,
        tiles._sms_of(q.device))))[1]
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
