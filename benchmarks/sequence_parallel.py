"""Sequence parallelism on 2 GPUs (issue 9): MHLA sharded by whole blocks against softmax attention
sharded Ulysses-style, per attention layer and for a Wan2.1-1.3B-sized transformer.

    torchrun --nproc_per_node 2 -m benchmarks.sequence_parallel --out OUT                        # 2 GPUs, NCCL
    torchrun --nproc_per_node 2 -m benchmarks.sequence_parallel --backend gloo --small --out OUT # CPU smoke run

(from the repository root, as a module)

Rank 0 prints markdown tables and writes OUT/sequence_parallel.md and OUT/sequence_parallel.json:

1. Correctness at a small size, before anything is timed: MHLA sequence-parallel against one rank
   (output and q/k/v gradients), our Ulysses against unsharded SDPA, and each sharded whole model
   against the same model on one rank (max abs error and max error relative to max |reference|).
2. One attention layer (the attention op: q, k, v -> o; the projections are per token and shard
   trivially) at 81 frames 720x1280 = 21x45x80 tokens, 12 heads x 128, bf16, B=1: forward and
   forward+backward ms and bytes sent per rank, for MHLA on rank 0 alone (full sequence) and
   sequence-parallel on 2 ranks, and for SDPA alone and Ulysses on 2 ranks.
3. Bytes sent per rank per layer against frame count (21, 41, 81 frames at 720x1280, fixed blocks).
4. The whole transformer (preset wan2.1-1.3b, random weights, bf16, 512 random text tokens of
   width 4096), one forward at 81f 480x832 and 720x1280: MHLA (``mediagen.convert``, fixed blocks)
   on 1 GPU vs 2 GPUs with ``enable_sequence_parallel``; stock SDPA on 1 GPU vs 2 GPUs with
   diffusers' own context parallelism (``enable_parallelism(ContextParallelConfig(ulysses_degree=2))``).

Bytes are counted, not derived: a TorchDispatchMode sees every c10d collective the code issues
(``torch.distributed`` calls and the functional collectives diffusers uses) with the tensors
handed to it. "sent per rank" is what leaves one rank under the usual algorithms: all-gather
(P-1) x its input, reduce-scatter and all-to-all (P-1)/P x the input, all-reduce 2(P-1)/P x the
input. The JSON keeps every collective's op name, count, payload and bytes sent.

Times are medians of mediagen.eval.timing.measure (CUDA events on a GPU, wall clock on CPU) after
warm-up; a 2-rank time is the larger of the two ranks' medians, each call starting after a barrier.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mediagen.eval.tables import markdown_table

GIB = 2**30


# ---- counting what the collectives send ---------------------------------------------------------

def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _all_to_all_share(splits, rank, world) -> float:
    """Share of an all-to-all input that leaves this rank (its own split stays)."""
    splits = [int(s) for s in splits or []]
    return 1 - splits[rank] / sum(splits) if splits and sum(splits) else (world - 1) / world


# op name -> (argument holding this rank's input, share of it sent by this rank); c10d ops are what
# torch.distributed calls dispatch to, _c10d_functional ops are the functional collectives
_RULES = {
    "allgather_": (1, lambda a, r, P: P - 1),
    "_allgather_base_": (1, lambda a, r, P: P - 1),
    "allgather_into_tensor_coalesced_": (1, lambda a, r, P: P - 1),
    "all_gather_into_tensor": (0, lambda a, r, P: P - 1),
    "all_gather_into_tensor_coalesced": (0, lambda a, r, P: P - 1),
    "_reduce_scatter_base_": (1, lambda a, r, P: (P - 1) / P),
    "reduce_scatter_": (1, lambda a, r, P: (P - 1) / P),
    "reduce_scatter_tensor": (0, lambda a, r, P: (P - 1) / P),
    "allreduce_": (0, lambda a, r, P: 2 * (P - 1) / P),
    "all_reduce": (0, lambda a, r, P: 2 * (P - 1) / P),
    "alltoall_base_": (1, lambda a, r, P: _all_to_all_share(a[4], r, P)),
    "alltoall_": (1, lambda a, r, P: (P - 1) / P),
    "all_to_all_single": (0, lambda a, r, P: _all_to_all_share(a[2], r, P)),
}
_NOT_COLLECTIVES = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier"}


class CollectiveBytes(TorchDispatchMode):
    """Records every collective issued inside it: op, payload (the tensors this rank hands in) and
    the bytes this rank sends."""

    def __init__(self, rank: int, world: int):
        super().__init__()
        self.rank, self.world = rank, world
        self.calls: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns, _, name = func._schema.name.partition("::")
        if ns in ("c10d", "_c10d_functional", "c10d_functional") and name not in _NOT_COLLECTIVES:
            index, share = _RULES.get(name, (0, lambda a, r, P: 1.0))  # unknown: count the payload once
            payload = _nbytes(args[index])
            self.calls.append((name if name in _RULES else f"{name} (unknown)", payload,
                               round(payload * share(args, self.rank, self.world))))
        return func(*args, **(kwargs or {}))

    def summary(self) -> dict:
        ops: dict[str, dict] = {}
        for name, payload, sent in self.calls:
            op = ops.setdefault(name, {"calls": 0, "payload": 0, "sent": 0})
            op["calls"] += 1
            op["payload"] += payload
            op["sent"] += sent
        return {"sent": sum(c[2] for c in self.calls), "payload": sum(c[1] for c in self.calls), "ops": ops}


# ---- Ulysses: softmax attention with the sequence sharded, heads exchanged by all-to-all ---------

def _all_to_all(x: torch.Tensor, scatter: int, gather: int, group) -> torch.Tensor:
    """Cut dim ``scatter`` into P equal chunks, chunk r to rank r; concatenate what arrives along
    dim ``gather`` in rank order."""
    world = dist.get_world_size(group)
    if x.shape[scatter] % world:
        raise ValueError(f"dim {scatter} of size {x.shape[scatter]} must be divisible by the world size {world}")
    send = torch.stack(x.chunk(world, dim=scatter)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter, gather, group):
        ctx.args = (scatter, gather, group)
        return _all_to_all(x, scatter, gather, group)

    @staticmethod
    def backward(ctx, g):
        scatter, gather, group = ctx.args
        return _all_to_all(g, gather, scatter, group), None, None, None  # the inverse exchange


def ulysses_attention(q, k, v, group=None):
    """Softmax attention over a sequence cut into P equal contiguous parts, q/k/v (B, N/P, H, D) per
    rank: all-to-all to (B, N, H/P, D), SDPA over the whole sequence for H/P heads, all-to-all back."""
    q, k, v = (_AllToAll.apply(t, 2, 1, group) for t in (q, k, v))
    o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    return _AllToAll.apply(o, 1, 2, group)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)


# ---- the run ----------------------------------------------------------------------------------

class Run:
    """Process group, device and the helpers that time and count on it."""

    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.backend == "nccl"
                       else torch.device("cpu"))

    def barrier(self):
        dist.barrier()

    def same(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor on every rank."""
        dist.broadcast(t, 0)
        return t

    def randn(self, *shape, dtype=None):
        return self.same(torch.randn(*shape, device=self.device, dtype=dtype or self.args.dtype))

    def max_over_ranks(self, x: float) -> float:
        t = torch.tensor([float(x)], device=self.device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_ms(self, fn, together: bool) -> float:
        """Median ms of fn(); together: every rank calls it (after a barrier each time) and the
        slower rank's median is returned. Otherwise only the calling rank runs it."""
        from mediagen.eval.timing import measure

        ms = measure(fn, self.device, warmup=self.args.warmup, repeats=self.args.repeats,
                     before_each=self.barrier if together else None).median_ms
        return self.max_over_ranks(ms) if together else ms

    def solo(self, fn):
        """fn() on rank 0 alone (the 1-GPU baseline); the other ranks wait."""
        out = fn() if self.rank == 0 else None
        self.barrier()
        return out

    def count_bytes(self, fn) -> dict:
        """Collectives of one fn() call on every rank; 'sent' is the largest over ranks."""
        with CollectiveBytes(self.rank, self.world) as counter:
            fn()
        self.sync()
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, counter.summary())
        return {"sent": max(r["sent"] for r in per_rank), "per_rank": per_rank}

    def peak_reset(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self, together: bool):
        if self.device.type != "cuda":
            return None
        gib = torch.cuda.max_memory_allocated(self.device) / GIB
        return self.max_over_ranks(gib) if together else gib


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max |got - want|, that over max |want|)."""
    abs_err = (got.double() - want.double()).abs().max().item()
    return abs_err, abs_err / max(want.double().abs().max().item(), 1e-30)


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def token_grid(frames, height, width, vae=(4, 8, 8), patch=(1, 2, 2)):
    """Latent token grid of a video: latent frames (F-1)/4+1, then the patch."""
    latent = ((frames - 1) // vae[0] + 1, height // vae[1], width // vae[2])
    return latent, tuple(a // p for a, p in zip(latent, patch))


def parse_size(text):
    return tuple(int(x) for x in text.lower().split("x"))


# ---- 1. attention op: correctness, one layer, bytes vs frames ----------------------------------

def op_inputs(run, grid, heads, head_dim):
    from mediagen.attention.mhla import locality_mix

    N = math.prod(grid)
    q, k, v, g = (run.randn(1, N, heads, head_dim) for _ in range(4))
    mix = locality_mix(run.args.blocks).to(device=run.device, dtype=run.args.dtype)
    return q, k, v, mix, g


def mhla_full(q, k, v, mix, grid, blocks):
    from mediagen.kernels import mhla

    return mhla(q, k, v, mix, grid, blocks, feature_map="relu")


def mhla_sp(q, k, v, mix, grid, blocks):
    from mediagen.attention.sequence_parallel import sequence_parallel_mhla

    return sequence_parallel_mhla(q, k, v, mix, grid, blocks, feature_map="relu")


def shard_mhla(run, tensors, grid):
    from mediagen.attention.sequence_parallel import shard_tokens

    return [shard_tokens(t, grid, run.args.blocks, run.rank, run.world).contiguous() for t in tensors]


def busiest_rank_tokens(kind, grid, blocks, world) -> int:
    """Tokens on the rank holding the most: MHLA slabs are whole block rows along frames (ragged
    when the frame count is not a multiple), Ulysses / diffusers cut the sequence in equal parts."""
    from mediagen.attention.sequence_parallel import shard_layout

    if kind == "mhla":
        return max(end - first for first, end, _, _ in (shard_layout(grid, blocks, r, world) for r in range(world)))
    return -(-math.prod(grid) // world)


def shard_even(run, tensors):
    return [t.chunk(run.world, dim=1)[run.rank].contiguous() for t in tensors]


def op_correctness(run, cfg):
    """MHLA SP vs one rank (output and q/k/v gradients), Ulysses vs SDPA, at cfg['check_grid']."""
    grid, blocks = cfg["check_grid"], run.args.blocks
    q, k, v, mix, g = op_inputs(run, grid, cfg["heads"], cfg["head_dim"])
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    checks = []
    size = f"grid {'x'.join(map(str, grid))}, {cfg['heads']}x{cfg['head_dim']}, blocks {'x'.join(map(str, blocks))}"
    for name, single, sharded, shard in (("MHLA sequence-parallel vs 1 rank", mhla_full, mhla_sp,
                                          lambda ts: shard_mhla(run, ts, grid)),
                                         ("Ulysses vs unsharded SDPA", sdpa, ulysses_attention,
                                          lambda ts: shard_even(run, ts))):
        extra = (mix, grid, blocks) if single is mhla_full else ()
        want = single(*full, *extra)
        want_grads = torch.autograd.grad(want, full, g)
        local = [t.detach().clone().requires_grad_() for t in shard([q, k, v])]
        got = sharded(*local, *extra)
        got_grads = torch.autograd.grad(got, local, shard([g])[0])
        for what, a, b in [("output", got, shard([want.detach()])[0])] + [
                (f"d{n}", ga, shard([gb])[0]) for n, ga, gb in zip("qkv", got_grads, want_grads)]:
            abs_err, rel_err = (run.max_over_ranks(e) for e in errors(a, b))
            checks.append(dict(check=f"{name}: {what}", size=size, max_abs_err=abs_err, max_rel_err=rel_err,
                               ok=rel_err < cfg["tol"]))
    return checks


def layer_bench(run, cfg):
    """One attention layer at cfg['layer_size']: MHLA and SDPA on rank 0 alone vs sharded on all ranks."""
    args = run.args
    grid, blocks = cfg["layer_grid"], args.blocks
    q, k, v, mix, g = op_inputs(run, grid, cfg["heads"], cfg["head_dim"])
    rows = []
    variants = [("mhla", mhla_full, mhla_sp, lambda ts: shard_mhla(run, ts, grid), (mix,), (grid, blocks)),
                ("sdpa", sdpa, ulysses_attention, lambda ts: shard_even(run, ts), (), ())]
    for attention, single, sharded, shard, params, static in variants:
        for parallel in (False, True):
            if parallel:
                inputs = [t.detach().clone().requires_grad_() for t in shard([q, k, v])]
                inputs += [p.clone().requires_grad_() for p in params]
                grad_out, fn = shard([g])[0], sharded
            else:
                inputs = [t.clone().requires_grad_() for t in (q, k, v, *params)]
                grad_out, fn = g, single

            def fwd():
                with torch.no_grad():
                    fn(*inputs, *static)

            def fwd_bwd():
                torch.autograd.grad(fn(*inputs, *static), inputs, grad_out)

            def timed():
                return run.time_ms(fwd, parallel), run.time_ms(fwd_bwd, parallel)

            times = timed() if parallel else run.solo(timed)
            sent = (run.count_bytes(fwd), run.count_bytes(fwd_bwd)) if parallel else None
            label = {("mhla", False): "MHLA, 1 rank (full sequence)",
                     ("mhla", True): f"MHLA sequence-parallel, {run.world} ranks",
                     ("sdpa", False): "SDPA, 1 rank (full sequence)",
                     ("sdpa", True): f"SDPA Ulysses, {run.world} ranks"}[attention, parallel]
            rows.append(dict(attention=label, ranks=run.world if parallel else 1,
                             busiest_rank_tokens=busiest_rank_tokens(attention, grid, blocks, run.world)
                             if parallel else math.prod(grid),
                             fwd_ms=times[0] if times else None, fwd_bwd_ms=times[1] if times else None,
                             bytes_fwd=sent[0]["sent"] if sent else 0, bytes_fwd_bwd=sent[1]["sent"] if sent else 0,
                             collectives_fwd=sent[0]["per_rank"] if sent else None,
                             collectives_fwd_bwd=sent[1]["per_rank"] if sent else None))
            if run.rank == 0:
                r = rows[-1]
                print(f"  layer: {label}: fwd {fmt_ms(r['fwd_ms'])} ms, fwd+bwd {fmt_ms(r['fwd_bwd_ms'])} ms, "
                      f"sent/rank fwd {fmt_bytes(r['bytes_fwd'])}", flush=True)
    for row in rows:  # speed-up of each sharded row over its own 1-rank row
        base = next(r for r in rows if r["ranks"] == 1 and r["attention"][:4] == row["attention"][:4])
        row["fwd_speedup"] = base["fwd_ms"] / row["fwd_ms"] if run.rank == 0 else None
        row["fwd_bwd_speedup"] = base["fwd_bwd_ms"] / row["fwd_bwd_ms"] if run.rank == 0 else None
    return rows


def bytes_vs_frames(run, cfg):
    """Bytes sent per rank by one layer (fwd, fwd+bwd) at each frame count, blocks held fixed."""
    out = []
    _, height, width = cfg["layer_size"]
    for frames in cfg["frames"]:
        latent, grid = token_grid(frames, height, width)
        q, k, v, mix, g = op_inputs(run, grid, cfg["heads"], cfg["head_dim"])
        row = dict(frames=frames, latent_frames=latent[0], grid=list(grid), tokens=math.prod(grid))
        for name, fn, shard, params, static in (
                ("mhla", mhla_sp, lambda ts: shard_mhla(run, ts, grid), (mix,), (grid, run.args.blocks)),
                ("ulysses", ulysses_attention, lambda ts: shard_even(run, ts), (), ())):
            inputs = [t.detach().clone().requires_grad_() for t in shard([q, k, v])]
            inputs += [p.clone().requires_grad_() for p in params]
            grad_out = shard([g])[0]

            def fwd():
                with torch.no_grad():
                    fn(*inputs, *static)

            def fwd_bwd():
                torch.autograd.grad(fn(*inputs, *static), inputs, grad_out)

            row[f"{name}_fwd"] = run.count_bytes(fwd)["sent"]
            row[f"{name}_fwd_bwd"] = run.count_bytes(fwd_bwd)["sent"]
        out.append(row)
        if run.rank == 0:
            print(f"  bytes: {frames} frames, grid {grid}: MHLA fwd {fmt_bytes(row['mhla_fwd'])}, "
                  f"Ulysses fwd {fmt_bytes(row['ulysses_fwd'])}", flush=True)
    return out


# ---- 2. whole model -----------------------------------------------------------------------------

def enable_context_parallel(model, world):
    """diffusers' own context parallelism (Ulysses over all ranks) on a stock Wan transformer."""
    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(ulysses_degree=world)
    if torch.accelerator.device_count() == 0:  # CPU smoke run: diffusers computes rank % device_count
        count = torch.accelerator.device_count
        torch.accelerator.device_count = lambda: 1
        try:
            model.enable_parallelism(config=config)
        finally:
            torch.accelerator.device_count = count
    else:
        model.enable_parallelism(config=config)


