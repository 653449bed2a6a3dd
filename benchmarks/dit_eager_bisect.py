"""DiT-XL/2 256 px eager sampling step (CFG batch B, bf16, no grad): sdpa against mhla at HEAD and against mhla
with one factor at a time put back as 33835d7 (2026-12-01: sdpa 42.08 / mhla 43.68 ms) had it. One process, one
GPU, interleaved rounds, median ms per variant; then diagnostics (kernels per step and GPU time by kernel from the
profiler, host issue time against GPU time, CUDA syncs, clocks) to say where a gap sits if it shows.

    python benchmarks/dit_eager_bisect.py                 # GPU, ~2-3 min
    python benchmarks/dit_eager_bisect.py --no-profile    # timing table only (~1 min)
    python benchmarks/dit_eager_bisect.py --dry-run       # CPU: Triton interpreter, a 1-layer DiT, B = 2

At this shape 33835d7 and HEAD pick the same algorithm (dense) and the same tiles (head dim 72 as 64 + 16, `dense_split`: 256 queries, 64 keys a step, 8 warps, 2 stages; the
`short` variant and the fill rule do not apply), and the dense kernel compiles to the same instructions under
triton 3.6 (255 registers, 20 bytes spilled, 96,512 bytes of shared memory). Per layer 33835d7 launched three
kernels around the attention (Mc's bf16 -> fp32 cast, the dense kernel, the processor's division by 1), HEAD one.

Variants (each "old" one changes one thing back; the monkeypatches are marked [patch] and undone after each use):
  sdpa                 the stock diffusers processor (AttnProcessor2_0)
  mhla                 HEAD as shipped
  mhla ctl short=0     launch_settings("dense", short_tokens=0): the identical launch, a noise control: its
                       distance from "mhla" is the machine's noise
  mhla dispatched      use_switches(direct_launch=False): every launch through Triton's kernel[grid] (as 33835d7)
  mhla Mc cast/call    [patch autograd._fp32_mix] Mc copied to fp32 on every call (33835d7: one cast kernel a layer)
  mhla old proc tail   [patch DiTMHLAProcessor.project_out] o / rescale_output_factor even when it is 1 (one div
                       kernel a layer, as 33835d7)
  mhla 33835d7 path    [patch op.mhla_triton + the processor tail] the whole 33835d7 eager op: full argument
                       checks, choose_splits/choose_algorithm every call, an autograd.Function even without grad,
                       Mc cast per call, kernel[grid] dispatch with 33835d7's tiles (no fill rule, no short
                       variant), HEAD's dense kernel (the same instructions)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--batch", type=int, default=int(os.environ.get("B", "64")), help="CFG batch (64 as benchmarked)")
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--repeats", type=int, default=15)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--variants", default="", help="comma list of variant names to keep (substring match)")
ap.add_argument("--no-profile", action="store_true", help="skip the diagnostics after the table")
ap.add_argument("--dry-run", action="store_true",
                help="CPU only: Triton interpreter, a 1-layer DiT-XL/2-like model, B = 2, one call per variant")
args = ap.parse_args()
if args.dry_run:  # (before triton is imported: triton.jit reads it when the kernels are decorated)
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["MEDIAGEN_MHLA_BACKEND"] = "triton"
    args.batch, args.rounds, args.repeats, args.warmup = 2, 1, 1, 0

import torch  # noqa: E402
import triton  # noqa: E402

import mediagen  # noqa: E402
import importlib  # noqa: E402
from mediagen.eval.timing import measure  # noqa: E402
from mediagen.kernels.mhla import launch_settings  # noqa: E402
from mediagen.kernels.mhla import autograd as mhla_autograd, launches as mhla_launches, tiles as mhla_tiles  # noqa
from mediagen.kernels.mhla.checks import FEATURE_CODES, _check  # noqa: E402
from mediagen.kernels.mhla.triton_dense import dense_forward_kernel  # noqa: E402
from mediagen.kernels.switches import use_switches  # noqa: E402
from mediagen.models.presets import build_transformer  # noqa: E402
from mediagen.models.processors import DiTMHLAProcessor  # noqa: E402

mhla_op = importlib.import_module("mediagen.kernels.mhla.op")  # (the module: mediagen.kernels.mhla.mhla is the function)

dev = torch.device("cpu" if args.dry_run else "cuda")
dt = torch.bfloat16
if not args.dry_run and not torch.cuda.is_available():
    sys.exit("no CUDA device: run with --dry-run on a CPU")


def smi(query: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().replace("\n", " | ") or "-"
    except Exception as e:  # noqa: BLE001
        return f"({type(e).__name__})"


GPU_Q = "gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active"
print(f"torch {torch.__version__}, triton {triton.__version__}, device {dev}"
      + (f" ({torch.cuda.get_device_name(dev)}, {torch.cuda.get_device_properties(dev).multi_processor_count} SMs)"
         if dev.type == "cuda" else " (dry run: Triton interpreter)"), flush=True)
if dev.type == "cuda":
    print("nvidia-smi at start:", smi(GPU_Q))
    print("compute processes:", smi("compute-apps=pid,process_name,used_memory"), flush=True)

# ---- the model ---------------------------------------------------------------------------------------------------
torch.manual_seed(0)
B = args.batch
overrides = dict(num_layers=1, num_attention_heads=2) if args.dry_run else {}
with torch.device(dev):
    model = build_transformer("dit-xl-2-256", **overrides).to(dt).eval()
cfg = model.config
x = torch.randn(B, cfg.in_channels, cfg.sample_size, cfg.sample_size, device=dev, dtype=dt)
t = torch.full((B,), 500, device=dev)
y = torch.randint(0, 1000, (B,), device=dev)
attns = [blk.attn1 for blk in model.transformer_blocks]
sdpa_procs = [a.processor for a in attns]
mediagen.convert(model, "mhla", blocks=[4, 4])
mhla_procs = [a.processor for a in attns]
core = mhla_procs[0].core
print(f"model: {len(attns)} layers, {cfg.num_attention_heads} heads x {cfg.attention_head_dim}, "
      f"{(cfg.sample_size // cfg.patch_size) ** 2} tokens, B = {B}; MHLA core {core}, Mc {core.mix.dtype}, "
      f"cpe {mhla_procs[0].cpe}, out_norm {mhla_procs[0].out_norm}", flush=True)


def use_procs(procs):
    for a, p in zip(attns, procs):
        if a.processor is not p:
            a.set_processor(p)


def step():
    with torch.no_grad():
        return model(x, timestep=t, class_labels=y, return_dict=False)[0]


# ---- 33835d7's behaviours, as monkeypatches --------------------------------------------------------------------
@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _old_project_out(self, attn, o, residual):
    """DiTMHLAProcessor.project_out at 33835d7: divides by rescale_output_factor even when it is 1."""
    o = attn.to_out[1](attn.to_out[0](o))
    if attn.residual_connection:
        o = o + residual
    return o / attn.rescale_output_factor


def _old_fp32_mix(mix):
    """33835d7's launch_dense: ``mix.float().contiguous()`` on every call (a cast kernel for a bf16 Mc)."""
    return mix.detach().float().contiguous()


