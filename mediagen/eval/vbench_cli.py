"""``mediagen vbench``: VBench-style scores of generated videos (a folder, or sampled from a
checkpoint, one video per prompt); prints a table and writes JSON (and the table as markdown)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from .json_report import write_json_report


def register(sub):
    p = sub.add_parser("vbench", help="VBench-style quality and Moving-MNIST semantic scores of videos")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--videos", help="folder of videos (mp4, gif, webm, npy, ...)")
    src.add_argument("--checkpoint", help="a saved text-to-video pipeline folder (needs mediagen.pipelines)")
    p.add_argument("--prompts", default=None,
                   help="prompt file: one prompt per line, or JSON (a list, or {video file name: prompt}). "
                        "Videos named '<prompt>-<i>.mp4' (VBench's naming) are matched by name, others in "
                        "sorted order. Required with --checkpoint")
    p.add_argument("--subject-features", default="effnet-lite0",
                   help="frame features for subject consistency: effnet-lite0, mnist, inception or pixels")
    p.add_argument("--background-features", default="effnet-lite0",
                   help="frame features for background consistency (same choices)")
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
    p.add_argument("--text-encoder", default=None,
                   help="condition through this text encoder instead of the pipeline's (checkpoint only): "
                        "'minilm', 'minilm-mlra2', 'minilm-hla' or a saved encoder folder")
    p.add_argument("--save-format", default="mp4", choices=["mp4", "gif", "npy"],
                   help="file format of --save-videos (npy needs no video codec)")
    p.add_argument("--save-videos", default=None, help="write sampled videos here (checkpoint only)")
    p.add_argument("--out", default=os.path.join("outputs", "vbench.json"), help="JSON file for the results")
    p.add_argument("--table", default=None, help="also write the markdown table here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


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


def run(args) -> int:
    from .frame_features import get_frame_extractor
    from .vbench import evaluate_videos
    from .vbench_score import markdown_table
    from .video_io import list_videos, read_video

    prompts = read_prompts(args.prompts) if args.prompts else None
    subject_fx = get_frame_extractor(args.subject_features, args.device, args.inception_weights)
    background_fx = (subject_fx if args.background_features == args.subject_features
                     else get_frame_extractor(args.background_features, args.device, args.inception_weights))
    if args.videos:
        files = list_videos(args.videos)
        video_prompts = match_prompts(files, prompts)
        videos = [read_video(f) for f in files]
        names = [f.name for f in files]
    else:
        if not prompts:
            raise ValueError("--checkpoint needs --prompts FILE (one video is sampled per prompt)")
        if args.batch_size < 1:
            raise ValueError(f"--batch-size={args.batch_size} must be >= 1")
        from .sampling import sample_videos

        video_prompts = list(prompts.values()) if isinstance(prompts, dict) else list(prompts)
        videos = sample_videos(args.checkpoint, video_prompts, args.seed, args.device, progress=not args.quiet,
                               num_inference_steps=args.steps, guidance_scale=args.guidance,
                               height=args.height, width=args.width, num_frames=args.num_frames,
                               batch_size=args.batch_size, text_encoder=args.text_encoder)
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
    table = markdown_table(report)
    print(table)
    if args.table:
        Path(args.table).write_text(table + "\n")
    if args.out:
        write_json_report(args.out, report)
    return 0
