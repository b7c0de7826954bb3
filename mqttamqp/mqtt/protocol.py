"""The MQTT 3.1 / 3.1.1 / 5 connection: bytes from Twisted into the codec, packets
into the broker core, and the core's deliveries back out as bytes.

This module owns the transport side of one connection: feeding the codec, the
connect-timeout and keepalive timers, writing (one write per connection per
batch), and back-pressure (it is a push producer for its socket and pauses reading
when the subscribers it feeds fall behind).  The rules themselves — the state
machine, which packet may come when, the keepalive deadline and the order of
acknowledgements — are sans-IO in ``connection``; this module carries out what
they decide.

One connection's input is handled for at most ``Limits.mqtt_turn`` seconds in one
reactor turn while other clients wait to be read: then it is not read, and what it
sent is held, until a later turn (``_yield_turn``), so that a client whose packets
are costly (user properties, a fan-out, a flood of small ones) cannot stall the
others.

There is exactly one place that turns a protocol error into a disconnect:
``_violation`` (for MQTT 5 it sends DISCONNECT with the reason code first, or
CONNACK with it before the connection is accepted).  The routing rules live in
``mqttamqp.core``, not here; what an MQTT 5 connection negotiated, and the rules
that need it, live in ``v5``.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.broker import Broker, Published
from mqttamqp.core.clients.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clients.connections import ConnectionInfo, EventFields
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.queues.addresses import Consumer, is_queue_command, is_queue_topic
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_STORAGE,
    CAUSE_TAKEN_OVER,
)
from mqttamqp.core.routing.shared import route_filter
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, RETAIN_HANDLING, Session
from mqttamqp.core.topics import topic_matches
from mqttamqp.mqtt.codec import (
    Decoder,
    MalformedPacket,
    PropertyLimits,
    encode,
    encode_properties,
    encode_publish,
)
from mqttamqp.mqtt.connection import (
    MAX_PENDING_ACKS,
    AckQueue,
    ConnectionRules,
    ConnectionState,
    Deadlines,
    Keepalive,
    StringRules,
)
from mqttamqp.mqtt.packets import (
    PROTOCOL_5,
    PROTOCOL_31,
    PROTOCOL_311,
    SUBACK_FAILURE,
    Auth,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from mqttamqp.mqtt.v5 import (
    CONNACK_REASONS,
    RECEIVE_MAXIMUM,
    Negotiated,
    message_properties,
    negotiate,
    publish_properties,
    resolve_topic,
    utf8_payload_problem,
)
from mqttamqp.net.tcp import others_waiting, plain_tcp, send
from mqttamqp.net.tls import verified_common_name
from mqttamqp.security.enhanced_auth import (
    CONTINUE,
    SUCCESS,
    AuthExchange,
    AuthStep,
    EnhancedAuthenticator,
)

__all__ = ["MQTTProtocol", "MQTTFactory", "ConnectionState", "MAX_PENDING_ACKS"]

_PINGRESP = encode(Pingresp())
# CONNACK accepting a 3.1/3.1.1 client, by session present (encoded once).
_CONNACK_ACCEPTED = {present: encode(Connack(present, ConnackCode.ACCEPTED))
                     for present in (False, True)}
_CLOSED = ConnectionState.CLOSED
_CONNECTED = ConnectionState.CONNECTED
_AWAITING_CONNECT = ConnectionState.AWAITING_CONNECT
# Output held for one batch before it is written anyway (Twisted's own write buffer
# pauses its producer past 64 KiB; see MQTTProtocol._emit).
OUTPUT_BATCH_BYTES = 64 * 1024
# While publishers to durable queues are blocked, the packets of a connection that
# wait (``_Parked``) before it stops being read at all: bytes of payload, packets.
PARKED_BYTES = 256 * 1024
PARKED_PACKETS = 1024


class _Parked:
    """What a connection holds while publishers to durable queues are blocked
    (``MQTTProtocol._park``): it is still read, so that the acknowledgements of
    what it consumes (PUBACK, PUBREC, PUBCOMP, ``$ack``) and PINGREQ are handled
    and the queues can drain; the PUBLISHes to ``$queue/`` (and, in order, every
    packet after the first of them) wait here until the queues have room."""

    __slots__ = ("bytes", "packets", "waiting")

    def __init__(self) -> None:
        self.waiting = True   # registered with the storage alarm, not resumed yet
        self.packets: deque[Any] = deque()
        self.bytes = 0


# Handled at once even behind parked packets: they only settle what was sent.
_NEVER_PARKED = frozenset((Puback, Pubrec, Pubrel, Pubcomp, Pingreq))


def _parked_size(packet: Any) -> int:
    return len(packet.payload) + len(packet.topic) if type(packet) is Publish else 16


_FRAME_KINDS = ("reserved", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
                "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ",
                "PINGRESP", "DISCONNECT", "reserved")


def _consumer(props: Properties | None) -> Consumer | None:
    """How the ``$queue/`` filters of an MQTT 5 SUBSCRIBE join their queues: the
    user properties ``consumer-group``, ``consumer-mode`` and ``stream-offset``
    (the first of each; None when there are none: the core's defaults).  The core
    judges the values (SUBACK 0x80 for a mode or offset it does not know)."""
    if props is None or not props.user_properties:
        return None
    users: dict[str, str] = {}
    for key, value in props.user_properties:
        users.setdefault(key, value)
    return Consumer(group=users.get("consumer-group") or None,
                    mode=users.get("consumer-mode") or None,
                    stream_offset=users.get("stream-offset") or None)


def _frame_kind(data: bytes) -> str:
    """The MQTT packet type of an encoded frame (for debug lines)."""
    return _FRAME_KINDS[data[0] >> 4] if data else "empty"


def _ack_frame(kind: int, packet_id: int) -> bytes:
    return bytes((kind, 2, packet_id >> 8, packet_id & 0xFF))


# One-entry cache: fan-out sends the same QoS 0 message to many subscribers in a
# row; encode it once.
_qos0_cache: list[Any] = [None, False, b""]
_qos0_cache5: list[Any] = [None, False, b""]   # the same for MQTT 5 subscribers
_NO_PROPERTIES = b"\x00"


class _AuthInProgress:
    """An MQTT 5 AUTH exchange: its method, and for the first one the CONNECT it
    decides (``packet`` None: a re-authentication while connected)."""

    __slots__ = ("assigned", "exchange", "final", "method", "packet")

    def __init__(self, exchange: AuthExchange, method: str, packet: Connect | None,
                 assigned: bool) -> None:
        self.exchange = exchange
        self.method = method
        self.packet = packet
        self.assigned = assigned
        self.final: bytes | None = None


_NOT_PAUSED: frozenset[str] = frozenset()   # (one, shared)
# Reading paused for these, what was read is not handled either (``_process``).
_HOLD_INPUT = frozenset({"congestion", "turn"})
_RECHECK = 0.001   # seconds between "do others wait?" once a turn's share is used up
# "mqtt" + version, one string for all connections (not three copies each).
_PROTOCOL_LABELS = {v: "mqtt" + v for v in ("3.1", "3.1.1", "5")}


@implementer(IPushProducer)
class MQTTProtocol(Protocol):
    log = Logger()
    transport: Any
    # Slots: more than 30 instance attributes would cost every connection a full
    # (unshared) __dict__ of about 1.5 KB.  Twisted's ``transport`` and ``connected``
    # are slots too: with them here CPython never allocates the instance's dict.
    __slots__ = (
        "_acks",
        "_auth",
        "_backlog",
        "_cause",
        "_cause_detail",
        "_clean_close",
        "_congested",
        "_connect_timer",
        "_in_process",
        "_keepalive",
        "_keepalive_timer",
        "_last_activity",
        "_out",
        "_out_bytes",
        "_parked",
        "_peer",
        "_reading_paused_for",
        "_throttle",
        "_turn_timer",
        "_v5",
        "broker",
        "bytes_in",
        "bytes_out",
        "clean_session",
        "client_id",
        "clock",
        "connected",
        "connected_since",
        "decoder",
        "factory",
        "identity",
        "keepalive",
        "limits",
        "messages_in",
        "messages_out",
        "meter",
        "rules",
        "session",
        "strings",
        "transport",
        "username",
        "version",
    )

    def __init__(self, factory: MQTTFactory) -> None:
        self.transport = None
        self.connected = 0
        self._peer: str | None = None
        self.factory = factory
        self.broker = factory.broker
        self.clock = factory.clock
        self.meter = factory.meter
        self.limits: Limits = factory.broker.limits
        self.rules = ConnectionRules()
        self.strings: StringRules = factory.strings
        self.decoder = Decoder(max_packet_size=self.limits.max_packet_size,
                               property_limits=factory.property_limits, server=True)
        self.session: Session | None = None
        self.identity: Identity | None = None
        self.client_id = ""
        self.username: str | None = None
        self.version = ""
        self.keepalive = 0
        self.clean_session = True
        self.connected_since = 0.0
        self._clean_close = False
        self._cause = CAUSE_LOST     # why the connection ends, for the archive
        self._cause_detail = ""
        self._last_activity = 0.0
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self._connect_timer: list[Any] | None = None     # in factory.connect_deadlines
        self._keepalive: Keepalive | None = None
        self._keepalive_timer: list[Any] | None = None   # in factory.keepalives
        self._acks = AckQueue()
        self._congested = False
        self._out: list[bytes] | None = None   # written when the current batch ends
        self._out_bytes = 0
        self._backlog = 0
        # (a frozenset, replaced on change: the empty one is shared, an empty set
        # is 216 bytes per connection)
        self._reading_paused_for: frozenset[str] = _NOT_PAUSED
        self._in_process = False   # inside ``_process`` (no nested run on resume)
        self._parked: _Parked | None = None   # durable queues blocked: see ``_park``
        rate = self.broker.gate.publish_rate()     # None: publish rate not limited
        self._throttle = (None if rate is None else
                          PublishThrottle(rate, self.clock, self._rate_paused, self._rate_over))
        self._turn_timer: DelayedCall | None = None   # input held until a later turn
        self._v5: Negotiated | None = None     # set once an MQTT 5 CONNECT is read
        self._auth: _AuthInProgress | None = None   # an MQTT 5 AUTH exchange under way

    @property
    def state(self) -> ConnectionState:
        return self.rules.state

    @property
    def peer(self) -> str:
        """The client's ``host:port``, made once, when first read: every CONNECT
        reads it (admission, bans, authentication, the archive's connect event),
        three builds a connection for the 64 bytes kept."""
        peer = self._peer
        if peer is not None:
            return peer
        transport = self.transport
        if transport is None:
            return "?"
        client = getattr(transport, "client", None)
        if type(client) is tuple and len(client) >= 2:
            # (a TCP transport's accepted address: what getPeer would wrap)
            peer = f"{client[0]}:{client[1]}"
        else:
            address = transport.getPeer()
            peer = f"{getattr(address, 'host', '?')}:{getattr(address, 'port', '?')}"
        self._peer = peer
        return peer

    @property
    def protocol_label(self) -> str:
        """``mqtt3.1``, ``mqtt3.1.1`` or ``mqtt5`` (one shared string each)."""
        return _PROTOCOL_LABELS.get(self.version) or "mqtt" + self.version

    # -- Twisted ----------------------------------------------------------------

    def connectionMade(self) -> None:
        self._last_activity = self.clock.seconds()
        if not self.broker.gate.admit("MQTT", self.peer, len(self.factory.connections)):
            self.rules.advance("close")
            self.transport.abortConnection()
            return
        self.factory.connections[self] = None
        if plain_tcp(self.transport) and not getattr(self.transport, "nodelay", False):
            # Output is batched per socket read and sent at once (``_send``): without
            # this, Nagle's algorithm holds a second small write until the peer's
            # (possibly delayed) ACK.  (``nodelay``: the socket has it from its
            # listener, see ``net.tcp.lean_port``.)
            self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)
        self._connect_timer = self.factory.connect_deadlines.add(
            self, self.limits.connect_timeout)

    def dataReceived(self, data: bytes) -> None:
        if self.rules.state is _CLOSED:
            return
        self._last_activity = self.clock.seconds()
        self.meter.received_bytes(len(data))
        self.bytes_in += len(data)
        self.decoder.feed(data)
        self._process_batch()

    def _process_batch(self) -> None:
        """``_process`` as one batch: what it causes is committed and written once."""
        broker = self.broker
        broker.begin_batch()
        try:
            self._process()
        finally:
            broker.end_batch()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.connections.pop(self, None)
        self.broker.forget_paused(id(self))
        self._cancel_timers()
        was = self.state
        self.rules.advance("close")
        # Pending acknowledgements are not dropped: a committed QoS 2 message still
        # goes to its subscribers once its commit fires (``_flush_acks``).
        detail = self._cause_detail
        if not detail and self._cause == CAUSE_LOST and reason is not None:
            detail = "connection lost: " + reason.getErrorMessage()
        self.broker.unregister_connection(self.key, self, self._cause, detail)
        if self.session is not None:
            why = "client disconnected" if self._clean_close else (
                detail or "connection lost: unknown")
            # Lost before CONNACK: the CONNECT (and its will) was never accepted.
            clean = self._clean_close or was is ConnectionState.CONNECTING
            self.broker.end_session(self, self.session, clean, why, self._cause)
            self.session = None

    # IPushProducer: the transport tells us when its write buffer is full/drained.
    def pauseProducing(self) -> None:
        # Twisted calls this on every write while its buffer is full, not once: the
        # backlog counts from the first pause until resumeProducing, so a QoS 0
        # subscriber that stopped reading is held to congested_qos0_bytes.
        if not self._congested:
            self._congested = True
            self._backlog = 0

    def resumeProducing(self) -> None:
        self._congested = False
        self._backlog = 0
        if self.state is ConnectionState.CONNECTED:
            self.broker.link_drained(self.session)

    def stopProducing(self) -> None:
        pass

    # -- ClientLink (what the core calls) ----------------------------------------

    @property
    def congested(self) -> bool:
        return self._congested

    @property
    def backlog_bytes(self) -> int:
        return self._backlog

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool) -> None:
        if self.rules.state is _CLOSED:
            return
        if message.props is not None and message.expired(self.clock.seconds()):
            # Its message expiry interval ran out while it waited (queue, in flight
            # before sending, retained store): never sent, counted as dropped.
            self._not_sent(packet_id, message.topic)
            return
        v5 = self._v5
        if v5 is not None:
            if (message.props is None and v5.plain
                    and (self.session is None or not self.session.sub_options)):
                # Nothing MQTT 5 to add: an empty property block (QoS 0 frames are
                # shared across subscribers, as for 3.1.1).
                if qos == 0 and not dup:
                    cache = _qos0_cache5
                    if cache[0] is message and cache[1] == retain:
                        frame = cache[2]
                    else:
                        frame = encode_publish(message.topic.encode("utf-8"),
                                               message.payload, 0, retain, False, None,
                                               _NO_PROPERTIES)
                        cache[0], cache[1], cache[2] = message, retain, frame
                else:
                    frame = encode_publish(message.topic.encode("utf-8"), message.payload,
                                           qos, retain, dup, packet_id, _NO_PROPERTIES)
            else:
                frame5 = self._publish_frame5(v5, message, qos, packet_id, dup, retain)
                if frame5 is None:
                    self._not_sent(packet_id, message.topic)
                    return
                frame = frame5
        elif qos == 0 and not dup:
            cache = _qos0_cache
            if cache[0] is message and cache[1] == retain:
                frame = cache[2]
            else:
                frame = encode_publish(message.topic.encode("utf-8"), message.payload, 0,
                                       retain, False, None)
                cache[0], cache[1], cache[2] = message, retain, frame
        else:
            frame = encode_publish(message.topic.encode("utf-8"), message.payload, qos,
                                   retain, dup, packet_id)
        self._emit(frame)
        self.messages_out += 1
        self.bytes_out += len(frame)
        self.meter.delivered(message.timestamp, len(frame))
        if self._congested:
            self._backlog += len(frame)

    def _publish_frame5(self, v5: Negotiated, message: Message, qos: int,
                        packet_id: int | None, dup: bool, retain: bool) -> bytes | None:
        """The MQTT 5 PUBLISH for this client, or None when it is above the
        client's maximum packet size (never sent to it, counted)."""
        now = self.clock.seconds()
        topic = message.topic.encode("utf-8")
        session = self.session
        # Subscription identifiers of the filters that match (MQTT 5 options).  A
        # shared filter's only when no plain filter of the session matches: then the
        # message came through its group (a plain match gives the one copy sent).
        ids: tuple[int, ...] = ()
        if session is not None and session.sub_options:
            ids = tuple(packed >> 8 for f, packed in session.sub_options.items()
                        if packed >> 8 and not f.startswith("$share/")
                        and topic_matches(f, message.topic))
            if not ids and not any(topic_matches(f, message.topic)
                                   for f in session.subscriptions
                                   if not f.startswith("$share/")):
                ids = tuple(packed >> 8 for f, packed in session.sub_options.items()
                            if packed >> 8 and f.startswith("$share/")
                            and topic_matches(route_filter(f), message.topic))
        frame = encode_publish(topic, message.payload, qos, retain, dup, packet_id,
                               encode_properties(publish_properties(message, now, None, ids)))
        limit = v5.client_max_packet
        if limit is not None and len(frame) > limit:
            v5.too_large += 1
            cause = "packet too large for client"
            held = self.factory.log_limit.allow(cause)
            if held is not None:
                self.log.warn("a PUBLISH on {t!r} of {n} bytes is above the maximum packet "
                              "size {m} of {c}; not sent to it ({h} more since the last "
                              "such line)", t=message.topic, n=len(frame), m=limit,
                              c=self.client_id, h=held)
            return None
        if v5.client_alias_max:
            alias, with_topic = v5.outbound_alias(message.topic)
            if alias is not None:
                aliased = encode_publish(
                    topic if with_topic else b"", message.payload, qos, retain, dup,
                    packet_id,
                    encode_properties(publish_properties(message, now, alias, ids)))
                if limit is None or len(aliased) <= limit:
                    return aliased
                # A new alias costs 3 bytes more: without it the message fits.
                v5.forget_alias(message.topic)
        return frame

    def _not_sent(self, packet_id: int | None, topic: str) -> None:
        """A delivery this connection will not send: counted as dropped, and a QoS
        1/2 one leaves the session's window as if it had been acknowledged (on the
        next turn: the session is in the middle of sending)."""
        session = self.session
        if session is None:
            return
        if packet_id is None:
            session.drop_congested(topic)
        else:
            self.clock.callLater(0, self.broker.rejected, session, packet_id)

    def send_pubrel(self, packet_id: int) -> None:
        if self.state is not ConnectionState.CLOSED:
            self._write(_ack_frame(0x62, packet_id))

    def close(self, reason: str) -> None:
        """Closed by the broker (takeover, console): the session was already ended."""
        if self.state is ConnectionState.CLOSED:
            return
        cause = CAUSE_TAKEN_OVER if "taken over" in reason else CAUSE_CONSOLE
        if self._v5 is not None and self.state is _CONNECTED:
            code = (ReasonCode.SESSION_TAKEN_OVER if cause == CAUSE_TAKEN_OVER
                    else ReasonCode.ADMINISTRATIVE_ACTION)
            self._send_disconnect(code, reason)
        self.rules.advance("close")
        self.session = None
        self._cancel_timers()
        self.broker.unregister_connection(self.key, self, cause, reason)
        self._lose()

    def server_stopping(self) -> None:
        """The broker is stopping: an MQTT 5 client is told why (DISCONNECT 0x8B)
        before the socket closes; any other is cut at once."""
        if self._v5 is not None and self.state is _CONNECTED:
            self._send_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")
            self._lose()
        else:
            self.transport.abortConnection()

    @property
    def key(self) -> str:
        return "mqtt:" + self.client_id

    def event_fields(self) -> EventFields:
        return (self.client_id, self.peer, self.username, self.clean_session, self.keepalive)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            key=self.key, client_id=self.client_id, protocol=self.protocol_label,
            remote=self.peer, user=self.username, connected_since=self.connected_since,
            keepalive=self.keepalive, clean_session=self.clean_session,
            session_id=self.client_id,
            will_owners=(self.client_id,) if self.client_id in self.broker.wills else (),
            messages_in=self.messages_in, messages_out=self.messages_out,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out,
            last_activity=self._last_activity)

    # -- the one place a protocol error becomes a disconnect ----------------------

    def _violation(self, reason: str, cause: str | None = None,
                   code: int = ReasonCode.PROTOCOL_ERROR, limit: str | None = None) -> None:
        """Close for ``reason``; ``limit``: the bound the client went beyond (counted
        as ``$SYS/broker/limits/<limit>``, one line per bound a minute)."""
        cause = cause or (
            CAUSE_KEEPALIVE if reason.startswith("keepalive") else CAUSE_PROTOCOL_ERROR)
        if self._v5 is not None:
            if cause == CAUSE_KEEPALIVE:
                code = ReasonCode.KEEP_ALIVE_TIMEOUT
            elif cause == CAUSE_STORAGE:
                code = ReasonCode.UNSPECIFIED_ERROR
            # MQTT 5 says why before closing: DISCONNECT once connected, CONNACK
            # with the reason code while the CONNECT is being handled.
            if self.state is _CONNECTED:
                self._send_disconnect(code, reason)
            else:
                self._write(encode(Connack(False, code, self._problem(reason)), 5))
        if cause == CAUSE_STORAGE:
            # Not the client's fault, and the core logged the failing storage once
            # for every client it hits: no line per connection.
            self.log.debug("closing the connection of {c} ({peer}): {r}",
                           c=self.client_id, peer=self.peer, r=reason)
        else:
            self.meter.protocol_error()
            if limit is not None:
                self.meter.limit_hit(limit)
                held = self.factory.log_limit.allow("limit " + limit)
                if held is not None:
                    self.log.warn("{c} ({peer}) went beyond a limit: {r}; closing the "
                                  "connection (reason code {code:#04x}; {h} more beyond "
                                  "that limit since the last such line)",
                                  c=self.client_id or "(no client id yet)", peer=self.peer,
                                  r=reason, code=int(code), h=held)
            elif self._v5 is not None and cause != CAUSE_KEEPALIVE:
                # MQTT 5: one line per reason code a minute, saying how many more.
                held = self.factory.log_limit.allow(f"mqtt5 disconnect {code:#04x}")
                if held is not None:
                    self.log.warn("protocol error from {c} ({peer}): {r}; closing the "
                                  "connection with reason code {code:#04x} ({h} more "
                                  "with that code since the last such line)",
                                  c=self.client_id or "(no client id yet)", peer=self.peer,
                                  r=reason, code=int(code), h=held)
            elif cause != CAUSE_KEEPALIVE:   # (that one's line is the disconnect's own)
                self.log.warn("protocol error from {c} ({peer}): {r}; closing the "
                              "connection", c=self.client_id or "(no client id yet)",
                              peer=self.peer, r=reason)
        self._clean_close = False
        self._cause = cause
        self._cause_detail = reason
        self.rules.advance("close")
        self._cancel_timers()
        # It is over now, though the socket may linger (a half-open peer): it leaves
        # the console and $SYS with its cause, and a reconnecting client finds its
        # key free.
        self.broker.unregister_connection(self.key, self, self._cause, reason)
        # The will fires in connectionLost (the client did not send DISCONNECT).
        self._lose()

    # -- input --------------------------------------------------------------------

    def _process(self) -> None:
        decoder = self.decoder
        connected = self._connected_handlers
        rules = self.rules
        turn = self.limits.mqtt_turn
        seconds = self.clock.seconds
        until = seconds() + turn if turn else 0.0
        was_processing, self._in_process = self._in_process, True
        try:
            while True:
                state = rules.state
                if (state is not _CONNECTED and state is not _AWAITING_CONNECT
                        and state is not ConnectionState.AUTHENTICATING):
                    return
                paused = self._reading_paused_for
                if paused and not paused.isdisjoint(_HOLD_INPUT):
                    # Back-pressure holds what was read but not handled too (a
                    # 64 KB read is a thousand small PUBLISHes, and a hundred
                    # publishers' reads overran a subscriber's QoS 0 bound), and so
                    # does the end of this connection's share of a turn: handled
                    # once reading resumes (``_resume_reading``).  (A rate pause
                    # handles the read and grows instead: ``_after_publish``.)
                    return
                parked = self._parked
                if parked is not None and not parked.waiting:
                    # The queues have room again: what waited goes first, in order.
                    if parked.packets:
                        packet = parked.packets.popleft()
                        parked.bytes -= _parked_size(packet)
                    else:
                        self._parked = parked = None
                        packet = decoder.next_packet()
                else:
                    packet = decoder.next_packet()
                if packet is None:
                    return
                if parked is not None and parked.waiting and state is _CONNECTED \
                        and self._park(parked, packet):
                    continue
                # Connected, the table holds exactly what a client may send; anything
                # else (and anything before CONNECT) the rules explain.
                handler = connected.get(type(packet)) if state is _CONNECTED else None
                if handler is None:
                    problem = rules.check(packet)
                    if problem is not None:
                        self._violation(problem)
                        return
                    handler = self._handlers[type(packet)]
                handler(self, packet)
                if until and seconds() >= until:
                    if (decoder.buffered and rules.state is _CONNECTED
                            and self._others_waiting()):
                        self._yield_turn()     # (the next round returns: input held)
                    # Its share used up, it asks again every millisecond: another
                    # client's packet waits at most that long once the share is over.
                    until = seconds() + min(turn, _RECHECK)
        except MalformedPacket as exc:
            what = "protocol error" if exc.code == ReasonCode.PROTOCOL_ERROR else (
                "packet too large" if exc.code == ReasonCode.PACKET_TOO_LARGE
                else "limit exceeded" if exc.limit is not None
                else "malformed packet")
            if exc.in_connect5 and self.state is _AWAITING_CONNECT:
                # MQTT 5 answers a CONNECT it cannot accept with CONNACK and the code.
                self._write(encode(Connack(False, exc.code, Properties(
                    reason_string=exc.reason[:200])), 5))
            self._violation(f"{what}: {exc.reason}", code=exc.code, limit=exc.limit)
        finally:
            self._in_process = was_processing

    def _others_waiting(self) -> bool:
        """Another connection (or the reactor's waker, a listener) has input ready
        (``net.tcp.others_waiting``; a transport that is not plain TCP cannot tell
        its own descriptor apart: True when its socket has more)."""
        transport = self.transport
        own = transport.fileno() if plain_tcp(transport) else -1
        return others_waiting(self.clock, own)

    def _yield_turn(self) -> None:
        """This connection had its share of the reactor turn (``Limits.mqtt_turn``)
        and others wait: stop reading it and hold what it sent until the reactor
        has polled once more and read them.  (A reactor runs the calls due at the
        start of a turn, then polls: a ``callLater(0)`` made now would run before
        the next poll, ahead of the others; the call it makes runs after it.)"""
        self.meter.turn_yielded()
        self._pause_reading("turn")
        if self._turn_timer is None:
            self._turn_timer = self.clock.callLater(0, self._after_next_poll)

    def _after_next_poll(self) -> None:
        self._turn_timer = self.clock.callLater(0, self._turn_over)

    def _turn_over(self) -> None:
        self._turn_timer = None
        self._resume_reading("turn")

    def _problem(self, reason: str) -> Properties | None:
        """A reason string for a packet the client may be sent one in (unless it
        asked for no problem information)."""
        v5 = self._v5
        if v5 is None or not v5.problem_info:
            return None
        return Properties(reason_string=reason[:200])

    def _send_disconnect(self, code: int, reason: str) -> None:
        # DISCONNECT may always carry a reason string (request problem
        # information covers the other packets).
        self._write(encode(Disconnect(code, Properties(reason_string=reason[:200])), 5))

    def _write(self, data: bytes) -> None:
        self._emit(data)
        self.bytes_out += len(data)
        self.meter.sent_bytes(len(data))

    def _emit(self, data: bytes) -> None:
        """Every outbound byte goes through here, in order.  While the broker handles
        one socket read (a batch), what it gives this connection is collected and
        written when the batch ends: one transport write instead of one per message
        (fan-in, QoS 0 streams).  At most ``OUTPUT_BATCH_BYTES`` are held, so the
        transport's own back-pressure (pauseProducing past its 64 KiB buffer) still
        comes in time for the congestion logic; a congested connection is written
        at once."""
        out = self._out
        if out is not None:
            out.append(data)
            self._out_bytes += len(data)
            if self._out_bytes >= OUTPUT_BATCH_BYTES or self._congested:
                self._flush_out()
        elif not self._congested and self.broker.after_batch(self._flush_out):
            self._out = [data]
            self._out_bytes = len(data)
        else:
            self._send(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out:
            self._send(out[0] if len(out) == 1 else b"".join(out))

    def _send(self, data: bytes) -> None:
        send(self.transport, data)   # (at once when nothing is buffered: ``net.tcp``)

    def _lose(self) -> None:
        """Close after writing everything (including what a batch still holds)."""
        self._flush_out()
        self.transport.loseConnection()

    # -- CONNECT ------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        self._stop_connect_timer()
        proto = (packet.protocol_name, packet.protocol_level)
        if proto not in (PROTOCOL_31, PROTOCOL_311, PROTOCOL_5):
            self._refuse(ConnackCode.UNACCEPTABLE_PROTOCOL,
                         f"unsupported protocol {packet.protocol_name!r} level "
                         f"{packet.protocol_level}")
            return
        level = packet.protocol_level
        self.decoder.protocol_level = level
        self.version = {3: "3.1", 4: "3.1.1"}.get(level, "5")
        client_id = packet.client_id
        assigned = False
        exchange: AuthExchange | None = None
        if level == 5:
            self._v5 = Negotiated(packet)
            method = self._v5.auth_method
            if method is not None:
                enhanced = self.factory.enhanced_auth
                exchange = enhanced.start(method) if enhanced is not None else None
                if exchange is None:
                    self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD,
                                 f"authentication method {method!r} is not offered")
                    return
            if not client_id:
                # MQTT 5 assigns an id whatever clean start says (and tells it).
                client_id = "auto-" + uuid.uuid4().hex
                assigned = True
        problem = self._connect_problem(packet)
        if problem is not None:
            code = (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID if "client identifier" in problem
                    else ReasonCode.BAD_USER_NAME_OR_PASSWORD if "user name" in problem
                    else ReasonCode.TOPIC_NAME_INVALID)
            self._violation(problem, code=code)
            return
        if level == 3:
            # 3.1 says 1-23 characters; real 3.1 clients send longer ids, which are
            # accepted up to 3.1.1's limits unless --strict-mqtt31.
            if not client_id:
                self._refuse(ConnackCode.IDENTIFIER_REJECTED, "MQTT 3.1 client id is empty")
                return
            if self.limits.strict_mqtt31 and len(client_id) > self.limits.max_client_id_31:
                self._refuse(ConnackCode.IDENTIFIER_REJECTED,
                             f"MQTT 3.1 client id must be 1-{self.limits.max_client_id_31} "
                             f"characters (--strict-mqtt31), got {len(client_id)}")
                return
        elif not client_id:
            if not packet.clean_session:
                self._refuse(ConnackCode.IDENTIFIER_REJECTED,
                             "empty client id requires clean session")
                return
            client_id = "auto-" + uuid.uuid4().hex
        self.client_id = client_id
        self.username = packet.username
        # --tls-cert-as-user: a verified client certificate names the user and is
        # the credential (no password, the authenticator is not asked).
        cert_user = verified_common_name(self.transport) if self.factory.cert_as_user else None
        if cert_user is not None:
            problem = self.strings.text(cert_user, "client certificate common name")
            if problem is not None:
                self._refuse(ConnackCode.NOT_AUTHORIZED, problem)
                return
            self.username = cert_user
            self.log.info("{c} ({peer}) is user {u!r} by its TLS client certificate",
                          c=client_id, peer=self.peer, u=cert_user)
        peer = self.peer     # (made when read: once here)
        banned = self.broker.gate.banned("MQTT", client_id, self.username, peer)
        if banned is not None:       # counted and logged (rate-limited) by the broker
            # MQTT 5 has its own code for it (0x8A); 3.1.1's is "not authorized".
            self._refuse(ReasonCode.BANNED if self._v5 is not None
                         else ConnackCode.NOT_AUTHORIZED, banned, logged=True)
            return
        self.keepalive = packet.keepalive
        self.clean_session = packet.clean_session
        if exchange is not None and cert_user is None:
            # MQTT 5 enhanced authentication: AUTH packets until the method says
            # yes or no, bounded by the connect timeout.
            assert self._v5 is not None and self._v5.auth_method is not None
            self._auth = _AuthInProgress(exchange, self._v5.auth_method, packet, assigned)
            self.rules.advance("authenticate")
            self._connect_timer = self.factory.connect_deadlines.add(
                self, self.limits.connect_timeout)
            props = packet.properties
            self._auth_answer(exchange.step(props.authentication_data if props else None))
            return
        self.rules.advance("connect")
        ok: bool | Deferred[bool] = True
        if cert_user is None:
            creds = Credentials(client_id, packet.username, packet.password, "mqtt", peer)
            ok = self.broker.gate.authenticate_now(creds)
        if isinstance(ok, Deferred):
            ok.addCallback(self._authenticated, packet, assigned)
            ok.addErrback(self._connect_failed)
        else:
            # Answered at once (anonymous, no users, a certificate): no Deferreds
            # unless the session's commit is awaited.
            try:
                d = self._authenticated(ok, packet, assigned)
            except Exception:
                self._connect_failed(Failure())
            else:
                if d is not None:
                    d.addErrback(self._connect_failed)
        if self.state is ConnectionState.CONNECTING:
            # Not read on until CONNACK is out (a password check in the thread pool,
            # a persistent session's commit).  Not paused when it was all done at
            # once: the two epoll calls were a tenth of the CPU of a connect storm.
            self._pause_reading("connect")

    def _connect_problem(self, packet: Connect) -> str | None:
        """Why the strings of ``packet`` break the rules (``StringRules``), or None."""
        strings = self.strings
        problem = strings.text(packet.client_id, "CONNECT client identifier")
        if problem is None and packet.username is not None:
            problem = strings.text(packet.username, "CONNECT user name")
        if problem is None and packet.will is not None:
            problem = strings.topic(packet.will.topic, "CONNECT will topic")
        return problem

    def _authenticated(self, ok: bool, packet: Connect, assigned: bool = False
                       ) -> Deferred[None] | None:
        if self.state is not ConnectionState.CONNECTING:
            return None  # the socket went away while we checked
        if not ok:
            code = (ConnackCode.BAD_CREDENTIALS if packet.username is not None
                    else ConnackCode.NOT_AUTHORIZED)
            self._refuse(code, "authentication failed")
            return None
        self.identity = Identity(self.client_id, self.username, self.protocol_label)
        if not self.broker.gate.may_claim(self.identity, self.client_id):
            self._refuse(ConnackCode.NOT_AUTHORIZED,
                         "the session of this client id belongs to another user")
            return None
        will = None
        if packet.will is not None:
            w = packet.will
            wp = w.properties
            will = WillMessage(self.client_id, w.topic, w.payload, w.qos, w.retain, "mqtt",
                               self.clock.seconds(), message_properties(wp),
                               float(wp.will_delay_interval or 0) if wp is not None else 0.0)
        connack_props = None
        expiry: float | None = None
        if self._v5 is not None:
            self._v5, connack_props = negotiate(packet, self.limits, self.client_id, assigned)
            self.keepalive = self._v5.keepalive
            expiry = float(self._v5.session_expiry)
            auth = self._auth
            if auth is not None:    # the method's final data goes in CONNACK
                self._auth = None
                connack_props = replace(connack_props, authentication_method=auth.method,
                                        authentication_data=auth.final)
        opened = self.broker.open_session(
            self, self.client_id, packet.clean_session, will, self.identity, expiry)
        session, present, d = opened.session, opened.present, opened.durable
        self.session = session
        if self._v5 is not None:
            session.window = min(self.limits.max_inflight, self._v5.client_receive_max)
        if d is None:
            self._connected(None, session, present, connack_props)
            return None
        d.addCallback(self._connected, session, present, connack_props)
        return d

    def _connected(self, _: object, session: Session, present: bool,
                   connack_props: Properties | None = None) -> None:
        if self.state is not ConnectionState.CONNECTING or self.session is not session:
            return
        self.rules.advance("accepted")
        self.connected_since = self.clock.seconds()
        if self._v5 is not None:
            self._write(encode(Connack(present, ReasonCode.SUCCESS, connack_props), 5))
        else:
            self._write(_CONNACK_ACCEPTED[present and self.version == "3.1.1"])
        self.broker.activate(session, self, self.protocol_label)
        self.broker.register_connection(self.key, self, self.protocol_label)
        held = self.factory.connect_lines.allow("connect")
        if held is not None:
            self.log.info("{c} connected from {peer} (MQTT {v}, clean={cs}, keepalive={k}s)"
                          "{h}", c=self.client_id, peer=self.peer, v=self.version,
                          cs=self.clean_session, k=self.keepalive,
                          h=f" ({held} more connects not logged before it)" if held else "")
        debug_until = self.broker.client_debug.until(self.client_id)
        if debug_until is not None:
            self.start_debug(debug_until)
        if self.keepalive > 0:
            rule = self._keepalive = Keepalive.of(self.keepalive)
            self.keepalive = rule.seconds   # (the shared int: above 256 each is 32 bytes)
            self._keepalive_timer = self.factory.keepalives.add(self, self._keepalive.limit)
        self._resume_reading("connect")
        self._process()

    def _connect_failed(self, failure: Failure) -> None:
        self.log.failure("could not accept CONNECT from {peer}", failure, peer=self.peer)
        if self.state is ConnectionState.CONNECTING:
            self._refuse(ConnackCode.SERVER_UNAVAILABLE, "internal error while connecting")

    def _refuse(self, code: int, reason: str, logged: bool = False) -> None:
        """Answer CONNECT with a refusal (``code``: a 3.1.1 return code, or an MQTT
        5 reason code; a 3.1.1 code is translated for an MQTT 5 client); ``logged``:
        the caller logged (and counted) it already, rate-limited."""
        if not logged:
            self.meter.refused()
            self.log.warn("refused CONNECT from {peer} (client id {c!r}): {r} (CONNACK "
                          "{code})", peer=self.peer, c=self.client_id, r=reason,
                          code=int(code))
        if self.session is not None:
            # A refused CONNECT leaves no will behind and publishes none.
            self.broker.end_session(self, self.session, True, "CONNECT refused")
            self.session = None
        if self._v5 is not None:
            self._write(encode(Connack(False, CONNACK_REASONS.get(code, code),
                                       self._problem(reason)), 5))
        else:
            self._write(encode(Connack(False, code)))
        self.rules.advance("close")
        self._cancel_timers()
        self._lose()

    # -- timers -------------------------------------------------------------------

    def _connect_timed_out(self) -> None:
        self._connect_timer = None
        self._violation(f"no CONNECT within {self.limits.connect_timeout:g}s")

    def _keepalive_check(self) -> None:
        self._keepalive_timer = None
        keepalive = self._keepalive
        assert keepalive is not None
        now = self.clock.seconds()
        delay = keepalive.next_check(now, self._last_activity, bool(self._reading_paused_for))
        if delay is None:
            self._violation(keepalive.expired_reason(now, self._last_activity))
        else:
            self._keepalive_timer = self.factory.keepalives.add(self, delay)

    def _stop_connect_timer(self) -> None:
        if self._connect_timer is not None:
            self.factory.connect_deadlines.cancel(self._connect_timer)
            self._connect_timer = None

    def _cancel_timers(self) -> None:
        self._stop_connect_timer()
        if self._throttle is not None:
            self._throttle.stop()
        timer = self._turn_timer
        if timer is not None and timer.active():
            timer.cancel()
        if self._keepalive_timer is not None:
            self.factory.keepalives.cancel(self._keepalive_timer)
        self._keepalive_timer = self._turn_timer = None
        if "_debug_timer" in vars(self):
            self.stop_debug()

    # -- per-client debug logging (the console's "Debug log") ----------------------

    def start_debug(self, until: float) -> None:
        """Log every packet in and out of this connection until ``until``.

        The logging wrappers are put in this instance's ``__dict__`` (shadowing the
        class's ``_emit`` and handler table) only while it is debugged, so no other
        connection pays a check per packet."""
        own = vars(self)
        timer = own.get("_debug_timer")
        if timer is not None and timer.active():
            timer.cancel()
        own["_debug_timer"] = self.clock.callLater(
            max(0.0, until - self.clock.seconds()), self.stop_debug)
        if "_emit" in own:
            return   # already logging: a new deadline only
        plain_emit = self._emit
        log = self.log
        budget = LineBudget()

        def allowed() -> bool:
            if budget.take():
                return True
            if budget.left == -1:   # once: the rest of the window is not logged
                log.info("debug {c} ({peer}): {n} lines logged, the most for one "
                         "window; no more", c=self.client_id, peer=self.peer,
                         n=MAX_DEBUG_LINES)
            return False

        def emit(data: bytes) -> None:
            if allowed():
                log.info("debug {c} ({peer}): out {kind} ({n} bytes)", c=self.client_id,
                         peer=self.peer, kind=_frame_kind(data), n=len(data))
            plain_emit(data)

        def logged(handler: Callable[[MQTTProtocol, Any], None]
                   ) -> Callable[[MQTTProtocol, Any], None]:
            def handle(conn: MQTTProtocol, packet: Any) -> None:
                if allowed():
                    log.info("debug {c} ({peer}): in {packet}", c=conn.client_id,
                             peer=conn.peer, packet=repr(packet)[:300])
                handler(conn, packet)
            return handle

        own["_emit"] = emit
        own["_connected_handlers"] = {kind: logged(handler) for kind, handler
                                      in type(self)._connected_handlers.items()}
        log.info("debug logging of {c} ({peer}) on for {s:.0f}s", c=self.client_id,
                 peer=self.peer, s=until - self.clock.seconds())

    def stop_debug(self) -> None:
        own = vars(self)
        timer = own.pop("_debug_timer", None)
        if timer is not None and timer.active():
            timer.cancel()
        if own.pop("_emit", None) is not None:
            own.pop("_connected_handlers", None)
            self.log.info("debug logging of {c} ({peer}) ended", c=self.client_id,
                          peer=self.peer)

    # -- reading pause (connect in progress, back-pressure) -----------------------

    def _pause_reading(self, why: str) -> None:
        if not self._reading_paused_for:
            self.transport.pauseProducing()
        if why not in self._reading_paused_for:
            self._reading_paused_for = self._reading_paused_for | {why}

    def _resume_reading(self, why: str) -> None:
        if why in self._reading_paused_for:
            # (``or``: back to the shared empty one, not a new 216-byte frozenset)
            self._reading_paused_for = self._reading_paused_for - {why} or _NOT_PAUSED
            if not self._reading_paused_for and self.state is not ConnectionState.CLOSED:
                self._last_activity = self.clock.seconds()
                self.transport.resumeProducing()
                if (self.decoder.buffered or self._parked is not None) \
                        and not self._in_process:
                    # The packets held back when reading stopped (see ``_process``):
                    # after the batch that resumed us (another connection's PUBACK,
                    # say), not nested inside it.
                    if not self.broker.after_batch(self._process_held):
                        self._process_held()

    def _park(self, parked: _Parked, packet: Any) -> bool:
        """Hold ``packet`` while publishers to durable queues are blocked (True), or
        let it be handled now (False): a PUBLISH to ``$queue/`` waits, and so does
        every packet after it (their order is kept), except acknowledgements and
        PINGREQ, and queue commands (``$ack``...) that settle what this client
        consumed.  Past ``PARKED_BYTES``/``PARKED_PACKETS`` the connection is not
        read any more (the keepalive then waits too)."""
        kind = type(packet)
        if kind in _NEVER_PARKED:
            return False
        if kind is Publish:
            topic = packet.topic
            props = packet.properties
            if topic and is_queue_command(topic) and not (
                    parked.packets and props is not None and props.topic_alias):
                return False   # (one that sets an alias waits: the held ones use theirs)
            if not parked.packets:
                if topic and not is_queue_topic(topic):
                    return False   # (an alias only, MQTT 5: it may be a queue's; it waits)
                if packet.qos and self._v5 is not None and self.broker.queues.blocked:
                    return False   # refused at once with 0x97 (``QueueManager.publish``)
        elif not parked.packets:
            return False
        parked.packets.append(packet)
        parked.bytes += _parked_size(packet)
        if parked.bytes > PARKED_BYTES or len(parked.packets) > PARKED_PACKETS:
            self._pause_reading("queues")
        return True

    def _process_held(self) -> None:
        if (self._reading_paused_for or self._in_process
                or self.state is ConnectionState.CLOSED):
            return   # (paused again meanwhile: the next resume comes back here)
        self._process_batch()

    def _drained(self) -> None:
        self._resume_reading("congestion")

    def _queues_writable(self) -> None:
        parked = self._parked
        if parked is not None:
            parked.waiting = False
            if not parked.packets and not self._in_process:
                self._parked = None
        self._resume_reading("queues")
        if (self._parked is not None and not self._reading_paused_for
                and not self._in_process and self.state is not ConnectionState.CLOSED
                and not self.broker.after_batch(self._process_held)):
            self._process_held()

    # -- ordered acknowledgements ---------------------------------------------------

    def _ack(self, d: Deferred[None] | None, frame: bytes,
             after: Callable[[], None] | None = None, essential: bool = False) -> None:
        """Send ``frame`` once ``d`` fired and every earlier acknowledgement went out,
        then call ``after``; an ``essential`` one is called even if the connection
        closed meanwhile (though not if ``d`` failed)."""
        acks = self._acks
        if d is None and acks.empty:
            self._write(frame)
            if after is not None:
                after()
            return
        entry = acks.add(frame, after, d is None, essential)
        if acks.over_bound:
            # The client sends faster than commits finish: stop reading until they
            # catch up, rather than queue work for the writer without bound.
            self._pause_reading("storage")
        if d is None:
            self._flush_acks()
        else:
            d.addCallbacks(self._ack_ready, self._ack_failed,
                           callbackArgs=(entry,), errbackArgs=(entry,))

    def _ack_ready(self, _: object, entry: list[Any]) -> None:
        AckQueue.ready(entry)
        self._flush_acks()

    def _flush_acks(self) -> None:
        acks = self._acks
        for frame, after, essential in acks.take_flagged():
            if self.rules.closed:
                if essential and after is not None:
                    after()
                continue
            self._write(frame)
            if after is not None:
                after()
        if acks.under_resume_mark:
            self._resume_reading("storage")

    def _ack_failed(self, failure: Failure, entry: list[Any]) -> None:
        # One line for this connection, no traceback: the store logs the failure
        # itself (once when commits start failing, once when they recover).
        if self.state is not ConnectionState.CLOSED:
            self._violation(f"storage failure ({failure.getErrorMessage()}); nothing was "
                            "acknowledged, closing so the client retries", CAUSE_STORAGE)
        # Closed now: the entry's frame is never written, and its ``after`` (a QoS 2
        # gate, cancelled by the failure) does nothing; the entries behind it still
        # run theirs.
        AckQueue.ready(entry)
        self._flush_acks()

    # -- PUBLISH and its flows --------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        session = self.session
        assert session is not None
        if self._v5 is not None:
            self._on_publish5(self._v5, session, packet)
            return
        problem = self.strings.topic(packet.topic, "PUBLISH topic")
        if problem is not None:
            self._violation(problem)
            return
        self.messages_in += 1
        message = Message(packet.topic, packet.payload, packet.qos, packet.retain,
                          self.client_id, self.clock.seconds(), packet.dup)
        broker = self.broker
        qos = packet.qos
        if qos == 0:
            result = broker.publish(message, self.identity, wait=False)
        elif qos == 1:
            assert packet.packet_id is not None
            result = broker.publish(message, self.identity)
            self._ack(result.durable, _ack_frame(0x40, packet.packet_id))
        else:
            pid = packet.packet_id
            assert pid is not None
            result = broker.publish_qos2(session, message, self.identity, pid)
            # PUBREC first (after its commit), then the message goes to subscribers.
            gate = result.gate
            if gate is None:
                self._ack(result.durable, _ack_frame(0x50, pid))
            else:
                self._ack(result.durable, _ack_frame(0x50, pid), gate.open, True)
        self._after_publish(session, result, len(packet.payload))

    def _on_publish5(self, v5: Negotiated, session: Session, packet: Publish) -> None:
        """An MQTT 5 PUBLISH: topic alias, receive maximum, payload format, then the
        3.1.1 flows with reason codes (0x87 when the core denies the publish)."""
        topic, why, code = resolve_topic(v5, packet)
        if topic is None:
            self._violation(why, code=code)
            return
        props = packet.properties
        if props is not None and props.subscription_identifiers:
            self._violation("PUBLISH from a client carries a subscription identifier")
            return
        problem = self.strings.topic(topic, "PUBLISH topic")
        if problem is not None:
            self._violation(problem, code=ReasonCode.TOPIC_NAME_INVALID)
            return
        qos = packet.qos
        pid = packet.packet_id
        if pid is not None and not v5.quota_take(pid):
            self._violation(f"more than {RECEIVE_MAXIMUM} QoS 1/2 publishes awaiting "
                            "acknowledgement (receive maximum)",
                            code=ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
            return
        bad_payload = utf8_payload_problem(props, packet.payload)
        if bad_payload is not None:
            if pid is None:
                self._violation(bad_payload, code=ReasonCode.PAYLOAD_FORMAT_INVALID)
            else:
                ack = Puback if qos == 1 else Pubrec
                self._ack(None, encode(ack(pid, ReasonCode.PAYLOAD_FORMAT_INVALID,
                                           self._problem(bad_payload)), 5),
                          lambda: v5.quota_release(pid))
            return
        message = Message(topic, packet.payload, qos, packet.retain, self.client_id,
                          self.clock.seconds(), packet.dup, props=message_properties(props))
        broker = self.broker
        if qos == 0:
            result = broker.publish(message, self.identity, wait=False)
        elif qos == 1:
            assert pid is not None
            result = broker.publish(message, self.identity, count_drops=True)
            self._ack(result.durable, self._publish_ack(Puback, pid, result),
                      lambda: v5.quota_release(pid))
        else:
            assert pid is not None
            result = broker.publish_qos2(session, message, self.identity, pid,
                                         count_drops=True)
            frame = self._publish_ack(Pubrec, pid, result)
            gate = result.gate
            if result.denied or result.refusal is not None:
                # (the exchange ends at a failing PUBREC)
                self._ack(result.durable, frame, lambda: v5.quota_release(pid))
            elif gate is None:
                self._ack(result.durable, frame)
            else:
                self._ack(result.durable, frame, gate.open, True)
        self._after_publish(session, result, len(packet.payload))

    def _publish_ack(self, kind: type[Puback] | type[Pubrec], packet_id: int,
                     result: Published) -> bytes:
        """PUBACK/PUBREC for an MQTT 5 publisher; the core's verdict is its reason
        code: not authorized (0x87), or a subscriber's queue bound refused the
        message (0x97 quota exceeded on PUBACK: it was not a silent drop; a PUBREC
        that failed would end the QoS 2 exchange the other subscribers still get
        the message through, so it stays 0); a durable queue's refusal
        (``Published.refusal``: a bad ``$queue/`` topic, an acknowledgement of a
        message that is not pending) is its code with the reason string."""
        if result.denied:
            return encode(kind(packet_id, ReasonCode.NOT_AUTHORIZED,
                               self._problem("not authorized to publish there")), 5)
        refusal = result.refusal
        if refusal is not None:   # a durable queue refused the message or acknowledgement
            return encode(kind(packet_id, refusal.code, self._problem(refusal.reason)), 5)
        if result.dropped and kind is Puback:
            return encode(kind(packet_id, ReasonCode.QUOTA_EXCEEDED, self._problem(
                f"{result.dropped} subscriber(s) had no room for it")), 5)
        return _ack_frame(0x40 if kind is Puback else 0x50, packet_id)

    def _after_publish(self, session: Session, result: Published, size: int) -> None:
        broker = self.broker
        if result.blocked:
            # The durable queues are full on disk: its PUBLISHes to them wait until
            # they have room (``_park``); it is still read for its acknowledgements.
            parked = self._parked
            if parked is None:
                parked = self._parked = _Parked()
            parked.waiting = True
            broker.when_queues_writable(id(self), self._queues_writable)
        if result.congested:
            # Never pause for our own session: its acknowledgements arrive on this socket.
            congested = [s for s in result.congested if s is not session]
            if congested:
                self._pause_reading("congestion")
                broker.pause_until_drained(id(self), self._drained, congested)
        throttle = self._throttle
        if throttle is not None:
            throttle.charge(size)

    def _rate_paused(self, wait: float) -> None:
        self._pause_reading("rate")
        self.broker.gate.publish_rate_exceeded("MQTT", self.client_id, wait)

    def _rate_over(self) -> None:
        self._resume_reading("rate")

    def _acked(self, kind: str, packet_id: int) -> Session | None:
        """The session an acknowledgement of ``kind`` applies to, or None when it is
        the wrong kind for that message in flight (the connection is closed)."""
        session = self.session
        assert session is not None
        problem = session.ack_problem(kind, packet_id)
        if problem is not None:
            self._violation(problem)
            return None
        return session

    def _on_puback(self, packet: Puback) -> None:
        session = self._acked("PUBACK", packet.packet_id)
        if session is not None:
            self.broker.acknowledged(session, packet.packet_id)

    def _on_pubrec(self, packet: Pubrec) -> None:
        session = self._acked("PUBREC", packet.packet_id)
        if session is None:
            return
        if packet.reason_code >= 0x80:
            # MQTT 5: the subscriber refused the message; the exchange ends here.
            self.broker.completed(session, packet.packet_id)
            return
        self.broker.received(session, packet.packet_id)

    def _on_pubrel(self, packet: Pubrel) -> None:
        assert self.session is not None
        known = self.session.inbound_seen(packet.packet_id)
        d = self.broker.release_qos2(self.session, packet.packet_id)
        v5 = self._v5
        if v5 is None:
            self._ack(d, _ack_frame(0x70, packet.packet_id))
        else:
            pid = packet.packet_id
            frame = _ack_frame(0x70, pid) if known else encode(
                Pubcomp(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), 5)
            self._ack(d, frame, lambda: v5.quota_release(pid))

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        session = self._acked("PUBCOMP", packet.packet_id)
        if session is not None:
            self.broker.completed(session, packet.packet_id)

    # -- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------

    def _filters_problem(self, filters: Iterable[str], what: str) -> str | None:
        """An invalid filter is a protocol violation ([MQTT-4.7.1], [MQTT-4.8.0-1]),
        in SUBSCRIBE (no SUBACK 0x80) and UNSUBSCRIBE alike."""
        for topic_filter in filters:
            problem = self.strings.filter(topic_filter, what)
            if problem is not None:
                return problem
        return None

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None and self.identity is not None
        if self._v5 is not None:
            self._on_subscribe5(session, self.identity, packet)
            return
        problem = self._filters_problem((f for f, _ in packet.topics),
                                        "SUBSCRIBE topic filter")
        if problem is not None:
            self._violation(problem)
            return
        codes, d = self.broker.subscribe(session, self.identity, packet.topics)
        grants = [(f, code) for (f, _), code in zip(packet.topics, codes, strict=True)]
        # 3.1.1 has one failure code: any verdict of the core (an MQTT 5 reason code
        # such as 0x87 not authorized) is 0x80 here.
        acked = tuple(code if code < SUBACK_FAILURE else SUBACK_FAILURE for code in codes)
        if self.version == "3.1" and SUBACK_FAILURE in acked:
            # MQTT 3.1's SUBACK has no failure code: a refused filter is answered with
            # the QoS asked for and simply has no route (nothing is ever sent for it).
            acked = tuple(qos if code == SUBACK_FAILURE else code
                          for (_, qos), code in zip(packet.topics, acked, strict=True))
        self._ack(d, encode(Suback(packet.packet_id, acked)),
                  lambda: self.broker.send_retained(session, grants))

    def _on_subscribe5(self, session: Session, identity: Identity, packet: Subscribe
                       ) -> None:
        """MQTT 5 SUBSCRIBE: a filter that cannot be subscribed gets its reason code
        in SUBACK (0x8F invalid, or No Local on a shared subscription), the
        others go to the core with their options (no local, retain as published,
        the subscription identifier), whose verdicts (0x80, and 0x87 once access
        rules say so) come back as codes.  Retain handling picks which filters get
        retained messages: 0 all, 1 only new subscriptions, 2 none."""
        props = packet.properties
        sub_id = props.subscription_identifiers[0] if (
            props is not None and props.subscription_identifiers) else 0
        codes: list[int] = []
        wanted: list[tuple[str, int]] = []
        packed: list[int] = []
        retained_for: list[bool] = []
        options = packet.options or (0,) * len(packet.topics)
        no_ids = sub_id != 0 and not self.limits.subscription_identifiers
        for (topic_filter, qos), option in zip(packet.topics, options, strict=True):
            code = ReasonCode.SUCCESS
            if no_ids:      # --no-subscription-identifiers (CONNACK said so)
                code = ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED
            elif topic_filter.startswith("$share/") and option & NO_LOCAL:
                # MQTT 5 §3.8.3.1: No Local on a shared subscription is a protocol
                # error; refused here, per filter, rather than closing.
                code = ReasonCode.TOPIC_FILTER_INVALID
            elif self.strings.filter(topic_filter, "SUBSCRIBE topic filter") is not None:
                code = ReasonCode.TOPIC_FILTER_INVALID
            else:
                wanted.append((topic_filter, qos))
                packed.append((option & (NO_LOCAL | RETAIN_AS_PUBLISHED)) | sub_id << 8)
                handling = (option & RETAIN_HANDLING) >> 4
                retained_for.append(handling == 0 or (
                    handling == 1 and topic_filter not in session.subscriptions))
            codes.append(code)
        granted, d = (self.broker.subscribe(session, identity, wanted, packed,
                                            _consumer(props)) if wanted else ([], None))
        it = iter(granted)
        codes = [next(it) if code == ReasonCode.SUCCESS else code for code in codes]
        grants = [(f, code) for (f, _), code, send in zip(wanted, granted, retained_for,
                                                          strict=True) if send]
        self._ack(d, encode(Suback(packet.packet_id, tuple(codes)), 5),
                  lambda: self.broker.send_retained(session, grants))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.session is not None
        problem = self._filters_problem(packet.topics, "UNSUBSCRIBE topic filter")
        if problem is not None:
            self._violation(problem)
            return
        if self._v5 is not None:
            existed = self.session.subscriptions
            codes = tuple(ReasonCode.SUCCESS if f in existed
                          else ReasonCode.NO_SUBSCRIPTION_EXISTED for f in packet.topics)
            frame = encode(Unsuback(packet.packet_id, codes), 5)
        else:
            frame = encode(Unsuback(packet.packet_id))
        d = self.broker.unsubscribe(self.session, packet.topics)
        self._ack(d, frame)

    # -- PING / DISCONNECT --------------------------------------------------------------

    def _on_pingreq(self, packet: Pingreq) -> None:
        self._write(_PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        with_will = False
        new_expiry: float | None = None
        if self._v5 is not None:
            props = packet.properties
            expiry = props.session_expiry_interval if props is not None else None
            if expiry is not None:
                if self._v5.session_expiry == 0 and expiry != 0:
                    self._violation("DISCONNECT sets a session expiry interval after "
                                    "CONNECT gave 0")
                    return
                # Applied by the registry as the session ends (which restarts its
                # expiry timer on it), not here: only the holder may change it.
                limit = self.limits.session_expiry
                new_expiry = float(min(expiry, limit) if limit else expiry)
            # 0x04: the client wants its will published though it says goodbye.
            with_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        self._clean_close = True
        self._cause = CAUSE_CLEAN
        self.rules.advance("close")
        self.broker.unregister_connection(self.key, self, CAUSE_CLEAN)
        self._cancel_timers()
        if self.session is not None:
            why = ("client sent DISCONNECT with will" if with_will
                   else "client sent DISCONNECT")
            self.broker.end_session(self, self.session, not with_will, why,
                                    expiry=new_expiry)
            self.session = None
        self._lose()

    def _on_auth(self, packet: Auth) -> None:
        """AUTH: the next step of the exchange CONNECT began, or (connected) a
        re-authentication with the same method (reason code 0x19)."""
        props = packet.properties
        method = props.authentication_method if props is not None else None
        data = props.authentication_data if props is not None else None
        v5 = self._v5
        enhanced = self.factory.enhanced_auth
        auth = self._auth
        if (auth is None and self.state is _CONNECTED and v5 is not None
                and packet.reason_code == ReasonCode.REAUTHENTICATE
                and method is not None and method == v5.auth_method
                and enhanced is not None):
            exchange = enhanced.start(method)
            assert exchange is not None
            auth = self._auth = _AuthInProgress(exchange, method, None, False)
        elif (auth is None or packet.reason_code != ReasonCode.CONTINUE_AUTHENTICATION
              or method != auth.method):
            self._violation("AUTH out of place (no exchange under way with that method)")
            return
        self._auth_answer(auth.exchange.step(data))

    def _auth_answer(self, step: AuthStep) -> None:
        """Carry out the method's answer: a challenge (AUTH 0x18), or the end of
        the exchange (CONNACK, or for a re-authentication AUTH 0x00 / DISCONNECT)."""
        auth = self._auth
        assert auth is not None
        if step.outcome == CONTINUE:
            self._write(encode(Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties(
                authentication_method=auth.method, authentication_data=step.data)), 5))
            return
        if auth.packet is None:     # re-authentication while connected
            self._auth = None
            if step.outcome == SUCCESS and step.username == self.username:
                self._write(encode(Auth(ReasonCode.SUCCESS, Properties(
                    authentication_method=auth.method, authentication_data=step.data)), 5))
            else:
                self._violation(f"re-authentication failed: {step.reason or 'another user'}",
                                code=ReasonCode.NOT_AUTHORIZED)
            return
        self._stop_connect_timer()
        if step.outcome != SUCCESS:
            self._auth = None
            self.broker.gate.auth_failed(Credentials(self.client_id, step.username, None, "mqtt",
                                                self.peer), step.reason or "refused")
            self._refuse(ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                         f"authentication failed ({step.reason})")
            return
        # The name the exchange proved may be banned (the CONNECT's own user name
        # field, checked before, is whatever the client put there).
        banned = self.broker.gate.banned("MQTT", self.client_id, step.username, self.peer)
        if banned is not None:
            self._auth = None
            self._refuse(ReasonCode.BANNED, banned, logged=True)
            return
        auth.final = step.data
        self.username = step.username
        self.rules.advance("connect")
        self._pause_reading("connect")
        self._authenticated(True, auth.packet, auth.assigned)

    _handlers: ClassVar[dict[type, Callable[[MQTTProtocol, Any], None]]] = {
        Connect: _on_connect,
        Publish: _on_publish,
        Puback: _on_puback,
        Pubrec: _on_pubrec,
        Pubrel: _on_pubrel,
        Pubcomp: _on_pubcomp,
        Subscribe: _on_subscribe,
        Unsubscribe: _on_unsubscribe,
        Pingreq: _on_pingreq,
        Disconnect: _on_disconnect,
        Auth: _on_auth,
    }
    _connected_handlers: ClassVar[dict[type, Callable[[MQTTProtocol, Any], None]]] = {
        kind: handler for kind, handler in _handlers.items() if kind is not Connect}


class MQTTFactory(Factory):
    """Builds one ``MQTTProtocol`` per accepted socket; knows every live connection."""

    def __init__(self, broker: Broker, clock: Clock) -> None:
        self.broker = broker
        self.clock = clock
        self.strings = StringRules(broker.limits)
        limits = broker.limits
        # What a property block may hold (every connection's decoder shares it): a
        # client sends at most one subscription identifier (in SUBSCRIBE).
        self.property_limits = PropertyLimits(limits.max_user_properties,
                                              limits.max_user_property_bytes, 1,
                                              limits.max_subscribe_filters)
        # Open connections (CONNECT or not), in a dict used as a set: at thousands
        # of entries a set's table is twice a dict's (~50 against ~30 bytes each).
        self.connections: dict[MQTTProtocol, None] = {}
        # Lines about what a client can repeat at will: one per cause a minute.
        self.log_limit = LogLimiter(clock.seconds)
        # "connected from": 20 lines a second at most (then a count in the next one).
        self.connect_lines = LogLimiter(clock.seconds, interval=1.0, burst=20)
        # Every connection's keepalive check, on one timer.
        self.keepalives = Deadlines(clock, MQTTProtocol._keepalive_check)
        # CONNECT (and MQTT 5 AUTH) time-outs: one heap too, not a DelayedCall each.
        self.connect_deadlines = Deadlines(clock, MQTTProtocol._connect_timed_out)
        self.meter = DeliveryMeter(broker.stats)   # shared by its connections
        self.noisy = False
        self.cert_as_user = False   # --tls-cert-as-user
        # MQTT 5 enhanced authentication methods (None: none offered, 0x8C).
        self.enhanced_auth: EnhancedAuthenticator | None = None

    # (``addr`` is not read: ``net.tcp.LeanPort`` passes None instead of building it)
    wants_address = False

    def buildProtocol(self, addr: Any) -> MQTTProtocol:
        return MQTTProtocol(self)
