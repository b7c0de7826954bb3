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
    ClearRetained,
    DeleteBan,
    DeleteInboundQos2,
    DeleteQueue,
    DeleteQueued,
    DeleteQueueGroup,
    DeleteQueueMessage,
    DeleteRetained,
    DeleteSession,
    DeleteSubscription,
    DeleteWill,
    Op,
    PutBan,
    PutInboundQos2,
    PutQueue,
    PutQueued,
    PutQueueGroup,
    PutQueueMessage,
    PutRetained,
    PutSession,
    PutSubscription,
    PutWill,
    QueueDone,
    Snapshot,
    TrimQueue,
)
from mqttamqp.store.engines import FILENAME, Engine
from mqttamqp.store.engines import resolve as resolve_engine
from mqttamqp.store.models import (
    PersistentQueue,
    PersistentSession,
    advance_floor,
    ban_to_record,
    group_to_record,
    init_root,
    message_to_record,
    new_done_set,
    queue_to_record,
    queued_to_record,
    record_to_ban,
    record_to_message,
    record_to_will,
    session_to_record,
    will_to_record,
)

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


class _Trees:
    """The root's BTrees, fetched once per commit attempt."""

    __slots__ = ("bans", "deleted", "queues", "retained", "sessions", "wills")

    def __init__(self, root: Any) -> None:
        self.bans: Any = root["bans"]
        self.queues: Any = root["queues"]
        self.retained: Any = root["retained"]
        self.wills: Any = root["wills"]
        self.sessions: Any = root["sessions"]
        # Sessions removed by DeleteSession earlier in the current submit: later
        # session ops of the same submit do not resurrect them implicitly.
        self.deleted: set[str] = set()


def _session_for_put(t: _Trees, client_id: str) -> PersistentSession | None:
    session: PersistentSession | None = t.sessions.get(client_id)
    if session is None and client_id not in t.deleted:
        session = PersistentSession(client_id)
        t.sessions[client_id] = session
    return session


def _put_retained(t: _Trees, op: PutRetained) -> None:
    t.retained[op.message.topic] = message_to_record(op.message)


def _delete_retained(t: _Trees, op: DeleteRetained) -> None:
    t.retained.pop(op.topic, None)


def _clear_retained(t: _Trees, op: ClearRetained) -> None:
    if len(t.retained):
        t.retained.clear()


def _put_will(t: _Trees, op: PutWill) -> None:
    t.wills[op.will.owner] = will_to_record(op.will)


def _delete_will(t: _Trees, op: DeleteWill) -> None:
    t.wills.pop(op.owner, None)


def _put_session(t: _Trees, op: PutSession) -> None:
    t.deleted.discard(op.client_id)
    session = _session_for_put(t, op.client_id)
    assert session is not None
    if session.last_seen != op.last_seen:
        session.last_seen = float(op.last_seen)
    if op.owner is not None and session.owner != op.owner:
        session.owner = op.owner
    if session.expiry != op.expiry:
        session.expiry = None if op.expiry is None else float(op.expiry)


def _delete_session(t: _Trees, op: DeleteSession) -> None:
    t.sessions.pop(op.client_id, None)
    t.deleted.add(op.client_id)


def _put_subscription(t: _Trees, op: PutSubscription) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.subscriptions[op.topic_filter] = int(op.qos)


def _delete_subscription(t: _Trees, op: DeleteSubscription) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.subscriptions.pop(op.topic_filter, None)


def _put_queued(t: _Trees, op: PutQueued) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.queue[int(op.seq)] = queued_to_record(op.entry)


# Ops an acknowledgement usually cancels within a millisecond (see _take).
_GATHER_FOR = (PutQueued, PutQueueMessage)


