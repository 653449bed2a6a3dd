"""Attention benchmark on the GPU: Triton MHLA (both algorithms), the plain-PyTorch reference and
every SDPA backend, forward and forward+backward, at DESIGN.md's shapes, in one run.

    python benchmarks/attention.py [--out benchmarks/attention-latest.md] [--sweep]

--sweep also times the Triton forward under several block-size settings (MEDIAGEN_MHLA_TILE / _BT /
_WARPS) to pick the defaults.
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mediagen.attention.mhla import locality_mix  # noqa: E402
from mediagen.eval.attention_bench import GPU_SHAPES, bench_attention, markdown_table  # noqa: E402
from mediagen.kernels.mhla.triton_op import mhla_triton  # noqa: E402


def sweep(shapes):
    import triton.testing

    lines = ["| shape | algorithm | TILE | BT | warps | fwd ms | fwd+bwd ms |", "|---|---|---|---|---|---|---|"]
    for s in shapes:
        B, N, H, D = s.batch, s.tokens, s.heads, s.head_dim
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mix = locality_mix(s.blocks).cuda()
        algos = ("chunked", "dense") if N <= 16384 else ("chunked",)
        for algo in algos:
            for tile, bt, warps in [(64, 64, 4), (128, 64, 8), (64, 32, 4), (128, 32, 8)]:
                if tile > max(16, 1 << (D - 1).bit_length()):
                    continue
                os.environ.update(MEDIAGEN_MHLA_TILE=str(tile), MEDIAGEN_MHLA_BT=str(bt), MEDIAGEN_MHLA_WARPS=str(warps))
                try:
                    f = lambda: mhla_triton(q, k, v, mix, s.grid, s.blocks, feature_map="relu", algorithm=algo)
                    t = triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
                    qg = q.detach().requires_grad_()
                    g = torch.randn_like(q)

                    def fb():
                        o = mhla_triton(qg, k, v, mix, s.grid, s.blocks, feature_map="relu", algorithm=algo)
                        torch.autograd.grad(o, qg, g)

                    tb = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
                    lines.append(f"| {s.name} | {algo} | {tile} | {bt} | {warps} | {t:.4f} | {tb:.4f} |")
                except Exception as err:
                    lines.append(f"| {s.name} | {algo} | {tile} | {bt} | {warps} | error {type(err).__name__} | |")
                print(lines[-1], flush=True)
        for key in ("MEDIAGEN_MHLA_TILE", "MEDIAGEN_MHLA_BT", "MEDIAGEN_MHLA_WARPS"):
            os.environ.pop(key, None)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    parts = []
    if args.sweep:
        parts.append("### Triton block-size sweep (bf16)\n\n" + sweep(GPU_SHAPES))
    rows, bw = bench_attention("cuda", dtype)
    head = (f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
            f"{args.dtype} · copy bandwidth {bw / 1e12:.2f} TB/s (read+write)\n"
            f"command: python benchmarks/attention.py {' '.join(sys.argv[1:])}")
    parts.insert(0, head + "\n\n" + markdown_table(rows))
    text = "\n\n".join(parts)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
