"""Launch settings of the fused HLA readout kernel at one shape: tokens per program, warps, stages.

    python -m benchmarks.sweep_hla_readout [--tokens 32768] [--batch 16] [--heads 12] [--head-dim 32] [--top-k 8]
    python -m benchmarks.sweep_hla_readout --layer --batch 16     # the whole HLA layer per setting

Times each setting with triton.testing.do_bench (median) on random summaries of the right shapes and
prints a table, fastest first, with the setting currently in force (``readout_settings()``) marked. With --layer it
times a random bf16 HLA layer's inference forward instead, under ``use_readout_settings(...)``:
the kernel then reads fla's strided summaries and writes the normalised token-major output, as in use.
"""

import argparse
import itertools

import torch
import triton.testing

from mediagen.text.attention.hla import HLAttention
from mediagen.text.kernels.hla.triton_readout import hla_readout_triton, readout_settings, use_readout_settings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--pool", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=None, help="listed walk over k past chunks per query chunk")
    ap.add_argument("--rep", type=int, default=200, help="do_bench milliseconds per setting")
    ap.add_argument("--layer", action="store_true", help="time the whole HLA layer (fla summaries, norm, output)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    H, D, C = args.heads, args.head_dim, args.chunk
    nc = args.tokens // C
    o_intra = torch.randn(args.batch, H, nc, C, D, device=dev, dtype=torch.bfloat16)
    r = torch.randn(args.batch, H, nc, C, D, device=dev) * 0.1
    a = torch.eye(D, device=dev) * 0.9 + 0.01 * torch.randn(args.batch, H, nc, D, D, device=dev)
    b = torch.randn(args.batch, H, nc, D, D, device=dev) * 0.1
    q_route = torch.randn(args.batch, nc * C, H, D, device=dev, dtype=torch.bfloat16)
    reps = torch.randn(args.batch, H, nc, C // args.pool, D, device=dev, dtype=torch.bfloat16)
    order = None
    if args.top_k:
        past = torch.arange(nc, device=dev)[:, None] - 1 - torch.arange(args.top_k, device=dev)[None, :]
        order = past.clamp_min(-1).expand(args.batch, H, nc, args.top_k).contiguous()
    if args.layer:
        layer = HLAttention(H * D, H, head_dim=D, chunk=C, pool=args.pool, top_k=args.top_k,
                            route="chunk").to(dev, torch.bfloat16).eval()
        x = torch.randn(args.batch, args.tokens, H * D, device=dev, dtype=torch.bfloat16)

        def layer_forward():
            with torch.no_grad():
                layer(x)
    now = readout_settings()
    current = (now.BT64 if D <= 64 else now.BT128, now.warps, now.stages)
    rows = []
    for bt, warps, stages in itertools.product((64, 128, 256), (4, 8), (2, 3)):
        if bt > C:
            continue
        fn = lambda: hla_readout_triton(o_intra, r, a, b, q_route, reps, 2.2, order, block_tokens=bt,  # noqa: E731
                                        num_warps=warps, num_stages=stages)
        if args.layer:
            fn = layer_forward
        fields = {"BT64" if D <= 64 else "BT128": bt, "warps": warps, "stages": stages} if args.layer else {}
        try:
            with use_readout_settings(**fields):
                ms = triton.testing.do_bench(fn, warmup=25, rep=args.rep, return_mode="median")
        except Exception as err:  # e.g. out of shared memory or registers
            print(f"BT={bt} warps={warps} stages={stages}: {type(err).__name__}", flush=True)
            continue
        rows.append((ms, bt, warps, stages))
        print(f"BT={bt} warps={warps} stages={stages}: {ms:.3f} ms", flush=True)
    print(f"\n{'whole layer, ' if args.layer else ''}batch {args.batch}, {args.tokens} tokens, {H}x{D}, "
          f"chunk {C}, pool {args.pool}, top_k {args.top_k} "
          f"({torch.cuda.get_device_name()})\n\n| BT | warps | stages | ms |\n|---|---|---|---|")
    for ms, bt, warps, stages in sorted(rows):
        mark = " (current)" if (bt, warps, stages) == current else ""
        print(f"| {bt} | {warps} | {stages} | {ms:.3f}{mark} |")


if __name__ == "__main__":
    main()
