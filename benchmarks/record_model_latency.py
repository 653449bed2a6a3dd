"""Merge ``python -m benchmarks video_latency --out`` JSON files into the recorded sampling time per clip that
ships with the package (``mediagen/eval/recorded/model_latency.json``, the app's Benchmarks tab).

    python -m benchmarks record_model_latency benchmarks/results/video_latency_cpu.json
    python -m benchmarks record_model_latency out_16x64.json out_32x128.json out_64x128.json   # a GPU session

A row replaces the recorded row of the same (device, attention, runtime, tokens per clip); the others stay;
files are merged in the order given (a later one wins a key two of them measured). Every file is checked
before the recorded file is replaced, in one step (``mediagen.eval.model_latency.record_video_latency``).
"""

from __future__ import annotations

import argparse

from mediagen.eval.model_latency import RECORDED_MODEL_LATENCY, record_video_latency, row_key


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outputs", nargs="+", help="video_latency --out JSON files")
    p.add_argument("--into", default=str(RECORDED_MODEL_LATENCY), help="the recorded file (default: the shipped one)")
    args = p.parse_args(argv)
    try:
        doc = record_video_latency(args.outputs, args.into)
    except ValueError as err:
        p.error(str(err))
    print(f"merged {len(args.outputs)} file(s) into {args.into}; it now holds "
          f"{sum(len(r['rows']) for r in doc['runs'])} rows in {len(doc['runs'])} run(s):")
    for run in doc["runs"]:
        for r in run["rows"]:
            device, attention, runtime, tokens = row_key(run["device"], r)
            print(f"  {device} | {attention} | {runtime} | {tokens:,} tokens | {r['s_per_clip']:.3f} s/clip | "
                  f"{run.get('date', '')[:10]} {run.get('commit', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
