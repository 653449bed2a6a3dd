"""The Benchmarks tab's data: latency against sequence length, read from the recorded markdown
tables of ``benchmarks/RESULTS.md`` or measured now with ``mediagen bench``'s attention sweep.

A recorded table qualifies when its header has an ``N`` column, a method column (``method`` or
``attention``) and a time column (``fwd ms`` preferred, else the first column ending in ``ms``).
"""

from __future__ import annotations

import re
from pathlib import Path

METHOD_COLUMNS = ("method", "attention", "variant")


def default_results_path() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    m = re.match(r"^[~≈]?\s*([0-9][0-9,]*\.?[0-9]*(?:e[-+]?\d+)?)", text.replace("**", "").strip(), re.I)
    return float(m.group(1).replace(",", "")) if m else None


def _tables(text: str):
    """Yield (heading, header cells, rows of cells) for every markdown table in ``text``."""
    lines, heading, i = text.splitlines(), "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.strip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|?\s*$", lines[i + 1]):
            header, rows, i = _cells(line), [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            yield heading, header, rows
            continue
        i += 1


def _table_rows(header: list[str], rows: list[list[str]]) -> list[dict]:
    names = [h.lower().replace("*", "").strip() for h in header]
    method_col = next((names.index(m) for m in METHOD_COLUMNS if m in names), None)
    times = [j for j, h in enumerate(names) if h.endswith("ms")]
    if "n" not in names or method_col is None or not times:
        return []
    time_col = names.index("fwd ms") if "fwd ms" in names else times[0]
    out = []
    for cells in rows:
        if len(cells) != len(names):
            continue
        n, ms = _number(cells[names.index("n")]), _number(cells[time_col])
        if n is not None and ms is not None:
            out.append({"N": int(n), "method": cells[method_col], "fwd_ms": ms})
    return out


def parse_results(text: str) -> list[dict]:
    """Rows {"N", "method", "fwd_ms"} from every qualifying table; with several tables the method
    is labelled with its table's heading (e.g. "sdpa flash [H200 bf16]")."""
    tables = [(heading, found) for heading, header, rows in _tables(text) if (found := _table_rows(header, rows))]
    if len(tables) > 1:
        for k, (heading, found) in enumerate(tables):
            for r in found:
                r["method"] = f"{r['method']} [{heading or f'table {k + 1}'}]"
    return [r for _, found in tables for r in found]


def read_results(path: str | Path | None = None) -> list[dict]:
    """Rows of the recorded results; a readable error when the file is missing or holds no table."""
    path = Path(path) if path is not None else default_results_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist yet: no latency has been recorded. Run a fresh "
                                "benchmark instead (or `mediagen bench --out benchmarks/RESULTS.md` on a GPU)")
    rows = parse_results(path.read_text())
    if not rows:
        raise ValueError(f"{path} has no table with N, method and a time in ms to plot")
    return rows


def fresh_rows(device, rep_ms: float = 50.0, shapes=None, repeats: int = 3) -> list[dict]:
    """Attention forward latency measured now (``mediagen bench``'s shapes for the device).

    A CPU's timings move with whatever else runs on it, so one pass is not a measurement: one
    discarded pass warms up (allocator, caches, thread pool), then ``repeats`` passes each time
    every (shape, method); a row reports their median ``fwd_ms`` and the spread ``fwd_min_ms`` /
    ``fwd_max_ms`` (``runs``: passes that gave a time)."""
    import statistics

    import torch

    from ..eval.attention_bench import bench_attention

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is not allowed: use a whole number of passes >= 1")
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def one_pass(rep):
        rows, _ = bench_attention(device, dtype, shapes=shapes, backward=False, warmup_ms=10.0, rep_ms=rep)
        return rows

    one_pass(min(rep_ms, 10.0))                                       # warm-up, not reported
    times: dict = {}
    for _ in range(repeats):
        for r in one_pass(rep_ms):
            if r.get("fwd_ms") is not None:
                times.setdefault((r["method"], r["N"]), []).append(float(r["fwd_ms"]))
    return [{"method": m, "N": n, "fwd_ms": statistics.median(t), "fwd_min_ms": min(t), "fwd_max_ms": max(t),
             "runs": len(t)} for (m, n), t in times.items()]


def markdown(rows: list[dict]) -> str:
    """The table shown under the plot; with repeated measurements, the spread (min–max) too."""
    spread = any("fwd_min_ms" in r for r in rows)
    head = "| method | N | fwd ms (median) | min–max ms | runs |" if spread else "| method | N | fwd ms |"
    lines = [head, "|---|---|---|---|---|" if spread else "|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["N"])):
        ms = r.get("fwd_ms")
        cells = [r["method"], str(r["N"]), "—" if ms is None else f"{ms:.3f}"]
        if spread:
            lo, hi = r.get("fwd_min_ms"), r.get("fwd_max_ms")
            cells += ["—" if lo is None else f"{lo:.3f}–{hi:.3f}", str(r.get("runs", ""))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
