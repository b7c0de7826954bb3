"""Fakes shared by the in-process tests: links the core delivers to, and stores.

``FakeLink`` records every call the core makes on a ``ClientLink``, in order, as
``("publish", message, qos, packet_id, dup, retain)`` or ``("pubrel", packet_id)``;
test modules read that record in the shape their assertions use.  The stores keep
nothing (``NullStore``), commit only when told (``ManualStore``), start from a
given snapshot (``SnapshotStore``) or apply what they are given to a snapshot a
second broker can start from (``MemoryStore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed

from mqttamqp.core import persistence as p
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, SessionRecord, Snapshot

__all__ = ["FakeLink", "NullStore", "ManualStore", "SnapshotStore", "MemoryStore"]


class NullStore:
    """A store that keeps nothing and commits at once."""

    def __init__(self) -> None:
        self.submitted: list[Op] = []

    def load(self) -> Snapshot:
        return Snapshot()

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        self.submitted.extend(ops)
        return succeed(None)

    def pack(self) -> Deferred[None]:
        return succeed(None)

    def close(self) -> None:
        pass


class FakeLink:
    """A ``ClientLink`` that records what it is asked to send."""

    def __init__(self, name: str = "link") -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = []
        # The MQTT 5 subscription identifiers of each publish in ``calls``.
        self.subscription_ids: list[tuple[int, ...]] = []
        self.closed: list[str] = []
        self.congested = False
        self.backlog_bytes = 0

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        self.calls.append(("publish", message, qos, packet_id, dup, retain))
        self.subscription_ids.append(subscription_ids)

    def send_pubrel(self, packet_id: int) -> None:
        self.calls.append(("pubrel", packet_id))

    def close(self, reason: str) -> None:
        self.closed.append(reason)

    def published(self) -> list[tuple[Any, ...]]:
        """(message, qos, packet_id, dup, retain) of every publish, in order."""
        return [c[1:] for c in self.calls if c[0] == "publish"]

    @property
    def pubrels(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "pubrel"]

    def topics(self) -> list[str]:
        return [m.topic for m, *_ in self.published()]


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


class SnapshotStore(NullStore):
    """A NullStore that starts from a given snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def load(self) -> Snapshot:
        return self.snapshot


