"""The writer thread and ``fence()``: a fence that takes the submits the writer is
gathering (its short wait for acknowledgements) leaves the writer alive, waiting for
work, instead of killing it with an empty queue."""

from __future__ import annotations

import time
from typing import Any

from ZODB.MappingStorage import MappingStorage

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import PutQueueMessage
from mqttamqp.store import ZODBStore

TIMEOUT = 10.0


class _InlineReactor:
    """Runs what the writer thread hands over at once, on that thread."""

    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


def _until(what: Any, timeout: float = TIMEOUT) -> bool:
    """Wait (polling with a deadline) until ``what()`` holds; whether it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.005)
    return bool(what())


def test_a_fence_while_the_writer_gathers_leaves_it_alive() -> None:
    """The writer gathers after a queue append; a fence then empties its queue; the
    writer goes back to waiting for work (it died with IndexError before)."""
    storage = MappingStorage()
    store = ZODBStore("", _InlineReactor(), gather_seconds=1.0,  # type: ignore[arg-type]
                      storage_factory=lambda: storage)
    store.load()
    failures: list[Any] = []
    store.submit([PutQueueMessage("jobs", 0, Message("$queue/jobs", b"x", 1))]
                 ).addErrback(failures.append)
    assert _until(lambda: store._gathering), "the writer did not start gathering"
    store.fence("lost the lock")
    assert failures, "the fenced submit did not fail"
    assert _until(lambda: store._idle), "the writer did not go back to waiting"
    assert store._writer.is_alive()
    store.close()
