"""The dense backward's half-precision gradients against fp64 at short sequences, launch variant by variant, to tell
which part of a launch makes them wrong on a GPU (Triton's CPU interpreter computes every variant right).

    python -m benchmarks.dense_grad_cases [--dtypes bf16,fp16] [--seeds 3]

Each row is one launch of the dense backward (``launch_settings("dense_grad", ...)``) on the case that was found
wrong on the H200 (B = H = 1, 29 tokens on a (1, 29) grid in (1, 4) blocks, D = 96 as 64 + 32 columns, relu,
normalize off, q, k, v from randn, Mc from rand) and on its neighbours (one head-dim piece, normalize on, a
longer sequence): the relative error of dq, dk, dv and dMc against the fp64 oracle, largest over the seeds. The
variants switch one thing at a time from the tiles as set (128 rows, 64 per step, 3 stages, a 32-row tail step
after a loop of no full steps) toward the tiles fitted to the sequence (one step of 32, one stage).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from mediagen.kernels.mhla import launch_settings, mhla
from mediagen.kernels.mhla.autograd import _plans

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mhla_oracle import mhla_dense  # noqa: E402 (the tests' fp64 oracle)

VARIANTS = {  # name: dense_grad settings
    "set tiles, tail step (as reported)": dict(fit_short=False, tail=True),
    "set tiles, whole masked step": dict(fit_short=False, tail=False),
    "set tiles, tail step, 1 stage": dict(fit_short=False, tail=True, stages=1),
    "set tiles, tail step, 4 warps": dict(fit_short=False, tail=True, warps=4),
    "32 rows and keys, 3 stages": dict(fit_short=False, tail=True, BT=32, BS=32),
    "fitted, with a tail step": dict(tail=True),
    "default (fitted below a tile, whole masked last step)": dict(),
}
CASES = {  # name: (grid, blocks, D, normalize)
    "29 tokens, D 96 (64 + 32)": ((1, 29), (1, 4), 96, False),
    "29 tokens, D 64": ((1, 29), (1, 4), 64, False),
    "29 tokens, D 96, normalize": ((1, 29), (1, 4), 96, True),
    "141 tokens, D 96": ((141,), (4,), 96, False),
    "80 tokens, D 96 (one full step, a 16-row tail)": ((80,), (4,), 96, False),
    "100 tokens, D 96, 2 heads' blocks (2, 2)": ((10, 10), (2, 2), 96, False),
}


def errors(grid, blocks, D, normalize, dtype, seed, device):
    gen = torch.Generator().manual_seed(seed)
    N, M = math.prod(grid), math.prod(blocks)
    q, k, v, g = (torch.randn(1, N, 1, D, generator=gen) for _ in range(4))
    mix = torch.rand(M, M, generator=gen)
    ins = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v)] + [mix.to(device).requires_grad_()]
    refs = [t.detach().double().requires_grad_() for t in ins]
    o = mhla(*ins, grid, blocks, normalize=normalize, feature_map="relu", algorithm="dense", backend="triton")
    r = mhla_dense(*refs, grid, blocks, normalize=normalize, feature_map="relu")
    got = torch.autograd.grad(o, ins, g.to(device=device, dtype=dtype))
    want = torch.autograd.grad(r, refs, g.to(device).double())
    return [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, want)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--variants", default="", help="comma-separated indices into VARIANTS (default: all); one "
                    "per process where a launch may fault: an illegal memory access ends the CUDA context")
    ap.add_argument("--cases", default="", help="comma-separated indices into CASES (default: all)")
    args = ap.parse_args(argv)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (interpreter)'}, "
          f"torch {torch.__version__}\n")
    print("| case | dtype | variant | dq | dk | dv | dMc |\n|---|---|---|---|---|---|---|")
    pick = lambda table, arg: [x for i, x in enumerate(table.items()) if not arg or str(i) in arg.split(",")]
    for case, (grid, blocks, D, normalize) in pick(CASES, args.cases):
        for dname in args.dtypes.split(","):
            for variant, fields in pick(VARIANTS, args.variants):
                _plans.clear()  # (a plan keeps the launches of the settings it was made with)
                with launch_settings("dense_grad", **fields):
                    worst = [0.0] * 4
                    for seed in range(args.seeds):
                        worst = [max(a, b) for a, b in zip(worst, errors(grid, blocks, D, normalize, dtypes[dname],
                                                                          seed, device))]
                print(f"| {case} | {dname} | {variant} | " + " | ".join(f"{e:.1e}" for e in worst) + " |", flush=True)


if __name__ == "__main__":
    main()
