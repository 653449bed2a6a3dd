"""Freed memory kept by the process for its next allocation (glibc's malloc), for sampling on a CPU.

By default glibc returns the free top of its heap to the OS once it exceeds a threshold that follows the largest
recently freed block (about twice it), and serves blocks over another (up to 32 MiB) from fresh mappings. A
diffusion step allocates and frees the same few-MiB temporaries (attention scores, FFN activations) in every
layer, so the next forward faults those pages in again and the kernel zeroes them: on a 2-core CPU the shipped
class-to-image models' 8-step sampling at batch 4 took 575-615 ms (sdpa) and 720-749 ms (mhla) with the
defaults, and 474 and 493 ms with both thresholds at ``LIMIT`` (benchmarks/RESULTS.md, shipped image models);
training, whose activations stay alive for the backward, ran at the same speed either way. The console script
calls ``keep_freed_memory`` once at start; a program of one's own can too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LIMIT = 256 << 20  # bytes: blocks up to this size come from the heap, and as much free memory stays there


def keep_freed_memory(limit: int = LIMIT) -> bool:
    """Set glibc's trim and mmap thresholds to ``limit`` bytes; True if set (False elsewhere than glibc)."""
    if not isinstance(limit, int) or limit < 1 << 20:
        raise ValueError(f"limit={limit!r} is not allowed: use an int of at least 1 MiB (1048576)")
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return mallopt(_M_MMAP_THRESHOLD, limit) == 1 and mallopt(_M_TRIM_THRESHOLD, limit) == 1
