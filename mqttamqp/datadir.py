"""The data directory: its storage opened at the broker's start with the lock that
keeps a second broker off it (``OpenAtStart``), the space left on it (``free_bytes``),
and its repair (``mqttamqp-admin recover``).

What it owns: naming the process that really holds the storage's lock (the kernel
knows it; the pid zc.lockfile wrote in the lock file may be a process long gone), and
the recovery workflow: take the lock (so no broker runs meanwhile), keep a copy of the
storage file and cut it after its last good transaction (``store.recover``).

What it must not do: import ZODB at import time (the broker's option parsing and the
admin tool's other commands import this module), or touch a storage it has not locked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, Snapshot

if TYPE_CHECKING:
    from mqttamqp.store.recover import Recovery

__all__ = ["LOCKFILE", "LOCK_SUFFIX", "OpenAtStart", "StorageBusy", "free_bytes", "lock_holder",
           "recover"]

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


LOCKFILE = "mqttamqp.lock"   # the data directory's lock when the storage has none


def free_bytes(path: str) -> int | None:
    """Bytes free to an unprivileged writer on the file system of ``path`` (the
    data directory: ``--disk-free-limit``); None while it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class OpenAtStart:
    """The store, opened when the broker first loads its state (in ``startService``),
    not when the service is assembled: option parsing and ``--help`` touch no files
    and no database, yet the broker gets its store at construction.

    Opening takes the lock that keeps a second broker off the same state: the
    FileStorage's own lock file; for other engines ``DATA/mqttamqp.lock``, and for
    PostgreSQL also an advisory lock on the database, held on a connection of its own
    while the broker runs (two boxes must not serve one database)."""

    def __init__(self, data_dir: str, reactor: Any, storage: str | None = None,
                 queue_body_budget: int = 0) -> None:
        """``queue_body_budget``: queue bodies ``load`` reads at most (the rest stay
        in storage: ``--queue-memory-budget``)."""
        self.data_dir = data_dir
        self.reactor = reactor
        self.storage = storage
        self.queue_body_budget = queue_body_budget
        self.opened: Any = None
        self._locks: list[Any] = []
        self.failed_lock = ""   # the lock file a failed open() could not take

    def open(self, lock: Any = None) -> None:
        """Take the locks, then open the storage.  ``lock``: the serving lock, taken
        already (``--ha``: the broker waited for it); the store then claims the next
        leader epoch (``store.fencing``) before anything is loaded."""
        if self.opened is not None:
            return
        from mqttamqp.store import (
            StorageUnavailable,
            ZODBStore,
            resolve_engine,
            serving_lock,
        )

        engine = resolve_engine(self.storage, self.data_dir)
        try:
            if not engine.locks_itself:
                import zc.lockfile

                # The data directory's lock, and an SQLite directory's own: two
                # brokers with other --data on one sqlite:///DIR must not both serve.
                paths = [os.path.join(self.data_dir, LOCKFILE)]
                if engine.kind == "sqlite" and engine.size_path != self.data_dir:
                    os.makedirs(engine.size_path, exist_ok=True)
                    paths.append(os.path.join(engine.size_path, LOCKFILE))
                for path in paths:
                    self.failed_lock = path
                    self._locks.append(zc.lockfile.LockFile(path, content_template="{pid}"))
                self.failed_lock = ""
            if lock is not None:
                self._locks.append(lock)
            elif engine.dsn:
                self._locks.append(serving_lock(engine))
            try:
                self.opened = ZODBStore(self.data_dir, self.reactor, engine=engine,
                                        queue_body_budget=self.queue_body_budget)
            except Exception as e:
                if engine.kind in ("file", "memory") or isinstance(e, OSError):
                    raise
                # RelStorage: the database refused, or is not there (one line).
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise StorageUnavailable(
                    f"cannot open the storage {engine.display}: {first}") from None
            if lock is not None:
                try:
                    self.opened.claim_epoch()
                except Exception as e:
                    self.opened.close()
                    self.opened = None
                    raise StorageUnavailable(f"cannot claim the leader epoch of "
                                             f"{engine.display}: {e}") from None
        except BaseException:
            self._release()
            raise

    def lock_path(self) -> str:
        """The lock file that keeps a second broker off this state: FileStorage's own
        beside its file, else the data directory's."""
        from mqttamqp.store import resolve_engine

        if self.failed_lock:
            return self.failed_lock
        engine = resolve_engine(self.storage, self.data_dir)
        if engine.locks_itself:
            return engine.size_path + LOCK_SUFFIX
        return os.path.join(self.data_dir, LOCKFILE)

    def describe(self) -> str:
        """The engine, for the log and the console (no password)."""
        return self.opened.engine.display if self.opened is not None else ""

    def load(self) -> Snapshot:
        self.open()
        return self.opened.load()  # type: ignore[no-any-return]

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        if self.opened is None:   # (a --ha standby: the console may still try)
            from twisted.internet.defer import fail

            from mqttamqp.store import StoreClosedError

            return fail(StoreClosedError("the store is not open (standby)"))
        return self.opened.submit(ops)  # type: ignore[no-any-return]

    def read_queue_messages(self, name: str, offsets: Sequence[int]
                            ) -> Deferred[list[tuple[int, Message]]]:
        return self.opened.read_queue_messages(name, offsets)  # type: ignore[no-any-return]

    def pack(self) -> Deferred[None]:
        return self.opened.pack()  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            if self.opened is not None:
                self.opened.close()
        finally:
            self._release()

    def _release(self) -> None:
        while self._locks:
            self._locks.pop().close()

    def stats(self) -> dict[str, Any] | None:
        return self.opened.stats() if self.opened is not None else None

    def disk_path(self) -> str:
        """The directory on whose file system the storage writes (``--disk-free-
        limit``): the storage file's directory, the SQLite directory; the data
        directory when its bytes are elsewhere (PostgreSQL) or before it is open."""
        path = self.opened.engine.size_path if self.opened is not None else ""
        if not path:
            return self.data_dir
        return path if os.path.isdir(path) else os.path.dirname(path)

    def free_bytes(self) -> int | None:
        """Free bytes where the storage writes (see ``disk_path``)."""
        return free_bytes(self.disk_path())

    def size_bytes(self) -> int:
        """The storage's bytes on this box (0 before it is open)."""
        if self.opened is None:
            return 0
        return self.opened.engine.size_bytes()  # type: ignore[no-any-return]
