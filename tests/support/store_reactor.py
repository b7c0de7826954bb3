"""The reactor side of ``ZODBStore``'s writer thread, run by the test: a fake
``IReactorFromThreads`` whose hand-offs run when the test drains them (bounded by a
timeout), and waits on the Deferreds of submits."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.python.failure import Failure

from mqttamqp.core.persistence import (
    Op,
)
from mqttamqp.store import ZODBStore

TIMEOUT = 30.0


class FakeReactor:
    """``IReactorFromThreads`` whose calls run when the test drains them."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[Callable[..., object], tuple[Any, ...]]] = queue.Queue()
        self.thread = threading.get_ident()

    def callFromThread(self, f: Callable[..., object], *args: Any) -> None:
        self.calls.put((f, args))

    def run_until_fired(self, d: Deferred[Any], timeout: float = TIMEOUT) -> None:
        """Run the writer's hand-offs, blocking for each, until ``d`` has fired."""
        fired: list[bool] = []

        def mark(result: object) -> object:
            fired.append(True)
            return result

        d.addBoth(mark)
        deadline = time.monotonic() + timeout
        while not fired:
            try:
                f, args = self.calls.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("timed out waiting for the store") from None
            assert threading.get_ident() == self.thread
            f(*args)


class Waiter:
    """Collects the outcome of Deferreds in firing order."""

    def __init__(self) -> None:
        self.results: list[tuple[int, object]] = []
        self.watched: list[Deferred[None]] = []

    def watch(self, d: Deferred[None], tag: int = 0) -> Deferred[None]:
        def ok(_: None) -> None:
            self.results.append((tag, None))

        def bad(f: Failure) -> None:
            self.results.append((tag, f))

        d.addCallbacks(ok, bad)
        self.watched.append(d)
        return d

    def wait(self, reactor: FakeReactor, timeout: float = TIMEOUT) -> None:
        """Run the fake reactor until every watched Deferred has fired."""
        reactor.run_until_fired(DeferredList(self.watched), timeout)


def wait(reactor: FakeReactor, d: Deferred[None], timeout: float = TIMEOUT) -> object:
    """Run the fake reactor until ``d`` fires; return None or the Failure."""
    w = Waiter()
    w.watch(d)
    w.wait(reactor, timeout)
    return w.results[0][1]


def commit(reactor: FakeReactor, store: ZODBStore, ops: Sequence[Op]) -> None:
    result = wait(reactor, store.submit(ops))
    assert result is None, result
