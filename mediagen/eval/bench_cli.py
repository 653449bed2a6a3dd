"""``mediagen bench``: attention latency table (markdown) for the chosen device."""

from __future__ import annotations

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def register(sub):
    p = sub.add_parser("bench", help="benchmark MHLA against SDPA backends and write a markdown table")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu (cpu runs small shapes: a smoke run)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--no-backward", action="store_true", help="time the forward only")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.add_argument("--e2e", action="store_true", help="also time whole transformers (see mediagen.eval.e2e_bench)")
    p.add_argument("--e2e-preset", default=None, help="Wan-style preset for --e2e (default: by device)")
    p.add_argument("--plot", default=None, help="write a PNG plot of latency against sequence length here")
    p.set_defaults(func=run)


def run(args) -> int:
    from .attention_bench import bench_attention, markdown_table

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device {args.device!r} is not allowed: use cuda or cpu")
    dtype = DTYPES[args.dtype] if device.type == "cuda" else torch.float32
    rows, bw = bench_attention(device, dtype, backward=not args.no_backward,
                               rep_ms=100.0 if device.type == "cuda" else 200.0)
    table = markdown_table(rows)
    header = f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, dtype {dtype}, " \
             f"copy bandwidth {bw / 1e9:.0f} GB/s"
    if args.e2e or args.plot:
        from .bench_report import extend_report

        table = extend_report(args, rows, table, device, dtype)
    print(header)
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(header + "\n\n" + table + "\n")
        print(f"wrote {args.out}")
    return 0
