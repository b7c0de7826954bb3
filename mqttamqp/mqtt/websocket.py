"""MQTT over WebSockets: autobahn's server handshake and framing in front of the
very ``MQTTProtocol`` the TCP listener uses.

What it owns: the WebSocket side of one connection.  The opening handshake is
checked here (path ``/mqtt``, subprotocol ``mqtt`` or ``mqttv3.1``, the Origin
rule, a bounded request head, ``--connect-timeout`` to finish it), and a socket in
it is counted under ``--max-connections`` with the MQTT connections from its accept
(``UpgradeSlots``: beyond the bound, closed at its accept); once open, the
bytes of every binary message go to an ``MQTTProtocol`` through
``net.websocket.StreamOverWebSocket``, a transport that makes the WebSocket look
like the TCP socket that protocol expects.  A WebSocket message may hold part of an MQTT packet
or several: frame data is fed to the protocol as it arrives (autobahn streams it),
so the MQTT decoder and its ``--max-packet-size`` are the size limit, as on TCP,
and no whole message is ever buffered here. A frame whose header announces more
than ``MAX_FRAME_PACKETS`` times ``--max-packet-size`` closes the connection at that
header (close code 1009), and so does any protocol error autobahn finds (a length
over 2^63, say): the close frame says why and the socket closes at once, without
reading what the peer still sends. Only RFC 6455's version 13 is spoken; a request
for another gets HTTP 426 naming it.  Each ``write`` of the protocol
(already batched per read) becomes one binary message.

Back-pressure is the socket's own: the protocol registers itself as the push
producer of the underlying TCP (or TLS) transport, so it is paused when that
transport's write buffer fills, exactly as on TCP; and when the protocol stops
reading (CONNECT in progress, slow subscribers, publish rate), the underlying
transport stops reading.

What it must not do: know MQTT.  Packets, the state machine, timers, wills and
the log line for each protocol error stay in ``protocol``; this module logs only
what a WebSocket peer does wrong before or outside MQTT (a refused handshake, a
text frame), at most one line per cause a minute (``LogLimiter``).

Origin rule (browsers send ``Origin``; they are the only clients it protects):
without ``--ws-allowed-origin``, a request without an Origin header is accepted
(MQTT libraries outside browsers send none), and one with an Origin is accepted
when its host name is the host name the request was sent to (``Host``), whatever
the port: a page served by this machine may connect, a page elsewhere may not.
With ``--ws-allowed-origin`` (repeatable), an Origin must be one of those given
(``scheme://host[:port]``, compared case-insensitively; ``*`` accepts any);
requests without Origin are still accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from autobahn.twisted.websocket import (
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.mqtt.protocol import MQTTFactory, MQTTProtocol
from mqttamqp.net.accept import RefusedAtAccept
from mqttamqp.net.websocket import (
    CLOSE_TOO_BIG,
    CLOSE_UNSUPPORTED_DATA,
    QuietLog,
    StreamOverWebSocket,
)

__all__ = ["MAX_FRAME_PACKETS", "SUBPROTOCOLS", "WS_PATH", "WS_VERSION",
           "MQTTWebSocketFactory", "MQTTWebSocketProtocol", "OriginRule", "UpgradeSlots"]

WS_PATH = "/mqtt"
# In the order of preference when a client offers both (MQTT.js offers "mqtt"; old
# Paho JavaScript clients, speaking 3.1, "mqttv3.1").
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# The opening request's head (request line and headers) may be at most this long;
# browsers send well under 2 KB.
MAX_REQUEST_HEAD = 16 * 1024
#: The one WebSocket version spoken (RFC 6455); autobahn also speaks the draft's 8.
WS_VERSION = 13
#: A frame may carry at most this many times --max-packet-size (several packets may
#: share a frame: MQTT.js batches its writes into one).
MAX_FRAME_PACKETS = 4


@dataclass(frozen=True)
class OriginRule:
    """Which ``Origin`` headers a handshake may carry (see the module's paragraph)."""

    allowed: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, origins: Iterable[str]) -> OriginRule:
        return cls(tuple(_normal_origin(o) for o in origins))

    def problem(self, origin: str | None, host: str) -> str | None:
        """Why a handshake with ``origin`` (None: no header) sent to ``host`` (the
        Host header's name, without port) is refused, or None."""
        if origin is None:
            return None
        if self.allowed:
            if "*" in self.allowed or _normal_origin(origin) in self.allowed:
                return None
            return f"origin {origin!r} is not one of --ws-allowed-origin"
        origin_host = urlsplit(origin).hostname
        if origin_host is not None and origin_host == host.strip("[]").lower():
            return None
        return (f"origin {origin!r} is not this host ({host}); allow it with "
                "--ws-allowed-origin")


