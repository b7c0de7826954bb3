"""Publishing: what an inbound message goes through before (and after) the router.

What it owns: a durable queue's acknowledgement commands (``$queue/<name>/$ack``,
``$nack``, ``$reject`` from an MQTT 5 member), the exactly-once rule of inbound
QoS 2 (a packet id is routed once, stored with its deliveries, and forgotten at
PUBREL or when the publish was refused), the per-topic counts the console shows,
and publishing without waiting (a storage failure is then logged here).

It also hands every publish of a topic to the queues bound to AMQP 0.9.1's
``amq.topic`` (``topic_exchange``, set only while something is bound there: one
attribute test per publish otherwise); their appends join ``Published.durable``.

What it must not do: route (``Router.publish`` does) or answer the publisher
(the adapter does, once ``Published.durable`` fires).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from twisted.internet.defer import Deferred

from mqttamqp.core.auth import Identity
from mqttamqp.core.commits import CommitBatcher, all_durable
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op
from mqttamqp.core.queues.addresses import QueueAddress, Refusal, is_command
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.routing.published import ROUTED, Published
from mqttamqp.core.routing.router import Router
from mqttamqp.core.routing.topicstats import TopicStats
from mqttamqp.core.sessions.session import Session

__all__ = ["Publishing", "TopicExchange"]


class TopicExchange(Protocol):
    """What the queues bound to ``amq.topic`` are to a publish
    (``core.exchanges.topicspace.TopicSpace``)."""

    def from_topic(self, message: Message) -> Deferred[None] | None:
        """Append ``message`` to the queues bound with a matching key; the
        Deferred fires once those appends are durable."""


class Publishing:
    def __init__(self, commits: CommitBatcher, router: Router, queues: QueueManager,
                 topic_stats: TopicStats, sessions: dict[str, Session]) -> None:
        self._commits = commits
        self._router = router
        self._queues = queues
        self.topic_stats = topic_stats
        self._topic_counts = topic_stats.by_topic
        self._sessions = sessions
        # The queues bound to amq.topic (AMQP 0.9.1), while any are.
        self.topic_exchange: TopicExchange | None = None

    def publish(self, message: Message, identity: Identity | None = None,
                wait: bool = True, counted: bool = True,
                count_drops: bool = False, early: bool = False) -> Published:
        """Route ``message`` (checked against ``identity``'s permissions, if given).

        With ``wait`` False nobody waits for ``Published.durable``: a storage
        failure is logged here and ``durable`` is None.  ``count_drops``: say in
        ``Published.dropped`` how many subscribers' queue bounds refused it.
        ``early``: the caller can wait on ``Published.waiter`` (``Router.publish``).
        (Not keyword-only: the MQTT flows call it positionally, every publish, since
        a call with keywords costs more.)
        """
        topic = message.topic
        queue = self._queues.address(topic) if topic[:1] == "$" else None
        if queue is not None and is_command(queue, topic):
            return self._queue_command(message, identity, queue)
        # (positional: extra_ops, counted, hold, count_drops, queue, early)
        exchange = self.topic_exchange
        result = self._router.publish(message, identity, (), counted, False, count_drops,
                                      queue, early and exchange is None)
        routed = result is ROUTED and exchange is None   # (its fields known: not read)
        if exchange is not None and queue is None and not result.denied:
            result = self._bound(message, result)
        if counted and (routed or not result.denied):
            counts = self._topic_counts   # (``TopicStats.note`` for a known topic)
            n = counts.get(topic)
            if n is not None:
                counts[topic] = n + 1
            else:
                self.topic_stats.note(topic)
        if routed or wait or result.durable is None:
            return result
        self._commits.watch(result.durable, "routing a message")
        return Published(None, result.congested, result.denied, blocked=result.blocked)

    def _queue_command(self, message: Message, identity: Identity | None,
                       address: QueueAddress | str) -> Published:
        """``$queue/<name>/$ack|$nack|$reject`` from an MQTT 5 member (user
        properties ``message-id``, ``group-id``, ``reason``): ``durable`` fires once
        the change is stored; ``refusal`` says why it was not taken."""
        client_id = identity.client_id if identity is not None else message.publisher
        session = self._sessions.get(client_id or "")
        if session is None:
            return Published(refusal=Refusal(0x80, "only a consumer's session may "
                                             "acknowledge queue messages"))
        props = message.props
        durable, refusal = self._queues.command(
            session, address, message.topic,
            props.user_properties if props is not None else ())
        return Published(durable, refusal=refusal)

    def publish_with(self, message: Message, extra_ops: Sequence[Op]) -> Published:
        """The broker's own publish of a will, deleted in the same commit
        (``extra_ops``)."""
        self.topic_stats.note(message.topic)
        result = self._router.publish(message, None, extra_ops)
        if self.topic_exchange is not None:
            result = self._bound(message, result)
        return result

    def _bound(self, message: Message, result: Published) -> Published:
        """``message`` reaches the queues bound to amq.topic too: its
        acknowledgement waits for those appends as well, and while the queues'
        storage alarm holds (or their writer is behind) the publisher is told
        ``blocked``, as one publishing to ``$queue/`` directly is."""
        assert self.topic_exchange is not None
        if message.topic[:1] == "$":
            return result
        appended = self.topic_exchange.from_topic(message)
        if appended is None:
            return result
        return replace(result, durable=all_durable([result.durable, appended]),
                       blocked=result.blocked or self._queues.paused)

    def publish_qos2(self, session: Session, message: Message, identity: Identity | None,
                     packet_id: int, count_drops: bool = False) -> Published:
        """An inbound QoS 2 PUBLISH: routed once per packet id, which is stored with
        it; ``durable`` is what PUBREC waits for (a duplicate waits behind whatever
        commit is still pending, e.g. the first copy's).  The deliveries wait too:
        the adapter opens ``Published.gate`` once PUBREC is out, so the publisher
        has its PUBREC before any subscriber (itself included) has the message."""
        if session.inbound_seen(packet_id):
            return Published(self._commits.barrier())
        queue = self._queues.address(message.topic) if message.topic[:1] == "$" else None
        if queue is not None and is_command(queue, message.topic):
            command = self._queue_command(message, identity, queue)
            if command.refusal is None:
                # Kept as any QoS 2 id, so that PUBREL finds it (PUBCOMP 0) and a
                # re-sent PUBLISH is not applied twice; a refusal ends at PUBREC.
                self._commits.background(session.inbound_add(packet_id),
                                         "recording a QoS 2 packet id")
            return command
        result = self._router.publish(message, identity, session.inbound_add(packet_id),
                                      hold=True, count_drops=count_drops, queue=queue)
        if self.topic_exchange is not None and queue is None and not result.denied:
            result = self._bound(message, result)
        if not result.denied:
            self.topic_stats.note(message.topic)
        if result.durable is not None:
            result.durable.addErrback(_forget_inbound, session, packet_id)
        if result.refusal is not None or result.denied:
            # A refused queue publish or a denied one is not routed: its packet id
            # must not make the client's next PUBLISH with that id look like a
            # duplicate (an MQTT 5 client's exchange ends at the failing PUBREC; a
            # 3.1.1 client's PUBREL of it still gets PUBCOMP, and a re-sent copy is
            # denied again).
            self._commits.background(session.inbound_release(packet_id),
                                     "forgetting a refused QoS 2 packet id")
        return result

    def release_qos2(self, session: Session, packet_id: int) -> Deferred[None] | None:
        """PUBREL from the publisher: forget its packet id; PUBCOMP waits for this."""
        return self._commits.persist(session.inbound_release(packet_id))


def _forget_inbound(failure: object, session: Session, packet_id: int) -> object:
    """The commit holding a QoS 2 packet id failed: its retry must be routed again."""
    session.inbound_qos2.discard(packet_id)
    return failure
