"""The data directory's storage lock and its repair, for the broker's start and for
``mqttamqp-admin recover``.

What it owns: naming the process that really holds the storage's lock (the kernel
knows it; the pid zc.lockfile wrote in the lock file may be a process long gone), and
the recovery workflow: take the lock (so no broker runs meanwhile), keep a copy of the
storage file and cut it after its last good transaction (``store.recover``).

What it must not do: import ZODB at import time (the broker's option parsing and the
admin tool's other commands import this module), or touch a storage it has not locked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqttamqp.store.recover import Recovery

__all__ = ["LOCK_SUFFIX", "StorageBusy", "lock_holder", "recover"]

LOCK_SUFFIX = ".lock"   # FileStorage's lock file: <storage file>.lock


class StorageBusy(Exception):
    """Another process holds the storage's lock (``str``: which)."""


def _key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _holders_from_proc(path: str) -> list[int]:
    """The processes whose open descriptors hold a lock on ``path`` (Linux: each
    descriptor's ``fdinfo`` lists the locks it holds). Empty if none is found or
    there is no /proc."""
    key = _key(path)
    if key is None:
        return []
    dev, ino = key
    # (as /proc/locks and fdinfo write it: "MAJOR:MINOR:INODE", the device in hex)
    tag = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino} "
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    holders: list[int] = []
    for pid in pids:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue   # gone, or not ours to read
        for fd in names:
            try:
                if _key(f"{fds}/{fd}") != key:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii",
                          errors="replace") as f:
                    info = f.read()
            except OSError:
                continue
            if any(line.startswith("lock:") and tag in line for line in info.splitlines()):
                holders.append(int(pid))
                break
    return holders


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return ""
    text = " ".join(w.decode("utf-8", "replace") for w in words if w)
    return text if len(text) <= 100 else text[:97] + "..."


def lock_holder(lock_path: str) -> str:
    """Who holds the lock on ``lock_path``, in words: "pid N (its command line)"
    for the process the kernel says holds it; else the pid the lock file names,
    marked as such; else "another process"."""
    holders = [pid for pid in _holders_from_proc(lock_path) if pid != os.getpid()]
    if holders:
        return ", ".join(f"pid {pid}" + (f" ({cmd})" if (cmd := _command(pid)) else "")
                         for pid in holders)
    try:
        with open(lock_path, encoding="ascii") as f:
            return f"pid {int(f.read().split()[0])} (as its lock file says)"
    except (OSError, ValueError, IndexError):
        return "another process"


def recover(data_dir: str, filename: str, now: float | None = None) -> Recovery:
    """Repair ``data_dir/filename`` (``store.recover.recover_file``) under its lock.
    Raises ``StorageBusy`` while another process (a broker) holds the lock,
    ``FileNotFoundError`` without a storage file, and what ``recover_file`` raises."""
    import zc.lockfile  # type: ignore[import-untyped]

    from mqttamqp.store.recover import recover_file

    path = os.path.join(data_dir, filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no storage file {path}")
    lock_path = path + LOCK_SUFFIX
    try:
        lock = zc.lockfile.LockFile(lock_path)
    except zc.lockfile.LockError:
        raise StorageBusy(lock_holder(lock_path)) from None
    try:
        return recover_file(path, now)
    finally:
        lock.close()
