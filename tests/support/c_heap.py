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


def run_script(script: str) -> list[str]:
    """Run ``script`` (which may import this module and the other support modules)
    in a fresh interpreter, so that a crash of a native library fails the test that
    runs it instead of ending pytest; its printed words."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    support = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [support, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode not in (-signal.SIGABRT, -signal.SIGSEGV), (
        "killed by the heap check or a bad pointer: " + done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()
