"""``ZODBStore``: the durable ``StateStore`` on a ZODB storage.

This module owns all ZODB I/O of the broker: opening the storage its ``Engine``
names (``engines``: FileStorage under the data directory by default, RelStorage on
SQLite or PostgreSQL; or the storage a ``storage_factory`` gives, e.g. a
``MappingStorage`` in unit tests), the single writer thread with natural group
commit, packing, and the start-up ``load()``.

Threading rules:

* ``load()`` runs once on the calling thread before serving.
* After that the reactor thread never touches ZODB: ``submit()`` only queues the ops
  and returns a Deferred; ``stats()`` reads counters and ``os.stat``s the file.
* The writer thread takes everything queued (up to ``max_batch_ops`` ops, never
  splitting one submit), applies it in order to its own connection, commits once
  (FileStorage fsyncs every commit, and so does SQLite as ``engines`` sets it up)
  and fires the Deferreds of that commit on the reactor thread through
  ``reactor.callFromThread``.  Whatever arrives during a commit goes into the next.
  A submit with the put of a QoS 1 entry just sent to an online subscriber
  (``PutQueued.online``), and every submit after it, may wait for a later commit
  (at most ``applying.HOLD_ROUNDS``): its subscriber's acknowledgement usually
  cancels the put first, and then neither it nor its delete is ever written.
* ``pack()`` runs in its own thread; FileStorage packs concurrently with commits.
* ``read_queue_messages()`` queues a request for the reader thread, which reads
  with a connection of its own (a new transaction per request: it sees every
  commit made before) and hands the messages to the reactor thread through
  ``reactor.callFromThread``.  It frees its connection's cache after each read,
  so the bodies it read are held only by the core.

It must not hold authoritative state (the core does), must not run ZODB work on the
reactor thread, and must not pickle ``mqttamqp.core`` classes (see ``models``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import transaction
from transaction.interfaces import NoTransaction
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorFromThreads
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from ZODB import DB

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import (
    Op,
    Snapshot,
)
from mqttamqp.store.applying import (
    HANDLERS,
    Trees,
    age_held,
    gather_window,
    split_held,
    superseded_puts,
)
from mqttamqp.store.engines import FILENAME, Engine
from mqttamqp.store.engines import resolve as resolve_engine
from mqttamqp.store.fencing import check, claim, lost_to
from mqttamqp.store.models import init_root, root_to_snapshot
from mqttamqp.store.reading import QueueReader

__all__ = ["FILENAME", "StorageFactory", "StoreClosedError", "ZODBStore"]

_log = Logger(namespace="mqttamqp.store")

# Returns a fresh ZODB storage (anything providing ``ZODB.interfaces.IStorage``), which
# the store owns from then on: closing the store closes it.
StorageFactory = Callable[[], Any]

_Waiter = tuple[tuple[Op, ...], "Deferred[None]"]
_Completion = tuple["Deferred[None]", Failure | None]


def _abort_if_open(tm: Any) -> None:
    """Abort a transaction left open (a failed commit in the last attempt does that)."""
    try:
        tm.get()
    except NoTransaction:
        return
    try:
        tm.abort()
    except Exception:  # logged; the commit has failed already
        _log.failure("abort after a failed commit failed")


class StoreClosedError(RuntimeError):
    """``submit()`` or ``pack()`` after ``close()`` (or after the writer died)."""


class Completions:
    """Results of the worker threads (the writer, packs), fired on the reactor thread
    in the order they were added."""

    def __init__(self, reactor: IReactorFromThreads) -> None:
        self._reactor = reactor
        self._items: deque[_Completion] = deque()
        self._lock = threading.Lock()
        self._draining = False  # touched only on the reactor thread (or in close())

    def add(self, items: list[_Completion]) -> None:
        """From a worker thread: hand results to the reactor thread."""
        with self._lock:
            self._items.extend(items)
        try:
            self._reactor.callFromThread(self.drain)
        except Exception:  # never lose results over a dead reactor
            # The reactor is gone; close() fires what is left.
            _log.failure("callFromThread failed; results wait for close()")

    def drain(self) -> None:
        """On the reactor thread (or in close()): fire finished Deferreds in order."""
        if self._draining:  # re-entered from a callback (e.g. one calling close())
            return
        self._draining = True
        try:
            while True:
                with self._lock:
                    if not self._items:
                        return
                    d, failure = self._items.popleft()
                if failure is None:
                    d.callback(None)
                else:
                    d.errback(failure)
        finally:
            self._draining = False


class ZODBStore:
    """A ``StateStore`` on a ZODB storage with one writer thread.

    By default the storage is ``FileStorage(<path>/mqttamqp.fs)``.  With ``engine``
    the store opens the storage that engine names (``path`` is then not used); with
    ``storage_factory``, the storage that factory returns (``self.path`` is empty
    and ``stats()`` reports a size of 0).

    Ops on a session that does not exist are ignored, except that ``PutQueued``,
    ``PutSubscription`` and ``PutInboundQos2`` create it implicitly unless a
    ``DeleteSession`` earlier in the same ``submit()`` removed it.

    ``close()`` is meant to be called on the reactor thread (or when no reactor
    runs): it fires the Deferreds of the final commits itself, so they fire even
    if the reactor is stopping.
    """

    def __init__(
        self,
        path: str,
        reactor: IReactorFromThreads,
        max_batch_ops: int = 5000,
        commit_attempts: int = 3,
        gather_seconds: float = 0.002,
        *,
        storage_factory: StorageFactory | None = None,
        engine: Engine | None = None,
        queue_body_budget: int = 0,
    ) -> None:
        """``queue_body_budget``: bytes of queue message bodies ``load()`` reads into
        memory at most (0: all); the others stay in storage, read back on demand
        (``read_queue_messages``)."""
        if max_batch_ops < 1:
            raise ValueError("max_batch_ops must be >= 1")
        if commit_attempts < 1:
            raise ValueError("commit_attempts must be >= 1")
        self._reactor = reactor
        self._max_batch_ops = max_batch_ops
        self._commit_attempts = commit_attempts
        if storage_factory is not None:
            engine = Engine("custom", "custom", storage_factory)
        elif engine is None:
            os.makedirs(path, exist_ok=True)
            engine = resolve_engine(None, path)
        self.engine = engine
        self.path: str = engine.size_path
        storage: Any = engine.factory()
        try:
            # (the object cache also bounded in bytes: a queue's buckets hold message
            # bodies, and 20,000 of them were gigabytes under a queue flood)
            self._db: Any = DB(storage, cache_size=20000, cache_size_bytes=16 << 20)
        except BaseException:
            storage.close()
            raise
        try:
            self._init_root()
        except BaseException:
            self._db.close()
            raise

        self._cond = threading.Condition()
        self._pending: deque[_Waiter] = deque()
        self._accepting = True
        self._stopping = False
        self._closed = False
        self._completions = Completions(reactor)
        self._idle = self._gathering = False   # the writer waits for work / gathers
        self._pack_lock = threading.Lock()
        self._pack_threads: set[threading.Thread] = set()
        self._queue_body_budget = queue_body_budget
        # --ha: the leader epoch every commit checks (None: none), and what a commit
        # that finds another leader's epoch calls (on the reactor thread).
        self.epoch: int | None = None
        self.on_fenced: Callable[[str], None] | None = None
        self.fenced = ""   # why commits stopped ("" while they go on)

        # Counters: written by the writer/pack threads, read by stats().
        self._pending_ops = 0
        self._submits = 0
        self._ops = 0
        self._batches = 0
        self._commits = 0
        self._failed_commits = 0
        self._gather = gather_seconds
        self._coalesced = 0
        self._held = 0
        self._rounds: dict[int, int] = {}   # writer thread: id of a held put -> commits
        self._last_commit_seconds = 0.0
        self._max_commit_seconds = 0.0
        self._commit_seconds = 0.0   # all commits' time, from taking a group to done
        self._last_batch_ops = 0
        self._max_batch_seen = 0
        self._packs = 0
        self._last_pack_seconds = 0.0

        self._queue_reader = QueueReader(self._db, reactor,
                                         lambda: StoreClosedError("store is closed"))
        self._writer = threading.Thread(
            target=self._run, name="mqttamqp-zodb-writer", daemon=False
        )
        self._writer.start()

    # -- StateStore ------------------------------------------------------------

    def load(self) -> Snapshot:
        """Read the whole durable state into plain objects (on the calling thread)."""
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            tm.begin()
            try:
                snapshot = root_to_snapshot(conn, self._queue_body_budget)
            finally:
                tm.abort()
            conn.cacheMinimize()
        finally:
            conn.close()
        return snapshot

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        """Queue ``ops`` for the next commit; the Deferred fires once it is durable.

        An empty ``ops`` is a barrier: it fires once everything submitted before
        is durable.  Unknown op types fail at once without affecting other submits.
        """
        batch = tuple(ops)
        for op in batch:
            if type(op) not in HANDLERS:
                return fail(TypeError(f"not a store operation: {op!r}"))
        d: Deferred[None] = Deferred()
        with self._cond:
            if not self._accepting:
                return fail(StoreClosedError("store is closed"))
            self._pending.append((batch, d))
            self._pending_ops += len(batch)
            self._submits += 1
            # (not while it gathers or commits: a GIL hand-off each, for nothing)
            if self._idle or (self._gathering
                              and self._pending_ops >= self._max_batch_ops):
                self._cond.notify()
        return d

    def read_queue_messages(self, name: str, offsets: Sequence[int]
                            ) -> Deferred[list[tuple[int, Message]]]:
        """The stored messages of queue ``name`` at ``offsets``, read on the reader
        thread; fires on the reactor thread."""
        return self._queue_reader.read(name, offsets)

    def pack(self, days: float = 0) -> Deferred[None]:
        """Drop revisions older than ``days`` days, in a thread; fires when done."""
        d: Deferred[None] = Deferred()
        with self._cond:
            if self._closed:
                return fail(StoreClosedError("store is closed"))
            thread = threading.Thread(
                target=self._pack_thread, args=(d, days), name="mqttamqp-zodb-pack",
                daemon=False,
            )
            self._pack_threads.add(thread)
            thread.start()
        return d

    def claim_epoch(self) -> int:
        """--ha: commit the next leader epoch (``fencing.claim``), checked in every
        commit from now on.  Before ``load()``."""
        self.epoch = claim(self._db, self._commit_attempts)
        return self.epoch

    def fence(self, reason: str, notify: bool = False) -> None:
        """Stop committing at once (the leadership is lost): what is queued or comes
        later fails (``StoreClosedError``); a commit under way finishes (what it
        commits precedes the new leader's epoch, so the new leader has it).
        ``notify``: call ``on_fenced(reason)`` on the reactor thread (the first time)."""
        with self._cond:
            first, self.fenced = not self.fenced, self.fenced or reason
            self._accepting = False
            leftover = list(self._pending)
            self._pending.clear()
            self._pending_ops = 0
        if leftover:
            err = Failure(StoreClosedError(f"not committed: {reason}"))
            self._completions.add([(d, err) for _, d in leftover])
        if first and notify and self.on_fenced is not None:
            self._reactor.callFromThread(self.on_fenced, reason)

    def close(self) -> None:
        """Stop accepting, commit what was submitted, fire its Deferreds, close.

        Idempotent.  Blocks until the writer (and any pack) is done.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._accepting = False
            self._stopping = True
            self._cond.notify_all()
            packs = list(self._pack_threads)
        reader = self._queue_reader.stop()
        self._writer.join()
        if reader is not None:
            reader.join()
        for thread in packs:
            thread.join()
        try:
            self._db.close()  # also closes the storage
        finally:
            self._completions.drain()

    def stats(self) -> dict[str, Any]:
        """Counters for the admin console; cheap and safe on the reactor thread."""
        return {
            "engine": self.engine.kind,
            "storage": self.engine.display,
            "path": self.path,
            "file_size_bytes": self.engine.size_bytes(),
            "submits": self._submits,          # submit() calls accepted
            "batches": self._batches,          # submits committed (or failed)
            "ops": self._ops,                  # ops committed
            "commits": self._commits,          # successful group commits
            "failed_commits": self._failed_commits,
            "coalesced_puts": self._coalesced,   # queue ops skipped (superseded_puts)
            "held_puts": self._held,   # puts held over a commit, each time (split_held)
            "last_commit_seconds": self._last_commit_seconds,
            "max_commit_seconds": self._max_commit_seconds,
            "commit_seconds": self._commit_seconds,   # summed over all commits
            "last_commit_ops": self._last_batch_ops,
            "max_commit_ops": self._max_batch_seen,
            "pending_submits": len(self._pending),
            "pending_ops": self._pending_ops,
            "packs": self._packs,
            "last_pack_seconds": self._last_pack_seconds,
            "packing": bool(self._pack_threads),
            "queue_reads": self._queue_reader.reads_done,
            "closed": self._closed,
            "epoch": self.epoch,               # --ha: this leader's epoch
            "fenced": self.fenced,
        }

    # -- internals ---------------------------------------------------------------

    def _init_root(self) -> None:
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            for attempt in tm.attempts(self._commit_attempts):
                with attempt:
                    init_root(conn.root())
        finally:
            conn.close()

    def _take(self) -> list[_Waiter] | None:
        """Block for work; return the next group (None once closed and drained; empty
        when ``fence`` took what it was gathering)."""
        with self._cond:
            while not self._pending and not self._stopping:
                self._idle = True
                self._cond.wait()
                self._idle = False
            if not self._pending:
                return None
            if self._gather > 0 and self._pending_ops < self._max_batch_ops and (
                    window := gather_window(self._pending, self._gather)):
                # Deliveries were just queued (to a session or a durable queue): their
                # acknowledgements usually follow within a millisecond, and a put
                # cancelled by its DeleteQueued or TrimQueue in the same commit is
                # never written (see superseded_puts).  A submit notifies the
                # condition only once the batch is full (or the store stops).
                deadline = time.monotonic() + window
                self._gathering = True
                while not self._stopping and self._pending_ops < self._max_batch_ops:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._gathering = False
                if not self._pending:   # fence() took them while it gathered
                    return []
            first = self._pending.popleft()
            group = [first]
            count = len(first[0])
            while self._pending:
                nxt = len(self._pending[0][0])
                if count + nxt > self._max_batch_ops:
                    break
                group.append(self._pending.popleft())
                count += nxt
            self._pending_ops -= count
            return group

    def _run(self) -> None:
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            while True:
                group = self._take()
                if group is None:
                    break
                if group:
                    self._commit(tm, conn, group)
        except BaseException:
            _log.failure("ZODB writer thread died")
            raise
        finally:
            conn.close()
            with self._cond:
                self._accepting = False
                leftover = list(self._pending)
                self._pending.clear()
                self._pending_ops = 0
            if leftover:
                err = Failure(StoreClosedError("ZODB writer stopped"))
                self._completions.add([(d, err) for _, d in leftover])

    def _commit(self, tm: Any, conn: Any, group: list[_Waiter]) -> None:
        started = time.monotonic()
        failure: Failure | None = None
        # (holds: not while closing, nor without a gather window; see ``split_held``)
        held: dict[int, list[Op]] | None = (
            {} if self._gather > 0 and not self._stopping else None)
        skip = superseded_puts(group, held)
        self._rounds = age_held(held, self._rounds) if held else {}
        carried: list[_Waiter] = []
        if held:
            self._held += sum(map(len, held.values()))
            group, carried = split_held(group, held)
            if not group:   # (all of it held over: no commit, no wake-up, no counts)
                self._carry(carried, None)
                return
            skip = superseded_puts(group)   # (only what is written with them)
        nops = sum(len(ops) for ops, _ in group)
        self._coalesced += len(skip)
        try:
            # (nothing left to write, and no leader epoch to check: no transaction)
            for attempt in (tm.attempts(self._commit_attempts)
                            if len(skip) < nops or self.epoch is not None else ()):
                with attempt:
                    if self.epoch is not None:
                        check(conn, self.epoch)
                    trees = Trees(conn.root())
                    for ops, _ in group:
                        trees.deleted.clear()
                        for op in ops:
                            if skip and id(op) in skip:
                                continue
                            HANDLERS[type(op)](trees, op)
        except Exception as e:  # any failure errbacks the whole commit
            failure = Failure()
            _abort_if_open(tm)
            if reason := lost_to(e, self.epoch):
                self.fence(reason, notify=True)
            # Debug only: the core logs one line per failing spell (CommitBatcher),
            # not a traceback per commit while the disk is full.
            _log.failure(
                "ZODB commit of {submits} submits ({ops} ops) failed",
                failure, submits=len(group), ops=nops, level=LogLevel.debug,
            )
        elapsed = time.monotonic() - started
        self._last_commit_seconds = elapsed
        self._max_commit_seconds = max(self._max_commit_seconds, elapsed)
        self._commit_seconds += elapsed
        self._batches += len(group)
        self._last_batch_ops = nops
        self._max_batch_seen = max(self._max_batch_seen, nops)
        if failure is None:
            self._commits += 1
            self._ops += nops
        else:
            self._failed_commits += 1
            self._rounds = {}
        self._completions.add([(d, failure) for _, d in group])
        if carried:   # (after those, in submit order; fence() fails what is queued at once)
            self._carry(carried, failure)

    def _carry(self, carried: list[_Waiter], failure: Failure | None) -> None:
        """Put what a commit held over back in front of the queue (or fail it)."""
        with self._cond:
            if not self.fenced and failure is None:
                self._pending.extendleft(reversed(carried))
                self._pending_ops += sum(len(ops) for ops, _ in carried)
                return
        err = failure or Failure(StoreClosedError(f"not committed: {self.fenced}"))
        self._completions.add([(d, err) for _, d in carried])

    def _pack_thread(self, d: Deferred[None], days: float) -> None:
        failure: Failure | None = None
        started = time.monotonic()
        try:
            try:
                with self._pack_lock:
                    self._db.pack(days=days)
                self._packs += 1
                self._last_pack_seconds = time.monotonic() - started
            except Exception:  # reported through the Deferred
                failure = Failure()
                _log.failure("ZODB pack failed", failure)
            self._completions.add([(d, failure)])  # before close() can stop waiting for us
        finally:
            with self._cond:
                self._pack_threads.discard(threading.current_thread())