def _superseded_puts(group: list[_Waiter]) -> set[int]:
    """ids of PutQueued ops whose entry a later DeleteQueued in the same commit removes
    (and of PutQueueMessage ops a later TrimQueue or DeleteQueue removes).

    A subscriber that acknowledges within one commit window makes the queue write
    pointless: skipping it (and keeping the delete, which may remove a record from
    an earlier commit) leaves the same state with far fewer bucket writes.
    """
    pending: dict[tuple[str, int], list[int]] = {}
    # Durable queues likewise: a message consumed by every group before the commit
    # is trimmed in it (queue -> [(offset, id of its PutQueueMessage)]).
    appended: dict[str, list[tuple[int, int]]] = {}
    skip: set[int] = set()
    for ops, _ in group:
        for op in ops:
            kind = type(op)
            if kind is PutQueueMessage:
                appended.setdefault(op.queue, []).append(  # type: ignore[union-attr]
                    (op.offset, id(op)))  # type: ignore[union-attr]
            elif kind is TrimQueue:
                appends = appended.get(op.queue)  # type: ignore[union-attr]
                if appends:
                    upto = op.upto  # type: ignore[union-attr]
                    skip.update(i for o, i in appends if o < upto)
                    appended[op.queue] = [  # type: ignore[union-attr]
                        a for a in appends if a[0] >= upto]
            elif kind is DeleteQueue:
                skip.update(i for _, i in appended.pop(op.name, ()))  # type: ignore[union-attr]
            elif kind is PutQueued:
                pending.setdefault((op.client_id, op.seq), []).append(id(op))  # type: ignore[union-attr]
            elif kind is DeleteQueued:
                puts = pending.pop((op.client_id, op.seq), None)  # type: ignore[union-attr]
                if puts:
                    skip.update(puts)
            elif kind is DeleteSession:
                client = op.client_id  # type: ignore[union-attr]
                for key in [k for k in pending if k[0] == client]:
                    del pending[key]
    return skip


def _delete_queued(t: _Trees, op: DeleteQueued) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.queue.pop(int(op.seq), None)


def _put_inbound_qos2(t: _Trees, op: PutInboundQos2) -> None:
    session = _session_for_put(t, op.client_id)
    if session is not None:
        session.inbound_qos2.add(int(op.packet_id))


def _delete_inbound_qos2(t: _Trees, op: DeleteInboundQos2) -> None:
    session = t.sessions.get(op.client_id)
    if session is not None:
        session.inbound_qos2.discard(int(op.packet_id))


def _put_ban(t: _Trees, op: PutBan) -> None:
    t.bans[(op.kind, op.value)] = ban_to_record(op)


def _delete_ban(t: _Trees, op: DeleteBan) -> None:
    t.bans.pop((op.kind, op.value), None)


def _queue_for_put(t: _Trees, name: str) -> PersistentQueue:
    queue: PersistentQueue | None = t.queues.get(name)
    if queue is None:
        queue = PersistentQueue(name)
        t.queues[name] = queue
    return queue


def _put_queue(t: _Trees, op: PutQueue) -> None:
    queue = _queue_for_put(t, op.name)
    retention = tuple(op.retention)
    if queue.retention != retention:
        queue.retention = retention


def _delete_queue(t: _Trees, op: DeleteQueue) -> None:
    t.queues.pop(op.name, None)


def _put_queue_message(t: _Trees, op: PutQueueMessage) -> None:
    # (queue messages keep their AMQP form: native receivers get them as sent)
    _queue_for_put(t, op.queue).log[int(op.offset)] = message_to_record(op.message)


def _delete_queue_message(t: _Trees, op: DeleteQueueMessage) -> None:
    queue = t.queues.get(op.queue)
    if queue is not None:
        queue.log.pop(int(op.offset), None)
        if op.offset >= queue.tail:   # (its offset is never given out again)
            queue.tail = int(op.offset) + 1


def _trim_queue(t: _Trees, op: TrimQueue) -> None:
    queue = t.queues.get(op.queue)
    if queue is None or op.upto <= queue.head:
        return
    upto = int(op.upto)
    log = queue.log
    for offset in list(log.keys(max=upto, excludemax=True)):
        del log[offset]
    queue.head = upto
    # (done offsets below the head are of no use any more: the floors move up)
    for key, record in list(queue.groups.items()):
        if record[2] == "classic" and record[3] < upto:
            queue.groups[key] = advance_floor(record, _done_set(queue, key), upto)


