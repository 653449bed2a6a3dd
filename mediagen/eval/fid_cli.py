"""``mediagen fid``: FID and KID of a checkpoint's samples (or of images already generated)
against a reference set, on the chosen features; prints the scores and writes JSON."""

from __future__ import annotations

import os
import time

import torch

from .features import FEATURE_DIMS, FEATURES
from .json_report import write_json_report


def register(sub):
    p = sub.add_parser("fid", help="FID and KID of a checkpoint's samples against a reference set")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a saved pipeline folder to sample from (needs mediagen.pipelines)")
    src.add_argument("--samples", help="already generated images: a folder of image files or an .npz/.npy (uint8)")
    p.add_argument("--reference", default="mnist",
                   help="'mnist' (the 2,000 held-out real digits, digits 8000-9999 of the shipped set, which no "
                        "digit model trains on), 'mnist-train' (the 8,000 training digits), 'mnist-all' (all "
                        "10,000; needed for --features inception), a folder / .npz of images, or a statistics "
                        ".npz written by --save-reference-stats (default: mnist). The JSON records which set "
                        "was used under reference_set")
    p.add_argument("--features", choices=sorted(FEATURES), default=None,
                   help="feature network: mnist (128-d, digits), effnet-lite0 (1280-d ImageNet CNN), inception "
                        "(clean-fid's 2048-d Inception-v3; needs its weights file). FID needs more samples than "
                        "feature dimensions: at least 129, 1281 and 2049 respectively. Default: mnist for the "
                        "digit references, the features a statistics file was made with, else effnet-lite0")
    p.add_argument("--num-samples", type=int, default=None,
                   help="samples to score (default: all of --samples; 1000 from a checkpoint); more than the "
                        "feature dimension (--features)")
    p.add_argument("--inception-weights", default=None, help="local path of inception-2015-12-05.pt")
    p.add_argument("--reference-num", type=int, default=None, help="use only the first N reference images")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prompts", default=None, help="prompt file (one per line) for text-to-image checkpoints")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (pipeline default when omitted)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (pipeline default when omitted)")
    p.add_argument("--splits", type=int, default=None,
                   help="also score this many disjoint equal parts of the samples (FID per part, mean and spread): "
                        "how much the estimate moves at that sample size")
    p.add_argument("--kid-subsets", type=int, default=100)
    p.add_argument("--kid-subset-size", type=int, default=1000)
    p.add_argument("--save-samples", default=None, help="also write the sampled images as PNG files into this folder, or into one .npz (uint8, key images)")
    p.add_argument("--save-reference-stats", default=None, help="write the reference statistics to this .npz")
    p.add_argument("--out", default=os.path.join("outputs", "fid.json"), help="JSON file for the results")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _positive(name, value):
    if value is not None and value < 1:
        raise ValueError(f"{name}={value} is not allowed: it must be a positive integer")


def run(args) -> int:
    import numpy as np

    from .fid import extract_features, fid_from_features, kernel_distance, split_fids
    from .features import get_extractor
    from .reference import check_reference_count, check_reference_spec, load_reference, save_reference_stats

    for name in ("num_samples", "batch_size", "reference_num", "kid_subsets", "kid_subset_size"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.splits is not None and args.splits < 2:
        raise ValueError(f"--splits={args.splits} is not allowed: use 2 or more disjoint parts")
    check_reference_spec(args.reference)
    features = args.features or default_features(args.reference)
    progress = not args.quiet
    t0 = time.perf_counter()

    # Cheap checks first: nothing is sampled or embedded when the run cannot give a valid FID.
    dim = FEATURE_DIMS[features]
    if args.num_samples is not None:
        _check_counts(args.num_samples, dim, args.splits, features, "--num-samples")
    check_reference_count(args.reference, dim, features, args.reference_num)
    extractor = get_extractor(features, args.device, args.inception_weights)

    if args.samples:
        from .image_io import load_images

        images = load_images(args.samples, args.num_samples)
        source = args.samples
    else:
        from .sampling import sample_images

        prompts = _read_lines(args.prompts) if args.prompts else None
        n = args.num_samples or 1000
        _check_counts(n, dim, args.splits, features, "--num-samples")
        images = sample_images(args.checkpoint, n, args.batch_size, args.seed, args.device, prompts=prompts,
                               progress=progress, num_inference_steps=args.steps, guidance_scale=args.guidance)
        source = args.checkpoint
        if args.save_samples:
            from .image_io import save_images

            save_images(images, args.save_samples)
    _check_counts(len(images), dim, args.splits, features, "--num-samples" if args.num_samples else "--samples")

    ref = load_reference(args.reference, extractor, args.batch_size, args.reference_num, progress)
    if args.save_reference_stats:
        save_reference_stats(ref, args.save_reference_stats)
    feats = extract_features(images, extractor, args.batch_size, progress, desc=f"samples {features}")
    fid = fid_from_features(feats, ref.mu, ref.sigma, features)
    kid = None
    if ref.feats is not None:
        kid = kernel_distance(feats, ref.feats, args.kid_subsets, args.kid_subset_size, seed=args.seed)
    result = {"fid": fid, "kid": kid, "features": features, "feature_dim": dim, "num_samples": len(feats),
              "num_reference": ref.n, "samples": str(source), "reference": str(args.reference),
              "reference_set": ref.reference_set,
              "seconds": round(time.perf_counter() - t0, 2)}
    if args.splits:
        parts = split_fids(feats, ref.mu, ref.sigma, args.splits, features)
        result.update(split_fids=parts, split_size=len(feats) // args.splits)
    print(f"FID ({features}, {len(feats)} samples vs {ref.n} reference, {ref.reference_set}): {fid:.4f}")
    if args.splits:
        print(f"FID of {args.splits} disjoint parts of {len(feats) // args.splits}: "
              + ", ".join(f"{x:.4f}" for x in parts)
              + f" (mean {np.mean(parts):.4f}, standard deviation {np.std(parts, ddof=1):.4f})")
    print("KID: " + (f"{kid:.6f}" if kid is not None else "n/a (reference statistics hold no features)"))
    if args.out:
        write_json_report(args.out, result)
    return 0


def _check_counts(n: int, dim: int, splits, features: str, flag: str) -> None:
    """Enough samples for a full-rank FID, overall and in each of ``splits`` parts (checked before any work).
    ``flag`` is what sets ``n`` (--num-samples, or --samples when all of them are scored): the error names it."""
    from .fid import check_enough_samples

    if flag == "--samples":
        fix = f"--samples holds {n} images: give {dim + 1} or more"
    else:
        fix = f"{flag}={n} is too few: use {flag} {dim + 1} or more"
    check_enough_samples(n, dim, "samples", features, fix)
    if splits:
        need = (dim + 1) * splits
        check_enough_samples(n // splits, dim, "samples per split", features,
                             f"--splits={splits} leaves {n // splits} samples per split: use fewer --splits or "
                             f"{need} or more samples")


def default_features(reference: str) -> str:
    """mnist for the digit references, the features a statistics file was made with, else effnet-lite0."""
    from .reference import MNIST_REFERENCES

    if reference in MNIST_REFERENCES:
        return "mnist"
    if reference.endswith(".npz") and os.path.isfile(reference):
        import numpy as np

        with np.load(reference, allow_pickle=False) as data:
            if "features" in data and str(data["features"]) in FEATURES:
                return str(data["features"])
    return "effnet-lite0"


def _read_lines(path):
    with open(path) as fh:
        lines = [ln.strip() for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"--prompts {path} holds no prompts")
    return lines
