"""Wan2.1-1.3B forward with sdpa vs mhla vs hybrid (Wan-MHLA-H) vs no self-attention, eager and
torch.compile, plus one self-attention layer (projections, norms, RoPE) at 31,500 tokens.

The "-rope" variants convert with rope="features" (RoPE on the MHLA features, the official recipe):
the plain MHLA layers see no token positions at all, since Wan's only position signal is that RoPE.

Uses diffusers' stock ``WanTransformer3DModel`` (random weights) converted by ``mediagen.convert``.
Prints markdown tables (append them to benchmarks/RESULTS.md).

    python -m benchmarks wan_model                               # 81 frames 480x832, then 720x1280
    python -m benchmarks wan_model --sizes 81x480x832 --modes eager --skip-layer
    python -m benchmarks wan_model --tiny                        # CPU smoke run of the whole script

(from the repository root)
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import warnings

import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

import mediagen
from benchmarks import common
from benchmarks.common import ProjectionsOnly, device_name, graph_breaks, markdown_table, reset_compiler
from mediagen.eval.timing import measure
from mediagen.models.attention_spec import AttentionSpec
from mediagen.models.latent_grid import LatentGrids
from mediagen.models.presets import build_transformer, preset
from mediagen.models.processors import WanMHLAProcessor

VARIANTS = ("sdpa", "sdpa-flash", "mhla", "mhla-rope", "hybrid", "hybrid-rope", "projections-only", "no-self-attn")


class NoSelfAttention:
    """Processor that drops self-attention entirely: the ceiling for any attention replacement."""

    def __call__(self, attn, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states)


def reset_self_attention(model):
    """Every self-attention layer back to Wan's stock processor (``common.reset_self_attention``)."""
    common.reset_self_attention(model, [block.attn1 for block in model.blocks], WanAttnProcessor)


def set_variant(model, variant: str, grid, blocks):
    """Give every self-attention layer of ``model`` the processor of ``variant``, whatever variant it ran
    before. sdpa lets torch pick its backend (cuDNN on an H200); sdpa-flash forces FlashAttention: the
    flash_attn package when it imports, else torch's flash backend."""
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not allowed: use one of {VARIANTS}")
    model.reset_attention_backend()
    reset_self_attention(model)
    if variant == "sdpa-flash":
        mediagen.convert(model, "sdpa", reinit=True)
        model.set_attention_backend("flash" if importlib.util.find_spec("flash_attn") else "_native_flash")
        return
    if variant in ("no-self-attn", "projections-only"):
        mediagen.convert(model, "sdpa", reinit=True)
        for block in model.blocks:
            block.attn1.set_processor(NoSelfAttention() if variant == "no-self-attn" else ProjectionsOnly())
        return
    attention = {"sdpa": "sdpa", "mhla": "mhla", "hybrid": "wan-mhla-h"}[variant.removesuffix("-rope")]
    with warnings.catch_warnings():  # the position-blind variants are measured on purpose
        warnings.filterwarnings("ignore", message=".*see no token positions")
        mediagen.convert(model, attention, blocks=blocks, grid=grid, reinit=True,
                         rope="features" if variant.endswith("-rope") else "none")


def parse_size(text: str):
    f, h, w = (int(x) for x in text.split("x"))
    return f, h, w


