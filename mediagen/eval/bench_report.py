"""The parts of ``mediagen bench`` beyond attention latency: the end-to-end table, the PNG plot, and the
recorded attention latency that ships with the package (``recorded/attention_latency.json``).

The recorded file holds the latest measurement of each (shape, method, dtype), grouped in runs that keep
the command, date and device they came from. ``benchmarks/attention.py --json PATH`` adds a run with
``record_attention_run``: rows it measured replace the same (shape, method, dtype) of older runs, and a
run left with no rows is dropped, so the file stays the present state while git keeps the history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORDED_LATENCY = Path(__file__).resolve().parent / "recorded" / "attention_latency.json"
ABOUT = ("Attention latency per shape and method: the latest measurement of each (shape, method, dtype). "
         "Times in ms, medians of triton.testing.do_bench; *_graph_ms replay a captured CUDA graph (the "
         "kernels' own time), the others are eager (Python launch work included); floor_ms reads q, k, v "
         "and writes o once at the run's copy bandwidth. Written by benchmarks/attention.py --json.")
# what a stored row keeps of an attention_bench row (GB/s and notes follow from these or are run-local)
ROW_KEYS = ("shape", "B", "N", "heads", "method", "fwd_ms", "fwd_graph_ms", "fwd_bwd_ms", "fwd_bwd_graph_ms",
            "floor_ms")


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


def _stored_row(row: dict) -> dict:
    out = {}
    for key in ROW_KEYS:
        value = row.get(key)
        if value is None:
            continue
        out[key] = round(float(value), 4) if key.endswith("_ms") else value
    return out


def record_attention_run(path, rows, *, command: str, date: str, device: str, dtype: str,
                         copy_bandwidth_tb_s: float | None = None) -> dict:
    """Add one run of ``bench_attention`` rows to the recorded file at ``path`` (created when missing).

    Rows without a forward time are not recorded (a backend that refused the shape). Older runs lose
    the rows this run measured again; runs left empty are dropped. Returns the written document."""
    path = Path(path)
    doc = json.loads(path.read_text()) if path.is_file() else {"about": ABOUT, "runs": []}
    new = [_stored_row(r) for r in rows if r.get("fwd_ms") is not None or r.get("fwd_graph_ms") is not None]
    if not new:
        raise ValueError("no row has a time: nothing to record")
    measured = {(r["shape"], r["method"]) for r in new}
    runs = []
    for run in doc.get("runs", []):
        same_dtype = run.get("dtype") == dtype
        kept = [r for r in run["rows"] if not (same_dtype and (r["shape"], r["method"]) in measured)]
        if kept:
            runs.append({**run, "rows": kept})
    run = {"command": command, "date": date, "device": device, "dtype": dtype}
    if copy_bandwidth_tb_s is not None:
        run["copy_bandwidth_tb_s"] = round(float(copy_bandwidth_tb_s), 2)
    run["rows"] = new
    doc = {"about": doc.get("about", ABOUT), "runs": [run] + runs}         # newest first
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dumps(doc))
    return doc


def _dumps(doc: dict) -> str:
    """Indented JSON with one line per row, so that a diff of the file shows which rows a run changed."""
    runs = []
    for run in doc["runs"]:
        head = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in run.items() if k != "rows")
        rows = ",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in run["rows"])
        runs.append("  {\n" + head + ',\n   "rows": [\n' + rows + "\n   ]\n  }")
    return ("{\n " + json.dumps("about") + ": " + json.dumps(doc["about"], ensure_ascii=False) + ',\n "runs": [\n'
            + ",\n".join(runs) + "\n ]\n}\n")
