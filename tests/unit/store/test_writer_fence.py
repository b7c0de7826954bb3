"""The writer thread and ``fence()``: a fence that takes the submits the writer is
gathering (its short wait for acknowledgements) leaves the writer alive, waiting for
work, instead of killing it with an empty queue."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from ZODB.MappingStorage import MappingStorage

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import PutQueueMessage
from mqttamqp.store import ZODBStore

TIMEOUT = 10.0


class _InlineReactor:
    """Runs what the writer thread hands over at once, on that thread."""

    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


class _WatchedCondition(threading.Condition):
    """The store's condition, telling the test when the writer waits while gathering
    and when it waits for work (``store`` set once the store is built)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: Any = None
        self.gathering = threading.Event()
        self.idle = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if self.store is not None:
            if self.store._gathering:
                self.gathering.set()
            if self.store._idle:
                self.idle.set()
        return super().wait(timeout)


def test_a_fence_while_the_writer_gathers_leaves_it_alive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer gathers after a queue append; a fence then empties its queue; the
    writer goes back to waiting for work (it died with IndexError before)."""
    cond = _WatchedCondition()
    real, handed = threading.Condition, []

    def condition(*args: Any) -> Any:
        """The first plain Condition the store builds is its writer's (ZODBStore's
        ``_cond``, before its queue reader's); any other is a real one."""
        if args or handed:
            return real(*args)
        handed.append(cond)
        return cond

    storage = MappingStorage()
    with monkeypatch.context() as m:   # (only while the store is built)
        m.setattr(threading, "Condition", condition)
        store = ZODBStore("", _InlineReactor(), gather_seconds=1.0,  # type: ignore[arg-type]
                          storage_factory=lambda: storage)
    assert store._cond is cond
    cond.store = store
    store.load()
    failures: list[Any] = []
    store.submit([PutQueueMessage("jobs", 0, Message("$queue/jobs", b"x", 1))]
                 ).addErrback(failures.append)
    assert cond.gathering.wait(TIMEOUT), "the writer did not start gathering"
    cond.idle.clear()
    store.fence("lost the lock")
    assert failures, "the fenced submit did not fail"
    assert cond.idle.wait(TIMEOUT), "the writer did not go back to waiting for work"
    assert store._writer.is_alive()
    store.close()
