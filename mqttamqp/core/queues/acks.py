"""Acknowledgements and the dead-letter queue.

MQTT 5 members acknowledge with ``$queue/<name>/$ack|$nack|$reject`` and user
properties (``command``); AMQP outcomes other than Accepted arrive through
``settle``.  A nack makes a message visible again until ``--queue-max-deliveries``,
a reject (or too many deliveries) moves it to ``$dlq/<name>`` with its origin, or,
for a queue with a dead-letter route (AMQP 0.9.1's x-dead-letter-exchange,
``QueueLog.dead_letter``; also taken by retention's drops), to the queues that
route names (``_route_dead``), with the same origin properties."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from twisted.internet.defer import Deferred

from mqttamqp.core.message import Message, MessageProperties
from mqttamqp.core.persistence import Op, PutQueueGroup
from mqttamqp.core.queues.addresses import (
    ACK,
    DLQ_PREFIX,
    NACK,
    QUEUE_PREFIX,
    STREAM,
    TOPIC_NAME_INVALID,
    QueueAddress,
    Refusal,
)
from mqttamqp.core.queues.deaths import DEATHS, add_death
from mqttamqp.core.queues.dispatch import Dispatch
from mqttamqp.core.queues.metadata import DLQ_KEYS, without_metadata
from mqttamqp.core.queues.model import ConsumerGroup, Pending, QueueLog, StreamRead
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.session import Session

__all__ = ["Acknowledgements"]

class Acknowledgements(Dispatch):
    """Explicit acknowledgements, AMQP settlements and dead-lettering."""

    def _find(self, session: Session, message_id: str | None, group_id: str | None,
              address: QueueAddress) -> tuple[ConsumerGroup, int] | str:
        if not message_id:
            return "no message-id user property (it is <queue>:<offset>)"
        name, sep, digits = message_id.rpartition(":")
        if not sep or not digits.isdigit():
            return f"malformed message-id {message_id!r} (it is <queue>:<offset>)"
        if name != address.queue:
            return f"message-id {message_id!r} is not of queue {address.queue!r}"
        queue = self.queues.get(name)
        if queue is None:
            return f"no queue {name!r}"
        offset = int(digits)
        groups = ([queue.groups[group_id]] if group_id in queue.groups
                  else [] if group_id else list(queue.groups.values()))
        if not groups:
            return f"no group {group_id!r} on queue {name!r}"
        for g in groups:
            if not any(m.session is session for m in g.members):
                continue
            if g.mode == STREAM:
                return (g, offset)
            pending = g.pending.get(offset)
            if pending is not None and pending.member.session is session:
                return (g, offset)
        if not any(any(m.session is session for m in g.members) for g in groups):
            return (f"{session.client_id} is not a member of group "
                    f"{group_id or '(any)'!r} of queue {name!r}")
        return f"message {message_id!r} is not pending for {session.client_id}"

    def command(self, session: Session, address: QueueAddress | str, topic: str,
                user_properties: Iterable[tuple[str, str]]
                ) -> tuple[Deferred[None] | None, Refusal | None]:
        """An acknowledgement published by an MQTT 5 member: ``$ack``, ``$nack`` or
        ``$reject`` with user properties ``message-id``, ``group-id`` (and
        ``reason``), ``topic`` parsed as ``address`` (``QueueManager.address``).  The
        Deferred fires once the change is durable."""
        if isinstance(address, str) or address.action is None:
            reason = address if isinstance(address, str) else "not an acknowledgement"
            return None, self._refuse("ack", session.client_id, topic, reason,
                                      TOPIC_NAME_INVALID)
        props: dict[str, str] = {}
        for key, value in user_properties:
            props.setdefault(key, value)
        found = self._find(session, props.get("message-id"), props.get("group-id"), address)
        if isinstance(found, str):
            return None, self._refuse("ack", session.client_id, topic, found)
        group, offset = found
        ops: list[Op] = []
        if group.mode == STREAM:
            if not group.queue.first <= offset < group.next:
                return None, self._refuse(
                    "ack", session.client_id, topic,
                    f"offset {offset} is not one group {group.key!r} has read "
                    f"({group.queue.first} to {group.next - 1})")
            if address.action == ACK:           # an explicit cursor commit
                group.cursor_saved = offset + 1
                group.cursor_saved_at = self.clock.seconds()
                ops.append(PutQueueGroup(group.queue.name, group.key,
                                         replace(group.record(), cursor=offset + 1)))
            return self._commit(ops), None
        pending = group.pending.pop(offset)
        pending.member.outstanding -= 1   # (its receipt is void: no longer pending)
        pending.detach()
        if address.action == ACK:
            self._done(group, offset)
            group.acked += 1
            group.queue.acked += 1
            self.stats.acked += 1
        elif address.action == NACK:
            self.stats.nacked += 1
            self._again(group, offset, ops, "nacked")
        else:
            self.stats.rejected += 1
            self._dead_letter(group, offset, props.get("reason") or "rejected", ops)
        d = self._commit(ops)
        self._pump(group)
        return d, None

    def settle(self, receipt: Pending | StreamRead, entry: OutEntry, outcome: str,
               failed: bool, reason: str | None) -> None:
        """An AMQP outcome other than Accepted on ``entry``, the delivery of
        ``receipt``: ``released`` (nack, not counted), ``modified`` (nack; ``failed``
        counts it), ``rejected`` (dead-letter with ``reason``).  Its session's
        window slot is free: it is fed (``_window_freed``)."""
        session = receipt.member.session
        self._settle(session, receipt, entry, outcome, failed, reason)
        self._window_freed(session)

    def _settle(self, session: Session, receipt: Pending | StreamRead, entry: OutEntry,
                outcome: str, failed: bool, reason: str | None) -> None:
        queue = self.queues.get(receipt.group.queue.name)
        group = queue.groups.get(receipt.group.key) if queue is not None else None
        session.take_back(entry)
        if group is None:
            return
        if group.mode == STREAM:
            # (no redelivery in a stream; the delivery is over all the same: its
            # member's prefetch is free again)
            receipt.acknowledged()
            return
        offset = receipt.offset
        pending = group.pending.get(offset)
        if pending is None or pending.member.session is not session:
            return
        del group.pending[offset]
        pending.member.outstanding -= 1
        pending.detach()   # (``entry`` was taken back above)
        ops: list[Op] = []
        if outcome == "rejected":
            self.stats.rejected += 1
            self._dead_letter(group, offset, reason or "rejected", ops,
                              queue is not None and queue.discard_rejected)
        else:
            self.stats.nacked += 1
            if outcome == "released" or not failed:
                group.counts[offset] = max(0, group.counts.get(offset, 1) - 1)
                group.uncounted.add(offset)
            self._again(group, offset, ops, "released")
        self._commit(ops, "recording a queue settlement")
        self._pump(group)

    def _again(self, group: ConsumerGroup, offset: int, ops: list[Op], why: str) -> None:
        """Visible again, or dead-lettered past ``--queue-max-deliveries``."""
        if group.counts.get(offset, 0) >= self.limits.queue_max_deliveries:
            self._dead_letter(
                group, offset,
                f"{why} after {group.counts.get(offset, 0)} deliveries "
                f"(--queue-max-deliveries {self.limits.queue_max_deliveries})", ops)
            return
        group.requeue(offset)
        ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))

    def _dead_letter(self, group: ConsumerGroup, offset: int, reason: str, ops: list[Op],
                     discard: bool = False) -> None:
        queue = group.queue
        message = queue.log.get(offset)
        count = group.counts.get(offset, 0)
        # Not consumed: its publisher waits for the commits (the dead letter's too,
        # which is in the same or a later one), never early.
        queue.unwait(offset)
        self._done(group, offset)
        if message is None:
            return
        queue.dead += 1
        self.stats.dead_lettered += 1
        if queue.dead_letter is not None:   # (AMQP 0.9.1's x-dead-letter-exchange)
            self._route_dead(queue, message, reason, offset, group.key, count, ops)
            return
        if queue.name.startswith(DLQ_PREFIX) or queue.transient or discard:
            return   # (a dead-letter or transient queue's dead messages go nowhere: counted)
        dlq = self._queue(DLQ_PREFIX + queue.name, ops)
        if dlq is None:
            return
        extra = (("origin-queue", queue.name), ("origin-offset", str(offset)),
                 ("origin-group", group.key), ("delivery-count", str(count)),
                 ("reason", reason))
        props = message.props or MessageProperties()
        dead = replace(message, topic=DLQ_PREFIX + message.topic[len(QUEUE_PREFIX):],
                       props=replace(props, user_properties=without_metadata(
                           props.user_properties) + extra))
        self._append(dlq, dead, ops)

    def _death(self, name: str, message: Message, kind: str) -> str:
        """The message's death history (``deaths``) with this death in queue
        ``name`` added: the exchange and key it had are those of its last
        dead-lettering, else (a 0.9.1 publisher's: None, its envelope says) the
        default exchange and the key its topic in the queue says."""
        before = last_exchange = last_key = None
        for k, v in message.props.user_properties if message.props is not None else ():
            if k == DEATHS:
                before = v
            elif k == "dead-letter-exchange":
                last_exchange = v
            elif k == "dead-letter-routing-key":
                last_key = v
        if last_exchange is None and message.amqp091 is None:
            rest = message.topic[len(QUEUE_PREFIX) + len(name) + 1:]
            last_exchange, last_key = "", rest.replace("/", ".") if rest else name
        return add_death(before, name, kind, self.clock.seconds(), last_exchange, last_key)

    def _route_dead(self, queue: QueueLog, message: Message, reason: str, offset: int,
                    group: str, count: int, ops: list[Op]) -> None:
        """A dead message of ``queue``, which has a dead-letter route (AMQP 0.9.1's
        x-dead-letter-exchange): appended to the queues the route names, with its
        origin as user properties (as ``$dlq/`` messages carry it) and the
        exchange and routing key it was dead-lettered with (``dead-letter-exchange``,
        ``dead-letter-routing-key``: a 0.9.1 delivery's exchange and key, and its
        x-death header, come from these).  Never back into ``queue`` for a reason of
        its own retention (that would not end)."""
        assert queue.dead_letter is not None
        exchange, key, targets = queue.dead_letter(message, reason)
        if not targets:
            return
        props = message.props or MessageProperties()
        # (the reasons of RabbitMQ's x-death: rejected, expired, maxlen, delivery_limit)
        kind = (reason if reason in ("expired", "maxlen")
                else "delivery_limit" if "deliveries" in reason else "rejected")
        extra = (("origin-queue", queue.name), ("origin-offset", str(offset)),
                 ("origin-group", group), ("delivery-count", str(count)),
                 ("reason", kind), ("dead-letter-exchange", exchange),
                 ("dead-letter-routing-key", key),
                 (DEATHS, self._death(queue.name, message, kind)))
        users = tuple(kv for kv in props.user_properties if kv[0] not in DLQ_KEYS) + extra
        plain = not key or "+" in key or "#" in key or "\x00" in key
        for name in targets:
            target = self.queues.get(name)
            if target is None or (target is queue and reason in ("expired", "maxlen")):
                continue
            if target.refuses(message):
                # (as RabbitMQ: a reject-publish target refuses dead letters too;
                # they are dropped, counted and logged, never dead-lettered again)
                self._refuse("overflow", queue.name, QUEUE_PREFIX + name,
                             f"queue {name!r} is full (x-overflow reject-publish): "
                             "dead letter dropped")
                continue
            topic = QUEUE_PREFIX + name if plain or key == name else (
                QUEUE_PREFIX + name + "/" + key)
            self._append(target, replace(
                message, topic=topic, retain=False, dup=False,
                props=replace(props, user_properties=users)), ops)
