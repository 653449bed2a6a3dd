"""The Benchmarks tab's data: attention latency against sequence length, either as recorded in the
package (``mediagen/eval/recorded/attention_latency.json``, written on a GPU by
``benchmarks/attention.py --json``) or measured now with ``mediagen bench``'s attention sweep.

The recorded file ships with the package, so an installed app plots it without the repository. Its
rows keep the command, date and device of the run that measured them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..eval.bench_report import RECORDED_LATENCY

SERIES = ("mhla vs fastest sdpa", "every method")
SPREAD = ("fwd_min_ms", "fwd_max_ms")
# the two families compared by default: per sequence length, the fastest method whose name starts so
FAMILIES = (("mhla", "mhla (fastest variant)"), ("sdpa", "sdpa (fastest backend)"))


def default_results_path() -> Path:
    return RECORDED_LATENCY


def read_results(path: str | Path | None = None) -> list[dict]:
    """Rows of the recorded latency file, each with its run's ``date``, ``device``, ``command`` and
    ``dtype``; a readable error when the file is missing, malformed or has no time."""
    path = Path(path) if path is not None else default_results_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: no latency has been recorded there. Run a fresh "
                                f"benchmark instead, or record one on a GPU with "
                                f"`python -m benchmarks.attention --json {path}`")
    try:
        doc = json.loads(path.read_text())
        rows = [{**r, "date": run.get("date", ""), "device": run.get("device", ""),
                 "command": run.get("command", ""), "dtype": run.get("dtype", "")}
                for run in doc["runs"] for r in run["rows"]]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a recorded latency file ({type(err).__name__}: {err}); it holds "
                         "{'runs': [{'command', 'date', 'device', 'rows': [...]}]}") from None
    if not any(r.get("fwd_graph_ms") is not None or r.get("fwd_ms") is not None for r in rows):
        raise ValueError(f"{path} has no row with a forward time to plot")
    return rows


def time_key(rows: list[dict]) -> str:
    """The time plotted: CUDA-graph replay (the kernels' own time) when the rows have it, else eager."""
    return "fwd_graph_ms" if any(r.get("fwd_graph_ms") is not None for r in rows) else "fwd_ms"


def select_series(rows: list[dict], series: str, y: str) -> list[dict]:
    """The rows to plot. "every method": each method as measured. "mhla vs fastest sdpa": two lines,
    at each sequence length the fastest MHLA method and the fastest SDPA backend (``picked`` names it);
    rows of neither family are then left out, unless no row is of either family. A row's spread
    (``fwd_min_ms`` / ``fwd_max_ms``, fresh rows) goes with it."""
    if series not in SERIES:
        raise ValueError(f"series={series!r} is not allowed: choose one of {list(SERIES)}")
    timed = [r for r in rows if r.get(y) is not None]

    def point(r, method):
        out = {"N": r["N"], "method": method, y: r[y]}
        out.update({k: r[k] for k in SPREAD if r.get(k) is not None})
        return out

    if series == "every method":
        return [point(r, r["method"]) for r in timed]
    out = []
    for prefix, label in FAMILIES:
        best: dict = {}
        for r in timed:
            if r["method"].startswith(prefix) and (r["N"] not in best or r[y] < best[r["N"]][y]):
                best[r["N"]] = r
        out += [{**point(r, label), "picked": r["method"]} for n, r in sorted(best.items())]
    return out or select_series(rows, "every method", y)


def figure(rows: list[dict], y: str, title: str):
    """The latency figure (``mediagen.eval.latency_plot``) as the tab shows it: each point's spread
    (min–max of the repeated passes, when the rows have one) as a bar in its line's colour, and the
    log axis labelled in plain numbers ("6", "20", "0.5"), not "6x10^0"."""
    from matplotlib.ticker import LogFormatterSciNotation

    from ..eval.latency_plot import latency_figure

    class Plain(LogFormatterSciNotation):
        # the ticks the log formatter labels, written as plain numbers
        def __call__(self, x, pos=None):
            return f"{x:,.6g}" if super().__call__(x, pos) else ""

    fig = latency_figure(rows, y=y, title=title)
    ax = fig.axes[0]
    for line in ax.get_lines():
        spread = sorted((r["N"], r[y], r["fwd_min_ms"], r["fwd_max_ms"]) for r in rows
                        if r["method"] == line.get_label() and r.get("fwd_min_ms") is not None)
        if spread:
            ns, mid, lo, hi = (list(col) for col in zip(*spread))
            ax.errorbar(ns, mid, yerr=[[m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)]], fmt="none",
                        ecolor=line.get_color(), capsize=3, linewidth=1)
    ax.yaxis.set_major_formatter(Plain())
    ax.yaxis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    return fig


