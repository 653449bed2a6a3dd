"""Per-kernel GPU times of the Triton MHLA (torch.profiler), eager vs CUDA-graph replay times.

    python -m benchmarks.profile_mhla      (from the repository root, as a module)
"""

import torch
import triton.testing

from mediagen.attention.mhla import locality_mix
from mediagen.eval.attention_bench import GPU_SHAPES
from mediagen.kernels.mhla.triton_op import mhla_triton


def main():
    for s in GPU_SHAPES:
        B, N, H, D = s.batch, s.tokens, s.heads, s.head_dim
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mix = locality_mix(s.blocks).cuda().requires_grad_()
        g = torch.randn_like(q)
        algos = ("chunked", "dense") if N <= 4096 else ("chunked",)
        for algo in algos:
            fwd = lambda: mhla_triton(q, k, v, mix, s.grid, s.blocks, feature_map="relu", algorithm=algo)

            def fb():
                torch.autograd.grad(fwd(), (q, k, v, mix), g)

            with torch.no_grad():
                t_eager = triton.testing.do_bench(fwd, warmup=25, rep=100, return_mode="median")
                t_graph = triton.testing.do_bench_cudagraph(fwd, rep=100, return_mode="median")
            tb_eager = triton.testing.do_bench(fb, warmup=25, rep=100, return_mode="median")
            print(f"\n## {s.name} {algo}: fwd eager {t_eager:.4f} ms, graph {t_graph:.4f} ms; fwd+bwd eager {tb_eager:.4f} ms")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fb()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
