"""Host (CPU) time per call of the MHLA op at the DiT-XL/2 256 px shape (B=8, grid 16 x 16, H=16, D=72,
blocks 4 x 4, bf16, ReLU features), where the GPU work is so short that the host's time decides the speed.

    python -m benchmarks.mhla_host_overhead [--calls 50] [--repeats 7] [--algorithm auto]

(from the repository root, as a module)

Three tables:

- "stubbed launches" (any machine): every Triton kernel the op launches is replaced by a no-op, so what is
  timed is the op's own Python: argument checks, the launch plan, output allocation, the autograd Function.
  On a machine without CUDA the tensors live on the meta device (allocations and torch ops cost their
  dispatch only, as asynchronous CUDA ops cost the host little more); with CUDA they are CUDA tensors. Some
  meta ops are Python (the reduction that adds dMc's parts, the autograd engine's checks of the gradients), so
  meta numbers overstate those. The floor column is an autograd Function with the same inputs that only
  allocates its outputs: what the Function machinery costs whatever the op does.
- "eager, CUDA" (a CUDA machine only): the real op (as shipped: after a plan's first call its launches call the
  compiled kernels directly, mediagen/kernels/launch.py; and with every launch through Triton's dispatch, for
  comparison) and cuDNN SDPA at the same shape, each row the median of
  ``--repeats`` runs of ``--calls`` back-to-back calls:
    host us  the time to issue one call while the GPU is held busy by a spin kernel (torch.cuda._sleep), so no
             call waits for the GPU: the host's cost alone (the Triton launchers' own Python included);
    GPU us   CUDA-event time of those calls, which the GPU then runs back to back: the kernels alone;
    wall us  calls issued with the GPU free, then one synchronize: what a training step sees, the larger of
             the two above when nothing overlaps.
  "fwd" runs the forward with inputs that require grad (the autograd graph is built), "fwd no-grad" under
  torch.no_grad(), "fwd+bwd" the forward and torch.autograd.grad of all inputs (q, k, v, Mc).
- "per launch" (a CUDA machine only): the host time of each Triton launch in a forward + backward, by kernel,
  through ``kernel[grid](...)`` (Triton's JIT dispatch: argument binding, specialisation and cache key, then
  the launcher) and through a direct call of the compiled kernel the dispatch returned, with the same
  arguments (the launcher alone, as the op's direct launches call it).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from mediagen.attention.mhla import locality_mix
from mediagen.kernels import launch, mhla
from mediagen.kernels.mhla import launches, triton_op
from mediagen.kernels.switches import use_switches

B, GRID, H, D, BLOCKS = 8, (16, 16), 16, 72, (4, 4)
N = GRID[0] * GRID[1]
# every Triton kernel the op launches, by its name in launches.py
KERNELS = ("summary_kernel", "apply_kernel", "query_grad_kernel", "key_grad_kernel", "dense_forward_kernel",
           "dense_query_grad_kernel", "dense_key_grad_kernel",
           "mix_kernel", "mix_grad_kernel", "part_sum_kernel")


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` launches nothing and returns a compiled
    kernel that launches nothing, so that the op's later launches take their direct path (launch.py) with its
    checks, as on a GPU."""

    def __init__(self, kernel):
        self.fn = kernel.fn  # the kernel's signature orders a direct launch's arguments

    def __getitem__(self, grid):
        return _dispatch


class _NoCompiled:
    run = None  # (a compiled kernel has a launcher)

    def __getitem__(self, grid):
        return _no_op


def _dispatch(*args, **kwargs):
    return _NoCompiled()


def _no_op(*args, **kwargs):
    return None


@contextlib.contextmanager
def replaced_kernels(stand_in):
    """Every kernel of ``KERNELS`` in launches.py replaced by ``stand_in(name, kernel)`` inside the block."""
    saved = {name: getattr(launches, name) for name in KERNELS}
    try:
        for name, kernel in saved.items():
            setattr(launches, name, stand_in(name, kernel))
        yield
    finally:
        for name, kernel in saved.items():
            setattr(launches, name, kernel)


