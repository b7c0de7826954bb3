"""The MQTT 3.1 / 3.1.1 / 5 connection: bytes from Twisted into the codec, packets
into the broker core, and the core's deliveries back out as bytes.

This module owns the transport side of one connection: feeding the codec, the
connect-timeout and keepalive timers, writing (one write per connection per
batch), and back-pressure (it is a push producer for its socket and pauses reading
when the subscribers it feeds fall behind).  The rules themselves — the state
machine, which packet may come when, the keepalive deadline and the order of
acknowledgements — are sans-IO in ``connection``, and what to do with each packet
(reason codes, receive maximum, retain handling, topic aliases, the
acknowledgement a verdict gets) in ``decisions``, as ``actions`` that
``executor.ActionExecutor`` carries out.

``MQTTProtocol`` is built from parts by concern (``link`` declares what they
share): carrying out the decisions' actions (acknowledgements in order, the
refusing CONNACK, DISCONNECT's end, deadlines) is ``executor.ActionExecutor``;
accepting a CONNECT and the AUTH exchange is ``handshake.ConnectHandshake``; the
packets of a connected client are ``flows.ConnectedFlows``; the one
disconnect is ``closing.Disconnects``; the input pump and reading pauses are
``reading.InputPump``; what the console sees is ``inspect.ConnectionView``; this
module keeps the Twisted protocol, the deliveries (``send_publish``), output
batches, the publish back-pressure (``_after_publish``) and timers.  The MQTT 5 frame of a
delivery is ``outbound``'s; what waits while durable queues are blocked is
``parking``'s; the console's debug log is ``debuglog``'s.

One connection's input is handled for at most ``Limits.mqtt_turn`` seconds in one
reactor turn while other clients wait to be read: then it is not read, and what it
sent is held, until a later turn (``reading.InputPump._yield_turn``), so that a client whose packets
are costly (user properties, a fan-out, a flood of small ones) cannot stall the
others.

There is exactly one place that turns a protocol error into a disconnect:
``closing.Disconnects._violation`` (for MQTT 5 it sends DISCONNECT with the
reason code first, or CONNACK with it before the connection is accepted).  The
routing rules live in ``mqttamqp.core``, not here; what an MQTT 5 connection
negotiated, and the rules that need it, live in ``v5``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final

from twisted.internet.interfaces import ILoggingContext, IProtocol, IPushProducer
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import classImplements  # type: ignore[import-untyped]

from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.adapter.throttle import PublishThrottle
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker, Published
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.commits import write_failed
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import CAUSE_LOST
from mqttamqp.core.sessions.entries import NativeLink
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import DELIVER_SAMPLE_MASK
from mqttamqp.mqtt import debuglog, outbound
from mqttamqp.mqtt.actions import Close, ack_frame
from mqttamqp.mqtt.codec import Decoder, PropertyLimits, encode_publish, one_packet
from mqttamqp.mqtt.connection import (
    MAX_PENDING_ACKS,
    NO_ACKS,
    ConnectionState,
    Keepalive,
    StringRules,
)
from mqttamqp.mqtt.deadlines import Deadlines, SoonDeadlines
from mqttamqp.mqtt.decoders import IDLE, SpareDecoders
from mqttamqp.mqtt.flows import ConnectedFlows
from mqttamqp.mqtt.handshake import ConnectHandshake
from mqttamqp.mqtt.opened import OpenConnections
from mqttamqp.mqtt.outbound import QOS0_FRAME, QOS0_FRAME5
from mqttamqp.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)
from mqttamqp.mqtt.parking import Parked
from mqttamqp.mqtt.reading import NOT_PAUSED, SINGLE_PUBLISH
from mqttamqp.mqtt.v5 import Negotiated
from mqttamqp.native import mypyc_attr
from mqttamqp.net.sending import plain_tcp, register_push_producer, send
from mqttamqp.security.enhanced_auth import EnhancedAuthenticator

__all__ = ["MQTTProtocol", "MQTTFactory", "ConnectionState", "MAX_PENDING_ACKS"]

_CLOSED: Final = ConnectionState.CLOSED
# Output held for one batch before it is written anyway (Twisted's own write buffer
# pauses its producer past 64 KiB; see MQTTProtocol._emit).
OUTPUT_BATCH_BYTES: Final = 64 * 1024
_NO_PROPERTIES: Final = b"\x00"


@mypyc_attr(allow_interpreted_subclasses=True)
class MQTTProtocol(ConnectHandshake, NativeLink):
    log: ClassVar[Logger] = Logger()
    transport: Any
    # Slots: more than 30 instance attributes would cost every connection a full
    # (unshared) __dict__ of about 1.5 KB; and with no dict at all (every base has
    # ``__slots__``; no Twisted ``Protocol`` base, which has none: what Twisted calls
    # is here and in ``inspect``) the dict's pointers and values block are gone too
    # (~40 bytes).  The console's debug log swaps the class.  Compiled (mypyc), the
    # parts' chain (``link``) is native: C fields, not these slots, and a vtable.
    # The connection is its own ``ConnectionRules`` (a base class, through
    # ``link.MQTTLink``: its ``state`` slot and methods): the rules stay sans-IO and
    # tested alone, and a connection does not pay for a second object (40 bytes) to
    # hold one field.
    __slots__ = (
        "_acks",
        "_backlog",
        "_cause",
        "_connect_timer",
        "_in_process",
        "_keepalive_timer",
        "_last_activity",
        "_out",
        "_out_bytes",
        "_parked",
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
        "congested",
        "connected_since",
        "decoder",
        "factory",
        "identity",
        "keepalive",
        "limits",
        "messages_in",
        "messages_out",
        "meter",
        "session",
        "strings",
        "transport",
        "username",
        "version",
    )

    def __init__(self, factory: MQTTFactory) -> None:
        self.transport = None
        self.factory = factory
        self.broker = factory.broker
        self.clock = factory.clock
        self.meter = factory.meter
        self.limits: Limits = factory.broker.limits
        self.state = ConnectionState.AWAITING_CONNECT
        self.strings: StringRules = factory.strings
        self.decoder: Decoder = IDLE   # (one lent per read: ``decoders``)
        self.session: Session | None = None
        self.identity: Identity | None = None
        self.client_id = ""
        self.username: str | None = None
        self.version = ""
        self.keepalive = 0
        self.clean_session = True
        self.connected_since = 0.0
        # why the connection ends, for the archive (and its detail: ``opened``)
        self._cause = CAUSE_LOST
        self._last_activity = 0.0
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        # The due times of the deadlines in factory.connect_deadlines and
        # factory.keepalives (set and cleared by them).
        self._connect_timer: float | None = None
        self._keepalive_timer: float | None = None
        self._acks = NO_ACKS   # (its own once an acknowledgement waits: ``_ack``)
        # The transport's buffer is full (a plain attribute, not a property: the core
        # reads it for every delivery, ``ClientLink.congested``).
        self.congested = False
        self._out: list[bytes] | None = None   # written when the current batch ends
        self._out_bytes = 0
        self._backlog = 0
        # (a frozenset, replaced on change: the empty one is shared, an empty set
        # is 216 bytes per connection)
        self._reading_paused_for: frozenset[str] = NOT_PAUSED
        self._in_process = False   # inside ``_process`` (no nested run on resume)
        self._parked: Parked | None = None   # durable queues blocked: see ``_park``
        rate = self.broker.gate.publish_rate()     # None: publish rate not limited
        self._throttle = (None if rate is None else
                          PublishThrottle(rate, self.clock, self._rate_paused, self._rate_over))
        self._turn_timer: DelayedCall | None = None   # input held until a later turn
        self._v5: Negotiated | None = None     # set once an MQTT 5 CONNECT is read

    @property
    def _link(self) -> MQTTProtocol:
        return self

    @property
    def _factory(self) -> MQTTFactory:
        factory: MQTTFactory = self.factory   # (Twisted types it Any)
        return factory

    # -- Twisted ----------------------------------------------------------------

    def connectionMade(self) -> None:
        # (``_last_activity`` is first read after the first read sets it)
        opened = self.factory.opened
        unregistered = opened.unregistered   # (``count`` inlined, and the entry)
        if not self.broker.gate.admit("MQTT", self.peer,
                                      len(opened.live.mqtt) + len(unregistered)):
            self.advance("close")
            self.transport.abortConnection()
            return
        unregistered[self] = ""   # (until its CONNACK: ``opened``)
        transport = self.transport   # (``hasattr``, not a getattr default: ``peer``)
        if not (hasattr(transport, "nodelay") and transport.nodelay) and plain_tcp(transport):
            # Output is batched per socket read and sent at once (``_flush_out``): without
            # this, Nagle's algorithm holds a second small write until the peer's
            # (possibly delayed) ACK.  (``nodelay``: the socket has it from its
            # listener, see ``net.tcp.lean_port``.)
            transport.setTcpNoDelay(True)
        register_push_producer(transport, self)
        # (armed next turn if CONNECT has not come by then: ``SoonDeadlines``)
        self.factory.connect_soon.add(self)

    def dataReceived(self, data: bytes) -> None:
        if self.state is _CLOSED:
            return
        now = self._last_activity = self.clock.seconds()
        size = len(data)
        # ``DeliveryMeter.received_bytes`` inlined (and ``sent_bytes`` in ``_write``).
        self.meter.stats.bytes_received += size
        self.bytes_in += size
        decoder = self.decoder
        one = False   # (a read of exactly one PUBLISH: ``reading.SINGLE_PUBLISH``)
        if decoder is IDLE:   # (lent for this read: ``_process_batch`` takes it back)
            decoder = self.decoder = self.factory.decoders.take(self.version)
            one = size > 1 and data[0] >> 4 == 3 and (
                size == data[1] + 2 if data[1] < 0x80 else one_packet(data))
        decoder.feed(data)
        self._process_batch(now, one)   # (its turn's share counted from this read)

    def connectionLost(self, reason: Failure | None = None) -> None:
        factory = self.factory
        # (out of its tables, with a protocol error's reason: see ``opened``)
        detail = factory.opened.registered(self)
        if factory.bridge_peers:
            factory.bridge_peers.discard(self)
        self.broker.forget_paused(id(self))
        self._cancel_timers()
        was = self.state
        self.advance("close")
        # Pending acknowledgements are not dropped: a committed QoS 2 message still
        # goes to its subscribers once its commit fires (``_flush_acks``).
        if not detail and self._cause == CAUSE_LOST and reason is not None:
            detail = "connection lost: " + reason.getErrorMessage()
        self.broker.registry.unregister_client(self.client_id, self, self._cause, detail)
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
        if not self.congested:
            self.congested = True
            self._backlog = 0

    def resumeProducing(self) -> None:
        self.congested = False
        self._backlog = 0
        if self.state is ConnectionState.CONNECTED:
            self.broker.link_drained(self.session)

    def stopProducing(self) -> None:
        pass

    # -- ClientLink (what the core calls) ----------------------------------------

    @property
    def backlog_bytes(self) -> int:
        return self._backlog

    def send_publish(self, message: Message, qos: int, packet_id: int | None,
                     dup: bool, retain: bool, subscription_ids: tuple[int, ...] = ()) -> None:
        if self.state is _CLOSED:
            return
        if message.props is not None and message.expired(self.clock.seconds()):
            # Its message expiry interval ran out while it waited (queue, in flight
            # before sending, retained store): never sent, counted as dropped.
            _not_sent(self, packet_id, message.topic)
            return
        v5 = self._v5
        if v5 is not None:
            if message.props is None and v5.plain and not subscription_ids:
                # Nothing MQTT 5 to add: an empty property block (QoS 0 frames are
                # shared across subscribers, as for 3.1.1).
                if qos == 0 and not dup:
                    cache = QOS0_FRAME5
                    if cache[0] is message and cache[1] == retain:
                        frame = cache[2]
                    else:
                        frame = encode_publish(message.topic.encode(),
                                               message.payload, 0, retain, False, None,
                                               _NO_PROPERTIES)
                        cache[0], cache[1], cache[2] = message, retain, frame
                else:
                    frame = encode_publish(message.topic.encode(), message.payload,
                                           qos, retain, dup, packet_id, _NO_PROPERTIES)
            else:
                frame, fits = outbound.publish5(v5, message, qos, packet_id, dup, retain,
                                                self.clock.seconds(), subscription_ids)
                if not fits:
                    _too_large(self, v5, message, len(frame))
                    _not_sent(self, packet_id, message.topic)
                    return
        elif qos == 0 and not dup:
            cache = QOS0_FRAME
            if cache[0] is message and cache[1] == retain:
                frame = cache[2]
            else:
                frame = encode_publish(message.topic.encode(), message.payload, 0,
                                       retain, False, None)
                cache[0], cache[1], cache[2] = message, retain, frame
        else:
            frame = encode_publish(message.topic.encode(), message.payload, qos,
                                   retain, dup, packet_id)
        size = len(frame)
        out = self._out
        if (out is not None and type(self) is MQTTProtocol and not self.congested
                and self._out_bytes + size < OUTPUT_BATCH_BYTES):
            # (``_emit``'s batch case; not in a subclass, whose ``_emit`` may do more:
            # ``debuglog``'s logs every frame)
            out.append(frame)
            self._out_bytes += size
        else:
            self._emit(frame)
        self.messages_out += 1
        self.bytes_out += size
        # ``DeliveryMeter.delivered`` inlined (the call cost fan-out 5 %, bench/results/
        # 2026-11-29-shape-old-vs-new.md); test_mqtt_protocol checks both count alike.
        stats = self.meter.stats
        sent = stats.messages_sent + 1
        stats.messages_sent = sent
        stats.bytes_sent += size
        if not sent & DELIVER_SAMPLE_MASK:
            stats.deliver_sampled(message.timestamp)
        if self.congested:
            self._backlog += len(frame)

    def send_pubrel(self, packet_id: int) -> None:
        if self.state is not ConnectionState.CLOSED:
            self._write(ack_frame(0x62, packet_id))

    def _write(self, data: bytes) -> None:
        self._emit(data)
        size = len(data)
        self.bytes_out += size
        self.meter.stats.bytes_sent += size   # (``DeliveryMeter.sent_bytes``, inlined)

    def _emit(self, data: bytes) -> None:
        """Every outbound byte goes through here, in order (but an accepting CONNACK
        with nothing before or behind it: ``handshake._send_now``).  While the broker handles
        one socket read (a batch), what it gives this connection is collected and
        written when the batch ends: one transport write instead of one per message
        (fan-in, QoS 0 streams).  At most ``OUTPUT_BATCH_BYTES`` are held, so the
        transport's own back-pressure (pauseProducing past its 64 KiB buffer) still
        comes in time for the congestion logic; a congested connection is written
        at once.  A write that raises is counted and logged a line a minute
        (``core.commits.write_failed``): the routing that called this goes on to the
        others.  (Of another class, the debug log's, it first tells ``debuglog.sent``.)"""
        if type(self) is not MQTTProtocol:
            debuglog.sent(self, data)
        try:
            out = self._out
            if out is not None:
                out.append(data)
                self._out_bytes += len(data)
                if self._out_bytes >= OUTPUT_BATCH_BYTES or self.congested:
                    self._flush_out()
            elif (self.congested   # (at once when nothing is held: ``net.tcp``)
                  or (SINGLE_PUBLISH[0] is not None and SINGLE_PUBLISH[0] is not self)
                  or not self.broker.after_batch(self._flush_out)):   # (outside a batch)
                send(self.transport, data)   # (congested, or another's one PUBLISH routed it)
            else:
                self._out = [data]
                self._out_bytes = len(data)
        except Exception:
            write_failed(self.meter.stats, self.factory.log_limit, self.log, Failure())

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out:
            send(self.transport, out[0] if len(out) == 1 else b"".join(out))

    def _lose(self) -> None:
        """Close after writing everything (including what a batch still holds); a
        client that does not read it within ``--close-grace`` is cut."""
        self._flush_out()
        transport = self.transport
        transport.unregisterProducer()   # (a producer is resumed once drained, not closed)
        transport.loseConnection()
        if self.state is _CLOSED:   # (not an MQTT 5 client told of a shutdown)
            self.factory.opened.closing(self)   # (found there until lost)
        # (in the turn timer's slot, no turn after the close; connectionLost cancels it)
        if self._turn_timer is not None and self._turn_timer.active():
            self._turn_timer.cancel()
        self._turn_timer = self.factory.close_grace.arm(transport, self.client_id)

    # -- timers -------------------------------------------------------------------

    def _connect_timed_out(self) -> None:
        self._carry_out(Close(f"no CONNECT within {self.limits.connect_timeout:g}s"))

    def _keepalive_check(self) -> None:
        keepalive = Keepalive.of(self.keepalive)
        now = self.clock.seconds()
        delay = keepalive.next_check(now, self._last_activity, bool(self._reading_paused_for))
        if delay is None:
            self._carry_out(Close(keepalive.expired_reason(now, self._last_activity)))
        else:
            self.factory.keepalives.add(self, delay)

    def _stop_connect_timer(self) -> None:
        if self._connect_timer is not None:
            self.factory.connect_deadlines.cancel(self)

    def _cancel_timers(self) -> None:
        self._stop_connect_timer()
        if self._throttle is not None:
            self._throttle.stop()
        timer = self._turn_timer
        if timer is not None and timer.active():
            timer.cancel()
        if self._keepalive_timer is not None:
            self.factory.keepalives.cancel(self)
        self._turn_timer = None
        if debuglog.debugged(self):
            self.stop_debug()

    # -- per-client debug logging (the console's "Debug log") ----------------------

    def start_debug(self, until: float) -> None:
        """Log every packet in and out of this connection until ``until``."""
        debuglog.start(self, until)

    def stop_debug(self) -> None:
        debuglog.stop(self)

    def _after_publish(self, session: Session, result: Published, size: int) -> None:
        broker = self.broker
        if result.blocked:
            # The durable queues are full on disk: its PUBLISHes to them wait until
            # they have room (``_park``); it is still read for its acknowledgements.
            parked = self._parked
            if parked is None:
                parked = self._parked = Parked()
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

    _handlers: ClassVar[dict[type, Callable[[MQTTProtocol, Any], None]]] = {
        Connect: ConnectHandshake._on_connect,
        Publish: ConnectedFlows._on_publish,
        Puback: ConnectedFlows._on_puback,
        Pubrec: ConnectedFlows._on_pubrec,
        Pubrel: ConnectedFlows._on_pubrel,
        Pubcomp: ConnectedFlows._on_pubcomp,
        Subscribe: ConnectedFlows._on_subscribe,
        Unsubscribe: ConnectedFlows._on_unsubscribe,
        Pingreq: ConnectedFlows._on_pingreq,
        Disconnect: ConnectedFlows._on_disconnect,
        Auth: ConnectHandshake._on_auth,
    }
    _connected_handlers: ClassVar[dict[type, Callable[[MQTTProtocol, Any], None]]] = {
        kind: handler for kind, handler in _handlers.items() if kind is not Connect}
    _plain_publish: ClassVar[Callable[[MQTTProtocol, Any], None]] = ConnectedFlows._on_publish


# (not ``@implementer``: a class decorator other than mypyc's would make the class
# not native in the compiled build)
classImplements(MQTTProtocol, IPushProducer, IProtocol, ILoggingContext)


def _not_sent(connection: MQTTProtocol, packet_id: int | None, topic: str) -> None:
    """A delivery ``connection`` will not send: counted as dropped, and a QoS 1/2
    one leaves the session's window as if it had been acknowledged (on the next
    turn: the session is in the middle of sending)."""
    session = connection.session
    if session is None:
        return
    if packet_id is None:
        session.drop_congested(topic)
    else:
        connection.clock.callLater(0, connection.broker.rejected, session, packet_id)


def _too_large(connection: MQTTProtocol, v5: Negotiated, message: Message,
               size: int) -> None:
    """One line (rate-limited) for a delivery above the client's maximum packet size."""
    held = connection.factory.log_limit.allow("packet too large for client")
    if held is not None:
        connection.log.warn("a PUBLISH on {t!r} of {n} bytes is above the maximum packet "
                            "size {m} of {c}; not sent to it ({h} more since the last "
                            "such line)", t=message.topic, n=size, m=v5.client_max_packet,
                            c=connection.client_id, h=held)


def _awaits_connect(connection: MQTTProtocol) -> bool:
    """A connection accepted a turn ago still needs its CONNECT deadline."""
    return (connection.state is ConnectionState.AWAITING_CONNECT
            and connection._connect_timer is None)


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
        # The decoders lent to connections for a read (an idle one holds none).
        self.decoders = SpareDecoders(limits.max_packet_size, self.property_limits)
        # Open connections (CONNECT or not), found in the registry's live table and
        # a table of those not in it (no table of all: ``opened``).
        self.opened = OpenConnections(broker.registry.connections, self)
        # The open connections that set Mosquitto's bridge flag (``bridge_peer``).
        self.bridge_peers: set[MQTTProtocol] = set()
        # Lines about what a client can repeat at will: one per cause a minute.
        self.log_limit = LogLimiter(clock.seconds)
        # "connected from": 20 lines a second at most (then a count in the next one).
        self.connect_lines = LogLimiter(clock.seconds, interval=1.0, burst=20)
        # Every connection's keepalive check, on one timer.
        self.keepalives = Deadlines(clock, MQTTProtocol._keepalive_check, "_keepalive_timer")
        # CONNECT (and MQTT 5 AUTH) time-outs: one heap too, not a DelayedCall each.
        self.connect_deadlines = Deadlines(clock, MQTTProtocol._connect_timed_out,
                                           "_connect_timer")
        # ... armed a turn after the accept, for a client that did not send CONNECT
        self.connect_soon = SoonDeadlines(clock, limits.connect_timeout, _awaits_connect,
                                          MQTTProtocol._arm_connect_deadline)
        self.meter = DeliveryMeter(broker.stats)   # shared by its connections
        self.close_grace = CloseGrace(clock, limits.close_grace, MQTTProtocol.log, "MQTT",
                                      lambda: self.meter.limit_hit("close_grace"))
        self.noisy = False
        self.cert_as_user = False   # --tls-cert-as-user
        # MQTT 5 enhanced authentication methods (None: none offered, 0x8C).
        self.enhanced_auth: EnhancedAuthenticator | None = None

    # (``addr`` is not read: ``net.tcp.LeanPort`` passes None instead of building it)
    wants_address = False

    def buildProtocol(self, addr: Any) -> MQTTProtocol:
        return MQTTProtocol(self)
