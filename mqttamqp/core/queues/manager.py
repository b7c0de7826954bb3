"""Durable queues (seed 004): ``$queue/<name>/...`` beside the pub/sub router.

A publish to ``$queue/<name>/<routing key>`` appends the message to queue
``<name>``'s durable log at the next offset; the publisher's acknowledgement waits
for the commit that holds it.  Queue messages never enter the trie, and pub/sub
messages never enter a queue.

Consumer groups read a queue.  Each group receives every message whose routing key
matches the group's filter (groups fan out); within a group each message goes to
one member, round-robin over the members with credit.  A group is the pair (name,
filter): ``$queue/jobs/#`` and ``$queue/jobs/eu/#`` joined under the same name are
two groups.  Its id, which deliveries carry and acknowledgements name, is the name
for the filter ``#`` and ``<name>@<filter>`` otherwise.

Classic groups (the default) claim messages: a delivered message is *pending* on
its member until acknowledged; after the visibility timeout it is visible again,
after ``max_deliveries`` deliveries it is dead-lettered to ``$dlq/<name>`` (itself
a queue), a member that leaves gives its pending messages back at once, and an idle
member may take over messages pending on a member that has not acknowledged for
half the visibility timeout.  Stream groups read by cursor without claiming; the
cursor is stored every few seconds and on an explicit ``$ack`` (commit).

How acknowledgements reach a group depends on the member:

* ``explicit`` (MQTT 5): ``$queue/<name>/$ack|$nack|$reject`` with user properties
  ``message-id`` and ``group-id`` (``QueueManager.command``);
* transport (MQTT 3.x at QoS >= 1, AMQP unsettled): the PUBACK / PUBCOMP / Accepted
  of the delivery itself: the session calls the delivery's receipt
  (``DeliveryReceipt``: ``Pending``, or ``StreamRead`` for a stream), which the
  queue hands to ``Session.deliver``; AMQP's other outcomes reach the same receipt
  (``settled``).  The queue never writes the session's entry;
* on send (MQTT 3.x at QoS 0, AMQP pre-settled).

Durability: every change of a queue's durable state is an ``Op`` committed before
it is confirmed.  A group's state is stored whole (``QueueGroupRecord``: floor,
acknowledged offsets above it, delivery counts, members); the dispatch watermark
is stored ahead of the deliveries in steps, a delivery goes out only below a
watermark already durable, and after a restart every message below it that was
not acknowledged counts one more delivery (at-least-once: a
message whose acknowledgement was lost in a crash comes back with its count
raised).  Messages are dispatched only once their append is durable.

What this module must not do: touch sockets or storage (deliveries go through
``Session.deliver``; durable changes are returned or handed to ``CommitBatcher``),
or know protocols beyond the three acknowledgement modes above.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, overload

from twisted.internet.defer import Deferred

from mqttamqp.core.commits import CommitRound, committed_or_early
from mqttamqp.core.message import Message, body_size
from mqttamqp.core.persistence import Op, QueueGroupRecord, QueueRecord
from mqttamqp.core.queues.addresses import (
    CLASSIC,
    NOT_QUEUED,
    QUEUE_COMMAND,
    QUEUED,
    QUOTA_EXCEEDED,
    STREAM,
    TOPIC_NAME_INVALID,
    QueueAddress,
    Refusal,
    is_command,
    is_queue_topic,
    parse_queue_topic,
)
from mqttamqp.core.queues.admin import QueueAdmin
from mqttamqp.core.queues.model import ConsumerGroup, QueueLog, Retention
from mqttamqp.core.queues.priority import level_of

__all__ = ["QueueManager"]

class QueueManager(QueueAdmin):
    """Durable queues beside the router: publishing to a queue and restoring them.