class MemoryStore(NullStore):
    """Applies submitted ops to a Snapshot, so a second Broker can start from them."""

    def __init__(self) -> None:
        super().__init__()
        self.state = Snapshot()
        self.queues: dict[str, p.QueueRecord] = {}
        # Reads of queue messages (``read_queue_messages``): answered at once, or,
        # with ``hold_reads``, when the test calls ``finish_reads``.
        self.hold_reads = False
        self.reads: list[tuple[str, tuple[int, ...]]] = []
        self._held_reads: list[tuple[list[tuple[int, Message]], Deferred[Any]]] = []

    def read_queue_messages(self, name: str, offsets: Sequence[int]
                            ) -> Deferred[list[tuple[int, Message]]]:
        self.reads.append((name, tuple(offsets)))
        q = self.queues.get(name)
        wanted = set(offsets)
        found = sorted((o, m) for o, m in (q.messages if q is not None else ())
                       if o in wanted)
        if not self.hold_reads:
            return succeed(found)
        d: Deferred[list[tuple[int, Message]]] = Deferred()
        self._held_reads.append((found, d))
        return d

    def finish_reads(self) -> int:
        """Answer the reads held so far (``hold_reads``); how many there were."""
        held, self._held_reads = self._held_reads, []
        for found, d in held:
            d.callback(found)
        return len(held)

    def load(self) -> Snapshot:
        s = self.state
        return Snapshot(dict(s.retained), dict(s.wills), {
            k: SessionRecord(r.client_id, r.last_seen, dict(r.subscriptions),
                             sorted(r.queue), set(r.inbound_qos2), owner=r.owner,
                             expiry=r.expiry)
            for k, r in s.sessions.items()}, list(s.bans), [
            p.QueueRecord(q.name, q.retention, q.head, sorted(q.messages),
                          next_offset=q.next_offset, groups=dict(q.groups),
                          arguments=q.arguments)
            for q in self.queues.values()], list(s.exchanges), list(s.bindings))

    def _queue(self, name: str) -> p.QueueRecord:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = p.QueueRecord(name)
        return q

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        s = self.state
        for op in ops:
            if isinstance(op, p.PutRetained):
                s.retained[op.message.topic] = op.message
            elif isinstance(op, p.DeleteRetained):
                s.retained.pop(op.topic, None)
            elif isinstance(op, p.ClearRetained):
                s.retained.clear()
            elif isinstance(op, p.PutWill):
                s.wills[op.will.owner] = op.will
            elif isinstance(op, p.DeleteWill):
                s.wills.pop(op.owner, None)
            elif isinstance(op, p.PutSession):
                rec = s.sessions.setdefault(op.client_id, SessionRecord(op.client_id))
                rec.last_seen = op.last_seen
                if op.owner is not None:
                    rec.owner = op.owner
                rec.expiry = op.expiry
            elif isinstance(op, p.DeleteSession):
                s.sessions.pop(op.client_id, None)
            elif isinstance(op, p.PutSubscription):
                s.sessions[op.client_id].subscriptions[op.topic_filter] = op.qos
            elif isinstance(op, p.DeleteSubscription):
                s.sessions[op.client_id].subscriptions.pop(op.topic_filter, None)
            elif isinstance(op, p.PutQueued):
                q = s.sessions[op.client_id].queue
                q[:] = [e for e in q if e[0] != op.seq] + [(op.seq, op.entry)]
            elif isinstance(op, p.DeleteQueued):
                q = s.sessions[op.client_id].queue
                q[:] = [e for e in q if e[0] != op.seq]
            elif isinstance(op, p.PutInboundQos2):
                s.sessions[op.client_id].inbound_qos2.add(op.packet_id)
            elif isinstance(op, p.DeleteInboundQos2):
                s.sessions[op.client_id].inbound_qos2.discard(op.packet_id)
            elif isinstance(op, p.PutBan):
                s.bans = [b for b in s.bans if (b.kind, b.value) != (op.kind, op.value)]
                s.bans.append(op)
            elif isinstance(op, p.DeleteBan):
                s.bans = [b for b in s.bans if (b.kind, b.value) != (op.kind, op.value)]
            elif isinstance(op, p.PutQueue):
                self._queue(op.name).retention = op.retention
            elif isinstance(op, p.DeleteQueue):
                self.queues.pop(op.name, None)
            elif isinstance(op, p.PutQueueMessage):
                q = self._queue(op.queue)
                q.messages = [m for m in q.messages if m[0] != op.offset]
                q.messages.append((op.offset, op.message))
            elif isinstance(op, p.DeleteQueueMessage):
                q = self._queue(op.queue)
                q.messages = [m for m in q.messages if m[0] != op.offset]
                q.next_offset = max(q.next_offset, op.offset + 1)
            elif isinstance(op, p.TrimQueue):
                q = self._queue(op.queue)
                q.messages = [m for m in q.messages if m[0] >= op.upto]
                q.head = max(q.head, op.upto)
            elif isinstance(op, p.PutQueueGroup):
                q = self._queue(op.queue)
                old = q.groups.get(op.group)
                done = set(old.done) if old is not None else set()
                done.update(op.state.done)
                floor = max(op.state.floor, old.floor if old is not None else 0)
                state = op.state
                if old is not None:   # (watermark and counts only grow: as the store)
                    counts = dict(old.counts)
                    for o, c in state.counts:
                        counts[o] = max(c, counts.get(o, 0))
                    marks = dict(old.levels)
                    for lv, m in state.levels:
                        marks[lv] = max(m, marks.get(lv, 0))
                    state = replace(state, watermark=max(state.watermark, old.watermark),
                                    counts=tuple(sorted(counts.items())),
                                    levels=tuple(sorted(marks.items())))
                q.groups[op.group] = _advanced(state, done, floor)
            elif isinstance(op, p.QueueDone):
                q = self._queue(op.queue)
                old = q.groups.get(op.group)
                if old is not None:
                    q.groups[op.group] = _advanced(old, set(old.done) | set(op.offsets),
                                                   old.floor)
            elif isinstance(op, p.DeleteQueueGroup):
                self._queue(op.queue).groups.pop(op.group, None)
            elif isinstance(op, p.PutQueueArguments):
                self._queue(op.name).arguments = op.arguments
            elif isinstance(op, p.PutExchange):
                s.exchanges = [e for e in s.exchanges if e.name != op.name] + [op]
            elif isinstance(op, p.DeleteExchange):
                s.exchanges = [e for e in s.exchanges if e.name != op.name]
            elif isinstance(op, (p.PutBinding, p.DeleteBinding)):
                key = (op.source, op.destination, op.to_exchange, op.routing_key,
                       op.arguments)
                s.bindings = [b for b in s.bindings if (
                    b.source, b.destination, b.to_exchange, b.routing_key, b.arguments
                ) != key]
                if isinstance(op, p.PutBinding):
                    s.bindings.append(op)
        return super().submit(ops)


def _advanced(state: p.QueueGroupRecord, done: set[int], floor: int) -> p.QueueGroupRecord:
    """A group record with its floor moved over ``done`` (what a store does)."""
    while floor in done:
        floor += 1
    return replace(state, floor=floor, done=tuple(sorted(o for o in done if o > floor)),
                   counts=tuple((o, c) for o, c in state.counts
                                if o >= floor and o not in done))


class ManualMemoryStore(MemoryStore):
    """A ``MemoryStore`` whose commits apply (and fire) only when the test says: a
    second Broker started from it sees what was durable at a crash."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[list[Op], Deferred[None]]] = []

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self.pending.append((list(ops), d))
        return d

    def commit_next(self) -> None:
        ops, d = self.pending.pop(0)
        MemoryStore.submit(self, ops)
        d.callback(None)

    def commit_all(self) -> None:
        while self.pending:
            self.commit_next()


class FailingStore(NullStore):
    """A store whose commits fail while ``failing`` is set (a full disk, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.refused = 0

    def submit(self, ops: Sequence[Op]) -> Deferred[None]:
        if self.failing:
            self.refused += 1
            return fail(OSError(28, "No space left on device"))
        return super().submit(ops)


def timers_left(clock: Any) -> list[Any]:
    """``clock``'s pending calls, less the shared timer of a ``Deadlines`` (keepalive
    and CONNECT deadlines) that has no deadline left, or of a ``SoonDeadlines`` with
    nothing left to arm: that one runs once more at its time, doing nothing, and is
    gone (``mqtt.deadlines``)."""
    from mqttamqp.mqtt.deadlines import Deadlines, SoonDeadlines

    def inert(call: Any) -> bool:
        owner = getattr(call.func, "__self__", None)
        return type(owner) in (Deadlines, SoonDeadlines) and len(owner) == 0

    return [call for call in clock.getDelayedCalls() if not inert(call)]
