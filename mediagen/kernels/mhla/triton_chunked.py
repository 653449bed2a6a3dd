"""Chunked MHLA kernels for long sequences: per-block summaries go through memory.

Forward:  summary_kernel writes, for every (batch, head, block, split), the partial summary
          S = sum phi(k_s) v_s^T (D x D) and z = sum phi(k_s) (D) as one fp32 row of X = D*D + D;
          the mixing S~ = Mc @ S is a matmul outside (splits are summed by the same matmul);
          apply_kernel computes o_t = phi(q_t) S~_i / (phi(q_t).z~_i + eps).
Backward: with du_t = g_t / den_t and dden_t = -(g_t . o_t) / den_t (normalize=False: du = scale*g),
          query_grad_kernel: dq~_t = S~_i du_t + z~_i dden_t and partial dS~_i = sum q~_t du_t^T,
          dz~_i = sum q~_t dden_t, where g_t . o_t = q~_t . (S~_i g_t) / den_t reuses the product of
          dq~ instead of reading o;  outside: dS_b = Mc^T dS~, dMc = dS~ . S;
          key_grad_kernel: dk~_s = dS_b v_s + dz_b, dv_s = dS_b^T k~_s.
With ROPE (rotation.py) the features that meet S (k in the summary, q in apply and their
gradients) are rotated in registers and z, den stay un-rotated; gradients that arrive in rotated
coordinates are rotated back before the feature map's derivative.
Every kernel tiles the output columns (TILE of the D columns per program) so D up to 256 fits.
D is a compile-time constant: with a head dim that is not a multiple of 16 (DiT's 72) a run-time D
leaves the compiler unable to prove the column masks constant over 8 lanes, and every load and store
of a token row falls back to 2-byte accesses. The summary row length X = D*D + D is one too in the
kernels that read summaries (apply, query_grad, key_grad and triton_mix.py's), for the same reason:
Triton marks a run-time int 16-divisible only when it is (X = 16,512 at D = 128 is, 5,256 at D = 72 is
not), and with a run-time X every S~ / dS row is read in 2-byte loads (129 per thread in apply instead of 16
of 16 bytes, `benchmarks/kernel_resources.py`). The summary kernel keeps a run-time X on purpose: 16-byte
stores would first move the accumulator out of the tensor-core layout through shared memory, which is slower
than 2-byte stores (measured: benchmarks/RESULTS.md, Kernel launch settings, dropped).
AL: the batch, token and head strides of q, k, v and their outputs arrive divided by AL (a power of two up to
16 dividing all of them, launches.stride_unit) and are multiplied back here, so that the compiler knows
each token row starts 16-byte aligned. Without it, at DiT's head dim 72 the head stride 72 is not one
Triton marks 16-divisible at launch, and every q, k, v, o row moves in 2-byte accesses
(`benchmarks/kernel_resources.py` counts them: 129 per thread in apply, 257 in key_grad).
Accumulation is fp32; DOT_F32 upcasts dot operands (fp32 inputs, and the CPU interpreter, whose
bf16 dot is wrong); IEEE selects exact fp32 dots over tf32.
Row sums run on the tensor cores as products with a one-hot column (``first_column``): z = sum phi(k_s)
is phi(K)^T e_0 summed over the 16 columns; with half-precision products (LOWP) apply's q.z~ is
q [z_hi | z_lo | 0..] (``hi_lo_columns``): cross-lane reductions are slower (measured: benchmarks/RESULTS.md,
Alternatives behind the defaults and rules). query_grad keeps cross-lane sums: the same products there, with 8
warps, compute wrong dz~ and fault on the H200 under triton 3.6 (Kernel launch settings, dropped).
PREFETCH: a program walks its block's sorted token list in steps of BT, and each step's rows are addressed
by ids loaded from that list; with PREFETCH the ids of the next step are loaded during this one, so a step
does not start with a dependent round trip (ids, then rows). It pays in summary and query_grad and not in
apply and key_grad (the ``prefetch`` launch setting, settings.py; measured: benchmarks/RESULTS.md, Kernel launch
settings).
The forward's summaries (S, z and the mixed S~, z~) are stored in fp32 for every input dtype; the backward's
dS~ and dS in bf16 for bf16 inputs (tiles.summary_dtype, grad_summary_dtype say why). With LOWP,
query_grad multiplies an fp32 S~ as two parts in the input dtype (hi + lo), since dq subtracts two nearly
equal terms made of it.
"""

import triton
import triton.language as tl

from ..triton_dot import dot as _dot
from .triton_common import (feature, feature_grad, first_column, hi_lo_columns, rope_tables, rotate, split_range,
                            token_ids)


