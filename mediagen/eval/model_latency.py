"""Recorded model-level sampling time: seconds per text-to-video clip against tokens per clip, MHLA beside
softmax, as ``benchmarks/video_latency.py --out`` measures it. The file (``recorded/model_latency.json``)
ships with the package for the app's Benchmarks tab, beside the attention-op latency.

The file holds the latest measurement of each (device, attention, runtime, tokens per clip), grouped in
runs that keep the device, dtype, size, steps, guidance, command, commit and date they came from.
``python -m benchmarks record_model_latency FILE.json...`` merges video_latency outputs into it with
``record_video_latency``: rows a file measured replace the same key in older runs, a run left with no rows
is dropped, and the file is replaced atomically, so it stays the present state while git keeps the history.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path

from .bench_report import _dumps

RECORDED_MODEL_LATENCY = Path(__file__).resolve().parent / "recorded" / "model_latency.json"
ABOUT = ("Text-to-video sampling time per clip (text encoding and decoding included), the latest measurement of "
         "each (device, attention, runtime, tokens per clip). s_per_clip: the median of the timed rounds after "
         "one warm-up; min/max_s_per_call: their spread. Written by python -m benchmarks record_model_latency from "
         "python -m benchmarks video_latency --out files; a command missing from such a file is rebuilt from its "
         "settings.")
# what a run keeps of a video_latency file's meta, and a row of its results
RUN_KEYS = ("device", "dtype", "num_frames", "height", "width", "steps", "guidance", "batch", "rounds",
            "peak_mem_kind", "torch", "commit", "date", "command", "source")
ROW_KEYS = ("pipeline", "attention", "runtime", "tokens_per_clip", "token_grid", "parameters", "s_per_clip",
            "min_s_per_call", "max_s_per_call", "peak_mem_mib")
RULE = ("{'runs': [{'device', 'date', 'command', 'commit', ..., 'rows': [{'attention', 'runtime', "
        "'tokens_per_clip', 's_per_clip', ...}]}]}")


def row_key(device: str, row: dict) -> tuple:
    """What one measurement is of: the device, the pipeline's attention, the runtime and the tokens per clip."""
    return (device, row["attention"], row["runtime"], int(row["tokens_per_clip"]))


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def rebuilt_command(meta: dict, results: list[dict]) -> str:
    """The video_latency command that a file's settings stand for (for files written before it kept its own)."""
    pipelines = list(dict.fromkeys(r["pipeline"] for r in results))
    device = "cpu" if str(meta.get("device", "")).lower().startswith("cpu") else "cuda"
    parts = ["python -m benchmarks video_latency", shlex.join(pipelines), "--device", device]
    for option, key in (("--dtype", "dtype"), ("--num-frames", "num_frames"), ("--height", "height"),
                        ("--width", "width"), ("--steps", "steps"), ("--guidance", "guidance"),
                        ("--batch", "batch"), ("--rounds", "rounds")):
        if meta.get(key) is not None:
            parts += [option, str(meta[key])]
    if meta.get("runtimes"):
        parts += ["--runtimes", ",".join(meta["runtimes"])]
    return " ".join(parts)


def run_from_output(doc, source: str = "") -> dict:
    """One recorded run out of a ``video_latency --out`` document; ValueError naming what is missing."""
    where = f"{source}: " if source else ""
    try:
        meta, results = doc["meta"], doc["results"]
        if not isinstance(meta, dict) or not isinstance(results, list) or not results:
            raise TypeError("'meta' must be an object and 'results' a non-empty list")
        if not (isinstance(meta.get("device"), str) and meta["device"] and meta.get("date")):
            raise KeyError("meta.device / meta.date")
        rows = []
        for r in results:
            got = {**r, "s_per_clip": r.get("median_s_per_clip")}
            row = {k: round(got[k], 4) if isinstance(got[k], float) else got[k] for k in ROW_KEYS
                   if got.get(k) is not None}
            if not (isinstance(r["attention"], str) and isinstance(r["runtime"], str) and r["attention"]
                    and r["runtime"] and _positive(r["tokens_per_clip"]) and _positive(r["median_s_per_clip"])):
                raise ValueError(f"a row without attention, runtime, tokens_per_clip > 0 or median_s_per_clip > 0: "
                                 f"{ {k: r.get(k) for k in ('pipeline', 'attention', 'runtime')} }")
            row["tokens_per_clip"] = int(row["tokens_per_clip"])
            rows.append(row)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}not a video_latency output ({type(err).__name__}: {err}); it holds "
                         "{'meta': {'device', 'date', ...}, 'results': [{'attention', 'runtime', "
                         "'tokens_per_clip', 'median_s_per_clip', ...}]}") from None
    keys = [row_key(meta["device"], r) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}two rows of one (device, attention, runtime, tokens per clip): the recorded "
                         "file keeps one measurement of each")
    run = {k: meta[k] for k in RUN_KEYS if meta.get(k) is not None}
    run["command"] = meta.get("command") or rebuilt_command(meta, results)
    if source:
        run["source"] = source
    run["rows"] = rows
    return run