OLD_LAUNCH = {}  # the last launch the 33835d7 emulation made: (grid, constexprs), for the dry run's comparison


def _old_launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode):
    """33835d7 triton_op.launch_dense, with HEAD's kernel (its extra arguments as the kernel's defaults: nothing
    saved, no CPE, no tail step): 33835d7's tiles (``dense_settings`` without N, so no short variant; no fill rule),
    host arithmetic through triton.cdiv / next_power_of_2, Mc cast on every call, kernel[grid] dispatch."""
    B_, N, H, D = q.shape
    M = math.prod(blocks)
    tl_ = mhla_tiles.dense_settings(D, q.dtype, False, normalize)
    warps, stages = tl_.pop("warps"), tl_.pop("stages")
    BM = max(16, triton.next_power_of_2(M))
    ieee = q.dtype == torch.float32
    o = torch.empty((B_, N, H, D), device=q.device, dtype=q.dtype)
    mixf = mix.float().contiguous()
    al = mhla_launches.stride_unit(q, k, v, o)
    rs = mhla_launches.row_strides
    kgrid = (B_ * H, triton.cdiv(N, tl_["BT"]))
    consts = dict(**tl_, BM=BM, ONEHOT=M <= 128, FEATURE=fcode, NORMALIZE=normalize,
                  DOT_F32=ieee or mhla_tiles._interpreting(), IEEE=ieee, ROPE=False, AL=al)
    OLD_LAUNCH["last"] = (kgrid, dict(consts, num_warps=warps, num_stages=stages))
    dense_forward_kernel[kgrid](
        q, k, v, mixf, mhla_launches._token_blocks_int32(grid, blocks, q.device), o, q, q, q, q, q, q,
        *rs(q, al), *rs(k, al), *rs(v, al), *rs(o, al), 0, 0, 0, 0,
        N, H, D, M, M * M if mix.dim() == 3 else 0, eps, scale, 1, 1, **consts, num_warps=warps, num_stages=stages)
    return o