def whole_model(run, cfg):
    from mediagen import convert
    from mediagen.models.presets import build_transformer, preset
    from mediagen.models.sequence_parallel import enable_sequence_parallel

    args = run.args
    p = preset(cfg["preset"])
    overrides = {"num_layers": args.layers} if args.layers else {}
    layers = args.layers or p["config"]["num_layers"]
    channels, text_dim = p["config"]["in_channels"], p["config"]["text_dim"]
    text = run.randn(1, cfg["text_len"], text_dim)
    t = torch.tensor([500.0], device=run.device)
    sizes = []
    for size in cfg["model_sizes"]:
        latent, grid = token_grid(*size)
        sizes.append((size, grid, run.randn(1, channels, *latent)))
    check_latent, check_grid = token_grid(*cfg["check_size"])
    x_check = run.randn(1, channels, *check_latent)
    rows, checks, params = [], [], None
    for attention in args.model_attention:
        torch.manual_seed(0)
        with torch.device(run.device):
            model = build_transformer(p, **overrides)
        if attention == "mhla":
            convert(model, "mhla", blocks=args.blocks)
        model = model.to(device=run.device, dtype=args.dtype).eval()
        for prm in model.parameters():  # one set of weights on every rank
            dist.broadcast(prm.data, 0)
        params = sum(prm.numel() for prm in model.parameters())

        def forward(x):
            with torch.no_grad():
                return model(x, t, text, return_dict=False)[0]

        want = forward(x_check)  # every rank, unsharded
        solo = {}
        for size, grid, x in sizes:
            def timed():
                run.peak_reset()
                return run.time_ms(lambda: forward(x), together=False), run.peak_gib(False)
            solo[size] = run.solo(timed)
            if run.rank == 0:
                print(f"  model {attention} {size}: 1 rank {fmt_ms(solo[size][0])} ms", flush=True)
        if attention == "mhla":
            enable_sequence_parallel(model)
            how = f"mediagen enable_sequence_parallel, blocks {'x'.join(map(str, args.blocks))}"
        else:
            enable_context_parallel(model, run.world)
            how = f"diffusers ContextParallelConfig(ulysses_degree={run.world})"
        abs_err, rel_err = (run.max_over_ranks(e) for e in errors(forward(x_check), want))
        checks.append(dict(check=f"whole model {attention}, {run.world} ranks ({how}) vs 1 rank",
                           size=f"{cfg['preset']}, {layers} layers, grid {'x'.join(map(str, check_grid))}",
                           max_abs_err=abs_err, max_rel_err=rel_err, ok=rel_err < cfg["model_tol"]))
        if run.rank == 0:
            print(f"  check: {checks[-1]}", flush=True)
        for size, grid, x in sizes:
            run.peak_reset()
            ms = run.time_ms(lambda: forward(x), together=True)
            peak = run.peak_gib(True)
            sent = run.count_bytes(lambda: forward(x))
            label = "x".join(map(str, size[1:]))
            base = solo[size]
            for ranks, ms_, peak_, sent_ in ((1, base[0] if base else None, base[1] if base else None, None),
                                             (run.world, ms, peak, sent)):
                rows.append(dict(size=f"{size[0]}f {label}", grid=list(grid), tokens=math.prod(grid),
                                 busiest_rank_tokens=busiest_rank_tokens(attention, grid, args.blocks, ranks)
                                 if ranks > 1 else math.prod(grid),
                                 attention=attention, parallel=how if ranks > 1 else "-", ranks=ranks, ms=ms_,
                                 speedup=(base[0] / ms if base and ranks > 1 else None),
                                 bytes_per_forward=sent_["sent"] if sent_ else 0,
                                 collectives=sent_["per_rank"] if sent_ else None, peak_gib=peak_))
            if run.rank == 0:
                print(f"  model {attention} {size}: {run.world} ranks {fmt_ms(ms)} ms "
                      f"({base[0] / ms:.2f}x), sent/rank {fmt_bytes(sent['sent'])}", flush=True)
        model = None  # free its weights before the next variant is built
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
    return dict(preset=cfg["preset"], layers=layers, params=params, text_tokens=cfg["text_len"], rows=rows), checks