@triton.jit
def block_program(offsets, H, J, D: tl.constexpr, BD: tl.constexpr, TILE: tl.constexpr):
    """The prologue of every chunked kernel: this program's (batch*head, block*split, column tile) ids, its
    batch b, head h and block i, its slice [lo, hi) of block i's sorted token list (which starts at ``start``),
    the head-dim columns d (all of them, padded to BD) and e (this tile's) and their masks."""
    bh = tl.program_id(0)
    ij = tl.program_id(1)
    tile = tl.program_id(2)
    b = bh // H
    h = bh % H
    i = ij // J
    start, lo, hi = split_range(offsets, i, ij % J, J)
    d = tl.arange(0, BD)
    e = tile * TILE + tl.arange(0, TILE)
    dmask = d < D
    emask = e < D
    return bh, ij, tile, b, h, i, start, lo, hi, d, e, dmask, emask


@triton.jit
def walk_step(order, start, t, hi, tok_next, BT: tl.constexpr, PREFETCH: tl.constexpr):
    """One step of the walk over a block's tokens from local index t: positions r, their mask and token ids,
    and (PREFETCH) the next step's ids; without PREFETCH ``tok_next`` comes back as given. The walk starts
    with tok_next = the first step's ids, which only PREFETCH reads (the compiler drops them otherwise)."""
    r = t + tl.arange(0, BT)
    rmask = r < hi
    if PREFETCH:
        tok = tok_next
        tok_next = token_ids(order, start, r + BT, hi)
    else:
        tok = token_ids(order, start, r, hi)
    return r, rmask, tok, tok_next


@triton.jit
def summary_kernel(K, V, SZ, order, offsets, COS, SIN,
                   skb, skn, skh, skd, svb, svn, svh, svd, sct, scj, sst, ssj,
                   H, MJ, J, D: tl.constexpr, X,
                   BD: tl.constexpr, TILE: tl.constexpr, BT: tl.constexpr,
                   FEATURE: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, ROPE: tl.constexpr,
                   AL: tl.constexpr, PREFETCH: tl.constexpr):
    skb, skn, skh, svb, svn, svh = skb * AL, skn * AL, skh * AL, svb * AL, svn * AL, svh * AL  # (AL: module doc)
    bh, ij, tile, b, h, i, start, lo, hi, d, e, dmask, emask = block_program(offsets, H, J, D, BD, TILE)
    acc = tl.zeros((BD, TILE), dtype=tl.float32)
    accz = tl.zeros((BD, 16), dtype=tl.float32)  # z in column 0 (first_column)
    if DOT_F32:
        ones = first_column(BT, tl.float32)
    else:
        ones = first_column(BT, V.dtype.element_ty)
    kbase = K + b.to(tl.int64) * skb + h * skh
    vbase = V + b.to(tl.int64) * svb + h * svh
    tok_next = token_ids(order, start, lo + tl.arange(0, BT), hi)  # (walk_step)
    for t in range(lo, hi, BT):
        r, rmask, tok, tok_next = walk_step(order, start, t, hi, tok_next, BT, PREFETCH)
        kmask = rmask[:, None] & dmask[None, :]
        kt = tl.load(kbase + tok[:, None] * skn + d[None, :] * skd, mask=kmask, other=0.0)
        kf = tl.where(kmask, feature(kt.to(tl.float32), FEATURE), 0.0)
        kn = kf
        if ROPE:
            c, s = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, 0, BD // 2, D)
            kn = rotate(kf, c, s, BT, BD, False)
        vt = tl.load(vbase + tok[:, None] * svn + e[None, :] * svd, mask=rmask[:, None] & emask[None, :], other=0.0)
        if DOT_F32:
            acc += _dot(tl.trans(kn), vt.to(tl.float32), IEEE)
            accz += _dot(tl.trans(kf), ones, IEEE)
        else:
            acc += tl.dot(tl.trans(kn.to(vt.dtype)), vt)
            accz += tl.dot(tl.trans(kf.to(vt.dtype)), ones)
    out = SZ + (bh.to(tl.int64) * MJ + ij) * X
    tl.store(out + d[:, None] * D + e[None, :], acc.to(SZ.dtype.element_ty), mask=dmask[:, None] & emask[None, :])
    if tile == 0:
        tl.store(out + D * D + d, tl.sum(accz, axis=1).to(SZ.dtype.element_ty), mask=dmask)


