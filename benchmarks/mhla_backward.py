"""Forward + backward of the MHLA op by forward and backward algorithm, beside torch's SDPA, at training shapes;
then the bf16 gradients of both backwards against fp64.

    python -m benchmarks.mhla_backward [SHAPE-SUBSTRING ...]

(from the repository root, as a module; a CUDA GPU). Per shape, µs per forward + ``torch.autograd.grad`` of
q, k, v and Mc (bf16, ReLU features, Mc at its locality initialisation), ``triton.testing.do_bench`` medians:
"graph" replays the pair captured as a CUDA graph (the kernels' own time), "eager" calls it from Python.
Variants: the chunked forward and backward; the dense forward with the chunked backward (which makes the
block summaries again: ``op_tiles.DENSE_BACKWARD = False``); the dense forward with the dense backward
(triton_dense_grad.py). The accuracy rows give each gradient's relative Frobenius error against the fp64
reference (mhla_reference) with positive q, k, v and no feature map (the ill-conditioned case for dq and
dMc) and with ReLU; with one block dMc is zero in exact arithmetic, so its relative error there means nothing.
"""

from __future__ import annotations

import math
import sys

import torch
import triton

from mediagen.attention.mhla import locality_mix
from mediagen.kernels.mhla import tiles as op_tiles
from mediagen.kernels.mhla.naive import mhla_reference
from mediagen.kernels.mhla.triton_op import mhla_triton

# name, B, grid, heads, head dim, blocks
SHAPES = [("DiT-XL/2 256px B8", 8, (16, 16), 16, 72, (4, 4)), ("DiT-XL/2 256px B64", 64, (16, 16), 16, 72, (4, 4)),
          ("image 14x14 B256", 256, (14, 14), 3, 64, (3, 3)), ("image 28x28 B256", 256, (28, 28), 3, 64, (4, 4)),
          ("DiT-XL/2 512px B8", 8, (32, 32), 16, 72, (5, 5)), ("video 16x8x8 B256", 256, (16, 8, 8), 6, 64, (4, 2, 2))]
VARIANTS = [("chunked", "chunked", True), ("dense + chunked backward", "dense", False),
            ("dense + dense backward", "dense", True)]
# grid, blocks, head dim, heads, B, feature map (None: positive q, k, v)
ACCURACY = [((16, 16), (4, 4), 72, 4, 2, None), ((16, 16), (4, 4), 72, 4, 2, "relu"),
            ((14, 14), (3, 3), 64, 3, 4, None), ((8, 3, 8), (3, 1, 2), 72, 5, 1, None),
            ((141,), (1,), 96, 2, 2, None), ((7, 10, 8), (4, 2, 6), 96, 5, 1, None)]


def graph_us(fn) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return 1e3 * triton.testing.do_bench(graph.replay, warmup=20, rep=200)


def timings(only) -> None:
    for name, B, grid, H, D, blocks in SHAPES:
        if only and not any(o in name for o in only):
            continue
        N = math.prod(grid)
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mix = locality_mix(blocks).cuda().requires_grad_()
        g = torch.randn_like(q)
        row = []
        for label, algorithm, dense_backward in VARIANTS:
            op_tiles.DENSE_BACKWARD = dense_backward

            def step():
                o = mhla_triton(q, k, v, mix, grid, blocks, feature_map="relu", algorithm=algorithm)
                return torch.autograd.grad(o, (q, k, v, mix), g)

            row.append(f"{label}: graph {graph_us(step):.1f} eager {1e3 * triton.testing.do_bench(step):.1f}")
        op_tiles.DENSE_BACKWARD = True
        qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        gs = g.transpose(1, 2)

        def sdpa():
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
            return torch.autograd.grad(o, (qs, ks, vs), gs)

        row.append(f"sdpa: graph {graph_us(sdpa):.1f} eager {1e3 * triton.testing.do_bench(sdpa):.1f}")
        print(name, "(us) |", " | ".join(row), flush=True)


def accuracy() -> None:
    torch.manual_seed(0)
    for grid, blocks, D, H, B, fmap in ACCURACY:
        N, M = math.prod(grid), math.prod(blocks)
        base = [torch.randn(B, N, H, D, device="cuda", dtype=torch.float64) for _ in range(3)]
        if fmap is None:
            base = [t.abs() for t in base]
        mix = torch.rand(M, M, device="cuda", dtype=torch.float64)
        refs = [t.clone().requires_grad_() for t in (*base, mix)]
        r = mhla_reference(*refs, grid, blocks, feature_map=fmap)
        g = torch.randn_like(r)
        want = torch.autograd.grad(r, refs, g)
        for dense_backward in (False, True):
            op_tiles.DENSE_BACKWARD = dense_backward
            ins = [t.detach().to(torch.bfloat16).requires_grad_() for t in base] + [mix.float().requires_grad_()]
            o = mhla_triton(*ins, grid, blocks, feature_map=fmap, algorithm="dense")
            got = torch.autograd.grad(o, ins, g.to(torch.bfloat16))
            errs = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, want)]
            print("bf16 against fp64", grid, blocks, f"D={D}", fmap or "positive, no map",
                  "dense backward" if dense_backward else "chunked backward",
                  " ".join(f"{n}={e:.1e}" for n, e in zip("q k v mix".split(), errs)), flush=True)
    op_tiles.DENSE_BACKWARD = True


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("benchmarks.mhla_backward needs a CUDA GPU")
    timings(sys.argv[1:])
    accuracy()