def plot(rows: list[dict], path, y: str, title: str) -> str:
    """``figure`` saved as the PNG ``path``; returns the path."""
    import matplotlib.pyplot as plt

    fig = figure(rows, y, title)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def recorded_title(rows: list[dict]) -> str:
    """A title that fits: the devices and dtypes of the recorded rows, short."""
    devices = sorted({r["device"].split(",")[0] for r in rows if r.get("device")})
    dtypes = sorted({r["dtype"] for r in rows if r.get("dtype")})
    where = ", ".join(devices + dtypes)
    return f"Attention latency, recorded ({where})" if where else "Attention latency, recorded"


def model_path(device) -> str:
    """The method name of MHLA as the models run it on ``device``: the op's default path ("mhla triton"
    on CUDA, "mhla blocked" elsewhere; ``MEDIAGEN_MHLA_BACKEND`` may force another)."""
    import torch

    from ..kernels.mhla.op import resolve_backend

    return f"mhla {resolve_backend(None, torch.device(device))}"


def op_rows(device, dtype, shapes=None, rep_ms: float = 50.0) -> list[dict]:
    """Forward latency of the MHLA op called as the models call it (no backend forced), one row per shape
    (``mediagen bench``'s shapes for the device unless given)."""
    import torch

    from ..attention.mhla import locality_mix
    from ..eval.attention_bench import CPU_SHAPES, GPU_SHAPES
    from ..eval.timing import measure
    from ..kernels import mhla

    device = torch.device(device)
    rows = []
    for shape in shapes or (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES):
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(shape.batch, shape.tokens, shape.heads, shape.head_dim, device=device, dtype=dtype,
                               generator=gen) for _ in range(3))
        mix = locality_mix(shape.blocks).to(device)
        row = {"shape": shape.name, "N": shape.tokens, "method": model_path(device)}
        try:
            row["fwd_ms"] = measure(lambda: mhla(q, k, v, mix, shape.grid, shape.blocks, feature_map="relu"), device,
                                    warmup=1, repeats=3, budget_ms=rep_ms).median_ms
        except ValueError as err:          # a shape the op refuses (a head dim out of its range): no time
            row.update(fwd_ms=None, note=str(err))
        rows.append(row)
    return rows


def fresh_rows(device, rep_ms: float = 50.0, shapes=None, repeats: int = 3) -> list[dict]:
    """Attention forward latency measured now (``mediagen bench``'s shapes for the device): MHLA as the
    models run it here (``model_path``: the op's default path, not the fp32 reference that the kernels are
    tested against) and every SDPA backend the device has.

    A CPU's timings move with whatever else runs on it, so one pass is not a measurement: one
    discarded pass warms up (allocator, caches, thread pool), then ``repeats`` passes each time
    every (shape, method); a row reports their median ``fwd_ms`` and the spread ``fwd_min_ms`` /
    ``fwd_max_ms`` (``runs``: passes that gave a time)."""
    import statistics

    import torch

    from ..eval import attention_bench

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is not allowed: use a whole number of passes >= 1")
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    path = model_path(device)

    def one_pass(rep):
        rows, _ = attention_bench.bench_attention(device, dtype, shapes=shapes, backward=False, reference=False,
                                                  warmup_ms=10.0, rep_ms=rep)
        if not any(r["method"] == path for r in rows):          # on CUDA the bench times the Triton path already
            rows = rows + op_rows(device, dtype, shapes, rep)
        return rows

    one_pass(min(rep_ms, 10.0))                                       # warm-up, not reported
    times: dict = {}
    for _ in range(repeats):
        for r in one_pass(rep_ms):
            if r.get("fwd_ms") is not None:
                times.setdefault((r["method"], r["N"]), []).append(float(r["fwd_ms"]))
    return [{"method": m, "N": n, "fwd_ms": statistics.median(t), "fwd_min_ms": min(t), "fwd_max_ms": max(t),
             "runs": len(t)} for (m, n), t in times.items()]


def _ms(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def markdown(rows: list[dict]) -> str:
    """The table shown under the plot: recorded rows with their times and date; fresh rows with the
    spread (min–max) of their repeated measurements."""
    if any("date" in r for r in rows):
        lines = ["| shape | N | method | fwd ms (CUDA graph) | fwd+bwd ms (CUDA graph) | fwd ms (eager) | measured |",
                 "|---|---|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (r["N"], r["method"])):
            lines.append(f"| {r.get('shape', '')} | {r['N']} | {r['method']} | {_ms(r.get('fwd_graph_ms'))} | "
                         f"{_ms(r.get('fwd_bwd_graph_ms'))} | {_ms(r.get('fwd_ms'))} | {r['date']} |")
        return "\n".join(lines)
    spread = any("fwd_min_ms" in r for r in rows)
    head = "| method | N | fwd ms (median) | min–max ms | runs |" if spread else "| method | N | fwd ms |"
    lines = [head, "|---|---|---|---|---|" if spread else "|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["N"])):
        cells = [r["method"], str(r["N"]), _ms(r.get("fwd_ms"))]
        if spread:
            lo, hi = r.get("fwd_min_ms"), r.get("fwd_max_ms")
            cells += ["—" if lo is None else f"{lo:.3f}–{hi:.3f}", str(r.get("runs", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
