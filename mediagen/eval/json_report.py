"""Writing a command's JSON report (the --out option of fid, vbench and attention-stats)."""

from __future__ import annotations

import json
import os


def write_json_report(path: str, report: dict) -> None:
    """Write ``report`` as indented JSON to ``path`` (parent folders created) and say where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2)
    print(f"wrote {path}")
