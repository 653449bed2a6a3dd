"""Attention benchmark on the GPU: Triton MHLA (both algorithms), the plain-PyTorch reference and
every SDPA backend, forward and forward+backward, at the shapes of docs/DESIGN.md (benchmark shapes), in one run.

    python -m benchmarks.attention [--out benchmarks/attention-latest.md] [--shapes Wan,SANA] [--methods "mhla triton,cudnn"]
        [--json mediagen/eval/recorded/attention_latency.json]

"--json" records the rows in the latency file the package ships (the app's Benchmarks tab plots it):
they replace the same shape and method of older runs there (mediagen.eval.bench_report).

"fwd ms" is eager (Python launch overhead included); "CUDA graph" replays the captured forward, the
kernels' own time. benchmarks/sweep_mhla.py tunes the kernels' launch settings.
"""

import argparse
import datetime
import sys

import torch

from mediagen.eval.attention_bench import GPU_SHAPES, bench_attention, markdown_table
from mediagen.eval.bench_report import record_attention_run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--shapes", default="", help="comma list of substrings of shape names (default: all)")
    ap.add_argument("--methods", default="", help="comma list of substrings of method names (default: all)")
    ap.add_argument("--json", default=None, help="record the rows in this latency file (the package's: "
                    "mediagen/eval/recorded/attention_latency.json)")
    args = ap.parse_args()
    wanted = [w for w in args.shapes.split(",") if w]
    shapes = [s for s in GPU_SHAPES if not wanted or any(w in s.name for w in wanted)]
    if not shapes:
        ap.error(f"--shapes {args.shapes!r} matches none of {[s.name for s in GPU_SHAPES]}")
    methods = [m for m in args.methods.split(",") if m] or None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    rows = []
    for shape in shapes:  # one shape at a time, so a time limit keeps the shapes already done
        new, bw = bench_attention("cuda", dtype, shapes=[shape], methods=methods,
                                  reference=methods is None or any("reference" in m for m in methods))
        rows += new
        head = (f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
                f"{args.dtype} · copy bandwidth {bw / 1e12:.2f} TB/s (read+write)\n"
                f"command: python -m benchmarks.attention {' '.join(sys.argv[1:])}")
        text = head + "\n\n" + markdown_table(rows)
        print(markdown_table(new), flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(text + "\n")
        if args.json:
            import triton

            record_attention_run(args.json, rows, command=f"python -m benchmarks.attention {' '.join(sys.argv[1:])}",
                                 date=str(datetime.date.today()), dtype=args.dtype, copy_bandwidth_tb_s=bw / 1e12,
                                 device=f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                                        f"triton {triton.__version__}")


if __name__ == "__main__":
    main()
