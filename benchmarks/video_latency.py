"""Text-to-video sampling latency per clip of several pipelines (e.g. an MHLA model and its softmax
counterpart), side by side in one run, per runtime.

    python -m benchmarks video_latency video-mhla video-sdpa --device cuda --runtimes eager,cuda-graphs \\
        --num-frames 32 --height 128 --width 128 --out benchmarks/results/video_latency.json
    python -m benchmarks video_latency video-mhla video-sdpa --num-frames 4 --height 32 --width 32 \\
        --steps 1 --rounds 1 --device cpu                         # a tiny CPU check

Per runtime, every pipeline samples one batch of ``--batch`` clips per round (text encoding and decoding
included, ``output_type="np"``); the first round is a warm-up (a compiled runtime compiles there) and is
not counted, and the pipelines' order is reversed every other round so that drift in the machine's speed
falls on all of them alike. Each call is timed by ``mediagen.eval.timing.measure`` (one repeat: CUDA
events after a synchronize on a GPU, the wall clock on a CPU). Reports per (pipeline, runtime) the median
seconds per call and per clip, peak memory (CUDA: ``torch.cuda.max_memory_allocated`` after a reset,
weights included; CPU: the peak resident set's growth during the call), the tokens per clip (the
transformer's token grid) and the attention; prints a markdown table last, with each pipeline's speed
against the first one. ``--out`` gets the same as JSON, written atomically; ``python -m benchmarks
record_model_latency OUT.json`` adds it to the sampling time the app's Benchmarks tab plots.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.common import markdown_table
from mediagen.eval.model_latency import write_atomic
from mediagen.eval.timing import measure
from mediagen.host_memory import keep_freed_memory

PROMPT = "the digit 3 moves left"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _rss_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of one call in MiB: CUDA's max_memory_allocated after a reset, or on a CPU the growth
    of the resident set's high-water mark (reset through /proc/self/clear_refs where Linux allows it)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.kind = "cuda max_memory_allocated" if self.cuda else "peak RSS growth"

    def start(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:  # "5" resets the peak RSS (VmHWM) to the current RSS
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        self.before = _rss_kib("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def stop(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        peak = _rss_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, peak - self.before) / 1024


def attention_name(folder: Path, transformer) -> str:
    """The card's "attention" when it names one, else the transformer config's layers: their one name, or
    the distinct names joined by "+" (a hybrid); plain softmax when the config names none."""
    try:
        card = json.loads((folder / "card.json").read_text())
        if isinstance(card.get("attention"), str):
            return card["attention"]
    except (OSError, ValueError):
        pass
    spec = getattr(transformer.config, "mediagen_attention", None) or {}
    layers = [layer or "sdpa" for layer in spec.get("layers") or []]
    names = list(dict.fromkeys(layers))
    return "+".join(names) if names else "sdpa"


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_args(argv=None):
    from mediagen.pipelines.runtime import RUNTIMES, check_runtime

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pipelines", nargs="+", help="pipeline folders or shipped names (video-mhla, video-sdpa)")
    p.add_argument("--num-frames", type=int, default=32)
    p.add_argument("--height", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--steps", type=int, default=8, help="the app's default")
    p.add_argument("--guidance", type=float, default=4.0, help="the app's default")
    p.add_argument("--batch", type=int, default=1, help="clips per call")
    p.add_argument("--runtimes", default="eager",
                   help=f"comma list of {', '.join(RUNTIMES)} (the pipelines' set_runtime); cuda-graphs, the "
                        "fastest, needs CUDA; a compiled runtime compiles in the warm-up round")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help=f"one of {', '.join(DTYPES)}; default bf16 on CUDA, fp32 elsewhere")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported) after one warm-up round")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)

    for name, value in (("--num-frames", args.num_frames), ("--height", args.height), ("--width", args.width),
                        ("--steps", args.steps), ("--batch", args.batch), ("--rounds", args.rounds)):
        if value < 1:
            p.error(f"{name}={value} is not allowed: use 1 or more")
    if not args.guidance >= 0:
        p.error(f"--guidance={args.guidance} is not allowed: use 0 or more")
    try:
        args.device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device={args.device!r} is not allowed: use a torch device such as cpu, cuda, cuda:1")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device={str(args.device)!r} is not allowed here: no CUDA device is available; use cpu")
    if args.dtype is None:
        args.dtype = "bf16" if args.device.type == "cuda" else "fp32"
    if args.dtype not in DTYPES:
        p.error(f"--dtype={args.dtype!r} is not allowed: use one of {', '.join(DTYPES)}")
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if not runtimes or len(set(runtimes)) != len(runtimes):
        p.error(f"--runtimes={args.runtimes!r} is not allowed: use a comma list of distinct names out of "
                f"{', '.join(RUNTIMES)}")
    for runtime in runtimes:
        try:
            check_runtime(runtime, args.device)
        except ValueError as err:
            p.error(f"--runtimes: {err}")
    args.runtimes = runtimes

    from mediagen.pipelines.shipping import checkpoints_dir

    folders = []
    for name in args.pipelines:
        folder = Path(name) if Path(name).is_dir() else checkpoints_dir() / name
        if not (folder / "model_index.json").is_file():
            p.error(f"pipelines: {name!r} is not allowed: use a pipeline folder (with model_index.json) or a "
                    f"shipped name in {checkpoints_dir()}")
        folders.append(folder)
    labels = [f.name for f in folders]
    if len(set(labels)) != len(labels):
        labels = [str(f) for f in folders]
    if len(set(labels)) != len(labels):
        p.error(f"pipelines={args.pipelines} is not allowed: name each pipeline once")
    args.folders = dict(zip(labels, folders))
    return p, args


def main(argv=None) -> int:
    from mediagen.pipelines import TextToVideoPipeline, build_pipeline
    from mediagen.pipelines.building import token_grid

    p, args = parse_args(argv)
    commit = git_commit()  # the code that runs: read before the (long) timing, while the tree may move on
    keep_freed_memory()  # as the console script runs the app and `mediagen generate` (mediagen/host_memory.py)
    device, dtype = args.device, DTYPES[args.dtype]

    pipes, info = {}, {}
    for label, folder in args.folders.items():
        pipe = build_pipeline(str(folder), device=device, dtype=dtype)
        if not isinstance(pipe, TextToVideoPipeline):
            p.error(f"pipelines: {str(folder)!r} is not allowed: it holds a {type(pipe).__name__}, not a "
                    f"TextToVideoPipeline")
        try:
            grid = token_grid(pipe, args.height, args.width, args.num_frames)
        except ValueError as err:   # names height / width / num_frames, the value and what is allowed
            p.error(f"{label}: {err}")
        pipe.set_progress_bar_config(disable=True)
        pipes[label] = pipe
        info[label] = {"folder": str(folder), "attention": attention_name(folder, pipe.transformer),
                       "token_grid": list(grid), "tokens_per_clip": int(torch.tensor(grid).prod()),
                       "patch_size": list(pipe.transformer.config.patch_size),
                       "parameters": sum(t.numel() for t in pipe.transformer.parameters())}

    memory = PeakMemory(device)
    prompt = [PROMPT] * args.batch
    seconds = {(n, r): [] for r in args.runtimes for n in pipes}
    peaks = {(n, r): [] for r in args.runtimes for n in pipes}
    for runtime in args.runtimes:
        for pipe in pipes.values():
            pipe.set_runtime(runtime)
        for rnd in range(args.rounds + 1):   # round 0: warm-up (and compilation), not counted
            order = list(pipes.items()) if rnd % 2 == 0 else list(reversed(pipes.items()))
            for label, pipe in order:
                def sample(pipe=pipe, seed=rnd):
                    with torch.no_grad():
                        pipe(prompt=prompt, num_frames=args.num_frames, height=args.height, width=args.width,
                             num_inference_steps=args.steps, guidance_scale=args.guidance,
                             generator=torch.Generator("cpu").manual_seed(seed), output_type="np")

                memory.start()
                # one call per round: the rounds interleave the pipelines (order reversed every other round)
                elapsed = measure(sample, device, warmup=0, repeats=1).median_ms / 1e3
                peak = memory.stop()
                if rnd > 0:
                    seconds[label, runtime].append(elapsed)
                    peaks[label, runtime].append(peak)
            if rnd == 0:
                print(f"{runtime}: warm-up round done", flush=True)

    first = next(iter(pipes))
    results = []
    for runtime in args.runtimes:
        base = statistics.median(seconds[first, runtime])
        for label in pipes:
            times = seconds[label, runtime]
            med = statistics.median(times)
            results.append({"pipeline": label, "runtime": runtime, **info[label],
                            "median_s_per_call": med, "median_s_per_clip": med / args.batch,
                            "min_s_per_call": min(times), "max_s_per_call": max(times), "times_s": times,
                            "peak_mem_mib": max(peaks[label, runtime]),
                            "speedup_vs_first": base / med, "first": first})
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else
            f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
            "dtype": args.dtype, "num_frames": args.num_frames, "height": args.height, "width": args.width,
            "steps": args.steps, "guidance": args.guidance, "batch": args.batch, "rounds": args.rounds,
            "warmup_rounds": 1, "runtimes": args.runtimes, "prompt": PROMPT, "peak_mem_kind": memory.kind,
            "torch": torch.__version__, "commit": commit,
            "command": "python -m benchmarks video_latency " + shlex.join(sys.argv[1:] if argv is None else argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if args.out:
        write_atomic(Path(args.out), json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
        print(f"wrote {args.out}")

    print(f"\n{meta['device']}, {args.dtype}, {args.batch} x {args.num_frames} frames of {args.height}x{args.width}, "
          f"{args.steps} steps, guidance {args.guidance}, median of {args.rounds} rounds after 1 warm-up; "
          f"memory: {memory.kind}; speed: {first}'s time / the pipeline's, same runtime")
    print(markdown_table(
        ["pipeline", "attention", "runtime", "tokens/clip", "s/call", "s/clip", "peak MiB", f"speed vs {first}"],
        [[r["pipeline"], r["attention"], r["runtime"], r["tokens_per_clip"], f"{r['median_s_per_call']:.3f}",
          f"{r['median_s_per_clip']:.3f}", f"{r['peak_mem_mib']:.1f}", f"{r['speedup_vs_first']:.2f}x"]
         for r in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
