"""Bytes one Wan2.1-1.3B-sized MHLA block keeps for backward, with the attention's output norm and to_out[0] fused
(``models.norm_linear``) and apart, and on a GPU the peak memory of a training step that checkpoints the block.

Saved bytes: the distinct storages autograd saves while ``blocks[0]`` runs forward with gradients on (parameters
left out), also scaled linearly to --scale-tokens (75,600: 81 frames at 720x1280). A gradient-checkpointed block
keeps these while its backward runs, so the difference is what the block's backward peak loses. On a CPU torch's
RMSNorm is its composite ops, which save more than the CUDA kernel does (an fp32 copy of the input and x * rstd):
the difference there overstates a GPU's, where it is the norm's output alone.

    python -m benchmarks saved_activations                     # 4 x 64 x 64 latent (4,096 tokens), bf16 autocast
    python -m benchmarks saved_activations --latent 21x90x160 --peak    # 720p on a GPU: saved bytes and step peaks
    python -m benchmarks saved_activations --tiny              # CPU smoke run
    python -m benchmarks saved_activations --latent 21x90x160 --peak --sdpa   # and the softmax block beside it

With --sdpa the same block with its softmax attention (as diffusers builds it) is measured too: what MHLA keeps beyond
softmax for backward, and the checkpointed step's peak of each. With --compile (and --peak) the checkpointed step's
peak is measured compiled as well, as ``train.compile`` compiles it (--compile-scope: the whole model as one graph,
each block on its own, or both); --layers N builds N blocks (each checkpointed: a compiled graph that holds a block's
activations past its checkpoint shows as a peak growing with N).

(from the repository root)
"""

from __future__ import annotations

import argparse
import math

import torch

import mediagen
from mediagen.models.norms import cast_rms_norms
from mediagen.models.presets import build_transformer, preset
from mediagen.training.trainer import compile_for_training


