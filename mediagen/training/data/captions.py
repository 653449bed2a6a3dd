"""Caption tables for folders of images or videos: ``metadata.jsonl`` or ``metadata.csv``.

One row per file, as diffusers' ImageFolder/``datasets`` expect: a ``file_name`` column (relative
to the folder) and a caption column named ``text``, ``caption`` or ``prompt``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

CAPTION_KEYS = ("text", "caption", "prompt")


def _caption_of(row: dict, where: str) -> str:
    for key in CAPTION_KEYS:
        if key in row:
            return str(row[key])
    raise ValueError(f"{where} has no caption column: use one of {list(CAPTION_KEYS)} (keys found: {sorted(row)})")


def read_captions(folder: str | Path) -> dict[str, str]:
    """{file_name: caption} from folder/metadata.jsonl or folder/metadata.csv."""
    folder = Path(folder)
    jsonl, csv_path = folder / "metadata.jsonl", folder / "metadata.csv"
    rows: list[tuple[dict, str]] = []
    if jsonl.is_file():
        for n, line in enumerate(jsonl.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append((json.loads(line), f"{jsonl} line {n}"))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{jsonl} line {n} is not JSON: {err}") from None
    elif csv_path.is_file():
        with open(csv_path, newline="") as f:
            rows = [(row, f"{csv_path} row {n}") for n, row in enumerate(csv.DictReader(f), 2)]
    else:
        raise ValueError(f"data.path={str(folder)!r} has no metadata.jsonl or metadata.csv with captions "
                         f"(rows: file_name plus one of {list(CAPTION_KEYS)})")
    table = {}
    for row, where in rows:
        if "file_name" not in row:
            raise ValueError(f"{where} has no file_name (keys found: {sorted(row)})")
        table[row["file_name"]] = _caption_of(row, where)
    return table
