"""The MHLA op per shape and method: Triton MHLA (both algorithms, RoPE, tf32 products), the plain-PyTorch
reference and every SDPA backend, forward and forward+backward, eager and CUDA graph, in one run
(``mediagen.eval.attention_bench``; shapes: docs/DESIGN.md, benchmark shapes).

    python -m benchmarks attention [--out FILE] [--shapes Wan,SANA] [--methods "mhla triton,cudnn"] [--json FILE]
    python -m benchmarks attention --shapes "DiT-XL/2 256" --batches 8,64 --methods "mhla triton,sdpa"
    python -m benchmarks attention --shapes "image 14x14,video" --batches 2,8,32 --no-backward   # shipped models
    python -m benchmarks attention --sweep dense_grad BT=64,128 BS=32,64 warps=4,8 stages=2,3 --shapes "DiT-XL/2 256"
    python -m benchmarks attention --profile --shapes "Wan2.1-1.3B 81f 480x832"
    python -m benchmarks attention --tiny          # CPU smoke run: attention_bench's CPU shapes, fp32

"fwd ms" is eager (Python launch overhead included); "CUDA graph" replays the captured call, the kernels' own
time. ``--json`` records the rows in the latency file the package ships (the app's Benchmarks tab plots it):
they replace the same shape and method of older runs there (mediagen.eval.bench_report).

``--sweep KERNEL FIELD=V1,V2 ...`` measures the same rows under every combination of the launch settings given
(``mediagen.kernels.mhla.launch_settings``; KERNEL may be a comma list, e.g. dense,dense_split, which take the
fields alike), MHLA methods only unless ``--methods`` says otherwise, and ranks the combinations per shape and
method by CUDA-graph time: forward+backward for a backward kernel, else forward. The other kernels of the op
are in every row alike, so the differences are the swept kernel's. Defaults to start from:
mediagen/kernels/mhla/settings.py. ``--profile`` prints, after each shape's rows, torch.profiler's time per
kernel of the op's forward+backward.
"""

import argparse
import contextlib
import dataclasses
import datetime
import shlex
import sys

import torch

from benchmarks.common import device_name, label, markdown_table, settings_grid
from mediagen.eval.attention_bench import CPU_SHAPES, GPU_SHAPES, Shape, bench_attention
from mediagen.eval.attention_bench import markdown_table as rows_table

# the shipped MNIST models' attention at their sampling batch: image-mhla, video-mhla (RoPE on the features:
# the "mhla triton rope" rows)
SHIPPED_SHAPES = [Shape("image 14x14", 2, (14, 14), 3, 64, (3, 3)), Shape("image 28x28", 2, (28, 28), 3, 64, (4, 4)),
                  Shape("video 16x8x8", 2, (16, 8, 8), 6, 64, (4, 2, 2))]
BACKWARD_KERNELS = ("query_grad", "key_grad", "mix_grad", "dense_grad")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the table to this markdown file")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--shapes", default="", help="comma list of substrings of shape names (default: the models')")
    ap.add_argument("--batches", default="", help="comma list of batch sizes: every shape at each (default: its own)")
    ap.add_argument("--methods", default="", help="comma list of substrings of method names (default: all)")
    ap.add_argument("--no-backward", action="store_true", help="time the forward only")
    ap.add_argument("--json", default=None, help="record the rows in this latency file (the package's: "
                    "mediagen/eval/recorded/attention_latency.json)")
    ap.add_argument("--sweep", nargs="+", default=None, metavar="KERNEL FIELD=V1,V2",
                    help="the rows under every combination of these launch settings of KERNEL")
    ap.add_argument("--profile", action="store_true", help="also the GPU time per kernel of forward+backward")
    ap.add_argument("--tiny", action="store_true", help="CPU, fp32, the tiny shapes: checks the script runs")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    if not args.tiny and not torch.cuda.is_available():
        ap.error("no CUDA GPU visible: run with --tiny for a CPU smoke run")
    if args.json and (args.tiny or args.sweep):
        ap.error("--json records GPU runs at the shipped launch settings in the package's latency file: not with "
                 "--tiny or --sweep")
    dtype_name = "fp32" if args.tiny else args.dtype
    dtype = DTYPES[dtype_name]
    default = CPU_SHAPES if args.tiny else GPU_SHAPES
    known = default if args.tiny else GPU_SHAPES + SHIPPED_SHAPES
    wanted = [w for w in args.shapes.split(",") if w]
    shapes = [s for s in known if any(w in s.name for w in wanted)] if wanted else default
    if not shapes:
        ap.error(f"--shapes {args.shapes!r} matches none of {[s.name for s in known]}")
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
        sweep = [] if args.sweep is None else [{}] + settings_grid(args.sweep[1:])  # {}: the defaults
    except ValueError as err:
        ap.error(f"--batches / --sweep: {err}")
    if batches:
        shapes = [dataclasses.replace(s, batch=b, name=s.name if b == s.batch else f"{s.name} B={b}")
                  for s in shapes for b in batches]
    methods = [m for m in args.methods.split(",") if m] or (["mhla triton"] if sweep else None)
    kernels = args.sweep[0].split(",") if sweep else []
    try:
        for fields in sweep:  # an unknown kernel or field fails here, before anything is timed
            with launch_settings(kernels, fields):
                pass
    except ValueError as err:
        ap.error(f"--sweep: {err}")
    command = f"python -m benchmarks attention {shlex.join(sys.argv[1:] if argv is None else argv)}"
    rows, runs = [], []
    for shape in shapes:  # one shape at a time, so a time limit keeps the shapes already done
        for fields in sweep or [None]:
            with launch_settings(kernels, fields or {}):
                new, bw = bench_attention(device, dtype, shapes=[shape], methods=methods, backward=not args.no_backward,
                                          reference=methods is None or any("reference" in m for m in methods))
            rows += new
            runs += [(fields, r) for r in new]
            print(rows_table(new) if fields is None else f"{label(fields)}:\n{rows_table(new)}", flush=True)
        if args.profile:
            profile(shape, device, dtype)
        head = (f"{datetime.date.today()} · {device_name(device)} · torch {torch.__version__} · "
                f"{dtype_name} · copy bandwidth {bw / 1e12:.2f} TB/s (read+write)\ncommand: {command}")
        text = head + "\n\n" + (ranked(runs, kernels, args.no_backward) if sweep else rows_table(rows))
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(text + "\n")
        if args.json:
            import triton

            from mediagen.eval.bench_report import record_attention_run

            record_attention_run(args.json, rows, command=command, date=str(datetime.date.today()), dtype=args.dtype,
                                 copy_bandwidth_tb_s=bw / 1e12, device=f"{device_name(device)}, torch "
                                 f"{torch.__version__}, triton {triton.__version__}")
    if sweep:
        print("\n" + ranked(runs, kernels, args.no_backward))


