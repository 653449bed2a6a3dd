"""Sweep the launch settings of each MHLA Triton kernel alone (CUDA-graph replay times), to choose
the defaults in mediagen/kernels/mhla/settings.py. Each candidate runs inside
``mediagen.kernels.mhla.launch_settings``, so nothing outside the sweep sees it.

    python -m benchmarks.sweep_mhla [--quick]
    python -m benchmarks.sweep_mhla --mix      # only the block-mixing kernels' settings (mix and mix_grad)
    python -m benchmarks.sweep_mhla --kernels query_grad,key_grad   # only these, at Wan 480p
    python -m benchmarks.sweep_mhla --kernels summary,apply --shape "DiT-XL/2 512px"   # at another shape
    python -m benchmarks.sweep_mhla --dense    # only the dense kernel's tiles, DiT shapes
    python -m benchmarks.sweep_mhla --dense --batches 8,64    # at other batch sizes (CFG doubles a batch)
    python -m benchmarks.sweep_mhla --dense-grad --batches 8,64   # the dense backward's tiles, DiT 256 px
    python -m benchmarks.sweep_mhla --dense --shipped --batches 2,8,32   # the dense forward at the shipped
                                                   # models' sampling shapes (no gradients), beside SDPA
    python -m benchmarks.sweep_mhla --dense --shipped --models image --wide --batches 8,32,128   # more tiles

(from the repository root, as a module)
"""

import argparse
import itertools
import math

import torch
import triton.testing

from mediagen.attention.mhla import locality_mix
from mediagen.eval.attention_bench import GPU_SHAPES, Shape
from mediagen.kernels.mhla import kernel_settings, launch_settings, launches as op_launches, layout, triton_op


def timed(fn):
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
    except Exception as err:  # a setting that does not compile (too much shared memory, say)
        return f"error {type(err).__name__}"


def chunked_inputs(s, J, dtype=torch.bfloat16):
    B, N, H, D = s.batch, s.tokens, s.heads, s.head_dim
    q, k, v, g = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
    mix = locality_mix(s.blocks).cuda()
    M = math.prod(s.blocks)
    order, offsets, _ = layout.block_token_lists(s.grid, s.blocks, q.device)
    sz = op_launches.launch_summary(k, v, order, offsets, M, J, 1)
    mixed = op_launches.launch_mix(mix, sz, J, False, out_dtype=sz.dtype)  # as forward_impl keeps it
    o = op_launches.launch_apply(q, mixed, order, offsets, M, J, True, 1e-6, 1.0, 1)
    return dict(q=q, k=k, v=v, g=g, mix=mix, M=M, J=J, order=order, offsets=offsets, sz=sz, mixed=mixed, o=o)


def kernel_calls(x):
    return {
        "summary": lambda: op_launches.launch_summary(x["k"], x["v"], x["order"], x["offsets"], x["M"], x["J"], 1),
        "apply": lambda: op_launches.launch_apply(x["q"], x["mixed"], x["order"], x["offsets"], x["M"], x["J"], True, 1e-6,
                                        1.0, 1),
        "query_grad": lambda: op_launches.launch_query_grad(x["q"], x["g"], x["o"], x["mixed"], x["order"], x["offsets"],
                                                  x["M"], x["J"], True, 1e-6, 1.0, 1),
        "key_grad": lambda: op_launches.launch_key_grad(x["k"], x["v"], x["mixed"], x["order"], x["offsets"], x["M"], x["J"],
                                              1),
    }