@triton.jit
def apply_kernel(Q, SZM, O, order, offsets, COS, SIN,
                 sqb, sqn, sqh, sqd, sob, son, soh, sod, sct, scj, sst, ssj,
                 H, M, J, D: tl.constexpr, X: tl.constexpr, eps, scale,
                 BD: tl.constexpr, TILE: tl.constexpr, BT: tl.constexpr,
                 FEATURE: tl.constexpr, NORMALIZE: tl.constexpr, IEEE: tl.constexpr, LOWP: tl.constexpr,
                 ROPE: tl.constexpr, AL: tl.constexpr, PREFETCH: tl.constexpr):
    # LOWP: half-precision inputs multiply in their own dtype (S~ rounded once to it, ~2^-9
    # relative per entry); otherwise fp32 operands (tf32 or IEEE).
    sqb, sqn, sqh, sob, son, soh = sqb * AL, sqn * AL, sqh * AL, sob * AL, son * AL, soh * AL
    bh, ij, tile, b, h, i, start, lo, hi, d, e, dmask, emask = block_program(offsets, H, J, D, BD, TILE)
    summ = SZM + (bh.to(tl.int64) * M + i) * X
    S = tl.load(summ + d[:, None] * D + e[None, :], mask=dmask[:, None] & emask[None, :], other=0.0)
    z = tl.load(summ + D * D + d, mask=dmask, other=0.0).to(tl.float32)
    if LOWP:
        S_lp = S.to(Q.dtype.element_ty)
        z_cols = hi_lo_columns(z, Q.dtype.element_ty)  # q.z~ as a product
    else:
        S = S.to(tl.float32)
    qbase = Q + b.to(tl.int64) * sqb + h * sqh
    obase = O + b.to(tl.int64) * sob + h * soh
    tok_next = token_ids(order, start, lo + tl.arange(0, BT), hi)  # (walk_step)
    for t in range(lo, hi, BT):
        r, rmask, tok, tok_next = walk_step(order, start, t, hi, tok_next, BT, PREFETCH)
        qmask = rmask[:, None] & dmask[None, :]
        qt = tl.load(qbase + tok[:, None] * sqn + d[None, :] * sqd, mask=qmask, other=0.0)
        qf = tl.where(qmask, feature(qt.to(tl.float32), FEATURE), 0.0)
        qn = qf
        if ROPE:
            c, s = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, 0, BD // 2, D)
            qn = rotate(qf, c, s, BT, BD, False)
        if LOWP:
            u = tl.dot(qn.to(Q.dtype.element_ty), S_lp)
        else:
            u = _dot(qn, S, IEEE)
        if NORMALIZE:
            if LOWP:
                den = tl.sum(tl.dot(qf.to(Q.dtype.element_ty), z_cols), axis=1) + eps
            else:
                den = tl.sum(qf * z[None, :], axis=1) + eps
            u = u / den[:, None]
        else:
            u = u * scale
        tl.store(obase + tok[:, None] * son + e[None, :] * sod, u.to(O.dtype.element_ty),
                 mask=rmask[:, None] & emask[None, :])


