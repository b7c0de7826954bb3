"""What the console shows of one AMQP 0.9.1 connection beyond its consumers: the
settings it negotiated and its channels (``Amqp091Details``; a transactional
channel's open transaction: its publishes, acknowledgements and bytes held), read from the
connection's and its channels' fields when the console asks (never on the
publish or deliver path).

What it must not do: change the connection, or hand out its channels (the
details are frozen values)."""

from __future__ import annotations

from typing import Any

from mqttamqp.core.clients.connections import Amqp091ChannelInfo, Amqp091Details

__all__ = ["details"]


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
