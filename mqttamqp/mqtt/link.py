"""What the parts of one MQTT connection share: its state and operations, declared.

``protocol.MQTTProtocol`` is one object built from parts by concern:
``executor.ActionExecutor`` (the decisions' actions carried out, the
acknowledgements in order), ``handshake.ConnectHandshake`` (CONNECT and AUTH to
CONNACK), ``flows.ConnectedFlows`` (the packets of a connected client: each
one's decision, and the broker calls between decisions), ``closing.Disconnects``
(the one disconnect),
``reading.InputPump`` (the input pump and reading pauses),
``inspect.ConnectionView`` (what the console sees) and the Twisted protocol
itself (bytes, batches, timers).
``MQTTLink`` declares, once, what the parts use of each other; ``MQTTProtocol``
has all of it (its slots and methods).  The parts are one chain of single bases,
in the order of ``MQTTProtocol``'s method resolution when they were mixins
(``MQTTLink`` → ``ConnectionView`` → ``InputPump`` → ``Disconnects`` →
``ActionExecutor`` → ``ConnectedFlows`` → ``ConnectHandshake`` → ``MQTTProtocol``),
so that in the compiled build (mypyc: single inheritance) every one is a native
class; a part still uses only what it or ``MQTTLink`` declares.  The connection is its own
``connection.ConnectionRules`` (``MQTTLink``'s base: the ``state`` slot and the
rules' methods), not a second object holding one field.  Nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from twisted.logger import Logger

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker, Published
from mqttamqp.core.clients.connections import InspectableConnection
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.entries import ClientLink
from mqttamqp.core.sessions.session import Session
from mqttamqp.mqtt.actions import Action
from mqttamqp.mqtt.codec import Decoder
from mqttamqp.mqtt.connection import (
    AckQueue,
    ConnectionRules,
    StringRules,
)
from mqttamqp.mqtt.deadlines import Deadlines
from mqttamqp.mqtt.decoders import SpareDecoders
from mqttamqp.mqtt.opened import OpenConnections
from mqttamqp.mqtt.packets import Publish, ReasonCode
from mqttamqp.mqtt.parking import Parked
from mqttamqp.mqtt.v5 import Negotiated
from mqttamqp.native import NO_SLOTS, mypyc_attr
from mqttamqp.security.enhanced_auth import EnhancedAuthenticator

__all__ = ["CoreLink", "ListenerState", "MQTTLink"]


class CoreLink(ClientLink, InspectableConnection, Protocol):
    """An MQTT connection as the core sees it: its session's link, and a
    connection the console inspects."""


class ListenerState(Protocol):
    """What the handshake uses of ``protocol.MQTTFactory``."""

    cert_as_user: bool
    enhanced_auth: EnhancedAuthenticator | None
    connect_deadlines: Deadlines
    keepalives: Deadlines
    decoders: SpareDecoders
    connect_lines: LogLimiter
    log_limit: LogLimiter
    opened: OpenConnections
    bridge_peers: set[Any]


@mypyc_attr(allow_interpreted_subclasses=True)
class MQTTLink(ConnectionRules):
    """The state and operations of one MQTT connection its parts share."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    log: ClassVar[Logger]
    # (the bools first: in the compiled build each is a byte, and these three share
    # a word with the attributes' bitmap, where elsewhere each took 8 bytes: a
    # connection 24 bytes smaller, in pymalloc's 320-byte class as in pure Python)
    clean_session: bool
    _in_process: bool
    congested: bool
    transport: Any
    factory: Any   # (Twisted's; ``_factory`` is the typed view, a call more)
    broker: Broker
    clock: Clock
    meter: DeliveryMeter
    limits: Limits
    strings: StringRules
    decoder: Decoder
    session: Session | None
    identity: Identity | None   # made at the first PUBLISH or SUBSCRIBE (``_identified``)
    client_id: str
    username: str | None
    version: str
    keepalive: int
    connected_since: float
    _v5: Negotiated | None
    _connect_timer: float | None    # due times, set by the ``Deadlines``
    _keepalive_timer: float | None
    messages_in: int
    _acks: AckQueue
    _cause: str
    _reading_paused_for: frozenset[str]
    _parked: Parked | None
    _throttle: PublishThrottle | None   # (--max-publish-rate: read per PUBLISH)
    _turn_timer: DelayedCall | None
    _last_activity: float
    messages_out: int
    _out: list[bytes] | None   # what the batch holds for the socket (``_emit``)
    bytes_in: int
    bytes_out: int
    _handlers: ClassVar[dict[type, Callable[[Any, Any], None]]]
    _connected_handlers: ClassVar[dict[type, Callable[[Any, Any], None]]]
    # The class's own PUBLISH handler: ``_process`` calls ``_on_publish`` directly
    # when the table holds it (not the debug log's, which wraps each handler).
    _plain_publish: ClassVar[Callable[[Any, Any], None]]

    # What one part calls of another declared as methods (not ``Callable``
    # attributes): in the compiled build the parts are one chain of native classes
    # (``protocol.MQTTProtocol``), where a method is a vtable entry that the part
    # defining it overrides, and an attribute would be a field of every connection.
    # None of these runs: every one is overridden.
    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def _send_disconnect(self, code: int, reason: str) -> None:
        raise NotImplementedError

    def _after_publish(self, session: Session, result: Published, size: int) -> None:
        raise NotImplementedError

    def _violation(self, reason: str, cause: str | None = None,
                   code: int = ReasonCode.PROTOCOL_ERROR, limit: str | None = None) -> None:
        raise NotImplementedError

    def _carry_out(self, action: Action, packet_id: int = 0) -> None:
        raise NotImplementedError

    def _lose(self) -> None:
        raise NotImplementedError

    def _process(self, now: float = 0.0) -> None:
        raise NotImplementedError

    def _on_publish(self, packet: Publish) -> None:
        raise NotImplementedError

    def _cancel_timers(self) -> None:
        raise NotImplementedError

    def _stop_connect_timer(self) -> None:
        raise NotImplementedError

    def _pause_reading(self, why: str) -> None:
        raise NotImplementedError

    def _resume_reading(self, why: str) -> None:
        raise NotImplementedError

    def start_debug(self, until: float) -> None:
        raise NotImplementedError

    def _identified(self) -> Identity:
        raise NotImplementedError

    def connectionMade(self) -> None:   # (Twisted's, ``protocol.MQTTProtocol``'s)
        raise NotImplementedError

    @property
    def bridge_peer(self) -> bool:   # the client announced Mosquitto's bridge flag
        raise NotImplementedError

    @bridge_peer.setter
    def bridge_peer(self, value: bool) -> None:
        raise NotImplementedError

    @property
    def peer(self) -> str:
        raise NotImplementedError

    @property
    def protocol_label(self) -> str:
        raise NotImplementedError

    @property
    def key(self) -> str:
        raise NotImplementedError

    @property
    def _factory(self) -> ListenerState:
        raise NotImplementedError

    @property
    def _link(self) -> CoreLink:
        """This connection as the core sees it."""
        raise NotImplementedError