class Upgrading(Protocol):
    """Where a WebSocket listener counts its sockets in their upgrade: a broker's
    ``UpgradeSlots``, or in gateway mode its ``gateway.websocket.WebSocketSide``."""

    def admit(self, peer: str) -> bool: ...
    def hold(self, ws: Any) -> None: ...
    def release(self, ws: Any) -> None: ...
    def hand_over(self, ws: Any, peer: str) -> None: ...


class UpgradeSlots:
    """The sockets of the WebSocket listeners still in their HTTP upgrade, under the
    broker's ``--max-connections``: each is counted with the MQTT connections from
    its accept (an entry of the MQTT factory's ``opened.unregistered``, as an MQTT
    socket before its CONNECT, so the TCP listener's admission counts it too, and
    the shutdown and --ha sweeps reach it), until its upgrade ends: at ``onOpen`` its
    place passes to its MQTT connection (admitted then, as on TCP), or it is lost
    (refused, timed out, closed, cut).  Its accept is the broker gate's, as a TCP
    socket's: beyond the bound, or past its address's --max-connect-rate, a new
    socket is closed at its accept, counted as a refused connection and a limit hit,
    logged in the gate's one line a minute for that cause (shared with TCP's).  The
    rate token it spent is given back when its MQTT connection is admitted
    (``hand_over``), so a WebSocket spends one, as a TCP socket does."""

    __slots__ = ("_gate", "_opened")

    def __init__(self, mqtt: MQTTFactory) -> None:
        self._opened = mqtt.opened
        self._gate = mqtt.broker.gate

    def admit(self, peer: str) -> bool:
        """May a socket accepted from ``peer`` begin its upgrade?"""
        opened = self._opened
        return self._gate.admit("MQTT over WebSocket", peer,
                                len(opened.live.mqtt) + len(opened.unregistered))

    def hold(self, ws: MQTTWebSocketProtocol) -> None:
        self._opened.unregistered[ws] = ""

    def release(self, ws: MQTTWebSocketProtocol) -> None:
        self._opened.registered(ws)

    def hand_over(self, ws: MQTTWebSocketProtocol, peer: str) -> None:
        """``ws``'s upgrade is done: its place and its rate token go to the MQTT
        connection about to be admitted (which takes them again)."""
        self._opened.registered(ws)
        self._gate.refund_connect(peer)


def _one_binary_frame(data: bytes) -> bool:
    """``data`` is exactly one whole, final, masked binary frame from a client (RFC
    6455 5.2: FIN and opcode 2, the mask bit, a 7-, 16- or 64-bit length, the key)."""
    size = len(data)
    if size < 6 or data[0] != 0x82:
        return False
    length = data[1] & 0x7F   # (the mask bit is what autobahn checks)
    if length < 126:
        return size == 6 + length
    if length == 126:
        return size == 8 + int.from_bytes(data[2:4], "big")
    return size == 14 + int.from_bytes(data[2:10], "big")