def _done_set(queue: PersistentQueue, key: str) -> Any:
    done = queue.done.get(key)
    if done is None:
        done = queue.done[key] = new_done_set()
    return done


def _queue_done(t: _Trees, op: QueueDone) -> None:
    queue = t.queues.get(op.queue)
    record = queue.groups.get(op.group) if queue is not None else None
    if queue is None or record is None:
        return
    floor = record[3]
    done = _done_set(queue, op.group)
    for offset in op.offsets:
        if offset >= floor:
            done.add(int(offset))
    if floor in done:
        queue.groups[op.group] = advance_floor(record, done, floor)


def _put_queue_group(t: _Trees, op: PutQueueGroup) -> None:
    queue = _queue_for_put(t, op.queue)
    record = group_to_record(op.state)
    old = queue.groups.get(op.group)
    if old is not None:
        # A snapshot taken before a later one may be committed after it: the
        # dispatch watermark and the delivery counts only ever grow.
        counts = dict(old[6])
        for offset, count in record[6]:
            counts[offset] = max(count, counts.get(offset, 0))
        record = (*record[:4], max(record[4], old[4]), record[5],
                  tuple(sorted(counts.items())), *record[7:])
    done = _done_set(queue, op.group)
    done.update(int(o) for o in op.state.done)
    record = advance_floor(record, done, record[3] if old is None else max(record[3], old[3]))
    floor = record[3]
    if any(o < floor or o in done for o, _ in record[6]):
        # (counts of finished messages are of no use: kept, they would only grow)
        record = (*record[:6], tuple((o, c) for o, c in record[6]
                                     if o >= floor and o not in done), *record[7:])
    queue.groups[op.group] = record


def _delete_queue_group(t: _Trees, op: DeleteQueueGroup) -> None:
    queue = t.queues.get(op.queue)
    if queue is not None:
        queue.groups.pop(op.group, None)
        queue.done.pop(op.group, None)


