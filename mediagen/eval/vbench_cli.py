"""``mediagen vbench``: VBench-style scores of generated videos (a folder, an .npz of clips, or sampled
from a checkpoint, one video per prompt); prints a table and writes JSON (and the table as markdown).

The Moving-MNIST semantic verdicts (``digit_ok`` / ``direction_ok`` / ``both_ok`` per video) and their
rates come with every video whose prompt names digits; ``--calibrate`` adds the scorer's calibration
rows (one digit: real / static / stops halfway / leaves the canvas / noise / blank clips of the data
generator; two digits: real / static / directions swapped / one digit drawn / noise / blank) to the same
table and JSON, at the size of the videos scored (``--calibrate-size``), so a model's rates are read
against what the measure gives on clips of that size whose answer is known.

A file of ``--videos`` that cannot be read (a cut or corrupt file, whose header may still read) stops the
command with one line naming it; ``--bad-videos skip`` scores the others and lists it in the JSON under
``skipped_videos``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch

from ..pipelines.generate_cli import DTYPES, sampling_dtype
from .frame_features import DEFAULT_BACKGROUND_FEATURES, DEFAULT_SUBJECT_FEATURES
from .json_report import write_json_report


def register(sub):
    p = sub.add_parser("vbench", help="VBench-style quality and Moving-MNIST semantic scores of videos")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--videos", help="folder of videos (mp4, gif, webm, npy, ...), or an .npz file with arrays "
                                      "'videos' (uint8, N x F x H x W or N x F x H x W x C) and 'prompts' (strings)")
    src.add_argument("--checkpoint", help="a shipped text-to-video checkpoint's name (video-mhla, video-sdpa) or a saved "
                                         "text-to-video pipeline folder")
    p.add_argument("--prompts", default=None,
                   help="prompt file: one prompt per line, or JSON (a list, or {video file name: prompt}). "
                        "Videos named '<prompt>-<i>.mp4' (VBench's naming) are matched by name, others in "
                        "sorted order. Required with --checkpoint; with an .npz it replaces the file's prompts")
    p.add_argument("--subject-features", default=DEFAULT_SUBJECT_FEATURES,
                   help="frame features for subject consistency: digit-crop (default: the digit classifier on "
                        "a box around the ink), mnist, effnet-lite0, inception or pixels")
    p.add_argument("--background-features", default=DEFAULT_BACKGROUND_FEATURES,
                   help="frame features for background consistency (same choices; default effnet-lite0). "
                        "Use different features for the two: the same ones count one score twice in Quality")
    p.add_argument("--calibrate", action="store_true",
                   help="also score the calibration clips (from the Moving-MNIST data generator: real clips and "
                        "static / stopping / leaving / noise / blank ones, for one and two digits) and report their "
                        "rates beside the videos'; alone, without --videos or --checkpoint, only the calibration runs")
    p.add_argument("--calibrate-per-cell", type=int, default=3,
                   help="calibration clips per digit x direction cell (default 3: 120 clips per row)")
    p.add_argument("--calibrate-size", default="auto",
                   help="clip sizes of the calibration rows, FRAMESxSIDE (square canvas), several joined by commas "
                        "(e.g. 16x64,32x128); auto (default): every square size of the videos scored, else 16x64 "
                        "(the shipped models' size)")
    p.add_argument("--calibrate-digits", default="1,2",
                   help="digit counts of the calibration rows: 1, 2 or 1,2 (default)")
    p.add_argument("--calibrate-seed", type=int, default=0, help="data generator seed of the calibration clips")
    p.add_argument("--inception-weights", default=None, help="local path of inception-2015-12-05.pt")
    p.add_argument("--fps", type=float, default=None,
                   help="frame rate of the videos (dynamic degree subsamples to ~8 fps when known)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="sampling steps (checkpoint only)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (checkpoint only)")
    p.add_argument("--height", type=int, default=None, help="video height (checkpoint only; pipeline default)")
    p.add_argument("--width", type=int, default=None, help="video width (checkpoint only; pipeline default)")
    p.add_argument("--num-frames", type=int, default=None, help="frames per video (checkpoint only)")
    p.add_argument("--batch-size", type=int, default=1, help="videos sampled per pipeline call (checkpoint only)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="sampling precision (checkpoint only; default: bf16 on cuda, fp32 on cpu, as mediagen "
                        "generate); the report records it under 'sampling_dtype'")
    p.add_argument("--rewrite-prompt", action=argparse.BooleanOptionalAction, default=None,
                   help="render each prompt in the model's caption template before sampling, as a user gets it "
                        "(checkpoint only; default: as the pipeline's config says, on for the shipped video "
                        "models); --no-rewrite-prompt measures the model on the prompts as written. Clips are "
                        "scored against the prompts as written either way")
    p.add_argument("--text-encoder", default=None,
                   help="condition through this text encoder instead of the pipeline's (checkpoint only): "
                        "'minilm', 'minilm-mlra2', 'minilm-hla' or a saved encoder folder")
    p.add_argument("--bad-videos", default="stop", choices=["stop", "skip"],
                   help="a file of --videos that cannot be read or decoded (a cut or corrupt file): stop with one "
                        "line naming it (default), or skip it: the others are scored and the report lists it under "
                        "'skipped_videos'")
    p.add_argument("--save-format", default="mp4", choices=["mp4", "gif", "npy"],
                   help="file format of --save-videos (npy needs no video codec)")
    p.add_argument("--save-videos", default=None, help="write sampled videos here (checkpoint only)")
    p.add_argument("--out", default=os.path.join("outputs", "vbench.json"), help="JSON file for the results")
    p.add_argument("--table", default=None, help="also write the markdown table here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def parse_calibrate_sizes(text: str) -> list[tuple[int, int]] | None:
    """--calibrate-size: None for auto, else [(frames, side), ...] the generator can draw."""
    from .moving_mnist import calibration_size_problem

    if text.strip() == "auto":
        return None
    sizes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) == 3 and parts[1] == parts[2]:
            parts = parts[:2]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"--calibrate-size {text!r} is not allowed: use auto or FRAMESxSIDE sizes of a square "
                             "canvas joined by commas, e.g. 16x64,32x128")
        frames, side = int(parts[0]), int(parts[1])
        problem = calibration_size_problem(frames, side)
        if problem:
            raise ValueError(f"--calibrate-size {item.strip()} is not allowed: {problem}")
        sizes.append((frames, side))
    return sizes


def parse_calibrate_digits(text: str) -> set[int]:
    try:
        digits = {int(x) for x in text.split(",")}
    except ValueError:
        digits = set()
    if not digits or not digits <= {1, 2}:
        raise ValueError(f"--calibrate-digits {text!r} is not allowed: use 1, 2 or 1,2")
    return digits


def read_prompts(path):
    """A list of prompts, or a {file name: prompt} dict for JSON mappings."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompts {path} does not exist")
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) or (isinstance(data, list) and all(isinstance(x, str) for x in data)):
            return data
        raise ValueError(f"--prompts {path}: JSON must be a list of prompts or a {{file name: prompt}} object")
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    prompts = [ln for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise ValueError(f"--prompts {path} holds no prompts")
    return prompts


def match_prompts(files, prompts):
    """The prompt of each video file (None everywhere when no prompts are given)."""
    if prompts is None:
        return [None] * len(files)
    if isinstance(prompts, dict):
        missing = [f.name for f in files if f.name not in prompts]
        if missing:
            raise ValueError(f"--prompts maps no prompt to {missing[:5]}")
        return [prompts[f.name] for f in files]
    by_name = {p.lower(): p for p in prompts}
    named = [by_name.get(re.sub(r"-\d+$", "", f.stem).lower()) or by_name.get(f.stem.lower()) for f in files]
    if all(named):
        return named
    if len(files) == len(prompts):
        return list(prompts)
    raise ValueError(f"cannot match {len(files)} videos to {len(prompts)} prompts: name the videos "
                     "'<prompt>-<i>.<ext>', give as many prompts as videos, or a JSON {file name: prompt}")


def read_npz_videos(path):
    """(videos as uint8 RGB arrays, prompts or None) of an .npz holding 'videos' (N, F, H, W) or
    (N, F, H, W, C) uint8 and optionally 'prompts' (N strings)."""
    import numpy as np

    from .video_io import as_rgb_video

    import zipfile

    try:
        with np.load(path, allow_pickle=False) as data:
            if "videos" not in data:
                raise ValueError(f"--videos {path}: the .npz must hold an array 'videos'; it holds "
                                 f"{sorted(data.keys())}")
            videos = data["videos"]
            prompts = [str(p) for p in data["prompts"].reshape(-1)] if "prompts" in data else None
    except (OSError, EOFError, zipfile.BadZipFile) as err:  # a cut or overwritten file
        raise ValueError(f"--videos {path} cannot be read as an .npz of clips: {' '.join(str(err).split())}") from None
    if videos.dtype != np.uint8 or videos.ndim not in (4, 5):
        raise ValueError(f"--videos {path}: 'videos' must be uint8 (N, F, H, W) or (N, F, H, W, C); "
                         f"got {videos.dtype} {tuple(videos.shape)}")
    if prompts is not None and len(prompts) != len(videos):
        raise ValueError(f"--videos {path}: 'prompts' has {len(prompts)} entries for {len(videos)} videos")
    return [as_rgb_video(v) for v in videos], prompts


def run(args) -> int:
    from .vbench_score import report_tables

    if not (args.videos or args.checkpoint or args.calibrate):
        raise ValueError("mediagen vbench needs --videos DIR|FILE.npz, --checkpoint PATH or --calibrate")
    if args.calibrate_per_cell < 1:
        raise ValueError(f"--calibrate-per-cell={args.calibrate_per_cell} is not allowed: use 1 or more")
    sizes = parse_calibrate_sizes(args.calibrate_size) if args.calibrate else None
    digits = parse_calibrate_digits(args.calibrate_digits) if args.calibrate else None
    prompts = read_prompts(args.prompts) if args.prompts else None
    report = {}
    if args.videos or args.checkpoint:
        report = score_videos(args, prompts)
    if args.calibrate:
        from .moving_mnist import calibration_rows, calibration_sizes

        if sizes is None:
            sizes = calibration_sizes(report.get("video_sizes", []))
        report["calibration"] = [row for frames, side in sizes
                                 for row in calibration_rows(args.calibrate_per_cell, args.calibrate_seed, args.device,
                                                             two_digits=2 in digits, resolution=side,
                                                             num_frames=frames, one_digit=1 in digits)]
    table = report_tables(report)
    print(table)
    if args.table:
        Path(args.table).write_text(table + "\n")
    if args.out:
        write_json_report(args.out, report)
    return 0


def score_videos(args, prompts) -> dict:
    """The report of the videos of --videos (folder or .npz) or sampled from --checkpoint."""
    from .frame_features import get_frame_extractor
    from .vbench import evaluate_videos
    from .video_io import VideoReadError, list_videos, read_video

    subject_fx = get_frame_extractor(args.subject_features, args.device, args.inception_weights)
    background_fx = (subject_fx if args.background_features == args.subject_features
                     else get_frame_extractor(args.background_features, args.device, args.inception_weights))
    skipped = []
    if args.videos and Path(args.videos).is_file() and Path(args.videos).suffix.lower() == ".npz":
        videos, npz_prompts = read_npz_videos(args.videos)
        if prompts is not None:
            npz_prompts = list(prompts.values()) if isinstance(prompts, dict) else list(prompts)
        if npz_prompts is not None and len(npz_prompts) != len(videos):
            raise ValueError(f"--prompts gives {len(npz_prompts)} prompts for the {len(videos)} videos of "
                             f"{args.videos}: give one per video")
        video_prompts = npz_prompts or [None] * len(videos)
        names = [f"{Path(args.videos).name}[{i}]" for i in range(len(videos))]
    elif args.videos:
        files = list_videos(args.videos)
        video_prompts = match_prompts(files, prompts)
        videos, names, kept_prompts, skipped = [], [], [], []
        for f, prompt in zip(files, video_prompts):
            try:
                videos.append(read_video(f))
            except VideoReadError as err:
                if getattr(args, "bad_videos", "stop") != "skip":
                    raise VideoReadError(f"--videos: {err} (--bad-videos skip scores the other videos)") from None
                print(f"--bad-videos skip: leaving out {err}", file=sys.stderr)
                skipped.append({"video": f.name, "error": str(err)})
                continue
            names.append(f.name)
            kept_prompts.append(prompt)
        if not videos:
            raise ValueError(f"--videos {args.videos}: none of its {len(files)} videos can be read")
        video_prompts = kept_prompts
    else:
        if not prompts:
            raise ValueError("--checkpoint needs --prompts FILE (one video is sampled per prompt)")
        if args.batch_size < 1:
            raise ValueError(f"--batch-size={args.batch_size} must be >= 1")
        from .sampling import sample_videos

        video_prompts = list(prompts.values()) if isinstance(prompts, dict) else list(prompts)
        dtype = sampling_dtype(args.dtype, args.device)
        videos = sample_videos(args.checkpoint, video_prompts, args.seed, args.device, progress=not args.quiet,
                               dtype=dtype,
                               num_inference_steps=args.steps, guidance_scale=args.guidance,
                               height=args.height, width=args.width, num_frames=args.num_frames,
                               batch_size=args.batch_size, text_encoder=args.text_encoder,
                               rewrite_prompt=args.rewrite_prompt)
        names = [f"{p}-{i}.{args.save_format}" for i, p in enumerate(video_prompts)]
        if args.save_videos:
            from .video_io import write_video

            os.makedirs(args.save_videos, exist_ok=True)
            for name, v in zip(names, videos):
                write_video(v, os.path.join(args.save_videos, name))
    report = evaluate_videos(videos, video_prompts, subject_fx, background_fx, args.fps, args.device,
                             progress=not args.quiet)
    for name, prompt, entry in zip(names, video_prompts, report["per_video"]):
        entry["video"], entry["prompt"] = name, prompt
    report["frame_features"] = {"subject": subject_fx.name, "background": background_fx.name}
    if args.checkpoint:
        report["sampling_dtype"] = str(dtype).removeprefix("torch.")
    report["video_sizes"] = sorted({tuple(int(n) for n in v.shape[:3]) for v in videos})  # (frames, height, width)
    if skipped:
        report["skipped_videos"] = skipped
    return report
