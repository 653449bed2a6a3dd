"""PNG plot of latency against sequence length, one line per method (log-log axes).

The legend sits outside the axes (right of them) and the title is wrapped to the figure's width, so
neither hides a curve nor gets cut; the x ticks are the measured sequence lengths.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict

Y_LABELS = {"fwd_ms": "forward (ms)", "fwd_graph_ms": "forward, CUDA-graph replay (ms)",
            "fwd_bwd_ms": "forward + backward (ms)", "fwd_bwd_graph_ms": "forward + backward, CUDA-graph replay (ms)"}


def latency_figure(rows, y: str = "fwd_ms", title: str = "latency vs sequence length"):
    """A matplotlib figure of rows (dicts with "N", "method" and ``y`` in ms); rows without a time are
    skipped, and a method measured twice at one N keeps its lower time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    series = defaultdict(dict)
    for r in rows:
        if r.get(y) is not None:
            series[r["method"]][r["N"]] = min(r[y], series[r["method"]].get(r["N"], float("inf")))
    if not series:
        raise ValueError(f"no rows with a {y!r} time to plot")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for method, points in series.items():                       # in the order the rows name them
        ns = sorted(points)
        ax.plot(ns, [points[n] for n in ns], marker="o", label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({n for points in series.values() for n in points})
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel(Y_LABELS.get(y, f"{y.removesuffix('_ms')} (ms)"))
    ax.set_title("\n".join(textwrap.wrap(title, 64)), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_latency(rows, path, y: str = "fwd_ms", title: str = "latency vs sequence length") -> str:
    """Plot rows to the PNG ``path`` (see ``latency_figure``); returns the path."""
    import matplotlib.pyplot as plt

    fig = latency_figure(rows, y=y, title=title)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return str(path)