def merge_run(doc: dict, run: dict) -> dict:
    """``doc`` with ``run`` added first (newest first); older runs lose the rows of the keys it measured, and a
    run left with no rows is dropped."""
    measured = {row_key(run["device"], r) for r in run["rows"]}
    runs = [run]
    for old in doc.get("runs", []):
        kept = [r for r in old["rows"] if row_key(old["device"], r) not in measured]
        if kept:
            runs.append({**old, "rows": kept})
    return {"about": doc.get("about", ABOUT), "runs": runs}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def record_video_latency(outputs, path=RECORDED_MODEL_LATENCY, sources=None) -> dict:
    """Merge ``video_latency --out`` documents (dicts, or paths to their JSON) into the recorded file at
    ``path`` (created when missing), in the order given, so a later one wins a key two of them measured.
    Every document is checked before anything is written, and the file is replaced in one step. Returns
    the written document."""
    path = Path(path)
    runs = []
    for i, out in enumerate(outputs):
        source = sources[i] if sources else ""
        if isinstance(out, (str, Path)):
            source = source or str(out)
            try:
                out = json.loads(Path(out).read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise ValueError(f"{source}: cannot read it as JSON ({type(err).__name__}: {err})") from None
        runs.append(run_from_output(out, source))
    if not runs:
        raise ValueError("no video_latency output given: nothing to record")
    doc = {"about": ABOUT, "runs": []}
    if path.is_file():
        read_model_latency(path)                                # refuse to merge into a malformed file
        doc = json.loads(path.read_text())
    for run in runs:
        doc = merge_run(doc, run)
    write_atomic(path, _dumps({"about": doc.get("about", ABOUT), "runs": doc["runs"]}))
    return doc


def read_runs(doc, path) -> list[dict]:
    """The rows of a recorded document, each with its run's fields (device, date, command, commit, ...);
    ValueError in one line when it is not such a document or has no row with a time."""
    try:
        rows = []
        for run in doc["runs"]:
            if not isinstance(run["device"], str):
                raise TypeError("a run's device is not a string")
            for r in run["rows"]:
                if not (isinstance(r["attention"], str) and isinstance(r["runtime"], str)
                        and _positive(r["tokens_per_clip"]) and _positive(r["s_per_clip"])):
                    raise ValueError(f"a row without attention, runtime, tokens_per_clip or s_per_clip > 0: {r}")
                rows.append({**{k: v for k, v in run.items() if k != "rows"}, **r})
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a recorded sampling-time file ({type(err).__name__}: {err}); it holds "
                         f"{RULE}") from None
    if not rows:
        raise ValueError(f"{path} has no row with a time per clip to plot")
    return rows


def read_model_latency(path=None) -> list[dict]:
    """Rows of the recorded sampling-time file, each with its run's fields; FileNotFoundError / ValueError
    in one line when the file is missing or malformed."""
    path = Path(path) if path is not None else RECORDED_MODEL_LATENCY
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: no sampling time per clip has been recorded there; record "
                                f"one with `python -m benchmarks record_model_latency OUT.json` from "
                                f"`python -m benchmarks video_latency ... --out OUT.json`")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a recorded sampling-time file ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); it holds {RULE}") from None
    return read_runs(doc, path)
