"""PNG plot of latency against sequence length, one line per method (log-log axes)."""

from __future__ import annotations

from collections import defaultdict


def plot_latency(rows, path, y: str = "fwd_ms", title: str = "latency vs sequence length") -> str:
    """Plot rows (dicts with "N", "method" and ``y`` in ms) to ``path``; rows without a time are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = defaultdict(dict)
    for r in rows:
        if r.get(y) is not None:
            series[r["method"]][r["N"]] = min(r[y], series[r["method"]].get(r["N"], float("inf")))
    if not series:
        raise ValueError(f"no rows with a {y!r} time to plot")
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for method, points in sorted(series.items()):
        ns = sorted(points)
        ax.plot(ns, [points[n] for n in ns], marker="o", label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel(f"{y.replace('_ms', '')} latency (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