def sweep_mix(shapes):
    """The mixing kernel S~ = Mc S (forward direction, bf16 summaries as forward_impl stores them) and the
    dMc contraction alone, at the chunked shapes; the same bytes copied, for scale."""
    default, default_grad = kernel_settings("mix"), kernel_settings("mix_grad")
    for s in shapes:
        x = chunked_inputs(s, 1)
        sz = x["sz"]
        mix = lambda: op_launches.launch_mix(x["mix"], sz, 1, False, out_dtype=sz.dtype)
        grad = lambda: op_launches.launch_mix_grad(x["mixed"], sz, False, False)
        rows = []
        # (BK is used only when M*J > 64 blocks: none of these shapes with J = 1)
        for bx, per_sm, warps, stages, lowp in itertools.product((64, 128, 256), (2, 4, 8), (4, 8), (2, 3, 4),
                                                                 (False, True)):
            with launch_settings("mix", BX=bx, per_sm=per_sm, warps=warps, stages=stages, lowp=lowp):
                rows.append((timed(mix), bx, per_sm, warps, stages, lowp))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        print(f"{s.name} mix (M={x['M']}, X={sz.shape[-1]}, copy of the summaries {timed(lambda: sz.clone()):.4f} ms): "
              f"best (ms, BX, per_sm, warps, stages, lowp) {ok[:4]}; default {default} -> {timed(mix)}; worst {ok[-1]}",
              flush=True)
        rows = []
        for xt, bk, warps, stages in itertools.product((256, 512, 1024, 2048), (32, 64, 128), (4, 8), (2, 3)):
            with launch_settings("mix_grad", XT=xt, BK=bk, warps=warps, stages=stages):
                rows.append((timed(grad), xt, bk, warps, stages))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        print(f"{s.name} mix_grad: best (ms, XT, BK, warps, stages) {ok[:4]}; default {default_grad} -> "
              f"{timed(grad)}; worst {ok[-1]}", flush=True)
        rows = []  # how the parts are summed, at the default tiles: torch's reduction or part_sum_kernel
        for how, br, by in [("torch", 0, 0), *itertools.product(("triton",), (8, 16, 32, 64), (64, 128, 256))]:
            with launch_settings("mix_grad", sum=how, BR=br, BY=by):
                rows.append((timed(grad), how, br, by))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        print(f"{s.name} mix_grad parts summed: best (ms, sum, BR, BY) {ok[:4]}; torch {rows[0]}", flush=True)


def sweep_dense(shapes, batches=(None,)):
    """The dense kernel's launch settings at the DiT shapes, at each batch of ``batches`` (None: the shape's)."""
    for s, batch in itertools.product(shapes, batches):
        B, N, H, D = batch or s.batch, s.tokens, s.heads, s.head_dim
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mix = locality_mix(s.blocks).cuda()
        rows = []
        for bt, bs, warps, stages in itertools.product((32, 64, 128, 256), (32, 64), (4, 8), (1, 2, 3)):
            # the head dim in two tiles (DiT's 72 in bf16) takes its settings from "dense_split"
            tiles = dict(BT=bt, BS=bs, warps=warps, stages=stages)
            with launch_settings("dense", **tiles, onehot=True, fill=False), launch_settings("dense_split", **tiles):
                rows.append((timed(lambda: op_launches.launch_dense(q, k, v, mix, s.grid, s.blocks, True, 1e-6, 1.0, 1)),
                             bt, bs, warps, stages))
        with launch_settings("dense", onehot=False):
            gathered = timed(lambda: op_launches.launch_dense(q, k, v, mix, s.grid, s.blocks, True, 1e-6, 1.0, 1))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        print(f"{s.name} B={B} dense (ms, BT, BS, warps, stages): best {ok[:3]}; worst {ok[-1]}", flush=True)
        for bt in (32, 64, 128, 256):
            print(f"  best with BT={bt}: {next((r for r in ok if r[1] == bt), None)}", flush=True)
        print(f"  default settings with gathered weights (onehot=False): {gathered}", flush=True)


# the shipped MNIST models' attention (shape, RoPE on the features): image-mhla, video-mhla
SHIPPED = [(Shape("image 14x14", 2, (14, 14), 3, 64, (3, 3)), False),
           (Shape("video 16x8x8", 2, (16, 8, 8), 6, 64, (4, 2, 2)), True)]


# query rows, keys per step, warps, stages
SHIPPED_GRID = list(itertools.product((16, 32, 64, 128, 256), (32, 64), (2, 4, 8), (2,)))
WIDE_GRID = list(itertools.product((32, 64, 128, 256), (16, 32, 64), (4, 8), (2, 3)))


