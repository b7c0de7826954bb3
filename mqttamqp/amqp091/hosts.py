"""What the parts of a 0.9.1 connection need of each other, as protocols, so
that they import downwards only: a channel of its connection (``ChannelHost``),
a consumer of its channel (``ConsumerHost``), the model's methods of their
channel (``MethodHost``), a channel's transactions of it (``TxHost``).

What it must not do: hold behaviour; it declares.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.exchanges.exchanges import Exchanges
from mqttamqp.core.message import Message

__all__ = ["ChannelHost", "ConsumerHost", "MethodHost", "TxHost"]


class ChannelHost(Protocol):
    """What a channel needs from its connection (``connection.AMQP091Connection``)."""

    broker: Broker
    clock: Clock
    meter: DeliveryMeter
    factory: Any               # watch_alarm, exclusive, consumers_of, queue_deleted
    log: Any
    key: str
    serial: int
    identity: Identity
    username: str | None
    client_id: str
    write_blocked: bool
    max_unacked: int
    frame_max: int
    cancel_notify: bool
    messages_out: int
    peer: str

    def send_method(self, channel: int, method: Any) -> None: ...

    def send_content(self, channel: int, method: Any, properties: bytes,
                     body: bytes) -> None: ...

    def send_frames(self, data: bytes) -> None: ...

    def assembler(self, channel: Any) -> Any: ...

    def fail(self, code: int, text: str) -> None: ...

    def close_channel(self, channel: Any, exc: Any) -> None: ...

    def call_soon(self, fn: Any) -> None: ...

    def unacked_bound(self) -> None: ...

    def fed_congested(self, sessions: Any) -> None: ...


class ConsumerHost(Protocol):
    """What a consumer needs from its channel (``channel.Channel``)."""

    connection: ChannelHost
    number: int
    flow_active: bool

    def at_limit(self) -> bool: ...

    def deliver(self, member: Any, message: Message, packet_id: int | None,
                dup: bool) -> None: ...

    def cancelled_by_broker(self, member: Any) -> None: ...


class MethodHost(Protocol):
    """What the model's methods need from a channel (``channel.Channel``)."""

    connection: ChannelHost

    @property
    def exchanges(self) -> Exchanges: ...

    def answer(self, method: Any, durable: Deferred[None] | None) -> None: ...


class TxHost(Protocol):
    """What a channel's transactions (``transactions``) need from it."""

    connection: ChannelHost
    number: int
    closing: bool
    confirming: bool
    unacked: OrderedDict[int, tuple[Any, int]]
    tx: Any

    @property
    def exchanges(self) -> Exchanges: ...

    def answer(self, method: Any, durable: Deferred[None] | None) -> None: ...

    def route(self, message: Message, content: Any) -> Deferred[None] | None: ...

    def settle_taken(self, taken: Any, outcome: Any, failed: bool) -> None: ...
