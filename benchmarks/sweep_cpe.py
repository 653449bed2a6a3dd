"""Sweep the CPE kernel's tiles (mediagen/kernels/cpe.py: tokens and channels per program, warps) at the shipped
models' sampling shapes, CUDA-graph replay, µs; the shipped launch and a copy of o beside them.

    python -m benchmarks.sweep_cpe [--batches 2,64]
    python -m benchmarks.sweep_cpe --in-op [--batches 2,8,128]

(from the repository root, as a module; a CUDA GPU). Prints every setting's time per shape, then the settings
ranked by the geometric mean of their time relative to each shape's best. ``--in-op``: instead, the MHLA op
without gradients at image-mhla's shape with the CPE handed to it (``mhla(..., cpe=)``: in the dense forward's
epilogue while its launch is one wave) beside the op followed by the CPE kernel, CUDA graph µs and eager wall µs
per call (the median of 5 runs of 200 calls, then a synchronize).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch
import triton
import triton.testing

from mediagen.kernels import cpe

# name, grid, channels, kernel: image-mhla (3x3 over 14x14, 3 heads x 64) and video-mhla ([3, 1, 1], 6 x 64)
SHAPES = [("image 14x14", (14, 14), 192, (3, 3)), ("video 16x8x8", (16, 8, 8), 384, (3, 1, 1))]
TILES = list(itertools.product((16, 32, 64), (32, 64, 128), (2, 4, 8)))  # tokens, channels, warps


def timed(fn) -> float:
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def sweep(batches):
    table = {}
    for (name, grid, C, kernel), B in itertools.product(SHAPES, batches):
        N = math.prod(grid)
        g3, k3 = cpe.grid3(grid), (1,) * (3 - len(kernel)) + tuple(kernel)
        o, v = (torch.randn(B, N, C, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.randn(C, 1, *kernel, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(C, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(o)
        row = {}
        for BT, BC, warps in TILES:
            launch = cpe.cpe_add_kernel[(triton.cdiv(N, BT), triton.cdiv(C, BC), B)]
            row[BT, BC, warps] = timed(lambda: launch(o, v, w, bias, out, N, C, g3[1], g3[2], o.stride(0), o.stride(1),
                                                      v.stride(0), v.stride(1), K0=k3[0], K1=k3[1], K2=k3[2],
                                                      HAS_BIAS=True, BT=BT, BC=BC, num_warps=warps))
        shipped = timed(lambda: cpe.cpe_add(o, v, w, bias, grid))
        best = min(row, key=row.get)
        print(f"{name} B={B}: shipped {shipped:.2f}, best {row[best]:.2f} at {best}, copy of o "
              f"{timed(lambda: o.clone()):.2f}; (tokens, channels, warps) -> us: "
              + ", ".join(f"{k}: {t:.2f}" for k, t in sorted(row.items())), flush=True)
        table[name, B] = row
    score = {t: math.exp(sum(math.log(r[t] / min(r.values())) for r in table.values()) / len(table)) for t in TILES}
    print("ranked by the geometric mean of time / each shape's best:",
          ", ".join(f"{t}: {x:.3f}" for t, x in sorted(score.items(), key=lambda kv: kv[1])[:8]))


def _eager_us(fn, calls=200, runs=5) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(times)[runs // 2]


def in_op(batches):
    """The op with its CPE handed over against the op then the CPE kernel, image-mhla's shape, bf16."""
    from mediagen.attention.mhla import locality_mix
    from mediagen.kernels.mhla.triton_op import mhla_triton

    name, grid, C, kernel = SHAPES[0]
    H, blocks = 3, (3, 3)
    for B in batches:
        q, k, v = (torch.randn(B, math.prod(grid), H, C // H, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mix = locality_mix(blocks).cuda()
        w = torch.randn(C, 1, *kernel, device="cuda", dtype=torch.bfloat16) / 4
        bias = torch.randn(C, device="cuda", dtype=torch.bfloat16)

        @torch.no_grad()
        def apart():
            o = mhla_triton(q, k, v, mix, grid, blocks, feature_map="relu")
            return cpe.cpe_add(o.flatten(2), v.flatten(2), w, bias, grid)

        @torch.no_grad()
        def handed():
            return mhla_triton(q, k, v, mix, grid, blocks, feature_map="relu", cpe=(w, bias)).flatten(2)

        a, h = apart().float(), handed().float()
        print(f"{name} B={B}: handed to the op {timed(handed):.2f} us graph, {_eager_us(handed):.1f} eager; op then "
              f"CPE kernel {timed(apart):.2f} graph, {_eager_us(apart):.1f} eager; relative difference "
              f"{((a - h).norm() / a.norm()).item():.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="2,64", help="comma list of batch sizes")
    ap.add_argument("--in-op", action="store_true", help="the CPE handed to the MHLA op against its own launch")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        ap.error(f"--batches={args.batches!r} is not allowed: use a comma list of positive ints, e.g. 2,64")
    if not torch.cuda.is_available():
        ap.error("a CUDA GPU is needed: the sweep times the Triton kernel")
    if args.in_op:
        in_op(batches)
    else:
        sweep(batches)


if __name__ == "__main__":
    main()
