"""Attention latency benchmark: Triton MHLA, the plain-PyTorch reference and every SDPA backend,
side by side in one run, with the memory floor and achieved bandwidth.

The memory floor of one attention forward is reading q, k, v and writing o once:
4 * B * N * H * D * element_size bytes, over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.mhla import locality_mix
from ..kernels import mhla, mhla_reference
from . import tables
from .timing import measure


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    grid: tuple[int, ...]
    heads: int
    head_dim: int
    blocks: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return math.prod(self.grid)


GPU_SHAPES = [
    Shape("DiT-XL/2 256px", 8, (16, 16), 16, 72, (4, 4)),
    Shape("DiT-XL/2 512px", 8, (32, 32), 16, 72, (4, 4)),
    Shape("SANA 4K 128x128", 1, (128, 128), 70, 32, (8, 8)),
    Shape("Wan2.1-1.3B 81f 480x832", 1, (21, 30, 52), 12, 128, (3, 5, 4)),
    Shape("Wan2.1-1.3B 81f 720x1280", 1, (21, 45, 80), 12, 128, (3, 5, 4)),
]
CPU_SHAPES = [
    Shape("tiny 2D", 2, (16, 16), 4, 32, (4, 4)),
    Shape("tiny 3D", 1, (4, 16, 16), 4, 32, (2, 2, 2)),
]
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def _timer(device: torch.device, warmup_ms: float, rep_ms: float):
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")

    return lambda fn: measure(fn, device, warmup=1, repeats=3, budget_ms=rep_ms).median_ms


def copy_bandwidth(device, timer) -> float:
    """Bytes per second of a device copy, counting bytes read plus bytes written."""
    n = (1 << 30) if device.type == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * n / (ms / 1e3)


def _sdpa(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name])

    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    return run


def bench_attention(device="cuda", dtype=torch.bfloat16, shapes=None, backward=True, reference=True,
                    warmup_ms=25.0, rep_ms=100.0, methods=None):
    """Time every method on every shape; return (rows, copy bytes/s). Each row is a dict."""
    device = torch.device(device)
    shapes = shapes or (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES)
    timer = _timer(device, warmup_ms, rep_ms)
    bandwidth = copy_bandwidth(device, timer)
    rows = []
    for shape in shapes:
        B, N, H, D = shape.batch, shape.tokens, shape.heads, shape.head_dim
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(B, N, H, D, device=device, dtype=dtype, generator=gen) for _ in range(3))
        mix = locality_mix(shape.blocks).to(device)
        floor_bytes = 4 * B * N * H * D * q.element_size()
        cands, settings = {}, {}
        if device.type == "cuda":
            cands["mhla triton"] = lambda q, k, v: mhla(q, k, v, mix, shape.grid, shape.blocks,
                                                        feature_map="relu", backend="triton")
            if N <= 4096:
                for algo in ("chunked", "dense"):
                    cands[f"mhla triton {algo}"] = (lambda a: lambda q, k, v: mhla(
                        q, k, v, mix, shape.grid, shape.blocks, feature_map="relu", backend="triton",
                        algorithm=a))(algo)

            def chunked(q, k, v):
                return mhla(q, k, v, mix, shape.grid, shape.blocks, feature_map="relu", backend="triton",
                            algorithm="chunked")

            if dtype != torch.float32:  # the default multiplies in the input dtype; this row in tf32
                cands["mhla triton chunked, tf32 products"] = chunked
                settings["mhla triton chunked, tf32 products"] = ("apply", "query_grad", "key_grad")
            if D % 2 == 0:  # RoPE on the numerator's features (Wan's rope="features"), fp32 angle tables
                angle = torch.rand(N, D // 2, device=device, generator=gen) * 6.3
                rope = (angle.cos(), angle.sin())
                cands["mhla triton rope"] = lambda q, k, v: mhla(q, k, v, mix, shape.grid, shape.blocks,
                                                                 feature_map="relu", backend="triton", rope=rope)
        if reference:
            cands["mhla reference (fp32)"] = lambda q, k, v: mhla_reference(q, k, v, mix, shape.grid,
                                                                           shape.blocks, feature_map="relu")
        for name in (SDPA_BACKENDS if device.type == "cuda" else ("math",)):
            if name == "math" and device.type == "cuda":
                continue  # O(N^2) memory: not a contender on a GPU
            cands[f"sdpa {name}"] = _sdpa(name)
        if methods:
            cands = {k_: f for k_, f in cands.items() if any(m in k_ for m in methods)}
        for name, fn in cands.items():
            with _tf32_kernels(settings.get(name, ())):
                rows.append(_measure(name, fn, q, k, v, shape, floor_bytes, bandwidth, timer, device, backward,
                                     rep_ms))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, bandwidth


@contextlib.contextmanager
def _tf32_kernels(names):
    """Turn off the input-dtype products of the named MHLA kernels (their ``lowp`` launch setting) for the
    duration: they multiply tf32 copies instead."""
    from ..kernels.mhla import launch_settings

    with contextlib.ExitStack() as stack:
        for n in names:
            stack.enter_context(launch_settings(n, lowp=False))
        yield


def _measure(name, fn, q, k, v, shape, floor_bytes, bandwidth, timer, device, backward, rep_ms):
    """One table row: forward (eager and graph) and forward+backward times of ``fn``."""
    B, N, H, D = q.shape
    row = {"shape": shape.name, "B": B, "N": N, "heads": f"{H}x{D}", "method": name,
           "floor_ms": floor_bytes / bandwidth * 1e3}
    try:
        row["fwd_ms"] = timer(lambda: fn(q, k, v))
        row["GB/s"] = floor_bytes / (row["fwd_ms"] / 1e3) / 1e9
    except Exception as err:  # a backend that refuses a shape (e.g. head dim 72)
        row["fwd_ms"] = None
        row["note"] = type(err).__name__ + ": " + str(err).splitlines()[0][:60]
    if device.type == "cuda" and row.get("fwd_ms") is not None:  # kernels without launch overhead
        import triton.testing

        try:
            row["fwd_graph_ms"] = triton.testing.do_bench_cudagraph(lambda: fn(q, k, v), rep=rep_ms,
                                                                    return_mode="median")
        except Exception as err:  # the reference copies index lists to the GPU: not capturable
            row["note"] = "no CUDA graph: " + type(err).__name__
    if backward and row.get("fwd_ms") is not None:
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        g = torch.randn_like(q)

        def fwd_bwd():
            out = fn(qg, kg, vg)
            torch.autograd.grad(out, (qg, kg, vg), g.transpose(1, 2) if out.shape != g.shape else g)

        try:
            row["fwd_bwd_ms"] = timer(fwd_bwd)
        except Exception as err:
            row["fwd_bwd_ms"] = None
            row["note"] = "bwd: " + type(err).__name__
        if device.type == "cuda" and row.get("fwd_bwd_ms") is not None:  # the kernels alone
            import triton.testing

            try:
                row["fwd_bwd_graph_ms"] = triton.testing.do_bench_cudagraph(fwd_bwd, rep=rep_ms, return_mode="median")
            except Exception as err:
                row["note"] = (row.get("note", "") + " no CUDA graph of fwd+bwd: " + type(err).__name__).strip()
    return row


def markdown_table(rows) -> str:
    """The rows of bench_attention as a markdown table (through ``tables.markdown_table``)."""
    header = ["shape", "B", "N", "heads×d", "method", "fwd ms", "fwd ms (CUDA graph)", "fwd+bwd ms",
              "fwd+bwd ms (CUDA graph)", "floor ms", "fwd GB/s", "note"]

    def f(x, nd=3):
        return "—" if x is None else f"{x:.{nd}f}"

    return tables.markdown_table(header, [
        [r["shape"], r["B"], r["N"], r["heads"], r["method"], f(r.get("fwd_ms")), f(r.get("fwd_graph_ms")),
         f(r.get("fwd_bwd_ms")), f(r.get("fwd_bwd_graph_ms")), f(r["floor_ms"]), f(r.get("GB/s"), 0),
         r.get("note", "")] for r in rows])
