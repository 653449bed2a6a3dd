"""Pieces shared by the MHLA Triton kernels: the feature map and its derivative, and the token
range a program owns.

With ROPE the numerator's features are rotated in registers (``rotate``, rotation.py has the math);
the angle tables are read per token through the same ids.

Programs are laid out as (batch*head, block*splits, column tile). Tokens of block i sit at
order[offsets[i]:offsets[i+1]] (row-major token ids sorted by block, see layout.py); split j of J
owns a contiguous slice of that list. Kernels read q, k, v rows in place through those ids.
"""

import triton
import triton.language as tl


@triton.jit
def feature(x, FEATURE: tl.constexpr):
    """phi(x): 0 = identity, 1 = ReLU, 2 = ELU + 1."""
    if FEATURE == 1:
        y = tl.maximum(x, 0.0)
    elif FEATURE == 2:
        y = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        y = x
    return y


@triton.jit
def feature_grad(x, FEATURE: tl.constexpr):
    """phi'(x) for the maps above."""
    if FEATURE == 1:
        y = tl.where(x > 0, 1.0, 0.0)
    elif FEATURE == 2:
        y = tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        y = tl.full(x.shape, 1.0, tl.float32)
    return y


@triton.jit
def first_column(ROWS: tl.constexpr, dtype: tl.constexpr):
    """(ROWS, 16) matrix whose column 0 is ones and the rest zeros: x^T @ it puts x's column sums in
    column 0, on the tensor cores (16 is the narrowest product they take)."""
    col = tl.arange(0, 16)
    return tl.broadcast_to(tl.where(col == 0, 1.0, 0.0)[None, :], (ROWS, 16)).to(dtype)


@triton.jit
def hi_lo_columns(x, dtype: tl.constexpr):
    """(n, 16) matrix in ``dtype`` from the fp32 vector x (n,): column 0 is x rounded to dtype, column 1
    the rounding's remainder, the rest zeros. Summed over its 16 columns, y @ it is y.x to ~2^-16
    relative with half-precision products, on the tensor cores."""
    hi = x.to(dtype)
    lo = (x - hi.to(tl.float32)).to(dtype)
    col = tl.arange(0, 16)[None, :]
    return tl.where(col == 0, hi[:, None], tl.where(col == 1, lo[:, None], 0.0)).to(dtype)


@triton.jit
def split_range(offsets_ptr, i, j, J):
    """(start of block i in the sorted token list, first and end local index of split j)."""
    start = tl.load(offsets_ptr + i)
    n = tl.load(offsets_ptr + i + 1) - start
    chunk = tl.cdiv(n, J)
    lo = j * chunk
    hi = tl.minimum(n, lo + chunk)
    return start, lo, hi


@triton.jit
def token_ids(order, start, r, hi):
    """Token ids (int64) at local positions r of a block's sorted list; 0 where r >= hi (masked off)."""
    return tl.load(order + start + r, mask=r < hi, other=0).to(tl.int64)


@triton.jit
def rope_tables(COS, SIN, tok, rmask, sct, scj, sst, ssj, j0, NP: tl.constexpr, D):
    """cos, sin (rows, NP) fp32 of the angles of channel pairs j0 .. j0 + NP - 1 of tokens ``tok``
    (pairs at or past D/2 get the identity rotation)."""
    j = j0 + tl.arange(0, NP)
    m = rmask[:, None] & (j < D // 2)[None, :]
    c = tl.load(COS + tok[:, None] * sct + j[None, :] * scj, mask=m, other=1.0).to(tl.float32)
    s = tl.load(SIN + tok[:, None] * sst + j[None, :] * ssj, mask=m, other=0.0).to(tl.float32)
    return c, s


@triton.jit
def rotate(x, c, s, ROWS: tl.constexpr, COLS: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate channel pairs (2j, 2j+1) of x (ROWS, COLS) by the angles (c, s) (ROWS, COLS // 2);
    INVERSE rotates back (the transpose, for gradients)."""
    xe, xo = tl.split(tl.reshape(x, (ROWS, COLS // 2, 2)))
    if INVERSE:
        s = -s
    return tl.reshape(tl.join(xe * c - xo * s, xe * s + xo * c), (ROWS, COLS))
