"""Text-encoder benchmarks: encoding latency per attention, decode latency per token with a cache
(MLRA vs MHA), and how far HLA chunk skipping moves the output. Distilled encoders' quality:
benchmarks/distill_text_encoders.py.

Prints markdown tables (and appends them to --out). On a GPU:
    python -m benchmarks text_encoders --out benchmarks/RESULTS.md
Prompt lengths, each attention's short path against its long path (the ``-long`` variants) and SDPA:
    python -m benchmarks text_encoders --only encode --lengths 77 512 4096 --batches 1 16 --iters 20 \
        --attentions sdpa mlra2 mlra2-long mlra4 mlra4-long hla hla-long --graph
The HLA encoders under other launch settings of the fused readout (the kernel's defaults: ReadoutSettings in
mediagen/text/kernels/hla/triton_readout.py), one row per combination:
    python -m benchmarks text_encoders --only encode --attentions hla-top8c --lengths 32768 --batches 16 \
        --readout BT64=64,128,256 warps=4,8 stages=2,3
On a CPU, end to end in about a minute with tiny shapes:
    python -m benchmarks text_encoders --tiny
Times are medians of mediagen.eval.timing.measure (CUDA events on a GPU; the graph rows replay CUDA graphs).

Work to expect: HLA's walk over all earlier chunks is about (N/C)^2/2 chunk pairs, each two
(C x d) @ (d x d) GEMMs per head; at 32K tokens with C = 256 that is 8,128 pairs, roughly half the
FLOPs of causal softmax attention (not a linear-time amount). ``hla-top8`` keeps the 8 past chunks
with the largest mean gate per query chunk, so 8 walk steps instead of 127, but its router still
scores every token against every past bucket; ``hla-top8c`` ranks chunks by the query chunk's mean
routed query first and scores tokens only against the 8 kept chunks (beyond the paper).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import label, markdown_table, settings_grid  # noqa: E402
from mediagen.eval.timing import measure  # noqa: E402
from mediagen.text.attention import MLRAttention, MultiHeadSelfAttention  # noqa: E402
from mediagen.text.encoders import MediagenTextEncoder  # noqa: E402
from mediagen.text.kernels.hla import fla_available  # noqa: E402

# encoder variants: name -> MediagenTextEncoder config overrides
VARIANTS = {
    "sdpa": dict(attention="sdpa"),
    "mlra2": dict(attention="mlra2"),
    "mlra4": dict(attention="mlra4"),
    "hla": dict(attention="hla"),
    "hla-top8": dict(attention="hla", hla_top_k=8),
    "hla-top4": dict(attention="hla", hla_top_k=4),
    "hla-top8c": dict(attention="hla", hla_top_k=8, hla_route="chunk"),     # cheap chunk-level routing
    "hla-top4c": dict(attention="hla", hla_top_k=4, hla_route="chunk"),
    "no-attention": dict(attention="sdpa"),   # the floor: every self-attention replaced by zeros (see below)
    # the same encoders with every layer's short-sequence path switched off (short_max_tokens = 0): what
    # the layers cost at prompt lengths without it (beyond their thresholds both variants are the same)
    "mlra2-long": dict(attention="mlra2"),
    "mlra4-long": dict(attention="mlra4"),
    "hla-long": dict(attention="hla"),
    # MLRA's and HLA's short paths on their torch ops instead of their Triton launches (what "auto" takes on CUDA)
    "mlra2-torch": dict(attention="mlra2"),
    "hla-torch": dict(attention="hla"),
}
LONG_PATH_ONLY = ("mlra2-long", "mlra4-long", "hla-long")
MINILM_SHAPE = dict(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536)
TINY_SHAPE = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, hla_chunk=16, hla_pool=4)
# decode shapes: (name, hidden, heads); MLRA defaults d_c = 4 d_h, d_r = d_h / 2
DECODE_SHAPES = {"minilm 12x32": (384, 12), "lm 16x128": (2048, 16)}
TINY_DECODE = {"tiny 4x8": (32, 4)}
TABLES = ("encode", "decode", "skipping")                            # for --only


def run_or_oom(fn):
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def fmt(ms):
    return "OOM" if ms is None else (f"{ms:.3f}" if ms < 10 else f"{ms:.1f}")


def row(rows, cells):
    """Add a table row and print it at once: a time-boxed run keeps what it measured."""
    rows.append(cells)
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


class NoAttention(torch.nn.Module):
    """Stands in for a self-attention layer and adds nothing: what the rest of the encoder costs."""

    def forward(self, x, attention_mask=None):
        return torch.zeros_like(x)


def make_encoder(name, shape, device, dtype):
    model = MediagenTextEncoder(**{**shape, **VARIANTS[name]})
    if name == "no-attention":
        for layer in model.layers:
            layer.attn = NoAttention()
    if name in LONG_PATH_ONLY:
        for layer in model.layers:
            layer.attn.short_max_tokens = 0
    if name in ("mlra2-torch", "hla-torch"):
        for layer in model.layers:
            layer.attn.short_backend = "torch"
    return model.to(device=device, dtype=dtype).eval()


def readout_settings(name, grid):
    """(row label, context) per readout setting of ``grid`` for an HLA variant; one plain run for the others."""
    if not grid or VARIANTS[name]["attention"] != "hla":
        return [("", contextlib.nullcontext)]
    from mediagen.text.kernels.hla.triton_readout import use_readout_settings

    return [(f" ({label(fields)})", lambda fields=fields: use_readout_settings(**fields)) for fields in grid]


def encoding_table(args, device, dtype, shape):
    """Eager rows; with --graph also CUDA-graph replays (kernels only), with --compile also
    torch.compile'd rows (default mode; the compile itself is not timed)."""
    rows = []
    for name in args.attentions:
        torch.manual_seed(0)
        model = make_encoder(name, shape, device, dtype)
        runs = {"": model}
        if args.compile:
            runs[" (compiled)"] = torch.compile(model)
        for setting, context in readout_settings(name, args.readout):
            for batch in args.batches:
                for mode, fn_model in runs.items():
                    cells, graph_cells = [], []
                    with context():
                        for n in args.lengths:
                            ids = torch.randint(1000, 2000, (batch, n), device=device)

                            def fwd():
                                with torch.no_grad():
                                    fn_model(ids)
                            cells.append(fmt(run_or_oom(lambda: measure(fwd, device, warmup=args.warmup,
                                                                        repeats=args.iters).median_ms)))
                            if args.graph and device.type == "cuda" and not mode:  # replayed: no host time
                                g = run_or_oom(lambda: graph_timed(fwd, device, args.iters))
                                graph_cells.append("n/a" if g is None else fmt(g))  # n/a: OOM or not capturable
                    row(rows, [f"{name}{setting}{mode}", batch, *cells])
                    if graph_cells:
                        row(rows, [f"{name}{setting} (CUDA graph)", batch, *graph_cells])
        del model, runs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return markdown_table(["attention", "batch", *(f"{n} tok (ms)" for n in args.lengths)], rows)


