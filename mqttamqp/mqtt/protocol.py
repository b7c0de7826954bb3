"""The MQTT 3.1 / 3.1.1 connection: bytes from Twisted into the codec, packets into
the broker core, and the core's deliveries back out as bytes.

This module owns the transport side of one connection: feeding the codec, the
connect-timeout and keepalive timers, writing (one write per connection per
batch), and back-pressure (it is a push producer for its socket and pauses reading
when the subscribers it feeds fall behind).  The rules themselves — the state
machine, which packet may come when, the keepalive deadline and the order of
acknowledgements — are sans-IO in ``connection``; this module carries out what
they decide.

There is exactly one place that turns a protocol error into a disconnect:
``_violation``.  The routing rules live in ``mqttamqp.core``, not here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.broker import SUBSCRIBE_FAILURE, Broker
from mqttamqp.core.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.connections import ConnectionInfo
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
    CAUSE_STORAGE,
    CAUSE_TAKEN_OVER,
)
from mqttamqp.core.session import Session
from mqttamqp.core.stats import DELIVER_SAMPLE_MASK
from mqttamqp.mqtt.codec import Decoder, MalformedPacket, encode, encode_publish
from mqttamqp.mqtt.connection import (
    MAX_PENDING_ACKS,
    AckQueue,
    ConnectionRules,
    ConnectionState,
    Keepalive,
    StringRules,
)
from mqttamqp.mqtt.packets import (
    PROTOCOL_31,
    PROTOCOL_311,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from mqttamqp.tls import verified_common_name

__all__ = ["MQTTProtocol", "MQTTFactory", "ConnectionState", "MAX_PENDING_ACKS"]

_PINGRESP = encode(Pingresp())
_CLOSED = ConnectionState.CLOSED
_CONNECTED = ConnectionState.CONNECTED
_AWAITING_CONNECT = ConnectionState.AWAITING_CONNECT
# Output held for one batch before it is written anyway (Twisted's own write buffer
# pauses its producer past 64 KiB; see MQTTProtocol._emit).
OUTPUT_BATCH_BYTES = 64 * 1024


_FRAME_KINDS = ("reserved", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL",
                "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ",
                "PINGRESP", "DISCONNECT", "reserved")


def _frame_kind(data: bytes) -> str:
    """The MQTT packet type of an encoded frame (for debug lines)."""
    return _FRAME_KINDS[data[0] >> 4] if data else "empty"


def _ack_frame(kind: int, packet_id: int) -> bytes:
    return bytes((kind, 2, packet_id >> 8, packet_id & 0xFF))


# One-entry cache: fan-out sends the same QoS 0 message to many subscribers in a
# row; encode it once.
_qos0_cache: list[Any] = [None, False, b""]


@implementer(IPushProducer)
class MQTTProtocol(Protocol):
    log = Logger()
    transport: Any
    # Slots: more than 30 instance attributes would cost every connection a full
    # (unshared) __dict__ of about 1.5 KB; Twisted's own attributes stay in __dict__.
    __slots__ = (
        "_acks",
        "_backlog",
        "_cause",
        "_cause_detail",
        "_clean_close",
        "_congested",
        "_connect_timer",
        "_keepalive",
        "_keepalive_timer",
        "_last_activity",
        "_out",
        "_out_bytes",
        "_rate",
        "_rate_timer",
        "_reading_paused_for",
        "broker",
        "bytes_in",
        "bytes_out",
        "clean_session",
        "client_id",
        "clock",
        "connected_since",
        "decoder",
        "factory",
        "identity",
        "keepalive",
        "limits",
        "messages_in",
        "messages_out",
        "peer",
        "rules",
        "session",
        "strings",
        "username",
        "version",
    )

    def __init__(self, factory: MQTTFactory) -> None:
        self.factory = factory
        self.broker = factory.broker
        self.clock = factory.clock
        self.limits: Limits = factory.broker.limits
        self.rules = ConnectionRules()
        self.strings: StringRules = factory.strings
        self.decoder = Decoder(max_packet_size=self.limits.max_packet_size)
        self.session: Session | None = None
        self.identity: Identity | None = None
        self.client_id = ""
        self.username: str | None = None
        self.version = ""
        self.keepalive = 0
        self.clean_session = True
        self.peer = "?"
        self.connected_since = 0.0
        self._clean_close = False
        self._cause = CAUSE_LOST     # why the connection ends, for the archive
        self._cause_detail = ""
        self._last_activity = 0.0
        self.messages_in = self.messages_out = self.bytes_in = self.bytes_out = 0
        self._connect_timer: DelayedCall | None = None
        self._keepalive: Keepalive | None = None
        self._keepalive_timer: DelayedCall | None = None
        self._acks = AckQueue()
        self._congested = False
        self._out: list[bytes] | None = None   # written when the current batch ends
        self._out_bytes = 0
        self._backlog = 0
        self._reading_paused_for: set[str] = set()
        self._rate = self.broker.publish_rate()     # None: publish rate not limited
        self._rate_timer: DelayedCall | None = None

    @property
    def state(self) -> ConnectionState:
        return self.rules.state

    # -- Twisted ----------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        self._last_activity = self.clock.seconds()
        if not self.broker.admit("MQTT", self.peer, len(self.factory.connections)):
            self.rules.advance("close")
            self.transport.abortConnection()
            return
        self.factory.connections.add(self)
        self.transport.registerProducer(self, True)
        self._connect_timer = self.clock.callLater(
            self.limits.connect_timeout, self._connect_timed_out)

    def dataReceived(self, data: bytes) -> None:
        if self.rules.state is _CLOSED:
            return
        self._last_activity = self.clock.seconds()
        self.broker.stats.bytes_received += len(data)
        self.bytes_in += len(data)
        self.decoder.feed(data)
        broker = self.broker
        broker.begin_batch()
        try:
            self._process()
        finally:
            broker.end_batch()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.connections.discard(self)
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
        if qos == 0 and not dup:
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
        stats = self.broker.stats
        stats.messages_sent += 1
        stats.bytes_sent += len(frame)
        if not stats.messages_sent & DELIVER_SAMPLE_MASK:
            stats.deliver_sampled(message.timestamp)
        if self._congested:
            self._backlog += len(frame)

    def send_pubrel(self, packet_id: int) -> None:
        if self.state is not ConnectionState.CLOSED:
            self._write(_ack_frame(0x62, packet_id))

    def close(self, reason: str) -> None:
        """Closed by the broker (takeover, console): the session was already ended."""
        if self.state is ConnectionState.CLOSED:
            return
        self.rules.advance("close")
        self.session = None
        self._cancel_timers()
        cause = CAUSE_TAKEN_OVER if "taken over" in reason else CAUSE_CONSOLE
        self.broker.unregister_connection(self.key, self, cause, reason)
        self._lose()

    @property
    def key(self) -> str:
        return "mqtt:" + self.client_id

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            key=self.key, client_id=self.client_id, protocol="mqtt" + self.version,
            remote=self.peer, user=self.username, connected_since=self.connected_since,
            keepalive=self.keepalive, clean_session=self.clean_session,
            session_id=self.client_id,
            will_owners=(self.client_id,) if self.client_id in self.broker.wills else (),
            messages_in=self.messages_in, messages_out=self.messages_out,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out,
            last_activity=self._last_activity)

    # -- the one place a protocol error becomes a disconnect ----------------------

    def _violation(self, reason: str, cause: str | None = None) -> None:
        cause = cause or (
            CAUSE_KEEPALIVE if reason.startswith("keepalive") else CAUSE_PROTOCOL_ERROR)
        if cause == CAUSE_STORAGE:
            # Not the client's fault, and the core logged the failing storage once
            # for every client it hits: no line per connection.
            self.log.debug("closing the connection of {c} ({peer}): {r}",
                           c=self.client_id, peer=self.peer, r=reason)
        else:
            self.broker.stats.protocol_errors += 1
            if cause != CAUSE_KEEPALIVE:   # (that one's line is the disconnect's own)
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
        try:
            while True:
                state = rules.state
                if state is not _CONNECTED and state is not _AWAITING_CONNECT:
                    return
                packet = decoder.next_packet()
                if packet is None:
                    return
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
        except MalformedPacket as exc:
            self._violation(f"malformed packet: {exc.reason}")

    def _write(self, data: bytes) -> None:
        self._emit(data)
        self.bytes_out += len(data)
        self.broker.stats.bytes_sent += len(data)

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
            self.transport.write(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _lose(self) -> None:
        """Close after writing everything (including what a batch still holds)."""
        self._flush_out()
        self.transport.loseConnection()

    # -- CONNECT ------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        if self._connect_timer is not None and self._connect_timer.active():
            self._connect_timer.cancel()
        self._connect_timer = None
        proto = (packet.protocol_name, packet.protocol_level)
        if proto not in (PROTOCOL_31, PROTOCOL_311):
            self._refuse(ConnackCode.UNACCEPTABLE_PROTOCOL,
                         f"unsupported protocol {packet.protocol_name!r} level "
                         f"{packet.protocol_level}")
            return
        level = packet.protocol_level
        self.decoder.protocol_level = level
        self.version = "3.1" if level == 3 else "3.1.1"
        client_id = packet.client_id
        problem = self._connect_problem(packet)
        if problem is not None:
            self._violation(problem)
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
        banned = self.broker.banned("MQTT", client_id, self.username, self.peer)
        if banned is not None:       # counted and logged (rate-limited) by the broker
            self._refuse(ConnackCode.NOT_AUTHORIZED, banned, logged=True)
            return
        self.keepalive = packet.keepalive
        self.clean_session = packet.clean_session
        self.rules.advance("connect")
        self._pause_reading("connect")
        creds = Credentials(client_id, packet.username, packet.password, "mqtt", self.peer)
        d = (succeed(True) if cert_user is not None
             else self.broker.authenticate(creds))
        d.addCallback(self._authenticated, packet)
        d.addErrback(self._connect_failed)

    def _connect_problem(self, packet: Connect) -> str | None:
        """Why the strings of ``packet`` break the rules (``StringRules``), or None."""
        strings = self.strings
        problem = strings.text(packet.client_id, "CONNECT client identifier")
        if problem is None and packet.username is not None:
            problem = strings.text(packet.username, "CONNECT user name")
        if problem is None and packet.will is not None:
            problem = strings.topic(packet.will.topic, "CONNECT will topic")
        return problem

    def _authenticated(self, ok: bool, packet: Connect) -> Deferred[None] | None:
        if self.state is not ConnectionState.CONNECTING:
            return None  # the socket went away while we checked
        if not ok:
            code = (ConnackCode.BAD_CREDENTIALS if packet.username is not None
                    else ConnackCode.NOT_AUTHORIZED)
            self._refuse(code, "authentication failed")
            return None
        self.identity = Identity(self.client_id, self.username, "mqtt" + self.version)
        if not self.broker.may_claim(self.identity, self.client_id):
            self._refuse(ConnackCode.NOT_AUTHORIZED,
                         "the session of this client id belongs to another user")
            return None
        will = None
        if packet.will is not None:
            w = packet.will
            will = WillMessage(self.client_id, w.topic, w.payload, w.qos, w.retain, "mqtt",
                               self.clock.seconds())
        opened = self.broker.open_session(
            self, self.client_id, packet.clean_session, will, self.identity)
        session, present, d = opened.session, opened.present, opened.durable
        self.session = session
        if d is None:
            self._connected(None, session, present)
            return None
        d.addCallback(self._connected, session, present)
        return d

    def _connected(self, _: object, session: Session, present: bool) -> None:
        if self.state is not ConnectionState.CONNECTING or self.session is not session:
            return
        self.rules.advance("accepted")
        self.connected_since = self.clock.seconds()
        self._write(encode(Connack(present and self.version == "3.1.1",
                                   ConnackCode.ACCEPTED)))
        self.broker.activate(session, self, "mqtt" + self.version)
        self.broker.register_connection(self.key, self, "mqtt" + self.version)
        self.log.info("{c} connected from {peer} (MQTT {v}, clean={cs}, keepalive={k}s)",
                      c=self.client_id, peer=self.peer, v=self.version,
                      cs=self.clean_session, k=self.keepalive)
        debug_until = self.broker.client_debug.until(self.client_id)
        if debug_until is not None:
            self.start_debug(debug_until)
        if self.keepalive > 0:
            self._keepalive = Keepalive(self.keepalive)
            self._keepalive_timer = self.clock.callLater(
                self._keepalive.limit, self._keepalive_check)
        self._resume_reading("connect")
        self._process()

    def _connect_failed(self, failure: Failure) -> None:
        self.log.failure("could not accept CONNECT from {peer}", failure, peer=self.peer)
        if self.state is ConnectionState.CONNECTING:
            self._refuse(ConnackCode.SERVER_UNAVAILABLE, "internal error while connecting")

    def _refuse(self, code: int, reason: str, logged: bool = False) -> None:
        if not logged:
            self.broker.stats.connections_refused += 1
            self.log.warn("refused CONNECT from {peer} (client id {c!r}): {r} (CONNACK "
                          "{code})", peer=self.peer, c=self.client_id, r=reason,
                          code=int(code))
        if self.session is not None:
            # A refused CONNECT leaves no will behind and publishes none.
            self.broker.end_session(self, self.session, True, "CONNECT refused")
            self.session = None
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
            self._keepalive_timer = self.clock.callLater(delay, self._keepalive_check)

    def _cancel_timers(self) -> None:
        for timer in (self._connect_timer, self._keepalive_timer, self._rate_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._connect_timer = self._keepalive_timer = self._rate_timer = None
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
        self._reading_paused_for.add(why)

    def _resume_reading(self, why: str) -> None:
        if why in self._reading_paused_for:
            self._reading_paused_for.discard(why)
            if not self._reading_paused_for and self.state is not ConnectionState.CLOSED:
                self._last_activity = self.clock.seconds()
                self.transport.resumeProducing()

    def _drained(self) -> None:
        self._resume_reading("congestion")

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
        if result.congested:
            # Never pause for our own session: its acknowledgements arrive on this socket.
            congested = [s for s in result.congested if s is not session]
            if congested:
                self._pause_reading("congestion")
                broker.pause_until_drained(id(self), self._drained, congested)
        rate = self._rate
        if rate is not None:
            wait = rate.take(len(packet.payload))
            if wait > 0:
                timer = self._rate_timer
                if timer is None:
                    self._pause_reading("rate")
                    broker.publish_rate_exceeded("MQTT", self.client_id, wait)
                    self._rate_timer = self.clock.callLater(wait, self._rate_over)
                else:   # more of the same read: the pause grows to pay for it
                    timer.reset(wait)

    def _rate_over(self) -> None:
        self._rate_timer = None
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
        if session is not None:
            self.broker.received(session, packet.packet_id)

    def _on_pubrel(self, packet: Pubrel) -> None:
        assert self.session is not None
        d = self.broker.release_qos2(self.session, packet.packet_id)
        self._ack(d, _ack_frame(0x70, packet.packet_id))

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
        problem = self._filters_problem((f for f, _ in packet.topics),
                                        "SUBSCRIBE topic filter")
        if problem is not None:
            self._violation(problem)
            return
        codes, d = self.broker.subscribe(session, self.identity, packet.topics)
        grants = [(f, code) for (f, _), code in zip(packet.topics, codes, strict=True)]
        if self.version == "3.1" and SUBSCRIBE_FAILURE in codes:
            # MQTT 3.1's SUBACK has no failure code: a refused filter is answered with
            # the QoS asked for and simply has no route (nothing is ever sent for it).
            codes = [qos if code == SUBSCRIBE_FAILURE else code
                     for (_, qos), code in zip(packet.topics, codes, strict=True)]
        self._ack(d, encode(Suback(packet.packet_id, tuple(codes))),
                  lambda: self.broker.send_retained(session, grants))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.session is not None
        problem = self._filters_problem(packet.topics, "UNSUBSCRIBE topic filter")
        if problem is not None:
            self._violation(problem)
            return
        d = self.broker.unsubscribe(self.session, packet.topics)
        self._ack(d, encode(Unsuback(packet.packet_id)))

    # -- PING / DISCONNECT --------------------------------------------------------------

    def _on_pingreq(self, packet: Pingreq) -> None:
        self._write(_PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        self._clean_close = True
        self._cause = CAUSE_CLEAN
        self.rules.advance("close")
        self.broker.unregister_connection(self.key, self, CAUSE_CLEAN)
        self._cancel_timers()
        if self.session is not None:
            self.broker.end_session(self, self.session, True, "client sent DISCONNECT")
            self.session = None
        self._lose()

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
    }
    _connected_handlers: ClassVar[dict[type, Callable[[MQTTProtocol, Any], None]]] = {
        kind: handler for kind, handler in _handlers.items() if kind is not Connect}


class MQTTFactory(Factory):
    """Builds one ``MQTTProtocol`` per accepted socket; knows every live connection."""

    def __init__(self, broker: Broker, clock: Clock) -> None:
        self.broker = broker
        self.clock = clock
        self.strings = StringRules(broker.limits)
        self.connections: set[MQTTProtocol] = set()
        self.noisy = False
        self.cert_as_user = False   # --tls-cert-as-user

    def buildProtocol(self, addr: Any) -> MQTTProtocol:
        return MQTTProtocol(self)
