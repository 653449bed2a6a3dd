"""Block mixing on the GPU, without the transposed copies a broadcast torch.matmul makes.

mix_kernel:       out[bh, i, x] = sum_j' A[h, i, j' // J] * src[bh, j', x]   (S~ = Mc S, or Mc^T dS~)
                  J token splits of a block are summed by the same product. src and out may be bf16
                  (the summaries of a bf16 forward that nothing differentiates, tiles.summary_dtype; fp32
                  otherwise); the product is fp32 (tf32 unless IEEE), or with
                  LOWP (the ``lowp`` launch setting, on by default) bf16 x bf16 for bf16 summaries, Mc rounded
                  to bf16, faster than tf32 products of fp32 copies (measured: benchmarks/RESULTS.md, Kernel
                  launch settings).
                  Each program owns a row tile and walks every P-th column tile (P column programs, a few
                  programs per SM in all): A is read once per program when K fits one step (not once per
                  column tile), and each program streams long enough for the pipeline to overlap its loads.
mix_grad_kernel:  part[bh, t, i, j] = sum_{x in tile t} L[bh, i, x] * R[bh, j, x]   (dMc = dS~ . S),
                  split over column tiles so the long reduction (X = D*D + D) runs in parallel.
part_sum_kernel:  out[h, y] = sum over r of part[r // NT, h, r % NT, y], the parts summed in a fixed order
                  (deterministic), for per-head Mc (H outputs) or shared Mc (one output, the heads summed too).
X is a compile-time constant so that row starts are known to be 16-byte aligned where they are (X = 5,256
at D = 72 is a multiple of 8, not of the 16 that Triton's run-time specialisation checks) and rows move in
16-byte accesses.
"""

import triton
import triton.language as tl


@triton.jit
def _dot(a, s, acc, IEEE: tl.constexpr):
    """acc + a @ s; exact fp32 products when IEEE, tf32 otherwise."""
    if IEEE:
        acc = tl.dot(a, s, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, s, acc)
    return acc


@triton.jit
def _operand(x, SRC, LOWP: tl.constexpr):
    """A product operand: in the summaries' own half-precision dtype when LOWP (Mc rounded to it, ~2^-9), else fp32."""
    if LOWP:
        y = x.to(SRC.dtype.element_ty)
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def mix_kernel(A, SRC, OUT, sah, sai, saj, H, M, K, J, P, X: tl.constexpr,
               BM: tl.constexpr, BK: tl.constexpr, BX: tl.constexpr, ONE_K: tl.constexpr, IEEE: tl.constexpr,
               LOWP: tl.constexpr):
    bh = tl.program_id(0)
    i = tl.program_id(2) * BM + tl.arange(0, BM)
    imask = i < M
    arow = A + (bh % H) * sah + i[:, None] * sai
    src = SRC + bh.to(tl.int64) * K * X
    out = OUT + bh.to(tl.int64) * M * X + i[:, None].to(tl.int64) * X
    if ONE_K:  # all of K in one step: this program's A tile and src row starts, once for all its column tiles
        kk = tl.arange(0, BK)
        kmask = kk < K
        a_once = _operand(tl.load(arow + (kk // J)[None, :] * saj, mask=imask[:, None] & kmask[None, :], other=0.0),
                          SRC, LOWP)
        srows = src + kk[:, None].to(tl.int64) * X
    for c in range(tl.program_id(1), tl.cdiv(X, BX), P):  # column tiles c = pid1, pid1 + P, ...
        x = c * BX + tl.arange(0, BX)
        xmask = x < X
        acc = tl.zeros((BM, BX), dtype=tl.float32)
        if ONE_K:
            s = tl.load(srows + x[None, :], mask=kmask[:, None] & xmask[None, :], other=0.0)
            acc = _dot(a_once, _operand(s, SRC, LOWP), acc, IEEE)
        else:
            for k0 in range(0, K, BK):
                kk = k0 + tl.arange(0, BK)
                kmask = kk < K
                a = _operand(tl.load(arow + (kk // J)[None, :] * saj, mask=imask[:, None] & kmask[None, :], other=0.0),
                             SRC, LOWP)
                s = tl.load(src + kk[:, None].to(tl.int64) * X + x[None, :], mask=kmask[:, None] & xmask[None, :],
                            other=0.0)
                acc = _dot(a, _operand(s, SRC, LOWP), acc, IEEE)
        tl.store(out + x[None, :], acc.to(OUT.dtype.element_ty), mask=imask[:, None] & xmask[None, :])


@triton.jit
def mix_grad_kernel(L, R, PART, M, X: tl.constexpr, NT, XT,
                    BM: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    bh = tl.program_id(0)
    t = tl.program_id(1)
    nb = tl.cdiv(M, BM)
    i = (tl.program_id(2) // nb) * BM + tl.arange(0, BM)
    j = (tl.program_id(2) % nb) * BM + tl.arange(0, BM)
    imask = i < M
    jmask = j < M
    lbase = L + bh.to(tl.int64) * M * X
    rbase = R + bh.to(tl.int64) * M * X
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    x_end = tl.minimum(X, (t + 1) * XT)
    for x0 in range(t * XT, x_end, BK):
        xx = x0 + tl.arange(0, BK)
        xmask = xx < x_end
        lt = tl.load(lbase + i[:, None].to(tl.int64) * X + xx[None, :], mask=imask[:, None] & xmask[None, :], other=0.0)
        rt = tl.load(rbase + j[:, None].to(tl.int64) * X + xx[None, :], mask=jmask[:, None] & xmask[None, :], other=0.0)
        lt = lt.to(tl.float32)  # (the op passes fp32 summaries; other callers may pass bf16)
        rt = rt.to(tl.float32)
        if IEEE:
            acc += tl.dot(lt, tl.trans(rt), input_precision="ieee")
        else:
            acc += tl.dot(lt, tl.trans(rt))
    out = PART + (bh.to(tl.int64) * NT + t) * M * M
    tl.store(out + i[:, None] * M + j[None, :], acc, mask=imask[:, None] & jmask[None, :])


@triton.jit
def part_sum_kernel(PART, OUT, G, ROWS, group_stride, head_stride, YY, BR: tl.constexpr, BY: tl.constexpr):
    """OUT[h, y] = sum over g < G, r < ROWS of PART[g * group_stride + h * head_stride + r, y] (rows of YY fp32).
    Program (y tile, h); the sum runs in the same order every time. For PART (B, H, NT, YY): per-head Mc takes
    G = B groups of NT rows (group_stride H * NT, head_stride NT); shared Mc one group of B * H * NT rows."""
    y = tl.program_id(0) * BY + tl.arange(0, BY)
    h = tl.program_id(1)
    ymask = y < YY
    acc = tl.zeros((BR, BY), dtype=tl.float32)
    for g in range(0, G):
        first = (g * group_stride + h * head_stride).to(tl.int64)
        for r0 in range(0, ROWS, BR):
            r = r0 + tl.arange(0, BR)
            acc += tl.load(PART + (first + r[:, None]) * YY + y[None, :], mask=(r < ROWS)[:, None] & ymask[None, :],
                           other=0.0)
    tl.store(OUT + h.to(tl.int64) * YY + y, tl.sum(acc, axis=0), mask=ymask)