def _normal_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class MQTTWebSocketProtocol(WebSocketServerProtocol):
    log = QuietLog()
    factory: MQTTWebSocketFactory
    transport: Any

    def __init__(self) -> None:
        super().__init__()
        self.mqtt: MQTTProtocol | None = None
        self._ignoring = False   # a text frame came: what follows is not fed to MQTT
        self._closing_reason: str | None = None   # ours, when we closed it
        self._handshake_timer: DelayedCall | None = None
        self._denied = False   # refused (and logged) by onConnect
        self._held = False     # counted under --max-connections (``UpgradeSlots``)

    def connectionMade(self) -> None:
        super().connectionMade()
        factory = self.factory
        slots = factory.slots
        if slots is not None:
            slots.hold(self)   # (until its upgrade ends: ``_release``)
            self._held = True
        # Our clock, not autobahn's timer (txaio's, on the global reactor).
        self._handshake_timer = factory.clock.callLater(
            factory.mqtt.broker.limits.connect_timeout, self._handshake_timed_out)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._release()
        self._cancel_handshake_timer()
        super().connectionLost(reason)

    def _release(self, opened: bool = False) -> None:
        """Its upgrade is over (``opened``, or lost on any path): no longer counted
        here."""
        if self._held:   # (only with ``slots``: ``connectionMade``)
            self._held = False
            slots = self.factory.slots
            assert slots is not None
            if opened:
                slots.hand_over(self, self._peer())
            else:
                slots.release(self)

    def server_stopping(self) -> None:
        """The broker stops (its sweep of ``opened``): a socket still in its upgrade
        is cut."""
        self.transport.abortConnection()

    def _cancel_handshake_timer(self) -> None:
        timer, self._handshake_timer = self._handshake_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    # -- the opening handshake -------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if (self.state == self.STATE_CONNECTING
                and len(self.data) + len(data) > MAX_REQUEST_HEAD):
            self.factory.refused(self._peer(), "request_head", "opening request head "
                                 f"longer than {MAX_REQUEST_HEAD} bytes")
            self.factory.mqtt.meter.limit_hit("ws_request_head")
            self.transport.abortConnection()
            return
        if (self.state == self.STATE_OPEN and not self.data and self.current_frame is None
                and _one_binary_frame(data)):
            # A read of one whole binary frame, nothing of an earlier one held or begun
            # (autobahn's ``data`` and ``current_frame``, pinned in test_net_pins): the
            # MQTT connection's own batch is the read's, as on TCP (a frame of one
            # PUBLISH is sent to each subscriber at once: ``reading.SINGLE_PUBLISH``).
            super().dataReceived(data)
            return
        # One socket read is one batch, as on TCP (commits, and one write per
        # connection), however many frames or part-frames it holds.
        broker = self.factory.mqtt.broker
        broker.begin_batch()
        try:
            super().dataReceived(data)
        finally:
            broker.end_batch()

    def onConnect(self, request: Any) -> str:
        """The subprotocol to answer with; ``ConnectionDeny`` refuses (autobahn sends
        the HTTP error and closes)."""
        if request.path != WS_PATH:
            self._deny(ConnectionDeny.NOT_FOUND, "path",
                       f"path {request.path!r} (MQTT is at {WS_PATH})")
        offered = [p.lower() for p in request.protocols]
        chosen = next((p for p in SUBPROTOCOLS if p in offered), None)
        if chosen is None:
            self._deny(ConnectionDeny.BAD_REQUEST, "subprotocol",
                       f"no MQTT subprotocol offered (got {request.protocols or 'none'}; "
                       f"expected one of {', '.join(SUBPROTOCOLS)})")
        problem = self.factory.origins.problem(request.headers.get("origin"), request.host)
        if problem is not None:
            self._deny(ConnectionDeny.FORBIDDEN, "origin", problem)
        return chosen  # type: ignore[return-value]

    def _deny(self, code: int, cause: str, reason: str) -> None:
        self.factory.refused(self._peer(), cause, reason)
        self._denied = True
        raise ConnectionDeny(code, reason)  # type: ignore[no-untyped-call]

    def failHandshake(self, reason: str, code: int = 400,
                      responseHeaders: Any = None) -> None:
        """Every refused handshake comes here; those autobahn refuses itself (not a
        WebSocket request, a malformed one) are logged here, ours in ``_deny``.
        A version we do not speak gets 426 Upgrade Required (RFC 6455 4.2.2) with
        the version we do (autobahn answers 400)."""
        names = {str(name).lower() for name, _ in responseHeaders or ()}
        cause = "bad_handshake"
        if "sec-websocket-version" in names:
            code, cause = 426, "version"
            responseHeaders = [("Sec-WebSocket-Version", str(WS_VERSION))]
        if not self._denied:
            self.factory.refused(self._peer(), cause, reason)
        super().failHandshake(reason, code, responseHeaders)

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if self.state == self.STATE_CONNECTING:
            timeout = self.factory.mqtt.broker.limits.connect_timeout
            self.factory.refused(self._peer(), "handshake_timeout",
                                 f"no WebSocket handshake within {timeout:g}s")
            self.transport.abortConnection()

    def _peer(self) -> str:
        peer = self.transport.getPeer()
        return f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    # -- open: the MQTT protocol on top ------------------------------------------------

    def onOpen(self) -> None:
        self._cancel_handshake_timer()
        # Its place under --max-connections (and its rate token) passes to the MQTT
        # connection, admitted in its connectionMade, which finds the place free:
        # never counted twice.
        self._release(opened=True)
        try:
            mqtt = self.factory.mqtt.buildProtocol(self.transport.getPeer())
            self.mqtt = mqtt
            mqtt.makeConnection(StreamOverWebSocket(self))
        except Exception:
            # (neither counted nor timed any longer: not left open)
            self.transport.abortConnection()
            self.factory.hand_over_failed(self._peer(), Failure())

    def onMessageBegin(self, isBinary: bool) -> None:
        if not isBinary and not self._ignoring:
            self._ignoring = True
            reason = "MQTT over WebSocket takes binary frames only; got a text frame"
            self._closing_reason = reason
            self.factory.refused(self._peer(), "text_frame", reason, open_=True)
            # sendClose() accepts only codes 1000 and 3000-4999; 1003 says it exactly.
            self.sendCloseFrame(code=CLOSE_UNSUPPORTED_DATA,
                                reasonUtf8=reason.encode("utf-8"), isReply=False)

    def onMessageFrameBegin(self, length: int) -> None:
        """The MQTT decoder bounds each packet; a frame is bounded here, at its
        header, before any of its payload is read."""
        limit = MAX_FRAME_PACKETS * self.factory.mqtt.broker.limits.max_packet_size
        if length > limit and not self._ignoring:
            reason = (f"a WebSocket frame of {length} bytes (at most {limit}: "
                      f"{MAX_FRAME_PACKETS} x --max-packet-size)")
            self.factory.mqtt.meter.limit_hit("ws_frame_size")
            self._end(CLOSE_TOO_BIG, "frame_size", reason)

    def _fail_connection(self, code: int = 1001, reason: str = "going away") -> None:
        """What autobahn finds wrong in what the peer sent (a protocol violation, an
        invalid payload) ends the connection now: one log line, the close frame
        saying why, then the socket closes. (autobahn would wait for the peer's
        close reply meanwhile, reading and dropping whatever it sends: up to the
        2^63 bytes a frame header may announce.)"""
        if self._ignoring or self.state == self.STATE_CLOSED:
            super()._fail_connection(code, reason)
            return
        self._end(code, "protocol_error", f"WebSocket protocol error: {reason}")

    def _end(self, code: int, cause: str, reason: str) -> None:
        """Close for what the peer sent: counted, logged (one line per cause a
        minute), the close frame with ``code`` and ``reason``, and the socket
        closed once it is written; nothing more is read or fed to MQTT."""
        self._ignoring = True
        self._closing_reason = reason
        self.factory.refused(self._peer(), cause, reason, open_=True)
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code=code, reasonUtf8=reason.encode("utf-8")[:123],
                                isReply=False)
        self.failedByMe = True
        self.dropConnection(abort=False)

    def onMessageFrameData(self, payload: bytes) -> None:
        mqtt = self.mqtt
        if mqtt is not None and not self._ignoring and payload:
            mqtt.dataReceived(payload)

    def onMessageFrameEnd(self) -> None:
        pass

    def onMessageEnd(self) -> None:
        pass

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        mqtt, self.mqtt = self.mqtt, None
        if mqtt is None:
            return   # never opened: no MQTT connection to end
        if self._closing_reason is not None:
            why: Failure = Failure(ConnectionLost(self._closing_reason))
        elif wasClean:
            why = Failure(ConnectionDone(f"WebSocket closed (code {code})"))
        else:
            why = Failure(ConnectionLost(self.wasNotCleanReason or "WebSocket lost"))
        mqtt.connectionLost(why)


