"""Process-wide switches of the Triton launchers: one frozen record, and one way to change it.

``kernel_switches()`` is what a launcher reads; ``use_switches(**fields)`` replaces fields for the duration of a
``with`` block and restores the record when it exits (also by an exception):

    with use_switches(poison_outputs=True):
        ...   # every kernel output allocated here starts as NaN

The record is process-wide, not per thread: autograd runs a GPU backward on its own worker thread, and a test
that poisons outputs must poison the backward's too. (The MHLA kernels' tile settings, which a forward hands to
its own backward, are per thread: mhla/settings.py.)

- ``direct_launch``: a ``CachedLaunch`` calls the compiled kernel directly after its first launch (launch.py);
  off, every launch goes through Triton's dispatch. The environment's MEDIAGEN_DIRECT_LAUNCH=0 turns it off.
- ``poison_outputs``: outputs and workspaces that a kernel must write whole start as NaN (``empty_output``), so
  an element a kernel forgets shows up in a test instead of passing as whatever memory held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass(frozen=True)
class Switches:
    direct_launch: bool = True
    poison_outputs: bool = False


_current = Switches(direct_launch=os.environ.get("MEDIAGEN_DIRECT_LAUNCH", "1") != "0")


def kernel_switches() -> Switches:
    """The switches in force."""
    return _current


@contextlib.contextmanager
def use_switches(**fields) -> Iterator[Switches]:
    """These fields replaced for the block (process-wide); yields the switches in force. An unknown field raises
    ValueError naming the allowed ones."""
    global _current
    names = [f.name for f in dataclasses.fields(Switches)]
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ValueError(f"no kernel switch {', '.join(map(repr, unknown))}: the switches are {', '.join(names)}")
    saved = _current
    _current = dataclasses.replace(saved, **fields)
    try:
        yield _current
    finally:
        _current = saved


def empty_output(shape, device, dtype=torch.float32) -> torch.Tensor:
    """``torch.empty``, or NaN-filled under ``poison_outputs``."""
    if _current.poison_outputs:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)