def saved_bytes(model, module, inputs, autocast: bool) -> int:
    """Bytes of the distinct tensors (by storage) autograd saves during ``module``'s forward inside the model's
    forward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    pre = module.register_forward_pre_hook(lambda *a: hooks.__enter__())
    post = module.register_forward_hook(lambda *a: hooks.__exit__(None, None, None))
    try:
        with torch.autocast(inputs["hidden_states"].device.type, dtype=torch.bfloat16, enabled=autocast):
            model(**inputs)
    finally:
        pre.remove()
        post.remove()
    return sum(storages.values())


def step_peak(model, inputs, autocast: bool) -> int:
    """Peak CUDA memory (bytes) of one forward and backward, less what was allocated before it."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs, return_dict=False)[0]
    out.float().square().mean().backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks saved_activations", description=__doc__.split("\n")[0])
    parser.add_argument("--latent", default="4x64x64", help="latent frames x height x width (tokens: F x H/2 x W/2)")
    parser.add_argument("--blocks", default=None, help="MHLA blocks per axis, e.g. 2x4x4 (default: auto)")
    parser.add_argument("--out-norm", choices=["all", "per_head", "both"], default="both")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="bf16: autocast, as training runs")
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--scale-tokens", type=int, default=75_600)
    parser.add_argument("--peak", action="store_true", help="(CUDA) also the peak memory of a checkpointed step")
    parser.add_argument("--tiny", action="store_true", help="a 2-head 32-wide block on a 3x8x8 latent (CPU smoke)")
    parser.add_argument("--sdpa", action="store_true", help="also the block with softmax attention (not converted)")
    parser.add_argument("--compile", action="store_true", help="with --peak: also the checkpointed step compiled")
    parser.add_argument("--compile-scope", choices=["model", "blocks", "both"], default="model",
                        help="with --compile: train.compile_scope to measure (both: one after the other)")
    parser.add_argument("--layers", type=int, default=1, help="blocks in the model (saved bytes: the first's)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.peak and device.type != "cuda":
        parser.error("--peak needs a CUDA device")
    if args.compile and not args.peak:
        parser.error("--compile measures the step's peak: give --peak too")
    if args.layers < 1:
        parser.error(f"--layers {args.layers} is not allowed: use 1 or more")
    try:
        frames, height, width = (3, 8, 8) if args.tiny else map(int, args.latent.split("x"))
        blocks = [int(b) for b in args.blocks.split("x")] if args.blocks else None
    except ValueError:
        parser.error(f"--latent {args.latent!r} / --blocks {args.blocks!r}: use FxHxW, e.g. 21x90x160 and 3x5x10")
    overrides = dict(num_layers=args.layers)
    if args.tiny:
        overrides.update(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, text_dim=32)
    autocast = args.dtype == "bf16"
    grid = (frames, height // 2, width // 2)
    tokens = math.prod(grid)
    g = torch.Generator().manual_seed(0)
    rows = []
    norms = {"per_head": ["per_head"], "all": [True], "both": ["per_head", True]}[args.out_norm]
    cfg = dict(preset("wan2.1-1.3b")["config"], **overrides)
    inputs = dict(hidden_states=torch.randn(1, cfg["in_channels"], frames, height, width, generator=g).to(device),
                  timestep=torch.tensor([500.0], device=device),
                  encoder_hidden_states=torch.randn(1, 8 if args.tiny else args.text_tokens, cfg["text_dim"],
                                                    generator=g).to(device))

    def built(out_norm):
        """The one-block model: MHLA with ``out_norm``, or softmax (None)."""
        torch.manual_seed(0)
        model = build_transformer("wan2.1-1.3b", **overrides)
        if out_norm is not None:
            mediagen.convert(model, "mhla", rope="features", out_norm=out_norm, grid=grid, blocks=blocks)
        cast_rms_norms(model)  # as the training components do
        return model.to(device).train()

    def fuse(model, fused):
        for block in model.blocks:
            block.attn1.processor.fuse_out_norm_linear = fused

    scopes = ["model", "blocks"] if args.compile_scope == "both" else [args.compile_scope]

    def compiled_peaks(model, into):
        """The checkpointed step's peak compiled per scope, as ``train.compile`` compiles it (after a step that
        compiles it), into ``into["peak compiled SCOPE"]``; the model is left uncompiled."""
        for scope in scopes:
            torch._dynamo.reset()
            compile_for_training(model, scope)
            step_peak(model, inputs, autocast)
            into[f"peak compiled {scope}"] = step_peak(model, inputs, autocast)
            for module in model.modules():
                module._compiled_call_impl = None
            torch._dynamo.reset()

    for out_norm in norms:
        model = built(out_norm)
        result = {}
        for fused in (False, True):
            fuse(model, fused)
            result[fused] = saved_bytes(model, model.blocks[0], inputs, autocast)
        row = dict(out_norm="per_head" if out_norm == "per_head" else "all heads", tokens=tokens,
                   apart=result[False], fused=result[True])
        if args.peak:
            model.enable_gradient_checkpointing()
            for fused in (False, True):
                fuse(model, fused)
                step_peak(model, inputs, autocast)  # warm-up (kernels compiled, allocator settled)
                row["peak fused" if fused else "peak apart"] = step_peak(model, inputs, autocast)
            if args.compile:
                compiled_peaks(model, row)
        rows.append(row)
        del model
    softmax = None
    if args.sdpa:
        model = built(None)
        softmax = dict(out_norm="softmax", tokens=tokens, saved=saved_bytes(model, model.blocks[0], inputs, autocast))
        if args.peak:
            model.enable_gradient_checkpointing()
            step_peak(model, inputs, autocast)
            softmax["peak"] = step_peak(model, inputs, autocast)
            if args.compile:
                compiled_peaks(model, softmax)
        del model

    scale = args.scale_tokens / tokens
    mib = 2 ** 20

    def compiled(row):
        """The row's compiled peaks as printed ("" without --compile)."""
        return "".join(f"; compiled ({s}) {row[f'peak compiled {s}'] / mib:.0f} MiB" for s in scopes if args.compile)
    channels = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device: {where}; dtype {args.dtype}; latent {frames}x{height}x{width} = {tokens} tokens; width {channels}")
    for row in rows:
        less = row["apart"] - row["fused"]
        print(f"{row['out_norm']:>9}: saved per block {row['apart'] / mib:.1f} MiB apart, "
              f"{row['fused'] / mib:.1f} MiB fused, {less / 1024:.1f} KiB less; at {args.scale_tokens} tokens "
              f"(x{scale:.2f}): {row['apart'] * scale / mib:.0f} -> {row['fused'] * scale / mib:.0f} MiB, "
              f"{less * scale / mib:.0f} MiB less")
        if args.peak:
            print(f"{'':>9}  step peak {row['peak apart'] / mib:.0f} MiB apart, {row['peak fused'] / mib:.0f} MiB "
                  f"fused ({(row['peak apart'] - row['peak fused']) / mib:.0f} MiB less)"
                  + compiled(row))
    if softmax is not None:
        print(f"  softmax: saved per block {softmax['saved'] / mib:.1f} MiB; at {args.scale_tokens} tokens "
              f"{softmax['saved'] * scale / mib:.0f} MiB" + (f"; step peak {softmax['peak'] / mib:.0f} MiB"
                                                            if args.peak else "")
              + compiled(softmax))
        rows.append(softmax)
    return rows


if __name__ == "__main__":
    main()
