"""``QueueReader``: the store's reader thread for queue bodies left in storage.

``read()`` queues a request and returns a Deferred; the thread, started on the first
read, reads with a ZODB connection of its own (a new transaction per request, so it
sees every commit made before), frees that connection's cache after each read (the
bodies it read are then held only by the core) and fires the Deferred on the
reactor thread through ``reactor.callFromThread``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import transaction
from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.message import Message
from mqttamqp.store.models import record_to_message

__all__ = ["QueueReader"]

_log = Logger(namespace="mqttamqp.store")


class QueueReader:
    """Reads stored queue messages on a thread of its own (see the module)."""

    def __init__(self, db: Any, reactor: Any, closed_error: Callable[[], Exception]) -> None:
        self._db = db
        self._reactor = reactor
        self._closed_error = closed_error
        # (a condition of its own: the writer's ``notify`` must wake the writer)
        self._cond = threading.Condition()
        self._reads: deque[tuple[str, tuple[int, ...], Deferred[Any]]] = deque()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._failing = False   # the thread died: logged, not again until a read succeeds
        self.reads_done = 0

    def read(self, name: str, offsets: Sequence[int]
             ) -> Deferred[list[tuple[int, Message]]]:
        """The stored messages of queue ``name`` at ``offsets``; fires on the reactor
        thread."""
        d: Deferred[list[tuple[int, Message]]] = Deferred()
        with self._cond:
            if self._stopped:
                return fail(self._closed_error())
            self._reads.append((name, tuple(offsets), d))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="mqttamqp-zodb-reader", daemon=False)
                self._thread.start()
            self._cond.notify()
        return d

    def stop(self) -> threading.Thread | None:
        """Stop reading (reads still queued are not answered: the store is closing);
        the thread to join, if one runs."""
        with self._cond:
            self._stopped = True
            self._reads.clear()
            self._cond.notify()
            return self._thread

    def _loop(self) -> None:
        try:
            self._read_with_connection()
        except Exception:
            # The thread cannot go on (its connection would not open, say): the
            # reads waiting for it fail, and the next read starts a new thread,
            # rather than every later read waiting for a thread that is gone.
            failure = Failure()
            with self._cond:
                failed, self._reads = self._reads, deque()
                self._thread = None
            if not self._failing:   # (once until a read succeeds again)
                self._failing = True
                _log.failure("the queue reader thread failed; queued reads fail, the "
                             "next read starts it again", failure)
            for _, _, d in failed:
                self._hand_over(d.errback, failure)

    def _read_with_connection(self) -> None:
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            while True:
                with self._cond:
                    while not self._reads and not self._stopped:
                        self._cond.wait()
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
                self.reads_done += 1
                self._failing = False
                self._hand_over(d.callback, found)
        finally:
            conn.close()

    def _hand_over(self, fire: Callable[[Any], object], value: Any) -> None:
        try:
            self._reactor.callFromThread(fire, value)
        except Exception:  # the reactor is gone: nobody waits for a read any more
            _log.failure("callFromThread failed for a queue read")
