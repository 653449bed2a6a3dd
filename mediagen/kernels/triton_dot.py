"""``dot``: tl.dot with the precision chosen at compile time, shared by the Triton kernels.

IEEE=True asks for exact fp32 products (``input_precision="ieee"``) where a plain tl.dot of fp32
operands would run in tf32 on the GPU.
"""

import triton
import triton.language as tl


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)
