"""Argument checks shared by the MHLA reference and kernels: each error names the parameter,
the value given and what is allowed."""

from __future__ import annotations

import math

import torch

from .layout import check_grid_blocks

FEATURE_MAPS = (None, "relu", "elu1")
# The kernels' constexpr code of each feature map: its index in FEATURE_MAPS (None is "none").
FEATURE_CODES = {name or "none": code for code, name in enumerate(FEATURE_MAPS)}
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


# Arguments that passed the checks, by everything the checks read (``_key``), with their (grid, blocks): a layer
# calls the op with the same shapes every step, and the checks cost more than the lookup.
_passed: dict = {}
_MAX_PASSED = 1024


def _exact_ints(x):
    """``x`` as a tuple when it is an int or a tuple or list of ints (bools and floats excluded, which compare
    equal to ints but are not allowed), else None."""
    if type(x) is int:
        return (x,)
    if type(x) is not tuple and type(x) is not list:
        return None
    for i in x:
        if type(i) is not int:
            return None
    return tuple(x)


def _key(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference):
    """A hashable key of everything ``check_mhla_args`` reads, or None when an argument cannot be keyed exactly
    (those calls are checked in full every time)."""
    grid, blocks = _exact_ints(grid), _exact_ints(blocks)
    if grid is None or blocks is None:
        return None
    try:
        return (type(q), type(k), type(v), type(mix), q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                q.device, k.device, v.device, mix.device, mix.shape, mix.dtype, grid, blocks, type(normalize),
                normalize, type(eps), eps, feature_map, type(scale), scale, reference)
    except AttributeError:  # not tensors: the full check says what is wrong
        return None


def check_mhla_args(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, *, reference=False):
    """Validate the arguments of ``mhla``/``mhla_reference``; return (grid, blocks) as tuples. Arguments equal
    to ones that passed before (same tensor types, shapes, dtypes and devices, same options) are not checked
    again. Under torch.compile the checks run in full at trace time and the cache is left alone: a traced lookup
    becomes a guard on the cache's contents, which the first call's insert then fails (one recompilation)."""
    if torch.compiler.is_compiling():
        return _check(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference)
    key = _key(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference)
    try:
        hit = _passed.get(key) if key is not None else None
    except TypeError:  # an unhashable option: checked in full
        key = hit = None
    if hit is not None:
        return hit
    result = _check(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference)
    if key is not None:
        if len(_passed) >= _MAX_PASSED:
            _passed.clear()
        _passed[key] = result
    return result


def _check(q, k, v, mix, grid, blocks, normalize, eps, feature_map, scale, reference):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, N, H, D); got {shape}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must have one shape (B, N, H, D); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    allowed = KERNEL_DTYPES + ((torch.float64,) if reference else ())
    if q.dtype not in allowed:
        raise ValueError(f"q has dtype {q.dtype}; allowed: {', '.join(map(str, allowed))}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device == getattr(mix, "device", q.device)):
        raise ValueError(
            f"q, k, v and mix must be on one device; got q {q.device}, k {k.device}, v {v.device}, "
            f"mix {getattr(mix, 'device', None)}"
        )
    B, N, H, D = q.shape
    if not reference and not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported: allowed {MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    grid, blocks = check_grid_blocks(grid, blocks, N)
    M = math.prod(blocks)
    if not isinstance(mix, torch.Tensor) or not mix.is_floating_point():
        raise ValueError(f"mix must be a floating-point tensor of shape ({M}, {M}) or ({H}, {M}, {M})")
    if tuple(mix.shape) not in ((M, M), (H, M, M)):
        raise ValueError(
            f"mix has shape {tuple(mix.shape)}; with blocks={blocks} (M={M}) and H={H} heads it must be "
            f"({M}, {M}) or ({H}, {M}, {M})"
        )
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"feature_map={feature_map!r} is not allowed: use one of {FEATURE_MAPS}")
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be True or False; got {normalize!r}")
    if normalize and scale is not None:
        raise ValueError(f"scale={scale!r} applies only with normalize=False; leave it None when normalizing")
    if not (isinstance(eps, (int, float)) and eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None; got {scale!r}")
    return grid, blocks


def feature(x: torch.Tensor, feature_map: str | None) -> torch.Tensor:
    """phi(x): the non-negative feature map (identity when the inputs already are features)."""
    if feature_map is None:
        return x
    if feature_map == "relu":
        return torch.relu(x)
    return torch.nn.functional.elu(x) + 1.0
