"""End-to-end latency: one forward of a whole diffusers transformer (``mediagen.models`` presets,
random weights) converted to each attention, over a sweep of token grids.

On a GPU the default is Wan2.1-1.3B size with 512 text tokens at growing frame counts of a
480x832 video; on a CPU a tiny Wan-style model (a smoke run). Rows are dicts with the model, the
token grid, N, the attention and the forward time in ms (median of repeats).
"""

from __future__ import annotations

import math

import torch

from . import tables
from .timing import measure

GPU_GRIDS = [(3, 30, 52), (6, 30, 52), (11, 30, 52), (21, 30, 52)]  # 9..81 frames at 480x832
CPU_GRIDS = [(1, 8, 8), (2, 8, 8), (4, 8, 8), (4, 16, 16)]


def bench_end_to_end(device="cpu", dtype=torch.float32, preset: str | None = None, grids=None,
                     attentions=("sdpa", "mhla", "linear"), text_tokens: int | None = None, repeats: int = 3):
    from ..models.convert import convert
    from ..models.presets import build_transformer, preset as get_preset

    device = torch.device(device)
    preset = preset or ("wan2.1-1.3b" if device.type == "cuda" else "wan-tiny")
    grids = grids or (GPU_GRIDS if device.type == "cuda" else CPU_GRIDS)
    info = get_preset(preset)
    if info["class"] != "WanTransformer3DModel":
        raise ValueError(f"--e2e-preset {preset!r} is not allowed: the sweep needs a Wan-style (video) preset")
    cfg = info["config"]
    patch = cfg["patch_size"]
    text_tokens = text_tokens or (512 if device.type == "cuda" else 16)
    rows = []
    for attention in attentions:
        torch.manual_seed(0)
        model = build_transformer(preset).eval()
        for grid in grids:
            convert(model, attention, grid=grid, reinit=True)  # each grid its own blocks
            model.to(device)
            if dtype != torch.float32:
                model.to(dtype=dtype)
            x = torch.randn(1, cfg["in_channels"], *(g * p for g, p in zip(grid, patch)), device=device, dtype=dtype)
            text = torch.randn(1, text_tokens, cfg["text_dim"], device=device, dtype=dtype)
            t = torch.full((1,), 500, device=device)

            def forward():
                with torch.no_grad():
                    model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)

            row = {"model": preset, "grid": "x".join(map(str, grid)), "N": math.prod(grid), "method": attention}
            try:
                row["fwd_ms"] = measure(forward, device, warmup=1, repeats=repeats).median_ms  # warm-up: compilation
            except Exception as err:  # e.g. out of memory for softmax at the largest grid
                row["fwd_ms"], row["note"] = None, type(err).__name__ + ": " + str(err).splitlines()[0][:60]
            rows.append(row)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def e2e_markdown_table(rows) -> str:
    base = {r["grid"]: r["fwd_ms"] for r in rows if r["method"] == "sdpa" and r.get("fwd_ms")}

    def speed(r):
        ms = r.get("fwd_ms")
        return f"{base[r['grid']] / ms:.2f}×" if ms and r["grid"] in base else "—"

    return tables.markdown_table(
        ["model", "grid", "N", "attention", "fwd ms", "speed-up vs sdpa", "note"],
        [[r["model"], r["grid"], r["N"], r["method"], "—" if r.get("fwd_ms") is None else f"{r['fwd_ms']:.2f}",
          speed(r), r.get("note", "")] for r in rows])
