"""The host allocator's state during a benchmark: warm (the default) or cold, and which it was.

glibc serves a request above its mmap threshold (at most 32 MB, however it is set) with a fresh
`mmap` and unmaps it on free, so every call of an op whose tensors exceed it pays for new pages:
the same table add measured 7 ms in one process and 20 ms in the next. A caching allocator (a
GPU's, or jemalloc) keeps memory instead. `warm` makes glibc do the same, through `mallopt`:
no `mmap` for large blocks (M_MMAP_MAX = 0) and no trimming of the heap (M_TRIM_THRESHOLD at
its maximum), so freed memory is reused. `cold` leaves glibc's defaults. There is no library
for this (it is two calls of glibc's own `mallopt`), hence ctypes here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

__all__ = ["STATES", "set_allocator", "allocator_state", "mapped_bytes"]

STATES = ("warm", "cold")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")
_state = "cold (glibc defaults)"


class _MallInfo2(ctypes.Structure):
    _names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in _names.split()]


@functools.cache  # find_library runs ldconfig in a subprocess: once is enough
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def set_allocator(state: str) -> str:
    """Put the host allocator in `state` ("warm" or "cold") -> the state as `allocator_state`
    says it. Warm is applied once and lasts for the process: call it before measuring. Without
    glibc nothing can be set, and the state says so."""
    global _state
    if state not in STATES:
        raise ValueError(f"allocator must be one of {', '.join(STATES)}, got {state!r}")
    env = [f"{k}={os.environ[k]}" for k in _ENV if k in os.environ]
    libc = _glibc()
    if libc is None:
        _state = "unknown (not glibc: its own defaults)"
    elif state == "warm":
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
        _state = "warm (glibc mallopt: no mmap, no trim)" if ok else "cold (mallopt refused)"
    else:
        _state = "cold (glibc defaults)" + (f", environment {' '.join(env)}" if env else "")
    return _state


def allocator_state() -> str:
    """What `set_allocator` last set in this process ("cold (glibc defaults)" before any call)."""
    return _state


def mapped_bytes() -> int | None:
    """Bytes glibc holds in mmap-ed blocks now (mallinfo2's hblkhd); None without glibc >= 2.33."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return int(libc.mallinfo2().hblkhd)
