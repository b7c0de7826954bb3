"""The console's side of the queues: frozen views and operator commands.

Views (queues, groups, messages) for the read model and the console; purge,
delete, requeue from a dead-letter queue, retention settings and group deletion,
each answering with the commit that makes it durable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from twisted.internet.defer import Deferred

from mqttamqp.core.message import body_size
from mqttamqp.core.persistence import (
    DeleteQueue,
    DeleteQueueGroup,
    DeleteQueueMessage,
    Op,
    PutQueue,
    PutQueueGroup,
    TrimQueue,
)
from mqttamqp.core.queues.addresses import CLASSIC, DLQ_PREFIX, QUEUE_PREFIX, STREAM
from mqttamqp.core.queues.memory import READ_MESSAGES
from mqttamqp.core.queues.metadata import DLQ_KEYS
from mqttamqp.core.queues.model import ConsumerGroup, QueueLog, Retention
from mqttamqp.core.queues.timers import QueueTimers
from mqttamqp.records import record

__all__ = ["QueueAdmin", "QueueView", "GroupView", "QueueMessageView", "DeleteHook"]

@record
class GroupView:
    id: str
    name: str
    filter: str
    mode: str
    members: tuple[str, ...]
    cursor: int
    lag: int
    pending: int
    redeliveries: int
    acknowledged: int


@record
class QueueView:
    name: str
    depth: int
    bytes: int
    oldest_age: float | None
    published: int
    acknowledged: int
    dead_lettered: int
    expired: int
    dlq_depth: int
    retention: Retention
    groups: tuple[GroupView, ...]
    first: int
    next: int
    in_storage_only: int = 0    # messages whose body is not in memory (the budget)


@record
class QueueMessageView:
    offset: int
    topic: str
    payload: bytes
    timestamp: float
    qos: int
    publisher: str | None
    user_properties: tuple[tuple[str, str], ...]
    # The body is in storage only (``--queue-memory-budget``): ``payload`` is
    # empty, ``size`` is its length.
    in_storage_only: bool = False
    size: int = 0


# Told of a queue that is being deleted, by whatever deletes it (``QueueAdmin.delete``):
# the durable ops of what goes with it elsewhere (AMQP 0.9.1's declaration and
# bindings, ``QueueDeclarations._queue_deleted``).
DeleteHook = Callable[[str], list[Op]]


class QueueAdmin(QueueTimers):
    """Views and commands for operators (the console and its JSON API)."""

    _delete_hook: DeleteHook | None = None

    def attach_delete_hook(self, hook: DeleteHook) -> None:
        """``hook(name)`` runs as queue ``name`` is deleted, before it goes (the
        0.9.1 model forgets its declaration and bindings, also when the console
        deletes the queue)."""
        self._delete_hook = hook

    def views(self) -> list[QueueView]:
        now = self.clock.seconds()
        out = []
        for name in sorted(self.queues):
            queue = self.queues[name]
            oldest = queue.oldest()
            dlq = self.queues.get(DLQ_PREFIX + name)
            groups = tuple(
                GroupView(g.key, g.name, g.filter, g.mode,
                          tuple(m.session.client_id for m in g.members),
                          g.next if g.mode == STREAM else g.floor,
                          g.lag(), len(g.pending), g.redelivered, g.acked)
                for g in queue.groups.values())
            out.append(QueueView(
                name, len(queue.log), queue.bytes,
                None if oldest is None else max(0.0, now - oldest.timestamp),
                queue.published, queue.acked, queue.dead, queue.expired,
                0 if dlq is None else len(dlq.log), queue.retention, groups,
                queue.first, queue.next_offset, len(queue.evicted)))
        return out

    def browse(self, name: str, start: int = 0, limit: int = 50) -> list[QueueMessageView]:
        queue = self.queues.get(name)
        if queue is None:
            return []
        out = []
        for offset, message in queue.log.items():
            if offset < start:
                continue
            props = message.props
            sizes = queue.evicted.get(offset)
            out.append(QueueMessageView(offset, message.topic, message.payload,
                                        message.timestamp, message.qos, message.publisher,
                                        props.user_properties if props else (),
                                        sizes is not None,
                                        len(message.payload) if sizes is None else sizes[0]))
            if len(out) >= limit:
                break
        return out

    def purge(self, name: str) -> Deferred[None] | None:
        """Remove every message of queue ``name`` (its groups stay)."""
        queue = self.queues.get(name)
        if queue is None:
            return None
        ops: list[Op] = []
        for offset in list(queue.log):
            self._forget(queue, offset)
        queue.first = queue.next_offset
        for group in queue.groups.values():
            group.ready.clear()
            group.parked.clear()
            if group.levels is not None:
                group.levels.clear()
            group.done.clear()
            group.counts.clear()
            group.uncounted.clear()
            if group.mode == CLASSIC:
                group.floor = group.next = queue.next_offset
            else:
                group.next = max(group.next, queue.next_offset)
            ops.append(PutQueueGroup(name, group.key, group.record()))
        ops.append(TrimQueue(name, queue.next_offset))
        return self.commits.persist(self._durable_ops(ops))

    def purge_ready(self, name: str) -> tuple[int, Deferred[None] | None]:
        """Remove the messages of queue ``name`` that no consumer holds (AMQP 0.9.1
        ``queue.purge``: unacknowledged deliveries stay theirs); how many went.  Not
        counted, nor removed here: what every classic group has finished, still in
        the log until the end of the socket read that acknowledged it (``_trim``)."""
        queue = self.queues.get(name)
        if queue is None:
            return 0, None
        held = {o for g in queue.groups.values() for o in g.pending}
        classic = [g for g in queue.groups.values() if g.mode == CLASSIC]
        if classic:
            held.update(o for o in queue.log
                        if all(o < g.floor or o in g.done for g in classic))
        if not held:
            count = len(queue.log)
            return count, self.purge(name)
        ops: list[Op] = []
        count = 0
        for offset in [o for o in queue.log if o not in held]:
            self._forget(queue, offset)   # (groups skip it: no message there)
            ops.append(DeleteQueueMessage(name, offset))
            count += 1
        return count, self._commit(ops)

    def delete(self, name: str) -> Deferred[None] | None:
        """Delete queue ``name`` with its messages and groups (members are dropped
        from it; a later message or consumer creates it anew).  The delete hook
        (``attach_delete_hook``) runs first; ``deleted_hooks`` hear its name once
        its members have left it."""
        queue = self.queues.get(name)
        if queue is None:
            return None
        ops = self._delete_hook(name) if self._delete_hook is not None else []
        del self.queues[name]
        for group in queue.groups.values():
            self._disband(group)
        self.total_bytes -= queue.bytes
        self.resident -= sum(body_size(m) for o, m in queue.log.items()
                             if o not in queue.evicted)
        self._removed()
        for hook in list(self.deleted_hooks):
            hook(name)
        if queue.transient:
            self.transient.discard(name)
        else:
            ops.append(DeleteQueue(name))
        return self.commits.persist(ops) if ops else None

    def _disband(self, group: ConsumerGroup) -> None:
        """Every member leaves ``group``, which is going away: what it has pending is
        taken back and given to nobody (not handed round the departing members)."""
        for member in group.members:
            memberships = self._memberships.get(member.session)
            if memberships:
                memberships[:] = [(g, m) for g, m in memberships if g is not group]
                if not memberships:
                    del self._memberships[member.session]
        for pending in group.pending.values():
            entry = pending.detach()
            if entry is not None:
                pending.member.session.take_back(entry)
        group.pending.clear()
        group.members.clear()

    def requeue(self, dlq_name: str, offset: int | None = None
                ) -> tuple[int, Deferred[None] | None]:
        """Move dead messages of ``$dlq/<name>`` (one, or all) back to their origin
        queue, as new messages; returns how many moved."""
        dlq = self.queues.get(dlq_name)
        if dlq is None or not dlq_name.startswith(DLQ_PREFIX):
            return 0, None
        offsets = [o for o in ([offset] if offset is not None else list(dlq.log))
                   if o in dlq.log]
        if not any(o in dlq.evicted for o in offsets):
            return self._requeue(dlq_name, dlq, offsets)
        # Some bodies are in storage only: read back and moved a batch at a time.
        batches = [offsets[i:i + READ_MESSAGES]
                   for i in range(0, len(offsets), READ_MESSAGES)]
        done: Deferred[None] = Deferred()

        def next_batch(_: object = None) -> None:
            if not batches or self.queues.get(dlq_name) is not dlq:
                done.callback(None)
                return
            batch = [o for o in batches.pop(0) if o in dlq.log]
            wanted = [o for o in batch if o in dlq.evicted]
            if not wanted or self._reader is None:
                moved(batch)
                return
            d = self._reader(dlq_name, wanted)
            d.addCallback(self._restored, dlq)
            d.addCallback(lambda _: moved(batch))
            d.addErrback(done.errback)

        def moved(batch: list[int]) -> None:
            batch = [o for o in batch if o in dlq.log and o not in dlq.evicted]
            d = self._requeue(dlq_name, dlq, batch)[1]
            if d is None:
                next_batch()
            else:
                d.addCallbacks(next_batch, done.errback)

        next_batch()
        return len(offsets), done

    def _requeue(self, dlq_name: str, dlq: QueueLog, offsets: list[int]
                 ) -> tuple[int, Deferred[None] | None]:
        ops: list[Op] = []
        moved = 0
        for o in offsets:
            message = dlq.log.get(o)
            if message is None:
                continue
            props = message.props
            origin = dlq_name[len(DLQ_PREFIX):]
            for key, value in (props.user_properties if props else ()):
                if key == "origin-queue":
                    origin = value
            target = self._queue(origin, ops)
            if target is None:
                break
            users = tuple(kv for kv in (props.user_properties if props else ())
                          if kv[0] not in DLQ_KEYS)
            again = replace(message, topic=QUEUE_PREFIX + origin + message.topic[
                len(dlq_name):], props=None if props is None else replace(
                    props, user_properties=users), timestamp=self.clock.seconds())
            self._forget(dlq, o)
            ops.append(DeleteQueueMessage(dlq_name, o))
            self._append(target, again, ops)
            moved += 1
        return moved, self._commit(ops)

    def set_retention(self, name: str, retention: Retention) -> Deferred[None] | None:
        queue = self.queues.get(name)
        if queue is None:
            return None
        queue.retention = retention
        queue.set_max_priority(retention.max_priority)
        ops: list[Op] = [PutQueue(name, retention.as_tuple())]
        self._enforce_retention(queue, ops, self.clock.seconds())
        d = self.commits.persist(self._durable_ops(ops))
        # Pending messages it dropped gave their members' credit back: use it now.
        self._pump_queue(queue)
        return d

    def depth(self) -> int:
        return sum(len(q.log) for q in self.queues.values())

    def delete_group(self, name: str, key: str) -> Deferred[None] | None:
        queue = self.queues.get(name)
        group = queue.groups.get(key) if queue is not None else None
        if queue is None or group is None:
            return None
        self._disband(group)
        del queue.groups[key]
        ops: list[Op] = [DeleteQueueGroup(name, key)]
        self._trim(queue, ops)
        return self.commits.persist(self._durable_ops(ops))
