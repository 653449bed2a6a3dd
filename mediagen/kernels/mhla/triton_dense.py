"""Dense MHLA forward for short sequences: nothing D x D goes to memory.

For a tile of queries the kernel walks all keys like flash attention, without the softmax:
    p_ts = Mc[i(t), i(s)] * phi(q_t).phi(k_s),   o_t = sum_s p_ts v_s / (sum_s p_ts + eps).
This is the dense form of MHLA (docs/DESIGN.md, dense form) and costs O(N^2 D), which beats writing, mixing and
re-reading M per-block D x D summaries when N is small (DiT at 256 px: N = 256, M = 16, d = 72,
where the summaries outweigh q, k and v together). Tokens stay in their grid order; each token's
block id comes from a small int32 table. D is a compile-time constant (see triton_chunked.py).
With ROPE the numerator's scores use rotated features, R_t(phi(q_t)).R_s(phi(k_s)), and the
denominator's do not (a second score dot).
DEN_COL (head dims below the padded width, no RoPE): the denominator sum_s p_ts rides in the p @ v
product as the padding column D of v set to ones, instead of a row reduction per key tile.
BD2 > 0 splits the head dim into two power-of-two pieces of BD and BD2 columns (DiT's 72, with its
denominator column, as 64 + 16 instead of one 128-wide tile): the scores add the two pieces'
products, and v and the output are two tiles, 80 columns instead of 128; with its own launch settings
(``dense_split``; measured: benchmarks/RESULTS.md, Kernel launch settings).
SAVE (normalised, ahead of the dense backward, triton_dense_grad.py): each row's 1 / den_t goes to INV (B*H, N,
fp32) and, with LO_PART (half-precision o), what rounding o to its dtype lost, o_fp32 - o, to LO (bf16, o's
layout): o + lo carries o to about 2^-16 relative, which g.o in the backward needs.
TAIL > 0: the keys past the last multiple of BS are walked in one step of TAIL keys (``tiles.dense_tail``: fewer
than half a step, rounded up to a power of two) instead of a whole masked step of BS; the dense backward's walks
do the same (triton_dense_grad.py).
CK0 > 0 (sampling, nothing saved): the layer's conditional positional encoding is added to o before it is stored,
o_t += bias + sum_taps w[tap] * v[t + offset(tap)], a depthwise convolution of v over the token grid (CK0 x CK1 x
CK2 taps, G1 x G2 the grid's last two axes; kernels/cpe.py has the same sum as a launch of its own). The channel
of head h, column d is h * D + d, as in the (B, N, H * D) view of v. The taps re-read v tiles that the key walk
has just read, so they mostly come from L2, and o is written once instead of written, read and written again.
"""

import triton
import triton.language as tl

from ..cpe import cpe_taps
from ..triton_dot import dot  # (by its own name: Inductor copies a traced kernel's helpers under theirs)
from .triton_common import feature, rope_tables, rotate