class MQTTWebSocketFactory(WebSocketServerFactory):
    """One per broker: builds an ``MQTTWebSocketProtocol`` per socket, and an
    ``MQTTProtocol`` from ``mqtt`` (the TCP listener's factory, so connection
    counts, limits and the list of live connections are shared) per open
    WebSocket.  A socket is counted under --max-connections from its accept
    (``slots``: ``UpgradeSlots``, or in gateway mode the MQTT side's own)."""

    protocol = MQTTWebSocketProtocol  # type: ignore[assignment]
    log = QuietLog()

    def __init__(self, mqtt: MQTTFactory, clock: Clock, origins: OriginRule,
                 reactor: Any = None) -> None:
        # server=None: no Server header (autobahn's would name itself and its version).
        super().__init__(protocols=list(SUBPROTOCOLS),  # type: ignore[no-untyped-call]
                         server=None, reactor=reactor)
        self.mqtt = mqtt
        self.clock = clock
        self.origins = origins
        self.noisy = False
        self._log = Logger()
        self._log_limit = LogLimiter(clock.seconds)
        self.slots: Upgrading | None = (UpgradeSlots(mqtt) if isinstance(mqtt, MQTTFactory)
                                        else getattr(mqtt, "slots", None))
        self.setProtocolOptions(  # type: ignore[no-untyped-call]
            openHandshakeTimeout=0,   # MQTTWebSocketProtocol times it on ``clock``
            # The MQTT decoder bounds packets; frames and messages may carry many.
            maxFramePayloadSize=0, maxMessagePayloadSize=0,
            # Not compressed: nothing to inflate, and MQTT payloads are often so.
            perMessageCompressionAccept=lambda offers: None,
            versions=[WS_VERSION],
            failByDrop=False,
            # A plain HTTP GET gets 426, not autobahn's page naming its version.
            webStatus=False,
            autoPingInterval=0)

    def buildProtocol(self, addr: Any) -> Any:
        """A socket beyond --max-connections is closed at its accept (``UpgradeSlots``),
        as an MQTT socket over it is (under TLS too), nothing of it read or held."""
        slots = self.slots
        if slots is not None and not slots.admit(
                f"{getattr(addr, 'host', '?')}:{getattr(addr, 'port', '?')}"):
            return RefusedAtAccept()
        return super().buildProtocol(addr)

    def hand_over_failed(self, peer: str, failure: Failure) -> None:
        """Building a WebSocket's MQTT connection at the end of its upgrade raised (a
        fault, not the peer's): its socket was closed; one line a minute, with the
        traceback."""
        held = self._log_limit.allow("ws_hand_over")
        if held is not None:
            self._log.failure("the MQTT connection of a WebSocket from {peer} could not "
                              "be built; closed ({n} more since the last such line)",
                              failure, peer=peer, n=held)

    def refused(self, peer: str, cause: str, reason: str, open_: bool = False) -> None:
        """One line per cause a minute for a WebSocket peer refused in its handshake
        (counted as a refused connection) or, ``open_``, closed for what it sent
        outside MQTT (counted as a protocol error)."""
        meter = self.mqtt.meter
        if open_:
            meter.protocol_error()
        else:
            meter.refused()
        held = self._log_limit.allow("ws_" + cause)
        if held is not None:
            more = f" ({held} more for this cause since the last line)" if held else ""
            self._log.warn("{what} MQTT over WebSocket from {peer}: {reason}{more}",
                           what="closing" if open_ else "refusing",
                           peer=peer, reason=reason, more=more)
