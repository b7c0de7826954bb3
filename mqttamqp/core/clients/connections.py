"""Read models of live connections, for the console and the JSON API.

Every live connection (an MQTT socket after CONNACK, an AMQP connection after
open) registers with the broker and can describe itself as a ``ConnectionInfo``;
AMQP connections list their links as ``LinkInfo``.  Nothing here changes state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["LinkInfo", "AmqpSessionInfo", "AmqpDetails", "Amqp091ChannelInfo",
           "Amqp091Details", "ConnectionInfo",
           "EventFields", "InspectableConnection"]


@dataclass(frozen=True)
class LinkInfo:
    name: str
    role: str                  # "sender" or "receiver", from the broker's side
    address: str
    snd_settle_mode: str       # "unsettled", "settled" or "mixed"
    rcv_settle_mode: str       # "first" or "second"
    credit: int
    unsettled: int
    delivered: int
    session: int = 0           # which AMQP session (``AmqpSessionInfo.number``) it is on


@dataclass(frozen=True)
class AmqpSessionInfo:
    number: int                # 1, 2, ... in the order the peer began them
    links: int
    outgoing_window: int
    incoming_bytes: int        # buffered, not yet processed
    outgoing_bytes: int        # buffered, not yet written


@dataclass(frozen=True)
class AmqpDetails:
    """What an AMQP connection negotiated (None for MQTT)."""

    container_id: str
    sasl_mechanism: str        # "" when the client skipped SASL
    max_frame_size: int        # ours
    remote_max_frame_size: int
    idle_timeout: float        # ours, seconds
    remote_idle_timeout: float
    sessions: tuple[AmqpSessionInfo, ...] = ()


@dataclass(frozen=True)
class Amqp091ChannelInfo:
    number: int
    consumers: int
    prefetch: int              # basic.qos global=false: each new consumer's (0: none)
    global_prefetch: int       # basic.qos global=true: the channel's (0: none)
    unacked: int               # deliveries not yet acknowledged on it
    confirming: bool           # confirm.select
    unconfirmed: int           # publishes not yet confirmed
    flow_active: bool          # channel.flow
    transactional: bool = False    # tx.select
    tx_publishes: int = 0      # the open transaction's publishes (routed at commit)
    tx_acks: int = 0           # its acknowledgements (basic.ack/nack/reject)
    tx_bytes: int = 0          # the work it holds (--max-transaction-bytes)


@dataclass(frozen=True)
class Amqp091Details:
    """What an AMQP 0.9.1 connection negotiated and its channels (None otherwise);
    its consumers are ``ConnectionInfo.links`` (tag, queue, prefetch as credit,
    unacknowledged, delivered, channel as ``session``)."""

    mechanism: str
    channel_max: int
    frame_max: int
    heartbeat: int             # seconds (0: none)
    cancel_notify: bool        # the client's consumer_cancel_notify capability
    blocked_notify: bool       # the client's connection.blocked capability
    blocked: bool              # reading paused now (back-pressure)
    channels: tuple[Amqp091ChannelInfo, ...] = ()


@dataclass(frozen=True)
class ConnectionInfo:
    key: str                   # unique per live connection ("mqtt:<client id>", "amqp:<n>")
    client_id: str             # MQTT client id or AMQP container id
    protocol: str              # "mqtt3.1", "mqtt3.1.1", "mqtt5", "amqp", "amqp0-9-1"
    remote: str                # "host:port"
    user: str | None
    connected_since: float
    keepalive: int             # seconds (AMQP: idle time-out)
    clean_session: bool | None
    session_id: str | None  # the session it is attached to, if any
    will_owners: tuple[str, ...] = ()   # keys into Broker.wills this connection owns
    links: tuple[LinkInfo, ...] = field(default=())
    amqp: AmqpDetails | None = None
    amqp091: Amqp091Details | None = None
    # Traffic of this connection (a couple of integer increments per message on the
    # hot path; rates are the console's job): messages and bytes from the client (in)
    # and to it (out), and when it last sent anything (0: never).
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    last_activity: float = 0.0


# (client id, remote "host:port", user, clean session, keepalive seconds)
EventFields = tuple[str, str, "str | None", "bool | None", int]


class InspectableConnection(Protocol):
    def info(self) -> ConnectionInfo:
        ...

    def event_fields(self) -> EventFields:
        """What the archive records of a connect or disconnect: the fields of
        ``info()`` it needs, without building the whole record (a connect storm
        paid for eighteen fields, AMQP's links and sessions, twice a client)."""
        ...

    def close(self, reason: str) -> None:
        ...
