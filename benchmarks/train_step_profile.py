"""Where a training step's time goes: torch.profiler over a few steps of a YAML config's run, the kernels
summed into attention, matmuls (projections, feed-forward), norms, optimizer and the rest, beside the
steps' wall time; wall time less kernel time is what the GPU spent waiting on the host.

    python -m benchmarks train_step_profile configs/train/wan2.1-1.3b-mhla-finetune.yaml KEY=VALUE ... \\
        --warmup 2 --steps 3 --out profile-mhla.json

The run is the trainer's own (``mediagen.training.trainer.train``, its YAML and overrides); the profiler
starts after ``--warmup`` optimizer steps (compilation, cuDNN plans, the allocator's growth) and covers
the next ``--steps``. On a GPU the kernels are CUDA kernels by name; on a CPU the aten operators, so the
same groups apply. A kernel counts in the first group whose pattern its name matches (``GROUPS``).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

# first match wins; attention before matmuls (cuDNN's and flash attention's kernels carry sm90 / gemm-like
# names), norms before the rest (a fused RMSNorm is one kernel; an unfused one falls into "other")
GROUPS = (
    ("optimizer", r"adam|multi_tensor|foreach"),   # first: multi_tensor_apply_kernel is not MHLA's apply_kernel
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|attention|mhla|summary_kernel|apply_kernel|query_grad"
                  r"|key_grad|mix_kernel|mix_grad|part_sum|dense_forward|dense_query|dense_key|cpe_add"),
    ("norms", r"norm|rowwisemoments|rsqrt"),    # rsqrt: inductor's fused norms (triton_red_fused_..._rsqrt_0)
    ("matmuls", r"gemm|xmma|cutlass|wgmma|cublas|nvjet|sm90_|sm80_|aten::mm\b|aten::addmm|aten::bmm|aten::linear"
                r"|matmul"),
)


def group_of(name: str) -> str:
    low = name.lower()
    for group, pattern in GROUPS:
        if re.search(pattern, low):
            return group
    return "other"


def kernel_times(prof, cuda: bool) -> dict[str, float]:
    """Self time in ms of each kernel (GPU) or leaf operator (CPU) the profiler saw, by name."""
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        if cuda:
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = getattr(evt, "self_device_time_total", None)
            us = evt.self_cuda_time_total if us is None else us
        else:
            us = evt.self_cpu_time_total
        if us > 0:
            out[evt.key] = out.get(evt.key, 0.0) + us / 1e3
    return out


def summarize(kernels: dict[str, float], wall_ms: float, steps: int) -> dict:
    groups: dict[str, float] = {g: 0.0 for g, _ in GROUPS} | {"other": 0.0}
    for name, ms in kernels.items():
        groups[group_of(name)] += ms
    busy = sum(groups.values())
    per_step = {g: round(ms / steps, 3) for g, ms in groups.items()}
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    return {"steps": steps, "wall_ms_per_step": round(wall_ms / steps, 3),
            "kernel_ms_per_step": round(busy / steps, 3), "ms_per_step": per_step,
            "host_wait_ms_per_step": round(max(wall_ms - busy, 0.0) / steps, 3),
            "top_kernels_ms_per_step": [[n[:120], round(ms / steps, 3)] for n, ms in top]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="the run's YAML (- for none: the overrides alone)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE, as `mediagen train` takes them")
    ap.add_argument("--warmup", type=int, default=2, help="optimizer steps before the profiler starts")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps profiled")
    ap.add_argument("--out", default=None, help="write the summary here as JSON")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error(f"--warmup={args.warmup} is not allowed: use an int >= 0")
    if args.steps < 1:
        ap.error(f"--steps={args.steps} is not allowed: use an int >= 1")

    from mediagen.training import load_config
    from mediagen.training.trainer import train

    last = args.warmup + args.steps
    cfg = load_config(None if args.config == "-" else args.config, [*args.overrides, f"train.max_steps={last}"])
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(activities=activities)
    clock = {}

    def on_step_end(step, loss):   # the trainer has read the loss (.item()), so the step's kernels are done
        if cuda:
            torch.cuda.synchronize()
        if step == args.warmup:
            prof.start()
            clock["start"] = time.perf_counter()
        elif step == last:
            clock["end"] = time.perf_counter()
            prof.stop()

    if args.warmup == 0:
        prof.start()
        clock["start"] = time.perf_counter()
    train(cfg, on_step_end=on_step_end)
    if "end" not in clock:
        raise SystemExit(f"the run stopped before step {last} (a time limit, or a resumed run "
                         "already past it): profile a fresh output_dir")
    summary = summarize(kernel_times(prof, cuda), (clock["end"] - clock["start"]) * 1e3, args.steps)
    summary |= {"config": args.config, "overrides": args.overrides,
                "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    print(json.dumps({k: summary[k] for k in ("wall_ms_per_step", "kernel_ms_per_step", "host_wait_ms_per_step",
                                              "ms_per_step")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
