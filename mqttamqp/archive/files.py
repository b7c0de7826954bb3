"""The archive's temporary segment names, and the clean-up of what a crash left.

Apart from ``segments`` (which imports pyarrow) because the broker's process runs
``remove_leftovers`` before it starts the writer process and must not load Arrow
for it. This module must not import pyarrow, Twisted or the broker.
"""

from __future__ import annotations

import os

__all__ = ["TEMP_PREFIX", "TEMP_SUFFIX", "check_writable", "remove_leftovers"]

#: A segment being written is ``.part-<start>-<n>.parquet.tmp`` (see ``segments``).
TEMP_PREFIX = ".part-"
TEMP_SUFFIX = ".parquet.tmp"


def remove_leftovers(directory: str) -> list[str]:
    """Delete the temporary segments a crash left under ``directory``."""
    removed: list[str] = []
    if not os.path.isdir(directory):
        return removed
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
                path = os.path.join(root, name)
                try:
                    os.unlink(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
    return removed


def check_writable(directory: str) -> None:
    """Create ``directory`` if needed and write a probe file in it: a directory that
    exists may still be read-only, and the archive says so once, at start."""
    probe = os.path.join(directory, f".probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise RuntimeError(f"archive: cannot write to {directory}: {e.strerror}; "
                           "fix its permissions, choose --archive-dir, or run with "
                           "--no-archive") from None
