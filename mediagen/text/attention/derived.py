"""Weights a layer derives from its parameters for a short-sequence path (fused projections, absorbed
up-projections, folded norm weights), and the position tables such a path reads.

Derived weights are rebuilt on every call that records gradients, so the path stays differentiable
and trains the parameters themselves; otherwise they are cached until a parameter changes (an
optimizer step in place, a replaced tensor, a move or a cast), so an inference call pays no
weight arithmetic. Under torch.compile they are rebuilt too: the compiled graph then holds them.
"""

from __future__ import annotations

import weakref
from functools import lru_cache
from typing import Callable

import torch
from torch import nn

from .rope import rope_tables

# Parameters and submodules registered anywhere in the process so far. A layer's parameter list is kept
# between calls while this count stands still: walking ``module.parameters()`` took three quarters of a
# cached ``get`` (17 of 23 us on the CPU, per layer and forward), and a parameter or submodule can only
# be swapped in through a registration, which moves the count.
_registrations = 0


def _count_registration(*args) -> None:
    global _registrations
    _registrations += 1


nn.modules.module.register_module_parameter_registration_hook(_count_registration)
nn.modules.module.register_module_module_registration_hook(_count_registration)


class DerivedWeights:
    """``get(module)`` returns ``build(module)``'s dict of tensors, cached as the module docstring says.
    ``build`` takes the module as its argument (an unbound method), so this object holds no reference to
    the module and copies with it (the parameter list it keeps is dropped from copies)."""

    def __init__(self, build: Callable[[nn.Module], dict[str, torch.Tensor]]):
        self.build = build
        self._key = None
        self._value: dict[str, torch.Tensor] | None = None
        self._params = None  # (weak reference to the module, _registrations, its parameters)
        self._held: list[torch.Tensor] = []

    def __getstate__(self):  # a copy rebuilds its weights from its own parameters on its first call
        return {**self.__dict__, "_key": None, "_value": None, "_params": None, "_held": []}

    def _parameters(self, module: nn.Module) -> list:
        kept = self._params
        if kept is None or kept[1] != _registrations or kept[0]() is not module:
            kept = self._params = (weakref.ref(module), _registrations, list(module.parameters()))
        return kept[2]

    def get(self, module: nn.Module) -> dict[str, torch.Tensor]:
        if torch.compiler.is_compiling():
            return self.build(module)
        params = self._parameters(module)
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return self.build(module)
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._value is None or key != self._key:
            # made outside inference mode, so that a later call that records gradients may use them
            with torch.inference_mode(False), torch.no_grad():
                self._value = self.build(module)
            # the key's storages are held, so no other tensor (a cast, a move) can take their addresses
            # while the key names them: an equal address is the same storage, and its version says the rest
            self._key, self._held = key, [p.detach() for p in params]
        return self._value


# (dim, base, lead, device, dtype) -> (cos, sin) tables of positions 0 .. L-1, the longest L asked for so far
_POSITION_TABLES: dict[tuple, tuple[torch.Tensor, ...]] = {}


def arange_rope_tables(n: int, dim: int, base: float, device, dtype, *, lead: int = 0):
    """``rope_tables`` of positions 0 .. n-1, each (n, lead + dim), with ``lead`` leading columns that
    pass a vector through unrotated: the cosine table starts with ``lead`` ones and the signed sine
    table with ``lead`` zeros. Cached per (dim, base, lead, device, dtype) for the longest n asked for,
    and sliced: row t depends on t alone, so a slice equals the tables computed for n positions."""
    key = (dim, float(base), lead, torch.device(device), dtype)
    tables = None if torch.compiler.is_compiling() else _POSITION_TABLES.get(key)
    if tables is None or tables[0].shape[0] < n:
        length = max(n, 2 * tables[0].shape[0]) if tables is not None else max(n, 128)
        with torch.inference_mode(False):  # constants that a later call may save for its backward
            cos, sin = rope_tables(torch.arange(length, device=device), dim, base, dtype=dtype)
            if lead:
                cos = torch.cat([cos.new_ones(length, lead), cos], dim=-1)
                sin = torch.cat([sin.new_zeros(length, lead), sin], dim=-1)
        tables = (cos, sin)
        if not torch.compiler.is_compiling():
            _POSITION_TABLES[key] = tables
    return tables[0][:n], tables[1][:n]


def arange_rope_views(n: int, dim: int, base: float, device, dtype, *, lead: int = 0):
    """Views of ``arange_rope_tables``' (cos, sin) for n positions as a short path reads them: the rotated
    columns alone (``[:, lead:]``, (n, dim)) and the whole tables with a head axis ((n, 1, lead + dim)), as
    (cos_rotated, sin_rotated, cos_heads, sin_heads). Kept for the last few n: at prompt lengths the layer's
    time is the host's, and this is one call per layer where slicing the tables was six."""
    if torch.compiler.is_compiling():
        return _rope_views(n, dim, base, device, dtype, lead)
    return _cached_rope_views(int(n), dim, float(base), torch.device(device), dtype, lead)


def _rope_views(n, dim, base, device, dtype, lead):
    cos, sin = arange_rope_tables(n, dim, base, device, dtype, lead=lead)
    return cos[:, lead:], sin[:, lead:], cos[:, None], sin[:, None]


@lru_cache(maxsize=8)
def _cached_rope_views(n, dim, base, device, dtype, lead):
    with torch.inference_mode(False):
        return _rope_views(n, dim, base, device, dtype, lead)


def strictly_upper(n: int, device) -> torch.Tensor:
    """(n, n) bool, True above the diagonal: the pairs (t, s), s > t, that causal attention masks out.
    Cached for the last few (n, device): a short path asks for it in every layer."""
    if torch.compiler.is_compiling():
        return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return _strictly_upper(int(n), torch.device(device))


@lru_cache(maxsize=8)
def _strictly_upper(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
