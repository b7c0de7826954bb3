"""What the console shows of one AMQP 0.9.1 connection: its consumers as links
(``links``), the settings it negotiated and its channels (``Amqp091Details``; a transactional
channel's open transaction: its publishes, acknowledgements and bytes held), read from the
connection's and its channels' fields when the console asks (never on the
publish or deliver path).

What it must not do: change the connection, or hand out its channels (the
details are frozen values)."""

from __future__ import annotations

from typing import Any

from mqttamqp.core.clients.connections import Amqp091ChannelInfo, Amqp091Details, LinkInfo

__all__ = ["details", "links"]


def links(connection: Any) -> tuple[LinkInfo, ...]:
    """``connection``'s consumers as the console shows links: the consumer tag, the
    queue, the prefetch as credit (0: none), the unacknowledged, the deliveries
    made; the channel number as the session."""
    return tuple(
        LinkInfo(member.tag, "sender", member.queue,
                 "settled" if member.no_ack else "unsettled", "first",
                 member.prefetch or channel.global_prefetch, member.unacked,
                 member.delivered, channel.number)
        for channel in connection.channels.values() for member in channel.consumers.values())


def details(connection: Any) -> Amqp091Details:
    """``connection`` (an ``AMQP091Connection``) as the console's client page shows it."""
    channels = tuple(
        Amqp091ChannelInfo(
            channel.number, len(channel.consumers), channel.prefetch,
            channel.global_prefetch, len(channel.unacked), channel.confirming,
            len(channel.confirms), channel.flow_active, channel.tx is not None,
            *(channel.tx.info() if channel.tx is not None else (0, 0, 0)))
        for _, channel in sorted(connection.channels.items()))
    return Amqp091Details(
        getattr(connection, "mechanism", ""), connection.channel_max, connection.frame_max,
        connection.heartbeat, connection.cancel_notify, connection.blocked_notify,
        bool(connection.reading_paused), channels)
