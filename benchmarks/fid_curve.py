"""FID (and KID) of a training run's saved checkpoints, step by step: how fast each run approaches
a target. Used for the conversion experiment of docs/RESULTS.md: a softmax checkpoint converted to
MHLA and fine-tuned, against MHLA trained from scratch, against the softmax teacher's FID.

    python -m benchmarks fid_curve --run runs/convert-dit-mnist-mhla --run runs/dit-mnist-mhla \
        --teacher runs/dit-mnist-sdpa/pipeline-step-6000 --steps 250,500,1000 --num-samples 2000 \
        --out runs/eval/fid-curve.json

Every checkpoint is exported with its EMA weights (``mediagen.training.export.export_checkpoint``)
and sampled with the same seeds; the reference is the 10,000 shipped MNIST digits.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from mediagen.eval.features import get_extractor
from mediagen.eval.fid import extract_features, fid_from_features, kernel_distance
from mediagen.eval.reference import load_reference
from mediagen.eval.sampling import sample_images
from mediagen.training import load_config
from mediagen.training.checkpoint import list_checkpoints
from mediagen.training.export import export_checkpoint


def score(folder, ref, extractor, args) -> dict:
    images = sample_images(folder, args.num_samples, args.batch_size, args.seed, args.device, progress=False,
                           num_inference_steps=args.sample_steps, guidance_scale=args.guidance)
    feats = extract_features(images, extractor, args.batch_size, progress=False)
    return {"fid": fid_from_features(feats, ref.mu, ref.sigma, extractor.name),
            "kid": kernel_distance(feats, ref.feats, 10, min(1000, len(feats)), seed=args.seed)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="a training output_dir (repeatable)")
    p.add_argument("--teacher", default=None, help="a pipeline folder scored once, as the target")
    p.add_argument("--steps", default=None, help="comma-separated steps (default: every saved checkpoint)")
    p.add_argument("--max-step", type=int, default=None, help="skip checkpoints after this step")
    p.add_argument("--features", default="mnist")
    p.add_argument("--num-samples", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--sample-steps", type=int, default=30)
    p.add_argument("--guidance", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", required=True, help="JSON file for the curve")
    args = p.parse_args()

    extractor = get_extractor(args.features, args.device)
    ref = load_reference("mnist", extractor, args.batch_size, progress=False)
    wanted = {int(s) for s in args.steps.split(",")} if args.steps else None
    result = {"features": args.features, "num_samples": args.num_samples, "sample_steps": args.sample_steps,
              "guidance": args.guidance, "runs": {}}
    if args.teacher:
        result["teacher"] = dict(score(args.teacher, ref, extractor, args), folder=args.teacher)
        print(f"teacher {args.teacher}: FID {result['teacher']['fid']:.3f}", flush=True)
    for run in args.run:
        cfg = load_config(Path(run) / "config.yaml")
        curve = []
        for step, _ in list_checkpoints(run):
            if (wanted is not None and step not in wanted) or (args.max_step and step > args.max_step):
                continue
            t0 = time.perf_counter()  # one export + scoring per checkpoint, reported once: not measure's repeats
            with tempfile.TemporaryDirectory() as tmp:
                folder = export_checkpoint(cfg, str(step), Path(tmp) / "pipe")
                row = dict(step=step, **score(folder, ref, extractor, args))
            row["seconds"] = round(time.perf_counter() - t0, 1)
            curve.append(row)
            print(f"{run} step {step}: FID {row['fid']:.3f} KID {row['kid']:.5f} ({row['seconds']} s)", flush=True)
        result["runs"][run] = curve
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