def dispatch_only():
    """Every launch through Triton's dispatch inside the block (the op's direct launches off)."""
    return use_switches(direct_launch=False)


def stubbed_launches():
    return replaced_kernels(lambda name, kernel: _NoLaunch(kernel))


def inputs(device, requires_grad=True):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in range(3))
    mix = locality_mix(BLOCKS).to(device)
    g = torch.randn(B, N, H, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    return [t.requires_grad_(requires_grad) for t in (q, k, v, mix)], g


def cases(algorithm, device):
    """{name: (forward, forward + backward, context)} closures: the MHLA op and, on CUDA, cuDNN SDPA; each is
    timed inside its context (SDPA's backend choice, entered once rather than per call)."""
    (q, k, v, mix), g = inputs(device)

    def op():
        return mhla(q, k, v, mix, GRID, BLOCKS, feature_map="relu", backend="triton", algorithm=algorithm)

    fwd_bwd = lambda: torch.autograd.grad(op(), (q, k, v, mix), g)  # noqa: E731
    out = {f"mhla ({algorithm})": (op, fwd_bwd, contextlib.nullcontext)}
    if device.type == "cuda":
        out[f"mhla ({algorithm}), every launch dispatched"] = (op, fwd_bwd, dispatch_only)
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                    v.transpose(1, 2))

        gt = g.transpose(1, 2)
        out["sdpa cudnn"] = (sdpa, lambda: torch.autograd.grad(sdpa(), (q, k, v), gt),
                             lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    return out


def _median_us(fn, calls, repeats):
    """Median over ``repeats`` of the mean time per call (perf_counter) of ``calls`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


class _Floor(torch.autograd.Function):
    """An op that only allocates its outputs (and its gradients): what the autograd Function machinery and the
    allocations alone cost, the floor under the op's own host time."""

    @staticmethod
    def forward(ctx, q, k, v, mix):
        ctx.mix = (mix.shape, mix.dtype)
        return torch.empty(q.shape, device=q.device, dtype=q.dtype)

    @staticmethod
    def backward(ctx, g):
        grads = [torch.empty(g.shape, device=g.device, dtype=g.dtype) for _ in range(3)]
        return (*grads, torch.empty(ctx.mix[0], device=g.device, dtype=ctx.mix[1]))


def stubbed_table(algorithm, calls, repeats):
    device = torch.device("cuda" if torch.cuda.is_available() else "meta")
    fwd, fwd_bwd, _ = cases(algorithm, device)[f"mhla ({algorithm})"]
    (q, k, v, mix), g = inputs(device)
    floor = (lambda: _Floor.apply(q, k, v, mix),
             lambda: torch.autograd.grad(_Floor.apply(q, k, v, mix), (q, k, v, mix), g))
    rows = []
    with stubbed_launches():
        for name, fn, grad in (("fwd", fwd, True), ("fwd no-grad", fwd, False), ("fwd+bwd", fwd_bwd, True)):
            with torch.set_grad_enabled(grad):
                floor_fn = floor[1] if name == "fwd+bwd" else floor[0]
                for _ in range(20):  # warm-up: caches filled
                    fn()
                    floor_fn()
                rows.append((name, _median_us(fn, calls, repeats), _median_us(floor_fn, calls, repeats)))
    print(f"\n### stubbed launches ({device.type} tensors), mhla {algorithm}: host us per call\n")
    print("The floor is an autograd Function with the same inputs that only allocates its outputs.\n")
    print("| call | mhla host us | floor host us |\n|---|---|---|")
    for name, us, floor_us in rows:
        print(f"| {name} | {us:.1f} | {floor_us:.1f} |")


class _TimedKernel:
    """Stands in for a Triton kernel: launches it as usual, adds each launch's host time to ``times[name]`` and
    keeps the last launch (compiled kernel, grid, arguments) in ``last[name]``."""

    def __init__(self, name, kernel, times, last):
        self.name, self.kernel, self.times, self.last = name, kernel, times, last

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            t0 = time.perf_counter()
            compiled = self.kernel[grid](*args, **kwargs)
            self.times.setdefault(self.name, []).append(time.perf_counter() - t0)
            self.last[self.name] = (self.kernel, compiled, grid, args, kwargs)
            return compiled
        return launch


def _direct_us(kernel, compiled, grid, args, kwargs, calls=200):
    """Host us per direct launch of ``compiled`` (every parameter in the kernel's order, constexprs included,
    as Triton's dispatch hands them to the launcher), the GPU held busy so that no launch waits."""
    ordered = (*args, *launch._argument_tail(kernel, len(args), kwargs))  # as the op's direct launches order them
    grid3 = (*grid, *(1,) * (3 - len(grid)))
    run = compiled[grid3]
    run(*ordered)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for _ in range(calls):
        run(*ordered)
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def per_launch_table(algorithm, calls):
    _, fwd_bwd, _ = cases(algorithm, torch.device("cuda"))[f"mhla ({algorithm})"]
    times, last = {}, {}
    # every launch through the dispatch, where the timer sees it (a direct launch bypasses kernel[grid])
    with replaced_kernels(lambda name, kernel: _TimedKernel(name, kernel, times, last)), dispatch_only():
        for _ in range(10):  # warm-up: kernels compiled, plans cached
            fwd_bwd()
        times.clear()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # every launch below is issued while the GPU is busy
        for _ in range(calls):
            fwd_bwd()
        torch.cuda.synchronize()
    print(f"\n### per launch, mhla {algorithm} fwd+bwd ({torch.cuda.get_device_name()}): host us per launch\n")
    print("| kernel | launches per call | through kernel[grid] | compiled kernel called directly |\n|---|---|---|---|")
    for name, spent in times.items():
        try:
            direct = ("n/a: no compiled kernel (interpreter)" if last[name][1] is None
                      else f"{_direct_us(*last[name]):.1f}")
        except Exception as err:  # the launcher's calling convention differs in this Triton version
            direct = f"n/a: {type(err).__name__}: {str(err).splitlines()[0][:60]}"
        print(f"| {name} | {len(spent) / calls:g} | {statistics.median(spent) * 1e6:.1f} | {direct} |")


def _cuda_times(fn, calls, repeats):
    """(host us, GPU us, wall us) per call, medians over ``repeats`` runs of ``calls`` calls."""
    host, gpu, wall = [], [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning: every call below is issued while the GPU is busy
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        host.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / calls * 1e3)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(gpu), statistics.median(wall)


def cuda_table(algorithm, calls, repeats):
    print(f"\n### eager, CUDA ({torch.cuda.get_device_name()}), DiT-XL/2 256 px bf16: us per call\n")
    print("| method | call | host us | GPU us | wall us |\n|---|---|---|---|---|")
    for name, (fwd, fwd_bwd, context) in cases(algorithm, torch.device("cuda")).items():
        for call, fn, grad in (("fwd", fwd, True), ("fwd no-grad", fwd, False), ("fwd+bwd", fwd_bwd, True)):
            with torch.set_grad_enabled(grad), context():
                try:
                    for _ in range(10):
                        fn()
                    host, gpu, wall = _cuda_times(fn, calls, repeats)
                except RuntimeError as err:  # e.g. no cuDNN attention for this shape or GPU
                    print(f"| {name} | {call} | n/a: {str(err).splitlines()[0][:80]} | | |")
                    continue
            print(f"| {name} | {call} | {host:.1f} | {gpu:.1f} | {wall:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=50,
                    help="calls per timed run (few enough that a CUDA run's launches fit the launch queue)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs; the median is reported")
    ap.add_argument("--algorithm", default="auto", choices=triton_op.ALGORITHMS,
                    help="the op's forward algorithm (auto picks dense at this shape)")
    args = ap.parse_args()
    if args.calls < 1 or args.repeats < 1:
        ap.error(f"--calls={args.calls} and --repeats={args.repeats} must be at least 1")
    stubbed_table(args.algorithm, args.calls, args.repeats)
    if torch.cuda.is_available():
        cuda_table(args.algorithm, args.calls, args.repeats)
        per_launch_table(args.algorithm, args.calls)
    else:
        print("\n(no CUDA device: the eager table needs one)")


if __name__ == "__main__":
    main()
