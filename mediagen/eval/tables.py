"""The one markdown table writer of the benchmarks and evaluation reports (no torch, no heavy imports).

    from mediagen.eval.tables import markdown_table
    print(markdown_table(["method", "ms"], [["sdpa", "1.234"], ["mhla", "0.567"]]))
"""

from __future__ import annotations

from typing import Iterable, Sequence


def markdown_table(header: Sequence, rows: Iterable[Sequence]) -> str:
    """A GitHub markdown table: the header row, a ``|---|`` rule per column, then one line per row with
    each cell as ``str(cell)``."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