_HANDLERS: dict[type, Callable[[_Trees, Any], None]] = {
    PutQueue: _put_queue,
    DeleteQueue: _delete_queue,
    PutQueueMessage: _put_queue_message,
    DeleteQueueMessage: _delete_queue_message,
    TrimQueue: _trim_queue,
    QueueDone: _queue_done,
    PutQueueGroup: _put_queue_group,
    DeleteQueueGroup: _delete_queue_group,
    PutBan: _put_ban,
    DeleteBan: _delete_ban,
    PutRetained: _put_retained,
    DeleteRetained: _delete_retained,
    ClearRetained: _clear_retained,
    PutWill: _put_will,
    DeleteWill: _delete_will,
    PutSession: _put_session,
    DeleteSession: _delete_session,
    PutSubscription: _put_subscription,
    DeleteSubscription: _delete_subscription,
    PutQueued: _put_queued,
    DeleteQueued: _delete_queued,
    PutInboundQos2: _put_inbound_qos2,
    DeleteInboundQos2: _delete_inbound_qos2,
}


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
        self._completions: deque[_Completion] = deque()
        self._completions_lock = threading.Lock()
        self._draining = False  # touched only on the reactor thread (or in close())
        self._pack_lock = threading.Lock()
        self._pack_threads: set[threading.Thread] = set()
        self._queue_body_budget = queue_body_budget
        # (a condition of its own: the writer's ``notify`` must wake the writer)
        self._read_cond = threading.Condition()
        self._reads: deque[tuple[str, tuple[int, ...], Deferred[Any]]] = deque()
        self._reader: threading.Thread | None = None
        self._reading_stopped = False
        self._reads_done = 0
        self._reader_failing = False   # the reader thread died: logged, not again

        # Counters: written by the writer/pack threads, read by stats().
        self._pending_ops = 0
        self._submits = 0
        self._ops = 0
        self._batches = 0
        self._commits = 0
        self._failed_commits = 0
        self._gather = gather_seconds
        self._coalesced = 0
        self._last_commit_seconds = 0.0
        self._max_commit_seconds = 0.0
        self._last_batch_ops = 0
        self._max_batch_seen = 0
        self._packs = 0
        self._last_pack_seconds = 0.0

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
                root = conn.root()
                snapshot = Snapshot()
                for topic, record in root["retained"].items():
                    snapshot.retained[topic] = record_to_message(record)
                for owner, record in root["wills"].items():
                    snapshot.wills[owner] = record_to_will(record)
                for client_id, session in root["sessions"].items():
                    snapshot.sessions[client_id] = session_to_record(session)
                snapshot.bans = [record_to_ban(r) for r in root["bans"].values()]
                queues = root["queues"]
                budget = self._queue_body_budget
                # (each queue's head, its share of the budget, in memory; the cache
                # emptied as it goes, so RSS stays near the budget at start too)
                share = budget // max(1, len(queues)) if budget > 0 else None
                snapshot.queues = [queue_to_record(q, share, conn.cacheMinimize)
                                   for q in queues.values()]
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
            if type(op) not in _HANDLERS:
                return fail(TypeError(f"not a store operation: {op!r}"))
        d: Deferred[None] = Deferred()
        with self._cond:
            if not self._accepting:
                return fail(StoreClosedError("store is closed"))
            self._pending.append((batch, d))
            self._pending_ops += len(batch)
            self._submits += 1
            self._cond.notify()
        return d

    def read_queue_messages(self, name: str, offsets: Sequence[int]
                            ) -> Deferred[list[tuple[int, Message]]]:
        """The stored messages of queue ``name`` at ``offsets``, read on the reader
        thread; fires on the reactor thread."""
        d: Deferred[list[tuple[int, Message]]] = Deferred()
        with self._read_cond:
            if self._reading_stopped:
                return fail(StoreClosedError("store is closed"))
            self._reads.append((name, tuple(offsets), d))
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read_loop, name="mqttamqp-zodb-reader", daemon=False)
                self._reader.start()
            self._read_cond.notify()
        return d

    def _read_loop(self) -> None:
        try:
            self._read_with_connection()
        except Exception:
            # The thread cannot go on (its connection would not open, say): the
            # reads waiting for it fail, and the next read starts a new thread,
            # rather than every later read waiting for a thread that is gone.
            failure = Failure()
            with self._read_cond:
                failed, self._reads = self._reads, deque()
                self._reader = None
            if not self._reader_failing:   # (once until a read succeeds again)
                self._reader_failing = True
                _log.failure("the queue reader thread failed; queued reads fail, the "
                             "next read starts it again", failure)
            for _, _, d in failed:
                self._hand_over(d.errback, failure)

    def _read_with_connection(self) -> None:
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            while True:
                with self._read_cond:
                    while not self._reads and not self._reading_stopped:
                        self._read_cond.wait()
                    if not self._reads:
                        return
                    name, offsets, d = self._reads.popleft()
                try:
                    tm.begin()
                    try:
                        found: list[tuple[int, Message]] = []
                        queue = conn.root()["queues"].get(name)
                        if queue is not None:
                            log = queue.log
                            for offset in sorted(offsets):
                                record = log.get(offset)
                                if record is not None:
                                    found.append((offset, record_to_message(record)))
                    finally:
                        tm.abort()
                    conn.cacheMinimize()
                except Exception:  # reported through the Deferred
                    self._hand_over(d.errback, Failure())
                    continue
                self._reads_done += 1
                self._reader_failing = False
                self._hand_over(d.callback, found)
        finally:
            conn.close()

    def _hand_over(self, fire: Callable[[Any], object], value: Any) -> None:
        try:
            self._reactor.callFromThread(fire, value)
        except Exception:  # the reactor is gone: nobody waits for a read any more
            _log.failure("callFromThread failed for a queue read")

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
        with self._read_cond:   # (reads still queued are not answered: stopping)
            self._reading_stopped = True
            self._reads.clear()
            self._read_cond.notify()
            reader = self._reader
        self._writer.join()
        if reader is not None:
            reader.join()
        for thread in packs:
            thread.join()
        try:
            self._db.close()  # also closes the storage
        finally:
            self._drain_completions()

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
            "coalesced_puts": self._coalesced,
            "last_commit_seconds": self._last_commit_seconds,
            "max_commit_seconds": self._max_commit_seconds,
            "last_commit_ops": self._last_batch_ops,
            "max_commit_ops": self._max_batch_seen,
            "pending_submits": len(self._pending),
            "pending_ops": self._pending_ops,
            "packs": self._packs,
            "last_pack_seconds": self._last_pack_seconds,
            "packing": bool(self._pack_threads),
            "queue_reads": self._reads_done,
            "closed": self._closed,
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
        """Block for work; return the next group (None once closed and drained)."""
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if not self._pending:
                return None
            if self._gather > 0 and self._pending_ops < self._max_batch_ops and any(
                    type(op) in _GATHER_FOR for ops, _ in self._pending for op in ops):
                # Deliveries were just queued (to a session or a durable queue): their
                # acknowledgements usually follow within a millisecond, and a put
                # cancelled by its DeleteQueued or TrimQueue in the same commit is
                # never written (see _superseded_puts).  Every
                # submit notifies the condition, so wait out the deadline.
                deadline = time.monotonic() + self._gather
                while not self._stopping and self._pending_ops < self._max_batch_ops:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
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
                self._complete([(d, err) for _, d in leftover])

    def _commit(self, tm: Any, conn: Any, group: list[_Waiter]) -> None:
        nops = sum(len(ops) for ops, _ in group)
        started = time.monotonic()
        failure: Failure | None = None
        skip = _superseded_puts(group)
        self._coalesced += len(skip)
        try:
            for attempt in tm.attempts(self._commit_attempts):
                with attempt:
                    trees = _Trees(conn.root())
                    for ops, _ in group:
                        trees.deleted.clear()
                        for op in ops:
                            if skip and id(op) in skip:
                                continue
                            _HANDLERS[type(op)](trees, op)
        except Exception:  # any failure errbacks the whole commit
            failure = Failure()
            _abort_if_open(tm)
            # Debug only: the core logs one line per failing spell (CommitBatcher),
            # not a traceback per commit while the disk is full.
            _log.failure(
                "ZODB commit of {submits} submits ({ops} ops) failed",
                failure, submits=len(group), ops=nops, level=LogLevel.debug,
            )
        elapsed = time.monotonic() - started
        self._last_commit_seconds = elapsed
        self._max_commit_seconds = max(self._max_commit_seconds, elapsed)
        self._batches += len(group)
        self._last_batch_ops = nops
        self._max_batch_seen = max(self._max_batch_seen, nops)
        if failure is None:
            self._commits += 1
            self._ops += nops
        else:
            self._failed_commits += 1
        self._complete([(d, failure) for _, d in group])

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
            self._complete([(d, failure)])  # before close() can stop waiting for us
        finally:
            with self._cond:
                self._pack_threads.discard(threading.current_thread())

    def _complete(self, items: list[_Completion]) -> None:
        """From a worker thread: hand results to the reactor thread."""
        with self._completions_lock:
            self._completions.extend(items)
        try:
            self._reactor.callFromThread(self._drain_completions)
        except Exception:  # never lose results over a dead reactor
            # The reactor is gone; close() fires what is left.
            _log.failure("callFromThread failed; results wait for close()")

    def _drain_completions(self) -> None:
        """On the reactor thread (or in close()): fire finished Deferreds in order."""
        if self._draining:  # re-entered from a callback (e.g. one calling close())
            return
        self._draining = True
        try:
            while True:
                with self._completions_lock:
                    if not self._completions:
                        return
                    d, failure = self._completions.popleft()
                if failure is None:
                    d.callback(None)
                else:
                    d.errback(failure)
        finally:
            self._draining = False