class _OldFunction(torch.autograd.Function):
    """33835d7's eager path went through an autograd.Function even without gradients."""

    @staticmethod
    def forward(ctx, q, k, v, mix, grid, blocks, normalize, eps, scale, fcode):
        o = _old_launch_dense(q, k, v, mix, grid, blocks, normalize, eps, scale, fcode)
        sz, mixed = q.new_empty((0,), dtype=torch.float32), q.new_empty((0,), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, mix, o, sz, mixed)
        return o

    @staticmethod
    def backward(ctx, g):  # pragma: no cover - sampling only
        raise RuntimeError("the 33835d7 emulation is for sampling only")


def _old_mhla_triton(q, k, v, mix, grid, blocks, *, normalize=True, eps=1e-6, feature_map=None, scale=None,
                     algorithm="auto", splits=None, rope=None, exchange=None, cpe=None):
    """33835d7 triton_op.mhla_triton for the dense forward without RoPE: the argument checks in full (33835d7 had
    no check cache), choose_splits (an environment lookup, the apply kernel's tiles) and choose_algorithm (its cost
    model: bf16 summaries, 5 us a launch) on every call."""
    if rope is not None or exchange is not None or cpe is not None:
        raise RuntimeError("the 33835d7 emulation covers the DiT layer only (no rope, exchange or cpe)")
    _check(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, False)
    B_, N, H, D = q.shape
    M = math.prod(blocks)
    if splits is None:
        forced = os.environ.get("MEDIAGEN_MHLA_SPLITS")
        if forced:
            splits = max(1, int(forced))
        elif q.device.type != "cuda":
            splits = 1
        else:
            BD = max(16, triton.next_power_of_2(D))
            programs = B_ * H * M * (BD // min(BD, 128, 16384 // BD))
            largest = math.prod([-(-g // b) for g, b in zip(grid, blocks)])
            want = math.ceil(mhla_tiles._num_sms(q.device.index or 0) / programs)
            splits = max(1, min(want, math.ceil(largest / (2 * 64))))
    if algorithm == "auto":
        es = 4 if q.dtype == torch.float32 else 2
        ss = 2 if q.dtype == torch.bfloat16 else 4
        BDs = sum(mhla_tiles.dense_head_pieces(D, True))
        io = 4 * B_ * N * H * D * es
        chunked = (io + 4 * ss * B_ * H * M * splits * (D * D + D)) / 3e12 + 3 * 5e-6
        dense = io / 3e12 + 4 * B_ * H * N * N * BDs / 150e12 + 5e-6
        algorithm = "dense" if dense < chunked else "chunked"
    if algorithm != "dense":
        raise RuntimeError(f"the 33835d7 cost model chose {algorithm!r} here; this emulation covers 'dense' only")
    return _OldFunction.apply(q, k, v, mix, tuple(grid), tuple(blocks), normalize, float(eps),
                              1.0 if scale is None else float(scale), FEATURE_CODES[feature_map or "none"])


# ---- variants ------------------------------------------------------------------------------------------------------
def variant(procs, *managers):
    @contextlib.contextmanager
    def enter():
        use_procs(procs)
        with contextlib.ExitStack() as stack:
            for make in managers:
                stack.enter_context(make())
            yield
    return enter


VARIANTS = {
    "sdpa": variant(sdpa_procs),
    "mhla": variant(mhla_procs),
    "mhla ctl short=0": variant(mhla_procs, lambda: launch_settings("dense", short_tokens=0)),
    "mhla dispatched": variant(mhla_procs, lambda: use_switches(direct_launch=False)),
    "mhla Mc cast/call [patch]": variant(mhla_procs, lambda: patched(mhla_autograd, "_fp32_mix", _old_fp32_mix)),
    "mhla old proc tail [patch]": variant(mhla_procs,
                                          lambda: patched(DiTMHLAProcessor, "project_out", _old_project_out)),
    "mhla 33835d7 path [patch]": variant(mhla_procs, lambda: patched(mhla_op, "mhla_triton", _old_mhla_triton),
                                         lambda: patched(DiTMHLAProcessor, "project_out", _old_project_out)),
}
if args.variants:
    keep = [s.strip() for s in args.variants.split(",") if s.strip()]
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in ("sdpa", "mhla") or any(s in k for s in keep)}

# every variant once: compiles, plan caches, and the same output as HEAD's mhla (the old paths are the same math)
ref = {}
for name, enter in VARIANTS.items():
    with enter():
        t0 = time.perf_counter()
        out = step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ref[name] = out.float()
        first_s = time.perf_counter() - t0
    base = ref.get("mhla")
    diff = "" if base is None or name == "sdpa" else f", max |out - mhla| {(ref[name] - base).abs().max().item():.3g}"
    print(f"first call {name}: {first_s:.2f} s{diff}", flush=True)
if args.dry_run:
    from mediagen.kernels.mhla.autograd import _plans
    plan = next(iter(_plans.values()))
    head = (plan.dense.grid, {k: v for k, v in plan.dense.consts.items()})
    old_grid, old_consts = OLD_LAUNCH["last"]
    same = {k: (head[1].get(k), v) for k, v in old_consts.items() if head[1].get(k) != v}
    print(f"HEAD plan launch {head[0]} {head[1]}\n33835d7 emulation launch {old_grid}; constexprs that differ "
          f"(HEAD, old): {same or 'none'}")
    # aten ops and Triton launches per step, by variant (ops inside the interpreter's kernels not counted): what
    # each variant puts back shows up here as the kernels it adds
    import collections
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime import interpreter as _interp

    inside, launched = [0], collections.Counter()
    _run = _interp.InterpretedFunction.run

    def _counting_run(self, *a, **kw):
        launched[self.fn.__name__] += 1
        inside[0] += 1
        try:
            return _run(self, *a, **kw)
        finally:
            inside[0] -= 1

    class _Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if not inside[0]:
                self.ops[func.overloadpacket.__name__] += 1
            return func(*a, **(kw or {}))

    _interp.InterpretedFunction.run = _counting_run
    try:
        for name, enter in VARIANTS.items():
            with enter():
                launched.clear()
                with _Ops() as m:
                    step()
            print(f"ops in one step, {name}: {sum(m.ops.values())} aten ({m.ops['_to_copy']} _to_copy, "
                  f"{m.ops['div']} div, {m.ops['empty'] + m.ops['new_empty']} empty), Triton {dict(launched)}")
    finally:
        _interp.InterpretedFunction.run = _run

# ---- interleaved timing ------------------------------------------------------------------------------------------
res: dict[str, list[float]] = {k: [] for k in VARIANTS}
t_start = time.perf_counter()
for r in range(args.rounds):
    order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))  # alternate the order: no fixed position
    for name in order:
        with VARIANTS[name]():
            res[name].append(measure(step, dev, warmup=args.warmup, repeats=args.repeats).median_ms)
    print(f"round {r + 1}/{args.rounds} ({time.perf_counter() - t_start:.0f} s): "
          + ", ".join(f"{k} {v[-1]:.2f}" for k, v in res.items()), flush=True)

sd = statistics.median(res["sdpa"])
mh = statistics.median(res["mhla"])
print(f"\n### DiT-XL/2 256 px eager sampling step, B = {B}, median of {args.rounds} round medians "
      f"({args.repeats} repeats each), ms\n")
print("| variant | median ms | min-max of rounds | sdpa / variant | vs mhla (HEAD) |")
print("|---|---|---|---|---|")
for k, v in res.items():
    m = statistics.median(v)
    print(f"| {k} | {m:.2f} | {min(v):.2f}-{max(v):.2f} | {sd / m:.3f}x | {m - mh:+.2f} ms |")
print("\n(a variant that puts a factor back and is clearly faster than 'mhla' names a cause; 'mhla ctl short=0' is the"
      " same launch as 'mhla': its distance from 'mhla' is the noise)", flush=True)

if args.no_profile or args.dry_run:
    if dev.type == "cuda":
        print("nvidia-smi at end:", smi(GPU_Q))
    sys.exit(0)

# ---- diagnostics ---------------------------------------------------------------------------------------------------
# host issue time (until step() returns, no sync) against the whole step: issue ~ whole means host-bound
print("\n### Host issue time against the step's time (ms, median of 10): host-bound when they are close")
for name in ("sdpa", "mhla", "mhla 33835d7 path [patch]"):
    if name not in VARIANTS:
        continue
    with VARIANTS[name]():
        for _ in range(3):
            step()
        issue, whole = [], []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            issue.append((t1 - t0) * 1e3)
            whole.append((time.perf_counter() - t0) * 1e3)
    print(f"{name}: host issue {statistics.median(issue):.2f}, whole step {statistics.median(whole):.2f}")

# syncs the host waits on inside a step (a hidden sync exposes every launch's latency)
with VARIANTS["mhla"](), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
print(f"\nCUDA syncs in one mhla step: {len(syncs)}" + (f" (first: {syncs[0]})" if syncs else ""))

# kernels per step and GPU time by kernel
try:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    print("\n### Profiler, one step each: kernels launched, GPU kernel time summed (ms), top kernels (us a step)")
    for name in ("sdpa", "mhla", "mhla 33835d7 path [patch]"):
        if name not in VARIANTS:
            continue
        with VARIANTS[name]():
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
        by_name: dict[str, list[float]] = {}
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
        kernels = {k: v for k, v in by_name.items() if not k.startswith(("Memcpy", "Memset"))}
        n = sum(len(v) for v in kernels.values())
        total = sum(sum(v) for v in kernels.values()) / 1e3
        top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:8]
        print(f"{name}: {n} kernels, {total:.2f} ms of kernels; memcpy/memset "
              f"{sum(len(v) for k, v in by_name.items() if k not in kernels)}")
        for k, v in top:
            print(f"    {sum(v):9.1f} us  {len(v):4d} x {statistics.mean(v):7.1f} us  {k[:110]}")
except Exception as e:  # noqa: BLE001 - the table above is what matters
    print(f"(profiler diagnostics failed: {type(e).__name__}: {e})")
print("\nnvidia-smi at end:", smi(GPU_Q))
