"""The parts of ``mediagen bench`` beyond attention latency: the end-to-end table and the PNG plot."""

from __future__ import annotations

import os


def extend_report(args, attention_rows, table: str, device, dtype) -> str:
    """Run the end-to-end sweep when asked, draw the plot(s), and return the extended markdown."""
    from .latency_plot import plot_latency

    parts = [table]
    e2e_rows = []
    if args.e2e:
        from .e2e_bench import bench_end_to_end, e2e_markdown_table

        e2e_rows = bench_end_to_end(device, dtype, preset=args.e2e_preset)
        parts += ["", "End to end (one transformer forward):", "", e2e_markdown_table(e2e_rows)]
    if args.plot:
        plot_latency(attention_rows, args.plot, title=f"attention forward latency ({device.type})")
        parts += ["", f"plot: {args.plot}"]
        if e2e_rows:
            stem, ext = os.path.splitext(args.plot)
            e2e_plot = f"{stem}_e2e{ext or '.png'}"
            plot_latency(e2e_rows, e2e_plot, title=f"end-to-end forward latency ({e2e_rows[0]['model']})")
            parts.append(f"plot: {e2e_plot}")
    return "\n".join(parts)
