"""A ``basic.consume``: a member of its queue's consumer group, delivering to one
channel (the core's ``ClientLink``).

What it owns: joining the group (``Broker.add_topic_receiver`` with the queue's
filter and default group, then ``start_topic_receiver``), the consumer's prefetch
as the credit the queue sees (``congested`` while the consumer, or its channel
under a global prefetch, holds as many unacknowledged deliveries as allowed, or
the socket's buffer is full), and leaving (``cancel``; ``close`` when the broker
ends it; ``queue_gone`` when its queue was deleted).  ``basic.get``'s
session of a channel is one too (``getter``: in no group, ``open_alone``).

What it must not do: encode frames or pick delivery tags (the channel does), or
hold queue rules (``core.queues``).
"""

from __future__ import annotations

from typing import Any

from mqttamqp.amqp091.hosts import ConsumerHost
from mqttamqp.core.auth import Identity
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.sessions.session import Session

__all__ = ["QueueConsumer"]


class QueueConsumer:
    """One consumer tag of a channel."""

    __slots__ = ("answering", "channel", "closed", "delivered", "getter", "key", "no_ack",
                 "prefetch", "queue", "session", "tag", "unacked")
    # (the queues build no metadata for a first delivery: ``Channel.deliver`` reads
    # only the delivery count of it, ``core.queues.metadata.COUNT_ONLY_ATTRIBUTE``)
    reads_delivery_count_only = True

    def __init__(self, channel: ConsumerHost, tag: str, queue: str, no_ack: bool,
                 prefetch: int, getter: bool = False) -> None:
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch      # 0: no per-consumer limit
        self.unacked = 0
        self.delivered = 0
        self.session: Session | None = None
        self.closed = False
        # basic.get's session of the channel: in no group, handed one message a get
        self.getter = getter
        self.answering = False   # (a getter: a basic.get is being answered now)
        self.key = _unused_key(
            channel, f"{channel.connection.key}:{channel.number}:{tag if not getter else 'get'}")

    def join(self, topic_filter: str, consumer: Consumer, identity: Identity | None = None
             ) -> bool:
        """Subscribe to the queue's group (as ``identity``: the connection's by
        default; False: refused); nothing is delivered until ``start`` (after
        ``basic.consume-ok``)."""
        broker = self.channel.connection.broker
        session = broker.add_topic_receiver(
            self.key, topic_filter, identity or self.channel.connection.identity,
            0 if self.no_ack else 1, consumer=consumer)
        if session is None:
            return False
        self.session = session
        self.apply_prefetch()
        return True

    def apply_prefetch(self) -> None:
        """The queue may have as many deliveries outstanding with this consumer as
        its prefetch allows (else the broker's --queue-prefetch, 16, would cap a
        prefetch of 100 and a consumer would get 16 a round trip): the consumer's
        own, else the channel's global one, else (0: unlimited, as RabbitMQ)
        --amqp091-max-unacked, which bounds all three.  Again when a basic.qos
        changes the channel's (``Channel.basic_qos``)."""
        session = self.session
        if session is None or self.no_ack or self.getter:
            return
        channel = self.channel
        cap = channel.connection.max_unacked
        limit = min(self.prefetch or getattr(channel, "global_prefetch", 0) or cap, cap)
        session.queue_prefetch = limit
        session.window = max(session.window, limit)

    def start(self) -> None:
        if self.session is not None:
            self.channel.connection.broker.start_topic_receiver(self.session, self)

    def open_alone(self) -> None:
        """basic.get's session: online, subscribed to nothing (the model hands it
        messages, ``Exchanges.get``); what it leaves unsettled goes back when it ends."""
        broker = self.channel.connection.broker
        session = broker.registry.add_link_subscriber(self.key)
        # Its unacknowledged gets are bounded by the channel's --amqp091-max-unacked,
        # not the session window's --max-inflight: a get past a full window would
        # be taken into the backlog and answered get-empty.
        session.window = max(session.window, self.channel.connection.max_unacked)
        self.session = session
        broker.activate(session, self, "amqp0-9-1")

    # ClientLink ----------------------------------------------------------------------

    @property
    def congested(self) -> bool:
        if self.closed:
            return True
        channel = self.channel
        if self.getter:
            # Only while a basic.get is answered: what its session holds back (a
            # full window) must not go out later, unasked and unseen.
            return not self.answering
        if channel.connection.write_blocked or not channel.flow_active:
            return True
        if self.no_ack:
            return False
        if self.prefetch and self.unacked >= self.prefetch:
            return True
        return channel.at_limit()

    @property
    def backlog_bytes(self) -> int:
        return 0

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        # (``subscription_ids``: MQTT 5's, no 0.9.1 field carries them)
        if self.closed:
            return
        if packet_id is not None:
            self.unacked += 1
        self.delivered += 1
        self.channel.deliver(self, message, packet_id, dup)

    def send_pubrel(self, packet_id: int) -> None:
        pass   # (queue deliveries are QoS 0 or 1)

    def close(self, reason: str) -> None:
        """Ended by the broker: the client hears ``basic.cancel`` if it said it
        understands one (consumer_cancel_notify)."""
        if self.closed:
            return
        self.closed = True
        self.session = None
        self.channel.cancelled_by_broker(self)

    def queue_gone(self) -> None:
        """Its queue was deleted (the console, ``queue.delete``, an auto-delete or
        exclusive queue's end: the queue manager's ``deleted_hooks``)."""
        if self.closed:
            return
        self.cancel()
        self.channel.cancelled_by_broker(self)

    # the channel's side --------------------------------------------------------------

    def settled(self) -> None:
        """One of its deliveries was acknowledged, rejected or requeued (after the
        core heard it: a cancelled consumer leaves with its last one)."""
        self.unacked -= 1
        if self.closed and self.unacked <= 0:
            self.leave()

    def wake(self) -> None:
        """It may take more (a prefetch freed, the socket drained)."""
        if not self.closed and self.session is not None:
            self.channel.connection.broker.link_drained(self.session)

    def cancel(self, keep_unacked: bool = False) -> None:
        """The client's ``basic.cancel`` (``keep_unacked``), its channel's or
        connection's end.  After a ``basic.cancel`` its unacknowledged deliveries
        stay the channel's, to be acked, nacked or rejected until it closes (as in
        RabbitMQ): the session stays in the group, handed nothing (``congested``),
        until the last is settled (``settled``) or the channel ends (``leave``)."""
        if self.closed:
            return
        self.closed = True
        if not (keep_unacked and self.unacked > 0):
            self.leave()

    def leave(self) -> None:
        """Out of the group; what it held unacknowledged goes back to the queue."""
        if self.session is None:
            return
        self.session = None
        self.closed = True
        self.channel.connection.broker.detach_topic_receiver(self.key)

    def info(self) -> dict[str, Any]:
        return {"tag": self.tag, "queue": self.queue, "no_ack": self.no_ack,
                "prefetch": self.prefetch, "unacked": self.unacked}


def _unused_key(channel: ConsumerHost, key: str) -> str:
    """``key``, the name of the consumer's session in the broker, or, while a
    session of that name is still there (a consumer cancelled with deliveries
    unacknowledged, whose tag RabbitMQ lets a new consumer reuse; a consumer
    tagged ``get`` beside basic.get's session), ``key#n``: two consumers never
    share one, or the old one's end would end the new one."""
    taken = channel.connection.broker.link_subscribers
    if key not in taken:
        return key
    for n in range(1, len(taken) + 2):   # (one of these is free)
        unique = f"{key}#{n}"
        if unique not in taken:
            return unique
    raise AssertionError("unreachable: more names tried than sessions exist")
