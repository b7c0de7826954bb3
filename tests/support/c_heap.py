"""The C heap's bytes in use (glibc's ``mallinfo2``), for the tests that check a
native library (proton) neither leaks nor crashes over many rounds: memory Python's
own allocator and tracemalloc do not see."""

from __future__ import annotations

import ctypes
import gc

__all__ = ["c_heap_in_use"]


class _MallInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _MallInfo


def c_heap_in_use() -> int:
    """Bytes malloc has handed out and not had back, after a collection."""
    gc.collect()
    return int(_libc.mallinfo2().uordblks)
