"""Freed heap handed back to the OS (glibc's `malloc_trim`), after work done on a second thread.

glibc gives each thread that allocates its own arena. numpy's arrays under glibc's mmap threshold (which rises
to 32 MiB once a large array is freed) come from the arena of the thread that made them, and what one thread
frees is reused only by that thread's later allocations. So once the analysis's insights thread ends, the
hundreds of MiB it freed stay resident, and the drawing that follows allocates beside them: a 1 GiB trace's
/analyze peaked at 1.53x its JSON with the thread and no trim, 1.44x with one (docs/benchmarks.md). A trim
takes a few ms.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_freed_heap() -> bool:
    """Hand every arena's free pages back to the OS; whether anything was released (False off glibc)."""
    trim = _malloc_trim()
    return bool(trim and trim(0))