@contextlib.contextmanager
def launch_settings(kernels, fields):
    """Every kernel of ``kernels`` launched with ``fields`` inside the block."""
    from mediagen.kernels.mhla import launch_settings as one

    with contextlib.ExitStack() as stack:
        for kernel in kernels:
            stack.enter_context(one(kernel, **fields))
        yield


def ranked(runs, kernels, forward_only) -> str:
    """The swept rows by shape and method, fastest first: CUDA-graph time where there is one (eager on a CPU),
    forward+backward when a swept kernel runs in the backward."""
    backward = not forward_only and any(k in BACKWARD_KERNELS for k in kernels)
    key = ("fwd_bwd_graph_ms", "fwd_bwd_ms") if backward else ("fwd_graph_ms", "fwd_ms")

    def ms(row):
        t = row.get(key[0], row.get(key[1]))
        return float("inf") if t is None else t

    out = []
    for shape, method in dict.fromkeys((r["shape"], r["method"]) for _, r in runs):
        mine = sorted(((f, r) for f, r in runs if (r["shape"], r["method"]) == (shape, method)), key=lambda x: ms(x[1]))
        default = next(i for i, (f, _) in enumerate(mine) if not f)
        fastest, (slowest, r) = ", ".join(f"{label(f)}: {ms(r):.4f}" for f, r in mine[:4]), mine[-1]
        out.append([shape, method, f"{ms(mine[default][1]):.4f} ({default + 1} of {len(mine)})", fastest,
                    f"{label(slowest)}: {ms(r):.4f}"])
    return (f"Launch settings of {','.join(kernels)}, ms by {key[0]} (else {key[1]}); the defaults: "
            "mediagen/kernels/mhla/settings.py\n\n"
            + markdown_table(["shape", "method", "defaults (rank)", "fastest 4", "slowest"], out))


def profile(shape: Shape, device, dtype):
    """torch.profiler's time per kernel over 5 forward+backward calls of the op, by forward algorithm."""
    from mediagen.attention.mhla import locality_mix
    from mediagen.kernels import mhla

    B, N, H, D = shape.batch, shape.tokens, shape.heads, shape.head_dim
    q, k, v = (torch.randn(B, N, H, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    mix = locality_mix(shape.blocks).to(device).requires_grad_()
    g = torch.randn_like(q)
    cuda = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    for algorithm in ("chunked", "dense") if N <= 4096 else ("chunked",):
        def step():
            o = mhla(q, k, v, mix, shape.grid, shape.blocks, feature_map="relu", algorithm=algorithm)
            torch.autograd.grad(o, (q, k, v, mix), g)

        step()  # compiled, planned
        with torch.profiler.profile(activities=[activity]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize() if cuda else None
        print(f"\n{shape.name}, {algorithm} forward, 5 forward+backward calls:\n"
              + prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=12,
                                          max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main()
