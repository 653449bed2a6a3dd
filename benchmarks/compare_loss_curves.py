"""Compare the per-step losses of two training runs (metrics.jsonl files written by mediagen train)."""

import json
import sys


def losses(path):
    out = {}
    for line in open(path):
        row = json.loads(line)
        out[row["step"]] = row["loss"]  # a resumed run may repeat steps: the last one wins
    return out


def main(a_path, b_path):
    a, b = losses(a_path), losses(b_path)
    steps = sorted(set(a) & set(b))
    if not steps:
        sys.exit("no common steps")
    rel = [abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps]
    worst = max(range(len(steps)), key=rel.__getitem__)
    for s in steps[:: max(1, len(steps) // 10)]:
        print(f"step {s:6d}  {a[s]:.6f}  {b[s]:.6f}")
    print(f"{len(steps)} steps; max relative difference {rel[worst]:.2e} at step {steps[worst]}; "
          f"mean {sum(rel) / len(rel):.2e}; first/last loss {a[steps[0]]:.4f} -> {a[steps[-1]]:.4f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
