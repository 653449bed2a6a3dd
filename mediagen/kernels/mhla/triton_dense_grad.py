"""Dense MHLA backward for short sequences: the dense forward's gradients, nothing D x D in memory.

With s_ts = phi(q_t).phi(k_s), w_ts = Mc[i(t), i(s)], p_ts = w_ts s_ts and, with normalize,
den_t = sum_s p_ts + eps and o_t = sum_s p_ts v_s / den_t (else o_t = scale sum_s p_ts v_s), the gradient g_t
of o_t gives
    dp_ts = (g_t.v_s - g_t.o_t) / den_t                (without normalize: scale g_t.v_s)
    dphi(q_t) = sum_s dp_ts w_ts phi(k_s)     dphi(k_s) = sum_t dp_ts w_ts phi(q_t)
    dv_s = sum_t p_ts g_t / den_t             dMc[i, j] = sum over t in block i, s in block j of dp_ts s_ts
and dq = dphi(q) phi'(q), dk = dphi(k) phi'(k). No RoPE (the chunked backward serves it).

dense_query_grad_kernel, program (batch x head, tile of BT queries): one walk over the keys makes dp per pair
and from it dq and the tile's dMc part (dp s summed per key block as a product with the keys' one-hot block
indicators, then per query block). 1 / den_t comes from the forward (INV), and g_t.o_t from the forward's o
plus what its rounding lost (LO, for half-precision o; triton_dense.py's SAVE): dp subtracts two nearly equal
terms where attention is nearly uniform over positive values, and a bf16 o's rounding (2^-8 relative) comes
back magnified: in an fp64 emulation of positive q, k, v, dq was 2e-2 to 5e-2 off with g.o from the bf16 o and
2e-3 with o + lo, the same as with an exact o (making g.o again from fp32 products would take a walk over the
keys, two more token-pair products per pair). The dMc block sums multiply in tf32 (_block_sums). Each row's
g_t.o_t goes to memory (GO) for:
dense_key_grad_kernel, program (batch x head, tile of BT keys): one walk over the queries makes dk and dv.
Both subtract in fp32 per pair and round only dp w (a difference already taken) for the products.
Head dims split as in the dense forward (triton_dense.py: BD + BD2 columns, DiT's 72 as 64 + 16); the
strides arrive divided by AL (triton_chunked.py's module doc); TAIL as in the forward, for both walks. The dMc
parts are summed outside.
"""

import triton
import triton.language as tl

from .triton_common import feature_grad
from .triton_dense import _feature_tile, _scores, _weighted_values


@triton.jit
def _tile(base, rows, rmask, stride_n, cols, stride_d, D: tl.constexpr, DOT_F32: tl.constexpr):
    """Token rows x head-dim columns as loaded (fp32 with DOT_F32), masked entries 0."""
    m = rmask[:, None] & (cols < D)[None, :]
    t = tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d, mask=m, other=0.0)
    if DOT_F32:
        t = t.to(tl.float32)
    return t


@triton.jit
def _operand(f, like, DOT_F32: tl.constexpr):
    """A feature tile (fp32) as a dot operand: fp32 with DOT_F32, else in the inputs' half dtype."""
    if DOT_F32:
        return f
    else:
        return f.to(like.dtype)


