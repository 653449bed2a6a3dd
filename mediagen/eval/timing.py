"""One way to time a callable for the benchmarks: warm-up calls, then timed repeats, reported as the
median and the spread.

On a CUDA device each repeat is timed by CUDA events around the call, after a synchronize, so the time is
the GPU's from the first launch to the last kernel's end; elsewhere by ``time.perf_counter`` around the
call (a CPU call is finished when it returns). With ``graph=True`` (CUDA only) the warmed-up callable is
captured once in a CUDA graph, ``graph_calls`` calls in a row, and each repeat replays it: the kernels'
own time without Python or launch overhead, per call.

    from mediagen.eval.timing import measure
    t = measure(step, device, warmup=2, repeats=10)
    print(f"{t.median_ms:.3f} ms (spread {t.spread_ms:.3f})")
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call of each timed repeat, in the order they ran."""

    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    @property
    def spread_ms(self) -> float:
        """Distance between the 20th and 80th percentiles (0 for fewer than two repeats): how far repeats
        wander without letting one outlier decide it."""
        if len(self.times_ms) < 2:
            return 0.0
        cuts = statistics.quantiles(self.times_ms, n=5, method="inclusive")
        return cuts[-1] - cuts[0]

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (spread {self.spread_ms:.3f}, {len(self.times_ms)} repeats)"


def _graphed(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    """A replay of ``fn`` called ``calls`` times in a row, captured in one CUDA graph (``fn`` warmed up)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph.replay


def measure(fn: Callable[[], object], device=None, *, warmup: int = 1, repeats: int = 10,
            budget_ms: Optional[float] = None, graph: bool = False, graph_calls: int = 10,
            before_each: Optional[Callable[[], object]] = None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls (compilation, autotuning, caches), then ``repeats`` timed
    ones, and more while the repeats so far took less than ``budget_ms`` in all (when given).

    ``device``: where fn's work runs (a torch.device or its name; None: CPU); CUDA devices are timed by
    events. ``graph``: time replays of a CUDA graph of ``graph_calls`` calls, per call; ValueError off CUDA.
    ``before_each``: called before every timed repeat, untimed (a barrier between ranks, say)."""
    device = torch.device("cpu" if device is None else device)
    cuda = device.type == "cuda"
    if repeats < 1 or warmup < 0 or graph_calls < 1:
        raise ValueError(f"repeats={repeats} must be at least 1, warmup={warmup} at least 0 and "
                         f"graph_calls={graph_calls} at least 1")
    if graph and not cuda:
        raise ValueError(f"graph=True needs a CUDA device, not {device}")
    calls = 1
    if graph:
        side = torch.cuda.Stream(device)  # warm up off the default stream, as graph capture requires
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(max(1, warmup)):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        fn, calls = _graphed(fn, graph_calls), graph_calls
    else:
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize(device)
    times: list[float] = []
    while len(times) < repeats or (budget_ms is not None and sum(times) * calls < budget_ms):
        if before_each is not None:
            before_each()
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return Timing(tuple(times))