@triton.jit
def _scores(a, b, DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """a @ b^T of two feature tiles: fp32 operands (exact or tf32), or b cast to a's half dtype."""
    if DOT_F32:
        return dot(a, tl.trans(b), IEEE)
    else:
        return tl.dot(a, tl.trans(b.to(a.dtype)))


@triton.jit
def _weighted_values(p, v, DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """p @ v with p fp32: in fp32 (exact or tf32), or both in v's half dtype."""
    if DOT_F32:
        return dot(p, v.to(tl.float32), IEEE)
    else:
        return tl.dot(p.to(v.dtype), v)


@triton.jit
def _feature_tile(base, rows, rmask, stride_n, cols, stride_d, D: tl.constexpr, FEATURE: tl.constexpr):
    """(loaded tile, phi of it in fp32 with masked entries 0) of token rows x head-dim columns."""
    m = rmask[:, None] & (cols < D)[None, :]
    t = tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d, mask=m, other=0.0)
    return t, tl.where(m, feature(t.to(tl.float32), FEATURE), 0.0)


@triton.jit
def _positional(o, vbase, rows, rmask, cols, cmask, svn, svd, CW, CB, channel0, N, G1, G2,
                CK0: tl.constexpr, CK1: tl.constexpr, CK2: tl.constexpr, CPE_BIAS: tl.constexpr):
    """o (rows x cols, fp32) plus the CPE of v at those rows and head-dim columns (channels channel0 + cols)."""
    ch = channel0 + cols
    o = cpe_taps(o, vbase, rows, rmask, cols, cmask, svn, svd, CW, ch, N, G1, G2, CK0, CK1, CK2)
    if CPE_BIAS:
        o += tl.load(CB + ch, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return o


@triton.jit
def _key_step(acc, acc2, den, s0, BS: tl.constexpr, qn, qf, qn2, qf2, mix_rows, mix_row, rmask, m, kbase, vbase,
              skn, skd, svn, svd, COS, SIN, sct, scj, sst, ssj, BLK, d, d2, dmask, N, D: tl.constexpr,
              BD: tl.constexpr, BD2: tl.constexpr, ONEHOT: tl.constexpr, DEN_COL: tl.constexpr,
              FEATURE: tl.constexpr, DOT_F32: tl.constexpr, IEEE: tl.constexpr, ROPE: tl.constexpr):
    """One step of the key walk: keys s0 .. s0 + BS - 1 (masked past N) added to acc (and acc2, the second head-dim
    piece) and den; returns them."""
    cols = s0 + tl.arange(0, BS)
    cmask = cols < N
    kt, kf = _feature_tile(kbase, cols, cmask, skn, d, skd, D, FEATURE)
    kn = kf
    if ROPE:
        ck, sk = rope_tables(COS, SIN, cols.to(tl.int64), cmask, sct, scj, sst, ssj, 0, BD // 2, D)
        kn = rotate(kf, ck, sk, BS, BD, False)
    vt = tl.load(vbase + cols[:, None].to(tl.int64) * svn + d[None, :] * svd,
                 mask=cmask[:, None] & dmask[None, :], other=0.0)
    if DEN_COL:  # column D is padding (zeros): ones there make the product's column D = sum_s p_ts
        # (not bool.to(bf16): wrong in the interpreter)
        if BD2 > 0:  # (split only when D > BD: the column is in the second piece)
            vt2 = tl.load(vbase + cols[:, None].to(tl.int64) * svn + d2[None, :] * svd,
                          mask=cmask[:, None] & (d2 < D)[None, :], other=0.0)
            vt2 = vt2 + tl.where(d2 == D, 1.0, 0.0).to(vt2.dtype)[None, :]
        else:
            vt = vt + tl.where(d == D, 1.0, 0.0).to(vt.dtype)[None, :]
    elif BD2 > 0:
        vt2 = tl.load(vbase + cols[:, None].to(tl.int64) * svn + d2[None, :] * svd,
                      mask=cmask[:, None] & (d2 < D)[None, :], other=0.0)
    bk = tl.load(BLK + cols, mask=cmask, other=0)
    if ONEHOT:
        onehot = tl.where((bk[:, None] == m[None, :]) & cmask[:, None], 1.0, 0.0)
        if IEEE:
            w = tl.dot(mix_rows, tl.trans(onehot), input_precision="ieee")
        else:
            w = tl.dot(mix_rows, tl.trans(onehot))
    else:
        w = tl.load(mix_row[:, None] + bk[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
    scores = _scores(qn, kn, DOT_F32, IEEE)
    if BD2 > 0:
        kt2, kf2 = _feature_tile(kbase, cols, cmask, skn, d2, skd, D, FEATURE)
        kn2 = kf2
        if ROPE:
            ck2, sk2 = rope_tables(COS, SIN, cols.to(tl.int64), cmask, sct, scj, sst, ssj, BD // 2, BD2 // 2, D)
            kn2 = rotate(kf2, ck2, sk2, BS, BD2, False)
        scores += _scores(qn2, kn2, DOT_F32, IEEE)
    p = scores * w
    acc += _weighted_values(p, vt, DOT_F32, IEEE)
    if BD2 > 0:
        acc2 += _weighted_values(p, vt2, DOT_F32, IEEE)
    if ROPE:  # the denominator's scores are the un-rotated ones
        plain = _scores(qf, kf, DOT_F32, IEEE)
        if BD2 > 0:
            plain += _scores(qf2, kf2, DOT_F32, IEEE)
        p = plain * w
    if not DEN_COL:
        den += tl.sum(p, axis=1)
    return acc, acc2, den


@triton.jit
def dense_forward_kernel(Q, K, V, MIX, BLK, O, COS, SIN, INV, LO, CW, CB,
                         sqb, sqn, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd, sob, son, soh, sod,
                         sct, scj, sst, ssj,
                         N, H, D: tl.constexpr, M, mix_head_stride, eps, scale, G1, G2,
                         BD: tl.constexpr, BD2: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                         BM: tl.constexpr, ONEHOT: tl.constexpr, DEN_COL: tl.constexpr, FEATURE: tl.constexpr,
                         NORMALIZE: tl.constexpr, DOT_F32: tl.constexpr,
                         IEEE: tl.constexpr, ROPE: tl.constexpr, AL: tl.constexpr,
                         SAVE: tl.constexpr = False, LO_PART: tl.constexpr = False,
                         CK0: tl.constexpr = 0, CK1: tl.constexpr = 1, CK2: tl.constexpr = 1,
                         CPE_BIAS: tl.constexpr = False, TAIL: tl.constexpr = 0):
    # row strides arrive divided by AL (triton_chunked.py's module doc says why)
    sqb, sqn, sqh, skb, skn, skh = sqb * AL, sqn * AL, sqh * AL, skb * AL, skn * AL, skh * AL
    svb, svn, svh, sob, son, soh = svb * AL, svn * AL, svh * AL, sob * AL, son * AL, soh * AL
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    rows = tl.program_id(1) * BT + tl.arange(0, BT)
    rmask = rows < N
    d = tl.arange(0, BD)
    dmask = d < D
    qmask = rmask[:, None] & dmask[None, :]
    qbase = Q + b.to(tl.int64) * sqb + h * sqh
    qt, qf = _feature_tile(qbase, rows, rmask, sqn, d, sqd, D, FEATURE)
    qn = qf
    if ROPE:
        cq, sq = rope_tables(COS, SIN, rows.to(tl.int64), rmask, sct, scj, sst, ssj, 0, BD // 2, D)
        qn = rotate(qf, cq, sq, BT, BD, False)
    if not DOT_F32:
        qf = qf.to(qt.dtype)
        qn = qn.to(qt.dtype)
    if BD2 > 0:  # the second piece of the head dim, columns BD .. BD + BD2 - 1
        d2 = BD + tl.arange(0, BD2)
        qt2, qf2 = _feature_tile(qbase, rows, rmask, sqn, d2, sqd, D, FEATURE)
        qn2 = qf2
        if ROPE:  # channel pairs never straddle the pieces: BD is even
            cq2, sq2 = rope_tables(COS, SIN, rows.to(tl.int64), rmask, sct, scj, sst, ssj, BD // 2, BD2 // 2, D)
            qn2 = rotate(qf2, cq2, sq2, BT, BD2, False)
        if not DOT_F32:
            qf2 = qf2.to(qt.dtype)
            qn2 = qn2.to(qt.dtype)
        acc2 = tl.zeros((BT, BD2), dtype=tl.float32)
    bq = tl.load(BLK + rows, mask=rmask, other=0)
    mix_row = MIX + h * mix_head_stride + bq * M
    if ONEHOT:
        # Mc rows of the tile's queries, once: weights per key tile are then a dot with one-hot
        # key-block indicators, W = Mc[i(t), :] @ onehot(i(s))^T, instead of a 2-D gather.
        m = tl.arange(0, BM)
        mix_rows = tl.load(mix_row[:, None] + m[None, :], mask=rmask[:, None] & (m < M)[None, :], other=0.0)
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    den = tl.zeros((BT,), dtype=tl.float32)
    kbase = K + b.to(tl.int64) * skb + h * skh
    vbase = V + b.to(tl.int64) * svb + h * svh
    if BD2 == 0:  # (placeholders for the second piece's arguments, unused)
        d2, qn2, qf2, acc2 = d, qn, qf, 0.0  # (a scalar: a tile would be carried through the walk)
    if not ONEHOT:  # (placeholders, unused)
        m, mix_rows = d, acc
    if TAIL > 0:  # full steps, then the last N % BS keys in one step of TAIL
        full = N // BS * BS
    else:
        full = N
    for s0 in range(0, full, BS):
        acc, acc2, den = _key_step(acc, acc2, den, s0, BS, qn, qf, qn2, qf2, mix_rows, mix_row, rmask, m, kbase,
                                   vbase, skn, skd, svn, svd, COS, SIN, sct, scj, sst, ssj, BLK, d, d2, dmask, N, D,
                                   BD, BD2, ONEHOT, DEN_COL, FEATURE, DOT_F32, IEEE, ROPE)
    if TAIL > 0:
        acc, acc2, den = _key_step(acc, acc2, den, full, TAIL, qn, qf, qn2, qf2, mix_rows, mix_row, rmask, m, kbase,
                                   vbase, skn, skd, svn, svd, COS, SIN, sct, scj, sst, ssj, BLK, d, d2, dmask, N, D,
                                   BD, BD2, ONEHOT, DEN_COL, FEATURE, DOT_F32, IEEE, ROPE)
    if DEN_COL:
        if BD2 > 0:
            den = tl.sum(tl.where((d2 == D)[None, :], acc2, 0.0), axis=1)
        else:
            den = tl.sum(tl.where((d == D)[None, :], acc, 0.0), axis=1)
    ooff = b.to(tl.int64) * sob + h * soh + rows[:, None].to(tl.int64) * son
    if NORMALIZE:
        inv = 1.0 / (den + eps)
    else:
        inv = tl.full((BT,), scale, tl.float32)
    o = acc * inv[:, None]
    if CK0 > 0:
        o = _positional(o, vbase, rows, rmask, d, dmask, svn, svd, CW, CB, h * D, N, G1, G2, CK0, CK1, CK2, CPE_BIAS)
    hi = o.to(O.dtype.element_ty)
    tl.store(O + ooff + d[None, :] * sod, hi, mask=qmask)
    if SAVE:
        tl.store(INV + bh.to(tl.int64) * N + rows, inv, mask=rmask)
        if LO_PART:
            tl.store(LO + ooff + d[None, :] * sod, (o - hi.to(tl.float32)).to(LO.dtype.element_ty), mask=qmask)
    if BD2 > 0:
        omask2 = rmask[:, None] & (d2 < D)[None, :]
        o2 = acc2 * inv[:, None]
        if CK0 > 0:
            o2 = _positional(o2, vbase, rows, rmask, d2, d2 < D, svn, svd, CW, CB, h * D, N, G1, G2, CK0, CK1, CK2,
                             CPE_BIAS)
        hi2 = o2.to(O.dtype.element_ty)
        tl.store(O + ooff + d2[None, :] * sod, hi2, mask=omask2)
        if SAVE and LO_PART:
            tl.store(LO + ooff + d2[None, :] * sod, (o2 - hi2.to(tl.float32)).to(LO.dtype.element_ty), mask=omask2)
