"""The Benchmarks tab's data: attention latency against sequence length, either as recorded in the
package (``mediagen/eval/recorded/attention_latency.json``, written on a GPU by
``benchmarks/attention.py --json``) or measured now with ``mediagen bench``'s attention sweep; and beside
it the models' sampling time per clip against tokens per clip, MHLA beside softmax, as recorded in
``mediagen/eval/recorded/model_latency.json`` (``python -m benchmarks record_model_latency``).

The recorded files ship with the package, so an installed app plots them without the repository. Their
rows keep the command, date and device of the run that measured them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..eval.bench_report import RECORDED_LATENCY
from ..eval.model_latency import RECORDED_MODEL_LATENCY, read_model_latency

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


# --- model-level sampling time per clip (recorded/model_latency.json) ----------------------------------------
MHLA, SOFTMAX = "mhla", "sdpa"      # the attention names of the compared pipelines (video-mhla, video-sdpa)


def default_model_results_path() -> Path:
    return RECORDED_MODEL_LATENCY


def short_device(device: str) -> str:
    """"cpu (x86_64, 2 threads)" -> "cpu", "NVIDIA H200, torch 2.11" -> "NVIDIA H200"."""
    return re.sub(r"\s*\(.*?\)", "", device).split(",")[0].strip() or device


def model_series(rows: list[dict]) -> list[dict]:
    """One line per (attention, runtime, device): its label and its points (tokens per clip, s per clip),
    sorted by tokens; lines in the order the rows name them."""
    lines: dict = {}
    for r in rows:
        key = (r["attention"], r["runtime"], r["device"])
        lines.setdefault(key, {})[r["tokens_per_clip"]] = r["s_per_clip"]
    return [{"attention": a, "runtime": rt, "device": d, "label": f"{a}, {rt}, {short_device(d)}",
             "points": sorted(points.items())} for (a, rt, d), points in lines.items()]


def model_ratios(rows: list[dict]) -> list[dict]:
    """Per (device, runtime, tokens per clip) where both were measured: MHLA's and softmax's seconds per clip,
    ``ratio`` = MHLA / softmax (below 1: MHLA is faster) and ``speedup`` = softmax / MHLA."""
    times: dict = {}
    for r in rows:
        if r["attention"] in (MHLA, SOFTMAX):
            times.setdefault((r["device"], r["runtime"], r["tokens_per_clip"]), {})[r["attention"]] = r["s_per_clip"]
    out = []
    for (device, runtime, tokens), t in sorted(times.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if MHLA in t and SOFTMAX in t:
            out.append({"device": device, "runtime": runtime, "tokens_per_clip": tokens, "mhla_s": t[MHLA],
                        "softmax_s": t[SOFTMAX], "ratio": t[MHLA] / t[SOFTMAX], "speedup": t[SOFTMAX] / t[MHLA]})
    return out


def model_runs(rows: list[dict]) -> list[dict]:
    """The runs the rows came from (device, dtype, size, steps, guidance, command, commit, date), once each."""
    keys = ("device", "dtype", "num_frames", "height", "width", "steps", "guidance", "batch", "command", "commit",
            "date")
    return list({tuple(r.get(k) for k in keys): {k: r.get(k) for k in keys} for r in rows}.values())


def model_caption(rows: list[dict]) -> str:
    """One line per run: device, dtype, clip size, steps, guidance, then command · commit · date."""
    lines = []
    for run in model_runs(rows):
        size = "×".join(str(run[k]) for k in ("num_frames", "height", "width") if run.get(k) is not None)
        what = [run["device"], run.get("dtype"), size and f"{size} clips",
                run.get("steps") is not None and f"{run['steps']} steps",
                run.get("guidance") is not None and f"guidance {run['guidance']:g}",
                run.get("batch") is not None and f"batch {run['batch']}"]
        lines.append(f"- {', '.join(w for w in what if w)}: `{run.get('command') or '?'}` · "
                     f"{run.get('commit') or '?'} · {str(run.get('date') or '?')[:10]}")
    return "\n".join(lines)


def model_figure(rows: list[dict], title: str = "Sampling time per clip, recorded"):
    """Seconds per clip against tokens per clip (log-log), one line per (attention, runtime, device): colour
    by attention, line style by runtime, marker by device; legend right of the axes."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatterSciNotation, NullLocator

    class Plain(LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            return f"{x:,.6g}" if super().__call__(x, pos) else ""

    series = model_series(rows)
    attentions = list(dict.fromkeys(s["attention"] for s in series))
    runtimes = list(dict.fromkeys(s["runtime"] for s in series))
    devices = list(dict.fromkeys(s["device"] for s in series))
    styles, markers = ("-", "--", ":", "-."), ("o", "s", "^", "D", "v", "P")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for s in series:
        xs, ys = zip(*s["points"])
        ax.plot(xs, ys, label=s["label"], color=f"C{attentions.index(s['attention']) % 10}",
                linestyle=styles[runtimes.index(s["runtime"]) % len(styles)],
                marker=markers[devices.index(s["device"]) % len(markers)])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({x for s in series for x, _ in s["points"]})
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 2, ticks[0] * 2)
    ax.yaxis.set_major_formatter(Plain())
    ax.yaxis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    ax.set_xlabel("tokens per clip")
    ax.set_ylabel("sampling time per clip (s)")
    ax.set_title("\n".join(textwrap.wrap(title, 64)), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def model_title(rows: list[dict]) -> str:
    devices = list(dict.fromkeys(short_device(r["device"]) for r in rows))
    dtypes = sorted({r["dtype"] for r in rows if r.get("dtype")})
    return f"Sampling time per clip, {MHLA} vs {SOFTMAX} ({', '.join(devices + dtypes)})"


def model_markdown(rows: list[dict], ratios: list[dict], name: str = "model_latency.json") -> str:
    """The MHLA / softmax ratio per token count, the recorded rows, and the runs' caption."""
    lines = [f"**Sampling time per clip, recorded in `{name}`** (text encoding and decoding included; median of "
             "the timed rounds after a warm-up)", "",
             f"| device | runtime | tokens/clip | {MHLA} s | {SOFTMAX} s | {MHLA} / {SOFTMAX} | {MHLA} speed-up |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {short_device(q['device'])} | {q['runtime']} | {q['tokens_per_clip']:,} | {q['mhla_s']:.2f} | "
              f"{q['softmax_s']:.2f} | {q['ratio']:.3f} | {q['speedup']:.2f}× |" for q in ratios]
    if not ratios:
        lines.append(f"| — | — | — | — | — | no token count has both {MHLA} and {SOFTMAX} | — |")
    lines += ["", "| device | attention | pipeline | runtime | tokens/clip | s/clip | min–max s | peak MiB |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["device"], r["runtime"], r["tokens_per_clip"], r["attention"])):
        spread = (f"{r['min_s_per_call']:.2f}–{r['max_s_per_call']:.2f}"
                  if r.get("min_s_per_call") is not None and r.get("max_s_per_call") is not None else "—")
        mem = "—" if r.get("peak_mem_mib") is None else f"{r['peak_mem_mib']:,.1f}"
        lines.append(f"| {short_device(r['device'])} | {r['attention']} | {r.get('pipeline', '')} | {r['runtime']} | "
                     f"{r['tokens_per_clip']:,} | {r['s_per_clip']:.2f} | {spread} | {mem} |")
    return "\n".join(lines + ["", "Measured by:", model_caption(rows)])


def model_view(path=None, folder=None) -> dict:
    """What the tab shows of the recorded sampling time: ``series`` (the plotted lines), ``ratios``
    (``model_ratios``), ``caption``, ``text`` (markdown) and ``plot`` (a PNG in ``folder``, when given).
    A missing or malformed file gives ``{"error": one line}`` and nothing else, not an exception."""
    path = Path(path) if path is not None else default_model_results_path()
    try:
        rows = read_model_latency(path)
    except (FileNotFoundError, ValueError) as err:
        return {"error": " ".join(str(err).split())}
    ratios = model_ratios(rows)
    view = {"series": model_series(rows), "ratios": ratios, "caption": model_caption(rows),
            "text": model_markdown(rows, ratios, path.name), "plot": None}
    if folder is not None:
        import matplotlib.pyplot as plt

        fig = model_figure(rows, model_title(rows))
        view["plot"] = str(Path(folder) / "sampling_time.png")
        fig.savefig(view["plot"], bbox_inches="tight")
        plt.close(fig)
    return view