def graph_timed(fn, device, iters: int):
    """Median milliseconds of one replay of fn captured in a CUDA graph (kernels without launch
    overhead; None off CUDA or when fn cannot be captured)."""
    if device.type != "cuda":
        return None
    try:
        return measure(fn, device, warmup=1, repeats=max(5, iters), graph=True).median_ms
    except Exception as err:  # e.g. a host sync inside fn
        print(f"no CUDA graph: {type(err).__name__}: {str(err).splitlines()[0][:80]}", flush=True)
        return None


def decode_table(args, device, dtype, shapes):
    """Per-token decode latency with a cache of ctx tokens; on CUDA also the captured step replayed
    as a CUDA graph, i.e. the kernels alone: a decode step is a few dozen tiny kernels, so eager
    timing mostly measures launch overhead, which serving stacks remove with CUDA graphs."""
    modes = ("eager", "CUDA graph") if device.type == "cuda" else ("eager",)
    rows = []
    for shape_name, (hidden, heads) in shapes.items():
        torch.manual_seed(0)
        layers = {"mha": MultiHeadSelfAttention(hidden, heads), "mlra2": MLRAttention(hidden, heads, branches=2),
                  "mlra4": MLRAttention(hidden, heads, branches=4)}
        for b in (2, 4):  # the plain rows: the decode step in torch ops (on CUDA the default is the kernel)
            layers[f"mlra{b}"].decode_backend = "torch"
        if device.type == "cuda":  # the same MLRA layers with the absorbed-weight step (six launches, Triton kernels)
            for b in (2, 4):
                layers[f"mlra{b} triton"] = MLRAttention(hidden, heads, branches=b)
                layers[f"mlra{b} triton"].decode_backend = "triton"
        for name, layer in layers.items():
            layer = layer.to(device=device, dtype=dtype).eval()
            for batch in args.decode_batches:
                cells = {mode: [] for mode in modes}
                for ctx in args.contexts:
                    def bench():
                        cache = layer.new_cache(batch, ctx + args.iters + args.warmup + 1)
                        fill = {k: torch.randn_like(buf[:, :ctx]) for k, buf in cache.buffers.items()}
                        cache.append(**fill)                       # a full cache of ctx tokens
                        x = torch.randn(batch, 1, hidden, device=device, dtype=dtype)

                        def step():
                            with torch.no_grad():
                                layer(x, cache=cache)

                        def step_at_ctx():  # every replay appends at slot ctx and attends over ctx + 1
                            cache.length = ctx
                            step()
                        eager = measure(step, device, warmup=args.warmup, repeats=args.iters).median_ms
                        return eager, graph_timed(step_at_ctx, device, args.iters)
                    times = run_or_oom(bench) or (None, None)
                    for mode, ms in zip(modes, times):
                        cells[mode].append(fmt(ms) if ms is not None or mode == "eager" else "-")
                for mode in modes:
                    row(rows, [shape_name, name, layer.kv_cache_bytes_per_token(dtype), batch, mode, *cells[mode]])
    return markdown_table(["shape", "attention", "cache bytes/token/layer", "batch", "timing",
                           *(f"{c // 1024}K ctx (ms)" if c >= 1024 else f"{c} ctx (ms)" for c in args.contexts)], rows)


