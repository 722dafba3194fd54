"""Freed memory kept by the C allocator between forwards, instead of returned to the system.

glibc returns a freed block at the top of its heap to the system once the free space passes a
trim threshold, and serves large blocks with `mmap`. A batched forward frees and allocates
blocks of a few megabytes at every step, so each step faulted its pages in again: on the demo
at two budgets that was about a quarter of the CPU time, spent as system time in page faults.
Raising both thresholds keeps the memory mapped for the next step. Only where memory comes from
changes; no number does.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters of glibc's malloc.h
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of freed heap
MMAP_THRESHOLD = 32 << 20  # blocks below 32 MiB (glibc's largest) come from the heap


def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds for this process; False where that is not
    possible (not Linux, or a C library without `mallopt`), and nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    )