def whole_model(args, device, dtype):
    cfg = preset("wan-tiny" if args.tiny else "wan2.1-1.3b")
    vae_t, vae_s = (1, 1) if args.tiny else (4, 8)
    with torch.device(device):
        model = build_transformer(cfg).to(dtype).eval()
    params = sum(p.numel() for p in model.parameters()) / 1e9
    text = torch.randn(1, args.text_len, cfg["config"]["text_dim"], device=device, dtype=dtype)
    rows = []
    for size in args.sizes:
        frames, height, width = size
        lat = ((frames - 1) // vae_t + 1, height // vae_s, width // vae_s)
        p = cfg["config"]["patch_size"]
        grid = (lat[0] // p[0], lat[1] // p[1], lat[2] // p[2])
        blocks = args.blocks or mediagen.models.auto_blocks(grid)
        x = torch.randn(1, cfg["config"]["in_channels"], *lat, device=device, dtype=dtype)
        t = torch.tensor([500.0], device=device)
        base = {}
        for compiled in [m == "compile" for m in args.modes]:
            for variant in args.variants:
                set_variant(model, variant, grid, blocks)
                reset_compiler()
                fn = torch.compile(model, backend=args.compile_backend) if compiled else model

                def step():
                    with torch.no_grad():
                        fn(x, t, text, return_dict=False)

                torch.cuda.reset_peak_memory_stats() if device.type == "cuda" else None
                ms = measure(step, device, warmup=args.warmup, repeats=args.iters).median_ms
                base.setdefault(compiled, ms if variant == "sdpa" else None)
                speedup = f"{base[compiled] / ms:.2f}x" if base.get(compiled) else "-"
                breaks = graph_breaks() if compiled else "-"
                mem = f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if device.type == "cuda" else "-"
                rows.append([f"{frames}f {height}x{width}", math.prod(grid), "x".join(map(str, blocks)), variant,
                             "compile" if compiled else "eager", f"{ms:.1f}", speedup, breaks, mem])
                print(rows[-1], flush=True)
    header = ["size", "tokens", "blocks", "variant", "mode", "ms", "vs sdpa", "graph breaks", "peak GiB"]
    return f"Whole model ({params:.2f}B params, {args.text_len} text tokens)", markdown_table(header, rows)


def one_layer(args, device, dtype):
    """One WanAttention self-attention layer with its projections, q/k RMSNorm and RoPE."""
    from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed

    heads, head_dim = (2, 16) if args.tiny else (12, 128)
    grid = (3, 4, 6) if args.tiny else (21, 30, 50)  # the paper's 31,500 tokens
    dim = heads * head_dim
    n = math.prod(grid)
    with torch.device(device):
        attn = WanAttention(dim, heads, head_dim, eps=1e-6, processor=WanAttnProcessor()).to(dtype).eval()
        rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), 1024)
    rotary = rope(torch.empty(1, 1, grid[0], grid[1] * 2, grid[2] * 2, device=device))
    x = torch.randn(1, n, dim, device=device, dtype=dtype)
    grids = LatentGrids()
    grids.record(grid)
    rows = []
    block_sets = [args.blocks or ([1, 2, 2] if args.tiny else [3, 5, 10])]
    if not args.tiny and mediagen.models.auto_blocks(grid) not in block_sets:
        block_sets.append(mediagen.models.auto_blocks(grid))
    configs = [("sdpa", None, "none")] + [("mhla", b, r) for b in block_sets for r in ("none", "features")]
    configs.append(("linear", None, "none"))
    base = None
    for kind, blocks, rope_mode in configs:
        if kind == "sdpa":
            attn.set_processor(WanAttnProcessor())
        else:
            spec = AttentionSpec(layers=[kind], blocks=blocks, rope=rope_mode)
            proc = WanMHLAProcessor(kind, spec, heads=heads, head_dim=head_dim, query_dim=dim, ndim=3, grids=grids)
            attn.set_processor(proc.to(device=device, dtype=dtype))

        def step():
            with torch.no_grad():
                attn(x, None, None, rotary)

        ms = measure(step, device, warmup=args.warmup, repeats=args.iters * 4).median_ms
        base = base or ms
        label = kind if kind != "mhla" else f"mhla {'x'.join(map(str, blocks))}" + (" rope" if rope_mode != "none" else "")
        rows.append([label, n, f"{ms:.3f}", f"{base / ms:.2f}x"])
        print(rows[-1], flush=True)
    title = f"One self-attention layer ({heads}x{head_dim}, {n} tokens, projections + norms + RoPE)"
    return title, markdown_table(["attention", "tokens", "ms", "vs sdpa"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU in fp32: checks the script runs")
    ap.add_argument("--sizes", default=None, help="comma list of FRAMESxHEIGHTxWIDTH (default 81x480x832,81x720x1280)")
    ap.add_argument("--variants", default="sdpa,mhla,mhla-rope,hybrid,hybrid-rope,no-self-attn", help=f"comma list from {VARIANTS}")
    ap.add_argument("--blocks", default="3,5,10",
                    help="MHLA blocks (frames,height,width); default the paper's 3,5,10; 'auto' picks M^2 <= N")
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--modes", default="eager,compile", help="eager, compile or both (comma list)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--skip-layer", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default=None, help="also append the tables to this markdown file")
    args = ap.parse_args(argv)
    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        args.sizes = args.sizes or "3x8x12"
        args.text_len = min(args.text_len, 8)
        args.compile_backend = "eager" if args.compile_backend == "inductor" else args.compile_backend
        args.warmup, args.iters = 1, 1
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA GPU visible: run with --tiny for a CPU smoke run")
        device, dtype = torch.device("cuda"), torch.bfloat16
        args.sizes = args.sizes or "81x480x832,81x720x1280"
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in ("eager", "compile") for m in args.modes):
        ap.error(f"--modes {args.modes} not allowed: use eager, compile or eager,compile")
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants {bad} not allowed: use {VARIANTS}")
    if args.tiny and args.blocks == "3,5,10":
        args.blocks = "auto"
    args.blocks = None if args.blocks == "auto" else [int(b) for b in args.blocks.split(",")]
    torch.manual_seed(0)
    print(f"device: {device_name(device)}, dtype {dtype}, torch {torch.__version__}", flush=True)
    sections = []
    if not args.skip_model:
        sections.append(whole_model(args, device, dtype))
    if not args.skip_layer:
        sections.append(one_layer(args, device, dtype))
    text = "\n\n".join(f"### {title}\n\n{table}" for title, table in sections)
    print("\n" + text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(f"\n## Wan model benchmark ({device_name(device)}, {dtype})\n\n{text}\n")


if __name__ == "__main__":
    main()
