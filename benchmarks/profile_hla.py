"""Where one HLA layer's time goes, stage by stage, beside causal SDPA of the same shape.

    python -m benchmarks profile_hla [--tokens 32768] [--top-k 8] [--route chunk] [--kernels]
    python -m benchmarks profile_hla --tiny          # CPU smoke run

Each stage function the layer calls (gate routing, chunk summaries, the walk over past chunks, ...)
is wrapped for the run with a timer that synchronises the device before and after it, so the
stages add up to about the layer's time (synchronising costs a little overlap). The layer's code
path is the real one: ``HLAttention.forward`` runs unchanged. ``--kernels``: torch.profiler's GPU time per kernel.
"""

import argparse
import contextlib
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

import mediagen.text.attention.hla as hla_module
import mediagen.text.kernels.hla.chunk as chunk_module
import mediagen.text.kernels.hla.readout as readout_module
from benchmarks.common import markdown_table
from mediagen.eval.timing import measure

# (module, function name): the stages of HLAttention.forward, as it calls them
STAGES = [(hla_module, "pad_to_chunks"), (hla_module, "bucket_representatives"), (hla_module, "chunk_gates"),
          (hla_module, "chunk_routed_gates"), (hla_module, "select_chunks"),
          (chunk_module, "chunk_summaries"), (chunk_module, "hla_walk"), (chunk_module, "hla_walk_sparse"),
          (chunk_module, "hla_walk_indexed"), (hla_module, "chunk_routing_order"),
          (readout_module, "chunk_summaries"), (readout_module, "hla_readout_tokens")]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def stage_timers(device, totals):
    """Wrap every stage function with a synchronised timer adding to totals[name] (ms). Not measure: these
    are stages inside the measured calls, summed per stage, not a callable of their own."""
    saved = []
    for module, name in STAGES:
        fn = getattr(module, name)
        saved.append((module, name, fn))

        def timed(*args, _fn=fn, _name=name, **kwargs):
            sync(device)
            t0 = time.perf_counter()
            out = _fn(*args, **kwargs)
            sync(device)
            totals[_name] += (time.perf_counter() - t0) * 1e3
            return out
        setattr(module, name, timed)
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny layer on the CPU in fp32")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=None, help="HLA chunk skipping: keep k past chunks")
    ap.add_argument("--route", default="token", choices=["token", "chunk"])
    ap.add_argument("--readout", default="auto", choices=["auto", "torch", "triton"],
                    help="auto: the fused Triton readout on a GPU (gates + walk in one kernel); torch: unfused")
    ap.add_argument("--kernels", action="store_true", help="also print torch.profiler's per-kernel GPU times")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    hidden, heads, chunk, pool, n = (32, 4, 16, 4, 128) if args.tiny else (384, 12, 256, 16, args.tokens)
    torch.manual_seed(0)
    layer = hla_module.HLAttention(hidden, heads, chunk=chunk, pool=pool, top_k=args.top_k,
                                   route=args.route, readout=args.readout).to(device=device, dtype=dtype).eval()
    x = torch.randn(args.batch, n, hidden, device=device, dtype=dtype)
    qkv = torch.nn.Linear(hidden, 3 * hidden).to(device=device, dtype=dtype)

    def hla():
        with torch.no_grad():
            layer(x)

    def sdpa():  # the softmax layer of the same shape: projections, causal SDPA, output projection
        with torch.no_grad():
            q, k, v = qkv(x).view(args.batch, n, 3, heads, -1).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            layer.out_proj(o.transpose(1, 2).flatten(-2))

    total = measure(hla, device, warmup=1, repeats=args.iters).median_ms
    base = measure(sdpa, device, warmup=1, repeats=args.iters).median_ms
    totals = defaultdict(float)
    with stage_timers(device, totals):
        hla()  # warm-up with the timers in place
        totals.clear()
        staged = statistics.mean(measure(hla, device, warmup=0, repeats=args.iters).times_ms)  # the stages' calls
    print(f"{device} {dtype} · batch {args.batch} · {n} tokens · {heads}x{hidden // heads} · chunk {chunk} · top_k {args.top_k} "
          f"· route {args.route} · readout {args.readout}")
    print(f"HLA layer {total:.3f} ms · causal SDPA layer {base:.3f} ms · ratio {total / base:.2f} "
          f"(medians of {args.iters}); with stage timers {staged:.3f} ms (mean)")
    rows = [[name, f"{ms / args.iters:.3f}"] for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])]
    rest = staged - sum(totals.values()) / args.iters
    rows.append(["rest (projections, gates' einsum, norms, out_proj)", f"{rest:.3f}"])
    print(markdown_table(["stage", "ms (mean, with timers)"], rows))
    if args.kernels and device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                hla()
            sync(device)
        print(f"GPU kernels over {args.iters} layer calls:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
