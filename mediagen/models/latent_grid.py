"""Handing the latent token grid to attention processors.

Diffusers' processors see only (B, N, C) token sequences, never the grid the tokens came from. A
forward pre-hook on the transformer reads the input's shape, computes the token grid
(frames/p_t, height/p_h, width/p_w) and records it in a ``LatentGrids`` object shared by the
model's processors, keyed by the token count N. Keying by N keeps it right when

- the batch changes (classifier-free guidance doubles B; the grid does not depend on B),
- the resolution changes between calls (each call records its own grid),
- gradient checkpointing recomputes a layer during backward, after later forwards may have run
  (the recompute finds its grid by its own N; only two resolutions with the same N in flight
  before one backward would be ambiguous, and then the most recent wins).
"""

from __future__ import annotations

import math


class LatentGrids:
    """Token grids by token count, filled by the transformer's pre-hook on every forward."""

    MAX_ENTRIES = 64

    def __init__(self):
        self.by_tokens: dict[int, tuple[int, ...]] = {}

    def record(self, grid: tuple[int, ...]) -> None:
        n = math.prod(grid)
        if n not in self.by_tokens and len(self.by_tokens) >= self.MAX_ENTRIES:
            self.by_tokens.pop(next(iter(self.by_tokens)))
        self.by_tokens[n] = grid

    def lookup(self, n_tokens: int) -> tuple[int, ...]:
        grid = self.by_tokens.get(n_tokens)
        if grid is None:
            raise RuntimeError(
                f"no latent grid recorded for {n_tokens} tokens: call the converted transformer itself "
                f"(its forward pre-hook records the grid); recorded: {self.by_tokens}"
            )
        return grid


def _input_tensor(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _check_divisible(shape, patch, names):
    for size, p, name in zip(shape, patch, names):
        if size % p:
            raise ValueError(f"hidden_states {name}={size} is not a multiple of the patch size {p}")


def video_grid(hidden_states, patch_size) -> tuple[int, int, int]:
    """(B, C, F, H, W) -> (F/p_t, H/p_h, W/p_w)."""
    f, h, w = hidden_states.shape[-3:]
    _check_divisible((f, h, w), patch_size, ("frames", "height", "width"))
    return (f // patch_size[0], h // patch_size[1], w // patch_size[2])


def image_grid(hidden_states, patch: int) -> tuple[int, int]:
    """(B, C, H, W) -> (H/p, W/p)."""
    h, w = hidden_states.shape[-2:]
    _check_divisible((h, w), (patch, patch), ("height", "width"))
    return (h // patch, w // patch)


def install_grid_hook(model, grid_of) -> LatentGrids:
    """Register (once) a pre-hook on ``model`` recording ``grid_of(model, hidden_states)``."""
    grids = getattr(model, "_mediagen_grids", None)
    if grids is not None:
        return grids
    grids = LatentGrids()

    def record_grid(module, args, kwargs):
        # looked up on the module, not closed over, so a deep copy records into its own grids
        module._mediagen_grids.record(grid_of(module, _input_tensor(args, kwargs)))

    model.register_forward_pre_hook(record_grid, with_kwargs=True)
    model._mediagen_grids = grids  # a plain attribute: neither saved nor moved between devices
    return grids