The layers below own one concern each: ``QueueLogs`` (the logs and their
commits), ``MemoryBudget``, ``Dispatch``, ``Acknowledgements``, ``Membership``,
``QueueTimers`` and ``QueueAdmin``."""

    def store_done_now(self) -> None:
        """Hand what was finished to the store now, not at the end of the batch (a
        transaction's commit: its acknowledgements go in its own submission)."""
        self._flush_done()

    def address(self, topic: str) -> QueueAddress | str | None:
        """What a publish to ``topic`` is to the queues, parsed once per topic (the
        parse is cached): its address, why it is refused (a str), or None when it is
        not a queue topic.  The broker asks once per publish and passes it on."""
        address = self._parsed.get(topic)
        if address is None:
            if not is_queue_topic(topic):
                return None
            if len(self._parsed) >= 4096:
                self._parsed.clear()
            address = self._parsed[topic] = parse_queue_topic(topic)
        return address

    def kind(self, topic: str) -> int:
        """What a publish to ``topic`` is to the queues, for an adapter that must know
        before it publishes (MQTT parking, an AMQP sender's route): ``NOT_QUEUED``,
        ``QUEUED`` or ``QUEUE_COMMAND``, from the same cached parse as ``address``
        (the adapters recognise no queue topic themselves)."""
        if topic[:1] != "$":
            return NOT_QUEUED
        address = self.address(topic)
        if address is None:
            return NOT_QUEUED
        return QUEUE_COMMAND if is_command(address, topic) else QUEUED

    @overload
    def publish(self, message: Message, address: QueueAddress | str, publisher: str,
                extra_ops: Sequence[Op] = (), refuse_when_blocked: bool = False,
                in_round: Literal[False] = False
                ) -> tuple[Deferred[None] | None, Refusal | None]: ...

    @overload
    def publish(self, message: Message, address: QueueAddress | str, publisher: str,
                extra_ops: Sequence[Op] = (), refuse_when_blocked: bool = False,
                in_round: bool = False
                ) -> tuple[Deferred[None] | CommitRound | None, Refusal | None]: ...

    def publish(self, message: Message, address: QueueAddress | str, publisher: str,
                extra_ops: Sequence[Op] = (), refuse_when_blocked: bool = False,
                in_round: bool = False
                ) -> tuple[Deferred[None] | CommitRound | None, Refusal | None]:
        """Append ``message`` (topic ``$queue/<name>/...``, parsed as ``address`` by
        ``address()``) to its queue; the Deferred fires once the append is durable.
        Acknowledgement topics are ``command``'s, not this.

        ``in_round`` (a 0.9.1 publish with confirms): inside a batch, the append
        waits on the batch's ``CommitRound`` instead, with no Deferred of its own;
        its answer (``when_answered``) may come before the commit when every
        classic group finished every append of the round first.

        While the storage alarm is raised (``blocked``) the message is still
        appended (what a publisher sent before its protocol stopped reading it),
        unless ``refuse_when_blocked`` (an MQTT 5 QoS 1/2 publish: PUBACK/PUBREC
        0x97 tells it at once, where waiting would hold its connection)."""
        if isinstance(address, str):
            return (self._commit(extra_ops),
                    self._refuse("topic", publisher, message.topic, address,
                                 TOPIC_NAME_INVALID))
        if refuse_when_blocked and self.alarm.blocked:
            return (self._commit(extra_ops),
                    self._refuse("full", publisher, message.topic,
                                 f"durable queues full: {self.alarm.reason}",
                                 QUOTA_EXCEEDED))
        ops: list[Op] = list(extra_ops) if extra_ops else []
        queue = self.queues.get(address.queue)
        if queue is None and (queue := self._queue(address.queue, ops)) is None:
            return (self._commit(ops),
                    self._refuse("count", publisher, message.topic,
                                 f"too many queues (--queue-max-queues "
                                 f"{self.limits.queue_max_queues})", QUOTA_EXCEEDED))
        if queue.reject_above is not None and queue.refuses(message):
            if queue.reject_dead and queue.dead_letter is not None:
                self._route_dead(queue, message, "maxlen", -1, "", 0, ops)
            return self._commit(ops), self._overflow(queue, message, publisher)
        if message.retain or message.dup:
            message = message.with_flags(False, False)
        offset = self._append(queue, message, ops)
        if message.qos < 2:
            # (dispatched now, below: nothing to do when the commit comes)
            self._appended_to.pop(queue, None)
        if in_round and not queue.transient and self.commits.batching:
            r = self._commit_in_round(ops)
            # (``offset in queue.log``: not dropped or dead-lettered at its own
            # append, before it had an entry ``unwait`` could take back)
            classic = False
            if message.qos and offset in queue.log:
                for group in queue.groups.values():   # (``_has_classic``, inline)
                    if group.mode == CLASSIC:
                        classic = True
                        break
            if classic:
                waits = queue.round_waits
                if waits and waits[-1][1] is r:
                    waits[-1][0] = offset    # (one entry per round and queue)
                else:
                    # (released when consumed first: ``_trim``)
                    waits.append([offset, r])
                    r.outstanding += 1
            else:
                r.outstanding += 1   # (held: only the commit answers it)
            if message.qos < 2 and queue.committed < queue.next_offset:
                queue.committed = queue.next_offset   # (as below)
                self._pump_queue(queue)
            return r, None
        d = self._commit(ops)
        if d is not None and message.qos and offset in queue.log and _has_classic(queue):
            # As for persistent sessions: the acknowledgement promises the message is
            # stored, or already consumed.  When every classic group is done with it
            # before the writer commits, it need not wait (``_trim``).
            if not self.commits.owned:
                d = committed_or_early(d, self.commits.log_failure)
            queue.waiters[offset] = d   # (until trimmed or forgotten: ``_trim``)
        if message.qos < 2 and queue.committed < queue.next_offset:
            # QoS 0/1 goes to consumers at once, as to subscribers: were the commit
            # lost, so would be the publisher's PUBACK, and its resend is a
            # permitted duplicate.  QoS 2 waits for its commit (``_appended``).
            queue.committed = queue.next_offset
            self._pump_queue(queue)
        return d, None

    def _overflow(self, queue: QueueLog, message: Message, publisher: str) -> Refusal:
        """The refusal of an x-overflow reject-publish queue, QUOTA_EXCEEDED (MQTT 5
        PUBACK 0x97, as RabbitMQ answers both) either way: full for now (AMQP 1.0
        amqp:resource-limit-exceeded, sent again later), or for good when even an
        empty queue would refuse ``message`` (``Refusal.lasting``: AMQP 1.0
        amqp:precondition-failed; sent again, it is refused again).  A 0.9.1
        publisher gets a basic.nack for either, as RabbitMQ's."""
        if not queue.never_fits(message):
            return self._refuse("overflow", publisher, message.topic,
                                f"queue {queue.name!r} is full (x-overflow reject-publish)",
                                QUOTA_EXCEEDED)
        count, size = queue.reject_above or (None, None)
        bound = "x-max-length 0" if count == 0 else f"x-max-length-bytes {size}"
        return self._refuse("never-fits", publisher, message.topic,
                            f"queue {queue.name!r} can never take a message of "
                            f"{len(message.payload)} bytes ({bound}, x-overflow "
                            "reject-publish)", QUOTA_EXCEEDED, lasting=True)

    def publish_copies(self, copies: Sequence[tuple[str, Message]], publisher: str
                       ) -> tuple[Deferred[None] | None, list[tuple[str, Refusal]]]:
        """Append each ``(queue name, message)`` copy of one publish (a fanout, a
        topic or headers route to several queues) to its queue in one commit: one
        hand-off to the writer and one Deferred for all of them, not one per queue
        (those were most of a fanout's cost).  Queues that do not exist are
        skipped; the refusals (x-overflow reject-publish) are returned by name.

        The Deferred fires once every append is durable.  Unlike ``publish``, it is
        never answered early when the consumers finish a copy before the commit:
        that needs every queue's copy done, which a fanout seldom has, and a
        waiter per queue is the cost this saves."""
        ops: list[Op] = []
        refusals: list[tuple[str, Refusal]] = []
        pump: list[QueueLog] = []
        queues = self.queues
        for name, message in copies:
            queue = queues.get(name)
            if queue is None:
                continue
            if queue.refuses(message):
                if queue.reject_dead and queue.dead_letter is not None:
                    self._route_dead(queue, message, "maxlen", -1, "", 0, ops)
                refusals.append((name, self._overflow(queue, message, publisher)))
                continue
            if message.retain or message.dup:
                message = message.with_flags(False, False)
            self._append(queue, message, ops)
            if message.qos < 2:
                # (dispatched below, as ``publish`` does: not when the commit comes)
                self._appended_to.pop(queue, None)
                pump.append(queue)
        d = self._commit(ops)
        for queue in pump:
            if queue.committed < queue.next_offset and queues.get(queue.name) is queue:
                queue.committed = queue.next_offset
                self._pump_queue(queue)
        return d, refusals

    def room_problem(self, name: str | None, message: Message,
                     planned: dict[str, tuple[int, int]]) -> str | None:
        """Why queue ``name`` would refuse ``message`` now, after what ``planned``
        (a transaction's earlier publishes checked at its commit: queue ->
        messages, payload bytes) adds to it; None: it takes it (``planned`` then
        counts it).  Nothing changes but ``planned``.  A missing queue is made by
        the publish (a ``$queue/`` topic): only ``--queue-max-queues`` bounds it."""
        if name is None:
            return None
        queue = self.queues.get(name)
        if queue is None:
            if name not in planned and len(self.queues) + sum(
                    1 for q in planned if q not in self.queues
            ) >= self.limits.queue_max_queues:
                return f"too many queues (--queue-max-queues {self.limits.queue_max_queues})"
        else:
            bound = queue.reject_above
            if bound is not None:
                count, size = bound
                before, before_bytes = planned.get(name, (0, 0))
                ready, ready_bytes, _ = queue.ready()
                if ((count is not None and ready + before >= count)
                        or (size is not None
                            and ready_bytes + before_bytes + len(message.payload) > size)):
                    return f"queue {name!r} is full (x-overflow reject-publish)"
        before, before_bytes = planned.get(name, (0, 0))
        planned[name] = (before + 1, before_bytes + len(message.payload))
        return None

    def declare(self, name: str, transient: bool = False, extra_ops: Sequence[Op] = ()
                ) -> tuple[QueueLog | None, Deferred[None] | None]:
        """Queue ``name``, made now if it is missing (an AMQP 0.9.1 ``queue.declare``):
        the queue (None past ``--queue-max-queues``) and the commit that stores a
        new one with ``extra_ops``.  A ``transient`` queue stores nothing
        (``QueueLog.transient``)."""
        ops: list[Op] = []
        queue = self._queue(name, ops, transient)
        if queue is not None:
            ops.extend(extra_ops)
        return queue, self._commit(ops)

    def restore(self, records: Iterable[QueueRecord]) -> None:
        """Rebuild from storage.  Every message below a classic group's stored
        watermark that is not done counts one more delivery (it may have been
        delivered before the crash)."""
        for rec in records:
            retention = (Retention(*rec.retention)  # type: ignore[arg-type]
                         if rec.retention is not None
                         else self.default_retention(rec.name))
            queue = QueueLog(rec.name, retention, rec.head)
            # (before its groups: a priority queue's rebuild their order from the log)
            queue.set_max_priority(retention.max_priority)
            queue.next_offset = max(queue.next_offset, rec.next_offset)
            evicted = rec.evicted
            for offset, message in rec.messages:
                queue.log[offset] = message
                sizes = evicted.get(offset) if evicted else None
                if sizes is None:
                    queue.bytes += len(message.payload)
                    self.resident += body_size(message)
                else:   # (loaded without its body: ``load`` kept to the budget)
                    queue.evicted[offset] = sizes
                    queue.bytes += sizes[0]
                queue.next_offset = max(queue.next_offset, offset + 1)
            self.total_bytes += queue.bytes
            if queue.log:
                queue.first = min(queue.first, next(iter(queue.log)))
            queue.committed = queue.next_offset
            for key, g in rec.groups.items():
                group = ConsumerGroup(queue, g.name, g.filter, g.mode)
                group.key = key
                group.floor = max(g.floor, queue.first) if g.mode == CLASSIC else g.floor
                group.done = {o for o in g.done if o >= group.floor}
                group.advance_floor()
                group.stored_members = dict(g.members)
                self._stored_clients.update(group.stored_members)
                if g.mode == STREAM:
                    group.next = group.cursor_saved = min(max(g.cursor, queue.first),
                                                          queue.next_offset)
                else:
                    group.watermark = group.safe = g.watermark
                    group.next = group.floor
                    counts = dict(g.counts)
                    # (a priority group's levels each have their own: only what a
                    # level may have handed out counts; a record without them, all)
                    marks = dict(g.levels) if group.levels is not None else {}
                    top = queue.max_priority
                    if group.levels is not None and not marks and g.watermark > group.floor:
                        # (a record from before them: every level may have handed
                        # out what the watermark covers, now and at the next restart)
                        group.level_marks = {lv: g.watermark for lv in range(top + 1)}
                    else:
                        group.level_marks = dict(marks)
                    group.level_safe = dict(group.level_marks)
                    for offset in range(group.floor, min(g.watermark, queue.next_offset)):
                        held = queue.log.get(offset)
                        if held is not None and offset not in group.done and (
                                not marks or offset in counts
                                or offset < marks.get(level_of(held, top), 0)):
                            group.counts[offset] = counts.get(offset, 1)
                queue.groups[key] = group
                queue.next_offset = max(queue.next_offset, group.floor)
            self._skip_unstored_offsets(queue, rec.groups.values())
            queue.committed = queue.durable = queue.next_offset
            self.queues[rec.name] = queue
        self.alarm.check_total(self.total_bytes)
        if self.resident > self.budget > 0:
            self._evict()

    @staticmethod
    def _skip_unstored_offsets(queue: QueueLog, stored: Iterable[QueueGroupRecord]) -> None:
        """Never give out again an offset that may have gone out before the crash,
        and let floors and cursors jump the offsets that hold no message.

        QoS 0/1 messages go to consumers before their append is durable, so one
        whose append the crash lost was seen with an offset the log no longer has
        (its publisher got no acknowledgement and sends it again: a new message).
        Every classic delivery is below its group's stored watermark: new messages
        start above the highest, so a message id (``queue:offset``) always names one
        message, and a consumer deduplicating by it never drops a new one.  Every
        offset below that with no message in the log (skipped at an earlier
        restart, lost in the crash, deleted one by one) never holds one: the
        queue's skipped ranges, found again at every restart from the log itself.
        """
        top = max((g.watermark for g in stored if g.mode == CLASSIC), default=0)
        end = max(queue.next_offset, top)
        ranges: list[list[int]] = []
        low = queue.first
        for offset in sorted(queue.log):
            if offset > low:
                ranges.append([low, offset])
            low = offset + 1
        if end > low:
            ranges.append([low, end])
        queue.next_offset = end
        queue.skip_starts = [r[0] for r in ranges]
        queue.skip_ends = [r[1] for r in ranges]
        for group in queue.groups.values():
            if group.mode == CLASSIC:
                group.advance_floor()
                group.next = max(group.next, group.floor)
            else:
                group.next = queue.skip(group.next)


def _has_classic(queue: QueueLog) -> bool:
    """Whether a classic group may finish ``queue``'s messages (an early answer)."""
    for group in queue.groups.values():
        if group.mode == CLASSIC:
            return True
    return False
