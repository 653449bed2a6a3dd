"""Block mixing on the GPU, without the transposed copies a broadcast torch.matmul makes.

mix_kernel:       out[bh, i, x] = sum_j' A[h, i, j' // J] * src[bh, j', x]   (S~ = Mc S, or Mc^T dS~)
                  J token splits of a block are summed by the same product. src and out may be bf16
                  (the forward's summaries for bf16 inputs); the product is fp32 (tf32 unless IEEE).
mix_grad_kernel:  part[bh, t, i, j] = sum_{x in tile t} L[bh, i, x] * R[bh, j, x]   (dMc = dS~ . S),
                  split over column tiles so the long reduction (X = D*D + D) runs in parallel.
X is a compile-time constant so that row starts are known to be 16-byte aligned where they are (X = 5,256
at D = 72 is a multiple of 8, not of the 16 that Triton's run-time specialisation checks) and rows move in
16-byte accesses.
"""

import triton
import triton.language as tl


@triton.jit
def mix_kernel(A, SRC, OUT, sah, sai, saj, H, M, K, J, X: tl.constexpr,
               BM: tl.constexpr, BK: tl.constexpr, BX: tl.constexpr, IEEE: tl.constexpr):
    bh = tl.program_id(0)
    x = tl.program_id(1) * BX + tl.arange(0, BX)
    i = tl.program_id(2) * BM + tl.arange(0, BM)
    h = bh % H
    xmask = x < X
    imask = i < M
    src = SRC + bh.to(tl.int64) * K * X
    acc = tl.zeros((BM, BX), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        a = tl.load(A + h * sah + i[:, None] * sai + (kk // J)[None, :] * saj, mask=imask[:, None] & kmask[None, :],
                    other=0.0).to(tl.float32)
        s = tl.load(src + kk[:, None].to(tl.int64) * X + x[None, :], mask=kmask[:, None] & xmask[None, :], other=0.0)
        s = s.to(tl.float32)
        if IEEE:
            acc += tl.dot(a, s, input_precision="ieee")
        else:
            acc += tl.dot(a, s)
    tl.store(OUT + bh.to(tl.int64) * M * X + i[:, None].to(tl.int64) * X + x[None, :], acc.to(OUT.dtype.element_ty),
             mask=imask[:, None] & xmask[None, :])


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
        lt = lt.to(tl.float32)  # both sides bf16 for bf16 inputs (summary_dtype)
        rt = rt.to(tl.float32)
        if IEEE:
            acc += tl.dot(lt, tl.trans(rt), input_precision="ieee")
        else:
            acc += tl.dot(lt, tl.trans(rt))
    out = PART + (bh.to(tl.int64) * NT + t) * M * M
    tl.store(out + i[:, None] * M + j[None, :], acc, mask=imask[:, None] & jmask[None, :])