def skipping_table(args, device, dtype, shape):
    """HLA top-k against full HLA on the same random weights: relative error of the encoder output."""
    torch.manual_seed(0)
    full = MediagenTextEncoder(**{**shape, "attention": "hla"}).to(device=device, dtype=dtype).eval()
    ids = torch.randint(1000, 2000, (1, args.skip_length), device=device)
    rows = []
    with torch.no_grad():
        ref = full(ids).last_hidden_state.float()
        for route in ("token", "chunk"):
            for k in args.top_ks:
                full.set_hla_skipping(top_k=k, route=route)
                out = full(ids).last_hidden_state.float()
                err = ((out - ref).norm() / ref.norm()).item()
                cos = torch.nn.functional.cosine_similarity(out, ref, dim=-1).mean().item()
                row(rows, [f"top-{k}, {route} routing", f"{err:.4f}", f"{cos:.4f}"])
        full.set_hla_skipping(None, None, "token")
    return markdown_table(["variant", f"rel. L2 error vs full HLA at {args.skip_length} tok", "cosine"], rows)


@torch.no_grad()
def long_input_agreement(model, tok, prompts, length: int, top_k: int, route: str, device) -> float:
    """Held-out prompts concatenated into one ``length``-token document: mean token cosine between
    the encoder with top-k chunk skipping and without (prompts alone are shorter than one chunk,
    where skipping changes nothing)."""
    ids = [i for p in prompts for i in tok(p, add_special_tokens=False)["input_ids"]]
    ids = torch.tensor((ids * (length // max(1, len(ids)) + 1))[:length], device=device)[None]
    model.set_hla_skipping(top_k=top_k, route=route)
    skipped = model(ids).last_hidden_state.float()
    model.set_hla_skipping(None, None, "token")
    full = model(ids).last_hidden_state.float()
    model.set_hla_skipping(top_k=top_k, route=route)
    return torch.nn.functional.cosine_similarity(skipped, full, dim=-1).mean().item()


def distilled_skipping_table(args, device, dtype):
    """Chunk skipping on the distilled (shipped) HLA encoder, no retraining: mean token cosine to the
    same encoder without skipping on long documents of held-out prompts (prompts alone are shorter than
    one chunk, where skipping changes nothing)."""
    from mediagen.text.encoders import load_text_encoder, make_prompts
    enc = load_text_encoder(args.skip_distilled, torch_dtype=dtype, device=device)
    heldout = make_prompts(512, "heldout")
    rows = []
    for route in ("chunk", "token"):
        for k in args.top_ks:
            agree = long_input_agreement(enc.model, enc.tokenizer, heldout, args.skip_length, k, route, device)
            row(rows, [f"top-{k}, {route} routing", f"{agree:.4f}"])
    enc.model.set_hla_skipping(None, None, "token")
    return markdown_table(["variant", f"token cosine to full HLA, {args.skip_length}-token documents"], rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes, CPU-friendly smoke run")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"])
    p.add_argument("--lengths", type=int, nargs="+", default=[77, 512, 4096, 32768])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--attentions", nargs="+", default=[v for v in VARIANTS if v not in LONG_PATH_ONLY],
                   choices=list(VARIANTS), help="encoder variants (the -long ones only when named)")
    p.add_argument("--readout", nargs="+", default=None, metavar="FIELD=V1,V2",
                   help="HLA encoders' rows once per combination of these readout launch settings")
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768, 65536, 131072])
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--skip-length", type=int, default=8192)
    p.add_argument("--top-ks", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--skip-distilled", default=None,
                   help="a distilled HLA encoder folder (e.g. mediagen/checkpoints/text-hla): the skipping table "
                        "on it instead of random weights")
    p.add_argument("--graph", action="store_true",
                   help="encoding rows also replayed as CUDA graphs (on CUDA): time without the host's launches")
    p.add_argument("--compile", action="store_true", help="encoding rows also with torch.compile'd encoders")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--only", nargs="+", default=None, choices=TABLES, help="run only these tables")
    p.add_argument("--out", default=None, help="append the tables to this markdown file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.tiny:
        args.lengths, args.batches = [16, 64], [1, 2]
        args.contexts, args.decode_batches = [64, 256], [1]
        args.skip_length, args.top_ks = 128, [1, 2]
        args.warmup, args.iters = 1, 2
    if args.readout:
        from mediagen.text.kernels.hla.triton_readout import use_readout_settings

        try:
            args.readout = settings_grid(args.readout)
            for fields in args.readout:  # an unknown field fails here, before anything is timed
                with use_readout_settings(**fields):
                    pass
        except ValueError as err:
            p.error(f"--readout: {err}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    torch.backends.cuda.matmul.allow_tf32 = True
    from diffusers.utils import logging as diffusers_logging
    diffusers_logging.set_verbosity_error()                          # no dtype-cast notices in the tables
    shape = TINY_SHAPE if args.tiny else MINILM_SHAPE
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    header = (f"## Text encoders ({'tiny, ' if args.tiny else ''}{name}, {dtype}, torch {torch.__version__}, "
              f"fla {'yes' if fla_available() else 'no'})")
    print(header + "\n", flush=True)
    out = [header]
    tables = args.only or TABLES
    if "encode" in tables:
        out += ["### Encoding latency (forward, whole encoder)", encoding_table(args, device, dtype, shape)]
    if "decode" in tables:
        out += ["### Decode latency per token (one attention layer, cache of ctx tokens)",
                decode_table(args, device, dtype, TINY_DECODE if args.tiny else DECODE_SHAPES)]
    if "skipping" in tables and args.skip_distilled:
        out += [f"### HLA chunk skipping (beyond the paper) on the distilled encoder {args.skip_distilled}",
                distilled_skipping_table(args, device, dtype)]
    elif "skipping" in tables:
        out += ["### HLA chunk skipping (beyond the paper), random weights", skipping_table(args, device, dtype, shape)]
    text = "\n\n".join(out) + "\n"
    print("\n" + text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