# ---- report -------------------------------------------------------------------------------------

def report(run, cfg, result) -> str:
    args, world = run.args, run.world
    blocks = "x".join(map(str, args.blocks))
    parts = [f"{result['date']} · {result['device']} · torch {torch.__version__} · {args.backend} · "
             f"{str(args.dtype).replace('torch.', '')} · {world} ranks · warmup {args.warmup}, "
             f"repeats {args.repeats}\n"
             f"command: {result['command']}"]
    parts.append("### Correctness at a small size (before timing)\n\n" + markdown_table(
        ["check", "size", "max abs err", "max err / max abs ref", "ok"],
        [[c["check"], c["size"], f"{c['max_abs_err']:.3g}", f"{c['max_rel_err']:.3g}", "yes" if c["ok"] else "NO"]
         for c in result["correctness"]]))
    if "layer" in result:
        L = result["layer"]
        parts.append(
            f"### One attention layer, {L['size']} ({'x'.join(map(str, L['grid']))} = {L['tokens']:,} tokens, "
            f"{L['heads']}x{L['head_dim']}, B=1), MHLA blocks {blocks}\n\n"
            "Attention op only (q, k, v -> o); bytes are sent per rank per layer.\n\n" + markdown_table(
                ["attention", "ranks", "tokens on busiest rank", "fwd ms", "fwd+bwd ms", "fwd speed-up",
                 "fwd+bwd speed-up", "sent/rank fwd", "sent/rank fwd+bwd"],
                [[r["attention"], r["ranks"], f"{r['busiest_rank_tokens']:,}", fmt_ms(r["fwd_ms"]),
                  fmt_ms(r["fwd_bwd_ms"]),
                  f"{r['fwd_speedup']:.2f}x" if r["ranks"] > 1 else "-",
                  f"{r['fwd_bwd_speedup']:.2f}x" if r["ranks"] > 1 else "-",
                  fmt_bytes(r["bytes_fwd"]), fmt_bytes(r["bytes_fwd_bwd"])] for r in L["rows"]]))
    if "bytes_vs_frames" in result:
        rows = result["bytes_vs_frames"]
        h, w = cfg["layer_size"][1:]
        parts.append(
            f"### Bytes sent per rank per layer vs frames ({h}x{w}, {cfg['heads']}x{cfg['head_dim']}, MHLA blocks "
            f"{blocks} fixed)\n\n" + markdown_table(
                ["frames", "latent grid", "tokens", "MHLA SP fwd", "MHLA SP fwd+bwd", "Ulysses fwd",
                 "Ulysses fwd+bwd", "Ulysses / MHLA (fwd)"],
                [[r["frames"], "x".join(map(str, r["grid"])), f"{r['tokens']:,}", fmt_bytes(r["mhla_fwd"]),
                  fmt_bytes(r["mhla_fwd_bwd"]), fmt_bytes(r["ulysses_fwd"]), fmt_bytes(r["ulysses_fwd_bwd"]),
                  f"{r['ulysses_fwd'] / r['mhla_fwd']:.1f}x"] for r in rows]))
    if "model" in result:
        M = result["model"]
        parts.append(
            f"### Whole model, one forward ({M['preset']}, {M['layers']} layers, {M['params'] / 1e9:.2f}B params, "
            f"{M['text_tokens']} text tokens, random weights)\n\n"
            "Ceiling: tokens over the busiest rank's tokens (MHLA slabs are whole block rows along the frames; "
            "diffusers and Ulysses cut the sequence in equal parts).\n\n" + markdown_table(
                ["size", "tokens", "attention", "ranks", "parallelism", "tokens on busiest rank", "ms", "speed-up",
                 "ceiling (tokens / busiest)", "sent/rank per forward", "peak GiB per GPU"],
                [[r["size"], f"{r['tokens']:,}", r["attention"], r["ranks"], r["parallel"],
                  f"{r['busiest_rank_tokens']:,}", fmt_ms(r["ms"]), f"{r['speedup']:.2f}x" if r["speedup"] else "-",
                  f"{r['tokens'] / r['busiest_rank_tokens']:.2f}x" if r["ranks"] > 1 else "-",
                  fmt_bytes(r["bytes_per_forward"]),
                  f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"] for r in M["rows"]]))
    return "\n\n".join(parts)


def configs(args) -> dict:
    if args.small:  # tiny sizes: the CPU smoke run (Triton kernels in the interpreter)
        return dict(heads=2, head_dim=16, layer_size=(21, 64, 96), frames=(5, 9, 21), check_grid=(4, 4, 6),
                    preset="wan-tiny", model_sizes=[(9, 64, 96), (13, 64, 96)], check_size=(5, 64, 64),
                    text_len=8, tol=1e-4 if args.dtype == torch.float32 else 2e-2, model_tol=1e-3)
    return dict(heads=12, head_dim=128, layer_size=(81, 720, 1280), frames=(21, 41, 81), check_grid=(4, 6, 8),
                preset="wan2.1-1.3b", model_sizes=[(81, 480, 832), (81, 720, 1280)], check_size=(13, 96, 128),
                text_len=512, tol=2e-2 if args.dtype != torch.float32 else 1e-4, model_tol=5e-2)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for sequence_parallel.md and sequence_parallel.json")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo runs on CPU")
    ap.add_argument("--small", action="store_true", help="tiny sizes (wan-tiny, 2x16 heads): a CPU smoke run")
    ap.add_argument("--blocks", default=None,
                    help="MHLA blocks F,H,W held fixed everywhere; F divisible by the rank count (default 4,5,4; "
                         "--small 2,2,2)")
    ap.add_argument("--layers", type=int, default=None, help="cut the whole model to this many layers")
    ap.add_argument("--model-sizes", default=None,
                    help="comma list FRAMESxHEIGHTxWIDTH (default 81x480x832,81x720x1280)")
    ap.add_argument("--model-attention", default="mhla,sdpa", help="whole-model variants: mhla, sdpa or both")
    ap.add_argument("--skip-layer", action="store_true", help="skip the one-layer and bytes-vs-frames sections")
    ap.add_argument("--skip-model", action="store_true", help="skip the whole-model section")
    ap.add_argument("--dtype", default=None, choices=["bf16", "fp32"], help="default bf16 (fp32 with gloo)")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (1 with --small)")
    ap.add_argument("--repeats", type=int, default=None, help="default 10 (2 with --small)")
    args = ap.parse_args(argv)
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, None: None}[args.dtype] or (
        torch.float32 if args.backend == "gloo" else torch.bfloat16)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    args.repeats = args.repeats if args.repeats is not None else (2 if args.small else 10)
    args.blocks = tuple(int(b) for b in (args.blocks or ("2,2,2" if args.small else "4,5,4")).split(","))
    args.model_attention = [a for a in args.model_attention.split(",") if a]
    if any(a not in ("mhla", "sdpa") for a in args.model_attention):
        ap.error(f"--model-attention {args.model_attention} not allowed: use mhla, sdpa or mhla,sdpa")
    if args.backend == "nccl" and not torch.cuda.is_available():
        ap.error("--backend nccl needs CUDA GPUs; for a CPU smoke run use --backend gloo --small")
    return args


def close_process_groups():
    """Destroy every process group while the interpreter is still whole. diffusers' context
    parallelism keeps DeviceMeshes, each holding its process groups, in reference cycles: without the
    collection they outlive destroy_process_group(), and a gloo group destroyed only at interpreter
    exit can abort the process there (pytorch/pytorch#190489; the CPU smoke run lost rank 1 to SIGABRT
    in about one run in six)."""
    gc.collect()
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if args.backend == "gloo":  # the Triton kernels run in their interpreter on CPU tensors
        os.environ.setdefault("TRITON_INTERPRET", "1")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.backend == "nccl":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    try:
        run = Run(args)
        cfg = configs(args)
        if args.model_sizes:
            cfg["model_sizes"] = [parse_size(s) for s in args.model_sizes.split(",")]
        if args.blocks[0] % run.world:
            raise ValueError(f"--blocks {args.blocks}: the first count must be divisible by the world size {run.world}")
        torch.manual_seed(0)
        t0 = time.perf_counter()  # each section's wall time (section_s), once per run: not measure's repeats
        device = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "cpu"
        result = dict(date=str(datetime.date.today()), device=device, backend=args.backend, world=run.world,
                      dtype=str(args.dtype), torch=torch.__version__, small=args.small, blocks=list(args.blocks),
                      warmup=args.warmup, repeats=args.repeats,
                      command=f"torchrun --nproc_per_node {run.world} -m benchmarks.sequence_parallel "
                              + " ".join(sys.argv[1:]))
        if run.rank == 0:
            print(f"{device}, {run.world} ranks, {args.backend}, {args.dtype}, torch {torch.__version__}", flush=True)
        sections = result["section_s"] = {}
        result["correctness"] = op_correctness(run, cfg)
        sections["correctness"] = time.perf_counter() - t0
        if run.rank == 0:
            for c in result["correctness"]:
                print(f"  check: {c['check']}: max abs err {c['max_abs_err']:.3g}, rel {c['max_rel_err']:.3g}",
                      flush=True)
        if not args.skip_layer:
            latent, grid = token_grid(*cfg["layer_size"])
            cfg["layer_grid"] = grid
            rows = layer_bench(run, cfg)
            result["layer"] = dict(size="{}f {}x{}".format(*cfg["layer_size"]), grid=list(grid),
                                   tokens=math.prod(grid), heads=cfg["heads"], head_dim=cfg["head_dim"], rows=rows)
            sections["layer"] = time.perf_counter() - t0 - sum(sections.values())
            result["bytes_vs_frames"] = bytes_vs_frames(run, cfg)
            sections["bytes_vs_frames"] = time.perf_counter() - t0 - sum(sections.values())
        if not args.skip_model:
            result["model"], model_checks = whole_model(run, cfg)
            result["correctness"] += model_checks
            sections["model"] = time.perf_counter() - t0 - sum(sections.values())
        result["wall_s"] = time.perf_counter() - t0
        if run.rank == 0:
            text = report(run, cfg, result)
            spent = ", ".join(f"{k} {v:.1f} s" for k, v in sections.items())
            print("\n" + text + f"\n\nwall time {result['wall_s']:.1f} s ({spent})", flush=True)
            if args.out:
                out = Path(args.out)
                out.mkdir(parents=True, exist_ok=True)
                (out / "sequence_parallel.md").write_text(text + "\n")
                (out / "sequence_parallel.json").write_text(json.dumps(result, indent=1) + "\n")
    finally:
        close_process_groups()


if __name__ == "__main__":
    main()
