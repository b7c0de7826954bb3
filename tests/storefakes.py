"""Store fakes shared by the unit tests of the core and the MQTT protocol."""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred

from mqttamqp.core.persistence import NullStore, Op


class ManualStore(NullStore):
    """A store whose commits become durable only when the test fires them."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[list[Op], Deferred[None]]] = []

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        self.submitted.extend(ops)
        d: Deferred[None] = Deferred()
        self.pending.append((list(ops), d))
        return d

    def commit_next(self) -> list[Op]:
        ops, d = self.pending.pop(0)
        d.callback(None)
        return ops

    def commit_all(self) -> None:
        """Commit everything, including what the callbacks submit meanwhile."""
        while self.pending:
            self.commit_next()