@triton.jit
def query_grad_kernel(Q, G, O, SZM, DQ, DSZ, order, offsets, COS, SIN,
                      sqb, sqn, sqh, sqd, sgb, sgn, sgh, sgd, sob, son, soh, sod, sdb, sdn, sdh, sdd,
                      sct, scj, sst, ssj,
                      H, M, J, D: tl.constexpr, X: tl.constexpr, eps, scale,
                      BD: tl.constexpr, TILE: tl.constexpr, BT: tl.constexpr,
                      FEATURE: tl.constexpr, NORMALIZE: tl.constexpr, IEEE: tl.constexpr, ROPE: tl.constexpr,
                      LOWP: tl.constexpr, AL: tl.constexpr, PREFETCH: tl.constexpr):
    # LOWP: half-precision inputs multiply in their own dtype (as apply_kernel's LOWP), fp32 accumulation.
    # P = g S~^T is the numerator's gradient times den; with one column tile (TILE == BD) it also gives
    # delta_t = g_t.o_t = qn_t.P_t / den_t, so o is read only when the head dim spans several tiles.
    sqb, sqn, sqh, sgb, sgn, sgh = sqb * AL, sqn * AL, sqh * AL, sgb * AL, sgn * AL, sgh * AL
    sob, son, soh, sdb, sdn, sdh = sob * AL, son * AL, soh * AL, sdb * AL, sdn * AL, sdh * AL
    bh, ij, tile, b, h, i, start, lo, hi, d, e, dmask, emask = block_program(offsets, H, J, D, BD, TILE)
    if LOWP:
        dt = Q.dtype.element_ty
    else:
        dt = tl.float32
    summ = SZM + (bh.to(tl.int64) * M + i) * X
    S_rows = tl.load(summ + e[:, None] * D + d[None, :], mask=emask[:, None] & dmask[None, :], other=0.0)
    if LOWP and SZM.dtype.element_ty == tl.float32:
        # S~ as two parts in the input dtype, hi + lo (~2^-16 relative for bf16): dq subtracts z~ (g.o) from
        # S~ g, two nearly equal terms with non-negative v, so S~ rounded once to bf16 made dq errors of 4e-2
        # to 8e-2 against fp64; the second product costs one more dot per step
        S_lo = (S_rows - S_rows.to(dt).to(tl.float32)).to(dt)
    S_rows = S_rows.to(dt)
    z = tl.load(summ + D * D + d, mask=dmask, other=0.0).to(tl.float32)
    z_e = tl.load(summ + D * D + e, mask=emask, other=0.0).to(tl.float32)
    accS = tl.zeros((BD, TILE), dtype=tl.float32)
    # dz~ summed over the tile's rows once after the loop: a sum over rows in the loop would cross warps
    # (through shared memory) at every step
    accz = tl.zeros((BT, BD), dtype=tl.float32)
    qbase = Q + b.to(tl.int64) * sqb + h * sqh
    gbase = G + b.to(tl.int64) * sgb + h * sgh
    obase = O + b.to(tl.int64) * sob + h * soh
    dbase = DQ + b.to(tl.int64) * sdb + h * sdh
    tok_next = token_ids(order, start, lo + tl.arange(0, BT), hi)  # (walk_step)
    for t in range(lo, hi, BT):
        r, rmask, tok, tok_next = walk_step(order, start, t, hi, tok_next, BT, PREFETCH)
        fmask = rmask[:, None] & dmask[None, :]
        tmask = rmask[:, None] & emask[None, :]
        qt = tl.load(qbase + tok[:, None] * sqn + d[None, :] * sqd, mask=fmask, other=0.0)
        qf = tl.where(fmask, feature(qt.to(tl.float32), FEATURE), 0.0)
        g = tl.load(gbase + tok[:, None] * sgn + d[None, :] * sgd, mask=fmask, other=0.0)
        if TILE == BD:  # one column tile: the tile is the whole row, no second load
            g_e = g
        else:
            g_e = tl.load(gbase + tok[:, None] * sgn + e[None, :] * sgd, mask=tmask, other=0.0)
        qn = qf
        if ROPE:
            c, s = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, 0, BD // 2, D)
            qn = rotate(qf, c, s, BT, BD, False)
        # w.r.t. the numerator's (rotated) features, columns e
        P = _dot(g.to(dt), tl.trans(S_rows), IEEE)
        if LOWP and SZM.dtype.element_ty == tl.float32:
            P = tl.dot(g.to(dt), tl.trans(S_lo), P)
        if NORMALIZE:
            # 0 on rows past the block's end (no token): with eps=0 their 1/0 would reach dS~ as 0 * inf = NaN
            inv = tl.where(rmask, 1.0 / (tl.sum(qf * z[None, :], axis=1) + eps), 0.0)
            if TILE == BD:
                delta = tl.sum(qn * P, axis=1) * inv
            else:  # delta_t = g_t . o_t (as in flash attention's backward)
                o = tl.load(obase + tok[:, None] * son + d[None, :] * sod, mask=fmask, other=0.0)
                delta = tl.sum(g.to(tl.float32) * o.to(tl.float32), axis=1)
            dden = -delta * inv  # dL/dden_t
            dq = P * inv[:, None]
            qs = qn * inv[:, None]  # dS~ = sum_t qn_t du_t^T with du_t = g_t / den_t
        else:
            dq = P * scale
            qs = qn
        if ROPE:
            if TILE == BD:
                dq = rotate(dq, c, s, BT, TILE, True)
            else:
                ce, se = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, tile * (TILE // 2), TILE // 2, D)
                dq = rotate(dq, ce, se, BT, TILE, True)
        if NORMALIZE:
            dq += dden[:, None] * z_e[None, :]
        if TILE == BD:
            q_e = qt.to(tl.float32)
        else:
            q_e = tl.load(qbase + tok[:, None] * sqn + e[None, :] * sqd, mask=tmask, other=0.0).to(tl.float32)
        dq = dq * feature_grad(q_e, FEATURE)
        tl.store(dbase + tok[:, None] * sdn + e[None, :] * sdd, dq.to(DQ.dtype.element_ty), mask=tmask)
        accS += _dot(tl.trans(qs.to(dt)), g_e.to(dt), IEEE)
        if NORMALIZE:
            accz += qf * dden[:, None]
    if not NORMALIZE:
        accS = accS * scale
    out = DSZ + (bh.to(tl.int64) * M * J + ij) * X
    tl.store(out + d[:, None] * D + e[None, :], accS.to(DSZ.dtype.element_ty), mask=dmask[:, None] & emask[None, :])
    if tile == 0:
        tl.store(out + D * D + d, tl.sum(accz, axis=0).to(DSZ.dtype.element_ty), mask=dmask)


@triton.jit
def key_grad_kernel(K, V, DSZ, DK, DV, order, offsets, COS, SIN,
                    skb, skn, skh, skd, svb, svn, svh, svd,
                    sdkb, sdkn, sdkh, sdkd, sdvb, sdvn, sdvh, sdvd, sct, scj, sst, ssj,
                    H, M, J, D: tl.constexpr, X: tl.constexpr,
                    BD: tl.constexpr, TILE: tl.constexpr, BT: tl.constexpr,
                    FEATURE: tl.constexpr, IEEE: tl.constexpr, ROPE: tl.constexpr, LOWP: tl.constexpr,
                    AL: tl.constexpr, PREFETCH: tl.constexpr):
    skb, skn, skh, svb, svn, svh = skb * AL, skn * AL, skh * AL, svb * AL, svn * AL, svh * AL
    sdkb, sdkn, sdkh, sdvb, sdvn, sdvh = sdkb * AL, sdkn * AL, sdkh * AL, sdvb * AL, sdvn * AL, sdvh * AL
    bh, ij, tile, b, h, i, start, lo, hi, d, e, dmask, emask = block_program(offsets, H, J, D, BD, TILE)
    summ = DSZ + (bh.to(tl.int64) * M + i) * X
    # dS read once in the dot dtype: LOWP rounds it to the input dtype, otherwise fp32
    if LOWP:
        dt = K.dtype.element_ty
    else:
        dt = tl.float32
    dS_cols = tl.load(summ + d[:, None] * D + e[None, :], mask=dmask[:, None] & emask[None, :], other=0.0).to(dt)
    if TILE == BD:  # rows e = all rows: the same tile
        dS_rows = dS_cols
    else:
        dS_rows = tl.load(summ + e[:, None] * D + d[None, :], mask=emask[:, None] & dmask[None, :], other=0.0).to(dt)
    dz_e = tl.load(summ + D * D + e, mask=emask, other=0.0).to(tl.float32)
    kbase = K + b.to(tl.int64) * skb + h * skh
    vbase = V + b.to(tl.int64) * svb + h * svh
    dkbase = DK + b.to(tl.int64) * sdkb + h * sdkh
    dvbase = DV + b.to(tl.int64) * sdvb + h * sdvh
    tok_next = token_ids(order, start, lo + tl.arange(0, BT), hi)  # (walk_step)
    for t in range(lo, hi, BT):
        r, rmask, tok, tok_next = walk_step(order, start, t, hi, tok_next, BT, PREFETCH)
        fmask = rmask[:, None] & dmask[None, :]
        tmask = rmask[:, None] & emask[None, :]
        kt = tl.load(kbase + tok[:, None] * skn + d[None, :] * skd, mask=fmask, other=0.0)
        kf = tl.where(fmask, feature(kt.to(tl.float32), FEATURE), 0.0)
        vt = tl.load(vbase + tok[:, None] * svn + d[None, :] * svd, mask=fmask, other=0.0)
        kn = kf
        if ROPE:
            c, s = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, 0, BD // 2, D)
            kn = rotate(kf, c, s, BT, BD, False)
        dv = _dot(kn.to(dt), dS_cols, IEEE)
        tl.store(dvbase + tok[:, None] * sdvn + e[None, :] * sdvd, dv.to(DV.dtype.element_ty), mask=tmask)
        dk = _dot(vt.to(dt), tl.trans(dS_rows), IEEE)  # w.r.t. the numerator's (rotated) features, columns e
        if ROPE:
            if TILE == BD:
                dk = rotate(dk, c, s, BT, TILE, True)
            else:
                ce, se = rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, tile * (TILE // 2), TILE // 2, D)
                dk = rotate(dk, ce, se, BT, TILE, True)
        dk = dk + dz_e[None, :]
        if TILE == BD:
            k_e = kt.to(tl.float32)
        else:
            k_e = tl.load(kbase + tok[:, None] * skn + e[None, :] * skd, mask=tmask, other=0.0).to(tl.float32)
        dk = dk * feature_grad(k_e, FEATURE)
        tl.store(dkbase + tok[:, None] * sdkn + e[None, :] * sdkd, dk.to(DK.dtype.element_ty), mask=tmask)
