"""Opening the store when the broker starts (not when it is assembled), with the
lock that keeps a second broker off the same state, and the disk figures the
queue budget and the console read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, Snapshot
from mqttamqp.datadir import LOCK_SUFFIX

__all__ = ["LOCKFILE", "OpenAtStart", "free_bytes"]


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

    def open(self) -> None:
        """Take the locks, then open the storage."""
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
                import zc.lockfile  # type: ignore[import-untyped]

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
            if engine.dsn:
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