@triton.jit
def _step_products(fbase, rbase, rows, rmask, sfn, sfd, srn, srd, cols, D: tl.constexpr, xf, xr,
                   FEATURE: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """One head-dim piece (columns ``cols``) of a step over the other side's rows: their raw features, phi of them
    as a dot operand, their second tile (v or g) as loaded, and this program's products with them, xf @ phi^T and
    xr @ second^T."""
    ft, ff = _feature_tile(fbase, rows, rmask, sfn, cols, sfd, D, FEATURE)
    ff = _operand(ff, ft, DOT_F32)
    rt = _tile(rbase, rows, rmask, srn, cols, srd, D, DOT_F32)
    return ft, ff, rt, _scores(xf, ff, DOT_F32, IEEE), _scores(xr, rt, DOT_F32, IEEE)


@triton.jit
def _both_pieces(fbase, rbase, rows, rmask, sfn, sfd, srn, srd, d, d2, D: tl.constexpr, xf, xr, xf2, xr2,
                 BD2: tl.constexpr, FEATURE: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """``_step_products`` over the head dim's one or two pieces: (phi operand, second tile) of each piece (the
    first piece's again in place of a second one) and the two products summed over the pieces."""
    ft, ff, rt, s, x = _step_products(fbase, rbase, rows, rmask, sfn, sfd, srn, srd, d, D, xf, xr, FEATURE,
                                      DOT_F32, IEEE)
    ff2, rt2 = ff, rt
    if BD2 > 0:
        ft2, ff2, rt2, s2, x2 = _step_products(fbase, rbase, rows, rmask, sfn, sfd, srn, srd, d2, D, xf2, xr2,
                                               FEATURE, DOT_F32, IEEE)
        s += s2
        x += x2
    return ff, rt, ff2, rt2, s, x


@triton.jit
def _onehot(ids, mask, m):
    """(rows, BM) fp32 indicators of each row's block id (0 on masked rows)."""
    return tl.where((ids[:, None] == m[None, :]) & mask[:, None], 1.0, 0.0)


@triton.jit
def _weights(rows_of_mix, onehot, IEEE: tl.constexpr):
    """Mc entries per (row, column) pair: rows_of_mix (R, BM) holds each row's Mc entries, onehot (C, BM) each
    column's block; the dense forward's one-hot product (triton_dense.py)."""
    if IEEE:
        return tl.dot(rows_of_mix, tl.trans(onehot), input_precision="ieee")
    else:
        return tl.dot(rows_of_mix, tl.trans(onehot))


@triton.jit
def _block_sums(r, onehot, IEEE: tl.constexpr):
    """r (R, C) fp32 summed over its columns per column block: r @ onehot (C, BM), on the tensor cores in tf32
    for half-precision inputs (the sums' relative error about 2e-4 in an fp64 emulation, beside bf16's 2^-8;
    exact fp32 products took as long as the tile's three bf16 products together: benchmarks/RESULTS.md, Forward +
    backward at training shapes: the dense backward), in exact fp32 products for fp32 inputs. (In bf16 parts on
    the tensor cores triton 3.6 read shared memory out of bounds, compute-sanitizer; the same section, dropped.)"""
    if IEEE:
        return tl.dot(r, onehot, input_precision="ieee")
    else:
        return tl.dot(r, onehot)


@triton.jit
def _row_dot(gt, obase, lobase, rows, rmask, son, cols, sod, D: tl.constexpr, LO_PART: tl.constexpr):
    """sum over the columns ``cols`` of g_t * o_t per row, fp32, with o's rounding added back (LO_PART)."""
    m = rmask[:, None] & (cols < D)[None, :]
    off = rows[:, None].to(tl.int64) * son + cols[None, :] * sod
    o = tl.load(obase + off, mask=m, other=0.0).to(tl.float32)
    if LO_PART:
        o += tl.load(lobase + off, mask=m, other=0.0).to(tl.float32)
    return tl.sum(gt.to(tl.float32) * o, axis=1)


@triton.jit
def _query_grad_step(acc, acc2, part, s0, BS: tl.constexpr, qf, gt, qf2, gt2, go, inv, mix_rows, m, kbase, vbase,
                     skn, skd, svn, svd, BLK, d, d2, N, D: tl.constexpr, BD2: tl.constexpr, FEATURE: tl.constexpr,
                     DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """One step of dense_query_grad_kernel's key walk (keys s0 .. s0 + BS - 1, masked past N): returns acc, acc2
    and part with the step's terms added."""
    cols = s0 + tl.arange(0, BS)
    cmask = cols < N
    kf, vt, kf2, vt2, s, gv = _both_pieces(kbase, vbase, cols, cmask, skn, skd, svn, svd, d, d2, D, qf, gt, qf2, gt2,
                                           BD2, FEATURE, DOT_F32, IEEE)
    onehot = _onehot(tl.load(BLK + cols, mask=cmask, other=0), cmask, m)
    w = _weights(mix_rows, onehot, IEEE)
    dp = (gv - go[:, None]) * inv[:, None]
    a = dp * w
    acc += _weighted_values(a, kf, DOT_F32, IEEE)
    if BD2 > 0:
        acc2 += _weighted_values(a, kf2, DOT_F32, IEEE)
    part += _block_sums(dp * s, onehot, IEEE)
    return acc, acc2, part


@triton.jit
def dense_query_grad_kernel(Q, K, V, G, O, LO, MIX, BLK, INV, DQ, GO, DMIX,
                            sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd,
                            sob, son, soh, sod,
                            N, H, D: tl.constexpr, M, mix_head_stride, scale,
                            BD: tl.constexpr, BD2: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                            BM: tl.constexpr, FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
                            DOT_F32: tl.constexpr, IEEE: tl.constexpr, AL: tl.constexpr,
                            LO_PART: tl.constexpr = False, TAIL: tl.constexpr = 0):
    # row strides arrive divided by AL; O, LO and DQ have the strides so* (contiguous, as the op allocates them)
    sqb, sqn, sqh, skb, skn, skh = sqb * AL, sqn * AL, sqh * AL, skb * AL, skn * AL, skh * AL
    svb, svn, svh, sgb, sgn, sgh = svb * AL, svn * AL, svh * AL, sgb * AL, sgn * AL, sgh * AL
    sob, son, soh = sob * AL, son * AL, soh * AL
    bh = tl.program_id(0)
    tile = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = tile * BT + tl.arange(0, BT)
    rmask = rows < N
    d = tl.arange(0, BD)
    qbase = Q + b.to(tl.int64) * sqb + h * sqh
    gbase = G + b.to(tl.int64) * sgb + h * sgh
    kbase = K + b.to(tl.int64) * skb + h * skh
    vbase = V + b.to(tl.int64) * svb + h * svh
    ooff = b.to(tl.int64) * sob + h * soh
    qt, qf = _feature_tile(qbase, rows, rmask, sqn, d, sqd, D, FEATURE)
    qf = _operand(qf, qt, DOT_F32)
    gt = _tile(gbase, rows, rmask, sgn, d, sgd, D, DOT_F32)
    if BD2 > 0:  # the second piece of the head dim, columns BD .. BD + BD2 - 1
        d2 = BD + tl.arange(0, BD2)
        qt2, qf2 = _feature_tile(qbase, rows, rmask, sqn, d2, sqd, D, FEATURE)
        qf2 = _operand(qf2, qt2, DOT_F32)
        gt2 = _tile(gbase, rows, rmask, sgn, d2, sgd, D, DOT_F32)
    m = tl.arange(0, BM)
    bq = tl.load(BLK + rows, mask=rmask, other=0)
    mix_rows = tl.load(MIX + h * mix_head_stride + bq[:, None] * M + m[None, :],
                       mask=rmask[:, None] & (m < M)[None, :], other=0.0)
    if NORMALIZE:
        row = bh.to(tl.int64) * N + rows
        inv = tl.load(INV + row, mask=rmask, other=0.0)  # (0 on padding rows: nothing there may reach dMc)
        go = _row_dot(gt, O + ooff, LO + ooff, rows, rmask, son, d, sod, D, LO_PART)
        if BD2 > 0:
            go += _row_dot(gt2, O + ooff, LO + ooff, rows, rmask, son, d2, sod, D, LO_PART)
        tl.store(GO + row, go, mask=rmask)
    else:
        inv = tl.where(rmask, scale, 0.0)
        go = tl.zeros((BT,), dtype=tl.float32)
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    if BD2 > 0:
        acc2 = tl.zeros((BT, BD2), dtype=tl.float32)
    part = tl.zeros((BT, BM), dtype=tl.float32)  # sum_s dp_ts s_ts per key block
    if BD2 == 0:  # (placeholders for the second piece's arguments, unused)
        d2, qf2, gt2, acc2 = d, qf, gt, 0.0  # (a scalar: a tile would be carried through the walk)
    if TAIL > 0:  # full steps, then the last N % BS keys in one step of TAIL (triton_dense.py)
        full = N // BS * BS
    else:
        full = N
    for s0 in range(0, full, BS):
        acc, acc2, part = _query_grad_step(acc, acc2, part, s0, BS, qf, gt, qf2, gt2, go, inv, mix_rows, m, kbase,
                                           vbase, skn, skd, svn, svd, BLK, d, d2, N, D, BD2, FEATURE, DOT_F32, IEEE)
    if TAIL > 0:
        acc, acc2, part = _query_grad_step(acc, acc2, part, full, TAIL, qf, gt, qf2, gt2, go, inv, mix_rows, m,
                                           kbase, vbase, skn, skd, svn, svd, BLK, d, d2, N, D, BD2, FEATURE, DOT_F32,
                                           IEEE)
    obase = DQ + ooff + rows[:, None].to(tl.int64) * son
    dq = acc * feature_grad(qt.to(tl.float32), FEATURE)
    tl.store(obase + d[None, :] * sod, dq.to(DQ.dtype.element_ty), mask=rmask[:, None] & (d < D)[None, :])
    if BD2 > 0:
        dq2 = acc2 * feature_grad(qt2.to(tl.float32), FEATURE)
        tl.store(obase + d2[None, :] * sod, dq2.to(DQ.dtype.element_ty), mask=rmask[:, None] & (d2 < D)[None, :])
    # this tile's dMc part: the key-block sums of its rows added per query block (onehot^T @ part)
    blocks = tl.dot(tl.trans(_onehot(bq, rmask, m)), part, input_precision="ieee")
    out = DMIX + (bh.to(tl.int64) * tl.num_programs(1) + tile) * M * M
    tl.store(out + m[:, None] * M + m[None, :], blocks, mask=(m < M)[:, None] & (m < M)[None, :])


@triton.jit
def _key_grad_step(dk, dv, dk2, dv2, t0, BS: tl.constexpr, kf, vt, kf2, vt2, mix_cols, m, qbase, gbase, sqn, sqd,
                   sgn, sgd, BLK, INV, GO, row, scale, d, d2, N, D: tl.constexpr, BD2: tl.constexpr,
                   FEATURE: tl.constexpr, NORMALIZE: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """One step of dense_key_grad_kernel's query walk (queries t0 .. t0 + BS - 1, masked past N): returns dk, dv,
    dk2 and dv2 with the step's terms added."""
    rows = t0 + tl.arange(0, BS)
    rmask = rows < N
    # (keys, queries) products
    qf, gt, qf2, gt2, s, vg = _both_pieces(qbase, gbase, rows, rmask, sqn, sqd, sgn, sgd, d, d2, D, kf, vt, kf2, vt2,
                                           BD2, FEATURE, DOT_F32, IEEE)
    w = _weights(mix_cols, _onehot(tl.load(BLK + rows, mask=rmask, other=0), rmask, m), IEEE)
    if NORMALIZE:
        inv = tl.load(INV + row + rows, mask=rmask, other=0.0)
        go = tl.load(GO + row + rows, mask=rmask, other=0.0)
        dp = (vg - go[None, :]) * inv[None, :]
        pv = s * w * inv[None, :]
    else:
        dp = vg * scale
        pv = s * w * scale
    a = dp * w
    dk += _weighted_values(a, qf, DOT_F32, IEEE)
    dv += _weighted_values(pv, gt, DOT_F32, IEEE)
    if BD2 > 0:
        dk2 += _weighted_values(a, qf2, DOT_F32, IEEE)
        dv2 += _weighted_values(pv, gt2, DOT_F32, IEEE)
    return dk, dv, dk2, dv2


@triton.jit
def dense_key_grad_kernel(Q, K, V, G, MIX, BLK, INV, GO, DK, DV,
                          sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd, sgb, sgn, sgh, sgd,
                          sob, son, soh, sod,
                          N, H, D: tl.constexpr, M, mix_head_stride, scale,
                          BD: tl.constexpr, BD2: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                          BM: tl.constexpr, FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
                          DOT_F32: tl.constexpr, IEEE: tl.constexpr, AL: tl.constexpr, TAIL: tl.constexpr = 0):
    # DK and DV share the strides so* (contiguous)
    sqb, sqn, sqh, skb, skn, skh = sqb * AL, sqn * AL, sqh * AL, skb * AL, skn * AL, skh * AL
    svb, svn, svh, sgb, sgn, sgh = svb * AL, svn * AL, svh * AL, sgb * AL, sgn * AL, sgh * AL
    sob, son, soh = sob * AL, son * AL, soh * AL
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    cols = tl.program_id(1) * BT + tl.arange(0, BT)  # this program's keys
    cmask = cols < N
    d = tl.arange(0, BD)
    qbase = Q + b.to(tl.int64) * sqb + h * sqh
    gbase = G + b.to(tl.int64) * sgb + h * sgh
    kbase = K + b.to(tl.int64) * skb + h * skh
    vbase = V + b.to(tl.int64) * svb + h * svh
    kt, kf = _feature_tile(kbase, cols, cmask, skn, d, skd, D, FEATURE)
    kf = _operand(kf, kt, DOT_F32)
    vt = _tile(vbase, cols, cmask, svn, d, svd, D, DOT_F32)
    if BD2 > 0:  # the second piece of the head dim
        d2 = BD + tl.arange(0, BD2)
        kt2, kf2 = _feature_tile(kbase, cols, cmask, skn, d2, skd, D, FEATURE)
        kf2 = _operand(kf2, kt2, DOT_F32)
        vt2 = _tile(vbase, cols, cmask, svn, d2, svd, D, DOT_F32)
    m = tl.arange(0, BM)
    bk = tl.load(BLK + cols, mask=cmask, other=0)
    # Mc's column of each key's block: mix_cols[s, i] = Mc[i, i(s)]
    mix_cols = tl.load(MIX + h * mix_head_stride + m[None, :] * M + bk[:, None],
                       mask=cmask[:, None] & (m < M)[None, :], other=0.0)
    dk = tl.zeros((BT, BD), dtype=tl.float32)
    dv = tl.zeros((BT, BD), dtype=tl.float32)
    if BD2 > 0:
        dk2 = tl.zeros((BT, BD2), dtype=tl.float32)
        dv2 = tl.zeros((BT, BD2), dtype=tl.float32)
    row = bh.to(tl.int64) * N
    if BD2 == 0:  # (placeholders for the second piece's arguments, unused)
        d2, kf2, vt2, dk2, dv2 = d, kf, vt, 0.0, 0.0  # (scalars: tiles would be carried through the walk)
    if TAIL > 0:  # full steps, then the last N % BS queries in one step of TAIL (triton_dense.py)
        full = N // BS * BS
    else:
        full = N
    for t0 in range(0, full, BS):
        dk, dv, dk2, dv2 = _key_grad_step(dk, dv, dk2, dv2, t0, BS, kf, vt, kf2, vt2, mix_cols, m, qbase, gbase, sqn,
                                          sqd, sgn, sgd, BLK, INV, GO, row, scale, d, d2, N, D, BD2, FEATURE,
                                          NORMALIZE, DOT_F32, IEEE)
    if TAIL > 0:
        dk, dv, dk2, dv2 = _key_grad_step(dk, dv, dk2, dv2, full, TAIL, kf, vt, kf2, vt2, mix_cols, m, qbase, gbase,
                                          sqn, sqd, sgn, sgd, BLK, INV, GO, row, scale, d, d2, N, D, BD2, FEATURE,
                                          NORMALIZE, DOT_F32, IEEE)
    kmask = cmask[:, None] & (d < D)[None, :]
    obase = b.to(tl.int64) * sob + h * soh + cols[:, None].to(tl.int64) * son
    tl.store(DK + obase + d[None, :] * sod, (dk * feature_grad(kt.to(tl.float32), FEATURE)).to(DK.dtype.element_ty),
             mask=kmask)
    tl.store(DV + obase + d[None, :] * sod, dv.to(DV.dtype.element_ty), mask=kmask)
    if BD2 > 0:
        kmask2 = cmask[:, None] & (d2 < D)[None, :]
        tl.store(DK + obase + d2[None, :] * sod,
                 (dk2 * feature_grad(kt2.to(tl.float32), FEATURE)).to(DK.dtype.element_ty), mask=kmask2)
        tl.store(DV + obase + d2[None, :] * sod, dv2.to(DV.dtype.element_ty), mask=kmask2)