def sweep_dense_shipped(batches=(None,), models=None, grid=SHIPPED_GRID):
    """The dense forward without gradients (what sampling runs) at the shipped models' shapes (``models``: the
    names to keep, None all), over query tiles down to 16 rows (at a small batch the default tiles leave most
    SMs idle), beside cuDNN and flash SDPA; then the settings ranked across the batches of each shape by the
    geometric mean of their time over each batch's best."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    table = {}
    for (s, rope), batch in itertools.product(SHIPPED, batches):
        if models is not None and s.name.split()[0] not in models:
            continue
        B, N, H, D = batch or s.batch, s.tokens, s.heads, s.head_dim
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        mix = locality_mix(s.blocks).cuda()
        tables = None
        if rope:
            angle = torch.rand(N, D // 2, device="cuda") * 6.28
            tables = (angle.cos(), angle.sin())

        def op():
            with torch.no_grad():
                return triton_op.mhla_triton(q, k, v, mix, s.grid, s.blocks, feature_map="relu", algorithm="dense",
                                     rope=tables)

        default = timed(op)
        rows = []
        for bt, bs, warps, stages in grid:
            tiles = dict(BT=bt, BS=bs, warps=warps, stages=stages)
            with launch_settings("dense", **tiles, fill=False), launch_settings("dense_split", **tiles):
                rows.append((timed(op), bt, bs, warps, stages))
        table.setdefault(s.name, []).append(({r[1:]: r[0] for r in rows if not isinstance(r[0], str)}, default))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        ref = {}
        for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
            with sdpa_kernel(getattr(SDPBackend, name)):
                ref[name] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs))
        print(f"{s.name} B={B} dense forward, no grad (ms, BT, BS, warps, stages): best {ok[:4]}; default "
              f"{kernel_settings('dense')} -> {default}; worst {ok[-1]}; sdpa {ref}", flush=True)
        for bt in sorted({g[0] for g in grid}):
            print(f"  best with BT={bt}: {next((r for r in ok if r[1] == bt), None)}", flush=True)
    for name, runs in table.items():
        common = set.intersection(*(set(r) for r, _ in runs))
        score = {t: math.exp(sum(math.log(r[t] / min(r.values())) for r, _ in runs) / len(runs)) for t in common}
        shipped = math.exp(sum(math.log(d / min(r.values())) for r, d in runs if not isinstance(d, str)) / len(runs))
        print(f"{name}: ranked across the batches (geometric mean of time / each batch's best; the shipped "
              f"settings {shipped:.3f}): " + ", ".join(f"{t}: {x:.3f}" for t, x in
                                                      sorted(score.items(), key=lambda kv: kv[1])[:8]), flush=True)


def sweep_dense_grad(shape, batches=(None,)):
    """The dense backward's launch settings (both of its kernels take them), timed as the op's forward +
    backward of q, k, v and Mc with the dense forward at its defaults, at ``shape`` and each batch."""
    s = shape
    for batch in batches:
        B, N, H, D = batch or s.batch, s.tokens, s.heads, s.head_dim
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mix = locality_mix(s.blocks).cuda().requires_grad_()
        g = torch.randn_like(q)

        def step():
            o = triton_op.mhla_triton(q, k, v, mix, s.grid, s.blocks, feature_map="relu", algorithm="dense")
            return torch.autograd.grad(o, (q, k, v, mix), g)

        default = timed(step)
        rows = []
        for bt, bs, warps, stages in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (1, 2, 3)):
            with launch_settings("dense_grad", BT=bt, BS=bs, warps=warps, stages=stages):
                rows.append((timed(step), bt, bs, warps, stages))
        ok = sorted(r for r in rows if not isinstance(r[0], str))
        failed = [r[1:] for r in rows if isinstance(r[0], str)]
        print(f"{s.name} B={B} dense forward + dense backward (ms, BT, BS, warps, stages): best {ok[:4]}; "
              f"default {kernel_settings('dense_grad')} -> {default}; worst {ok[-1]}; failed {failed}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mix", action="store_true", help="sweep only the block-mixing kernels")
    ap.add_argument("--kernels", default="", help="comma list of chunked kernels: sweep only these, at --shape")
    ap.add_argument("--shape", default="Wan2.1-1.3B 81f 480x832", help="the shape --kernels sweeps at")
    ap.add_argument("--dense", action="store_true", help="sweep only the dense kernel, at the DiT shapes")
    ap.add_argument("--shipped", action="store_true",
                    help="with --dense: at the shipped MNIST models' sampling shapes, no gradients")
    ap.add_argument("--models", default="", help="with --shipped: comma list of the models to keep (image, video)")
    ap.add_argument("--wide", action="store_true",
                    help="with --shipped: 16-key steps and 3 stages too (query rows from 32)")
    ap.add_argument("--dense-grad", action="store_true", help="sweep only the dense backward, at DiT-XL/2 256 px")
    ap.add_argument("--batches", default="",
                    help="with --dense or --dense-grad: comma list of batch sizes (default: the shapes')")
    args = ap.parse_args()
    shapes = {s.name: s for s in GPU_SHAPES}
    if args.shipped and not args.dense:
        ap.error("--shipped is not allowed without --dense: it picks the dense forward's shapes")
    if args.dense or args.dense_grad:
        try:
            batches = [int(b) for b in args.batches.split(",") if b] or [None]
        except ValueError:
            ap.error(f"--batches={args.batches!r} is not allowed: use a comma list of positive ints, e.g. 8,64")
        if any(b is not None and b < 1 for b in batches):
            ap.error(f"--batches={args.batches!r} is not allowed: use a comma list of positive ints, e.g. 8,64")
        if args.dense_grad:
            sweep_dense_grad(shapes["DiT-XL/2 256px"], batches)
            return
        if args.shipped:
            names = {s.name.split()[0] for s, _ in SHIPPED}
            models = {m for m in args.models.split(",") if m} or None
            if models and not models <= names:
                ap.error(f"--models={args.models!r} is not allowed: use a comma list of {', '.join(sorted(names))}")
            sweep_dense_shipped(batches, models, WIDE_GRID if args.wide else SHIPPED_GRID)
            return
        sweep_dense([shapes["DiT-XL/2 256px"], shapes["DiT-XL/2 512px"]], batches)
        return
    if args.mix:
        sweep_mix([s for s in GPU_SHAPES if 1024 <= s.tokens <= 32768])
        return
    if args.shape not in shapes:
        ap.error(f"--shape={args.shape!r} is not one of {', '.join(shapes)}")
    wan, dit256, dit512 = shapes["Wan2.1-1.3B 81f 480x832"], shapes["DiT-XL/2 256px"], shapes["DiT-XL/2 512px"]
    only = [k for k in args.kernels.split(",") if k]
    grid = list(itertools.product((64, 128), (32, 64), (4, 8), (2, 3)))
    if only:  # one shape: the full-width tile, finer token steps and stages
        grid = list(itertools.product((128,), (16, 32, 64), (4, 8), (1, 2, 3)))
    if args.quick:
        grid = grid[::3]
    chunked = ("summary", "apply", "query_grad", "key_grad")  # the keys of kernel_calls
    unknown = sorted(set(only) - set(chunked))
    if unknown:
        ap.error(f"--kernels names unknown kernels {unknown}: choose from {', '.join(chunked)}")
    best = {}
    for s in (shapes[args.shape],) if only else (wan, dit512):
        for J in (1,) if only else (1, 4):
            x = chunked_inputs(s, J)
            for name, call in kernel_calls(x).items():
                if only and name not in only:
                    continue
                rows = []
                # with --kernels: also the token ids loaded a step ahead or not (``prefetch``)
                prefetch = (False, True) if only else (None,)
                for (tile, bt, warps, stages), ahead in itertools.product(grid, prefetch):
                    # other fields (the product precision) keep their defaults
                    ahead_field = {} if ahead is None else dict(prefetch=ahead)
                    with launch_settings(name, TILE=tile, BT=bt, warps=warps, stages=stages, **ahead_field):
                        rows.append((timed(call), tile, bt, warps, stages) + (() if ahead is None else (ahead,)))
                ok = sorted(r for r in rows if not isinstance(r[0], str))
                print(f"{s.name} J={J} {name}: best {ok[0]}, default {kernel_settings(name)} -> "
                      f"{timed(call)}; worst {ok[-1]}", flush=True)
                best.setdefault(name, []).append((s.name, J, ok[:3]))
            del x
    if only:
        return
    sweep_dense((dit256, dit512))
    # mixing kernels and splits, with the defaults
    x = chunked_inputs(wan, 1)
    print("wan mix fwd", timed(lambda: op_launches.launch_mix(x["mix"], x["sz"], 1, False)))
    print("wan mix grad", timed(lambda: op_launches.launch_mix_grad(x["mixed"], x["sz"], False, False)))
    for J in (1, 2, 4, 8):
        f = lambda: triton_op.mhla_triton(x["q"], x["k"], x["v"], x["mix"], wan.grid, wan.blocks, feature_map="relu",
                                  algorithm="chunked", splits=J)
        print(f"wan full forward J={J}: {timed(f)} ms", flush=True)


if __name__ == "__main__":
    main()
