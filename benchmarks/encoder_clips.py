"""Clips through each text encoder, drawn as the app's Video tab draws them, scored against their prompts.

    python -m benchmarks encoder_clips [--wording template|held-out] [--seeds 0] [--attention mhla] [--out FILE]

For each text encoder the app knows (MiniLM and the distilled ones, ``catalog.text_encoders``, offered or
not): the shipped video model of ``--attention`` draws one clip per prompt and seed through
``mediagen.app.generation.text_samples`` (the app's noise, size, 8 steps, guidance 4), the prompts read by
that encoder as the app reads them, as written (the app's rewriting to the caption template is not
applied, so that ``--wording held-out`` measures the encoder on wordings the video model never saw). The
prompts: 10 digits x 4 directions, in the template ("the digit 3 moves left") or in the held-out wordings
(``wordings.held_out_caption``, rotating through them). Scored by ``mediagen.eval.moving_mnist.score_clips``
(calibration rows: docs/RESULTS.md). Prints a markdown table with each encoder's rates and its digit rate
against MiniLM's on the same clips; ``--out`` gets the per-clip verdicts as JSON (written atomically), and
the rows are what an encoder card's ``vs_minilm`` holds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.common import markdown_table

def prompts_for(wording: str) -> list[str]:
    """The scored grid's prompts (``video_samples.grid_prompts``), or each cell in a held-out wording."""
    from benchmarks.video_samples import grid_prompts
    from mediagen.eval.moving_mnist import parse_prompt
    from mediagen.training.data.wordings import held_out_caption

    grid = grid_prompts()
    if wording == "template":
        return grid
    cells = [parse_prompt(g) for g in grid]
    return [held_out_caption(c.digits, [c.direction], i) for i, c in enumerate(cells)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wording", default="template", choices=["template", "held-out"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--attention", default="mhla", help="which shipped video model draws (video-<attention>)")
    p.add_argument("--encoders", nargs="*", default=None, help="encoder labels (default: every one the app knows)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from diffusers.utils import logging as diffusers_logging

    from mediagen.app.generation import text_samples
    from mediagen.app.models import ModelCache, default_models
    from mediagen.eval.model_latency import write_atomic
    from mediagen.eval.moving_mnist import score_clips

    diffusers_logging.disable_progress_bar()                           # 8 steps a clip, hundreds of clips
    models = default_models()
    cache = ModelCache(models, device=args.device)
    labels = args.encoders or list(models.text_encoders)
    unknown = [label for label in labels if label not in models.text_encoders]
    if unknown:
        p.error(f"--encoders {unknown} are not allowed: choose from {list(models.text_encoders)}")
    frames, height, width = (models.video.size[k] for k in ("frames", "height", "width"))
    prompts = prompts_for(args.wording)
    report = {"wording": args.wording, "seeds": args.seeds, "model": f"video-{args.attention}", "steps": 8,
              "guidance": 4.0, "size": [frames, height, width], "device": args.device,
              "date": datetime.date.today().isoformat(),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(), "encoders": {}}
    for label in labels:
        t0 = time.perf_counter()  # the wall time of one encoder's clips, logged once, not a latency measure
        clips, asked = [], []
        for seed in args.seeds:
            for prompt in prompts:
                out = text_samples(cache, args.attention, label, prompt, None, batch=1, seed=seed, steps=8,
                                   guidance=4.0, height=height, width=width, frames=frames)
                clips.append(out.samples[0])
                asked.append(prompt)
        verdicts = score_clips(np.stack(clips), asked)
        rate = {k: float(np.mean([bool(v[f"{k}_ok"]) for v in verdicts])) for k in ("digit", "direction", "both")}
        report["encoders"][label] = {**rate, "clips": len(clips), "wall_s": round(time.perf_counter() - t0, 1),
                                     "verdicts": [{"prompt": a, "read": v["read"], "moved": v["moved"],
                                                   "digit_ok": bool(v["digit_ok"]), "both_ok": bool(v["both_ok"])}
                                                  for a, v in zip(asked, verdicts)]}
        print(f"{label}: digit {rate['digit']:.3f}, direction {rate['direction']:.3f}, both {rate['both']:.3f} "
              f"({len(clips)} clips, {time.perf_counter() - t0:.0f} s)", flush=True)
    base = next((r for label, r in report["encoders"].items() if models.text_encoders[label] == "minilm"), None)
    rows = [[label, f"{r['digit']:.3f} / {r['direction']:.3f} / {r['both']:.3f}",
             "" if base is None else f"{100 * (r['digit'] - base['digit']):+.1f}", r["clips"]]
            for label, r in report["encoders"].items()]
    print(markdown_table(["encoder", "digit / direction / both", "digit vs MiniLM, points", "clips"], rows))
    if args.out:
        write_atomic(Path(args.out), json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
