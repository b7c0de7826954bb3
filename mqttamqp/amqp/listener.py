"""The AMQP 1.0 listener: a Twisted protocol pumping a python-qpid-proton engine.

What it owns: one ``AMQPConnection`` per socket with its states (handshake →
authenticating → opening → open → closed), the SASL layer in front of the engine
(``sasl``), the pump (bytes into ``Transport.push``, events out of the
``Collector``, bytes out of ``Transport.peek``/``pop``, ``tick`` scheduled on the
injected clock and re-armed only when the deadline moves earlier), attaching
links to what their address means (``links``, ``services``), back-pressure (a
push producer for its socket), the console's view of the connection and its
close, and the one place where the end of a connection ends its links — as a
brute disconnect (wills fire) unless the peer closed cleanly.

Proton's own reactor is not used.  Every buffer proton hands out is copied.  An
exception raised while handling the peer's input is logged and closes this
connection only (``amqp:internal-error``); it never reaches Twisted.  A string the
peer sent that is not valid UTF-8 is the peer's error, not ours: proton's classes
raise ``UnicodeDecodeError`` when one is read, and wherever that happens while
handling the peer's frames the connection is closed with ``amqp:decode-error`` and
one line a minute is logged for that cause (``_undecodable``); error conditions
are read through ``net.rawproton.describe``, which escapes such bytes instead.

Links are bounded per connection (``--amqp-max-links``: beyond, the connection is
closed) and in all (``--amqp-max-links-total``: beyond, the attach is refused with
``amqp:resource-limit-exceeded``, one log line per episode).  Both count every link
proton holds, refused ones too, until the peer detaches it; a link closed at both
ends is freed (proton would keep it until the connection ends).

What it must not do: decode message bodies (``codec``), hold routing rules (the
core), or block the reactor (passwords are checked off the reactor thread by the
authenticator).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

from proton import (
    Collector,
    Condition,
    Connection,
    Endpoint,
    Event,
    Link,
    SymbolList,
    Transport,
)
from proton import symbol as amqp_symbol
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp.attach import REFUSALS_LOGGED, RESOURCE_LIMIT, attach, refuse_link
from mqttamqp.amqp.inspect import amqp_details
from mqttamqp.amqp.links import (
    BrokerLink,
    ControlOutlet,
    IncomingLink,
    OutgoingLink,
    SessionOutlet,
)
from mqttamqp.amqp.sasl import (
    Authenticate,
    Refuse,
    SaslServer,
    SaslState,
    SaslStep,
    SendBytes,
    StartAmqp,
)
from mqttamqp.amqp.services import (
    SessionRequests,
    WillServiceLink,
)
from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.clientdebug import MAX_DEBUG_LINES, LineBudget
from mqttamqp.core.clients.connections import ConnectionInfo, EventFields
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LIMIT,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
)
from mqttamqp.net.rawproton import (
    EV_LINK_FLOW,
    EV_TRANSPORT,
    delivery_link,
    describe,
    event_delivery,
    event_link,
    event_type,
    free_link,
    lib,
    next_event,
    output,
    pop_event,
    tick,
)
from mqttamqp.net.tcp import plain_tcp, send
from mqttamqp.net.tls import verified_common_name

__all__ = ["AMQPFactory", "AMQPConnection", "ConnectionState", "DEFAULT_IDLE_TIMEOUT",
           "refusal_margin"]

DEFAULT_IDLE_TIMEOUT = 60.0
CONTAINER_ID = "mqttamqp"

_E = Event


class ConnectionState(Enum):
    HANDSHAKE = "handshake"            # protocol header and SASL
    AUTHENTICATING = "authenticating"  # credentials are being checked; reading paused
    OPENING = "opening"                # engine running, waiting for the peer's open
    OPEN = "open"
    CLOSED = "closed"                  # closing or closed; input is ignored


# (an Enum member read from its class runs the metaclass's __getattr__ hook on
# Python 3.11: these are read per socket read)
_OPEN, _OPENING, _CLOSED = ConnectionState.OPEN, ConnectionState.OPENING, ConnectionState.CLOSED
_LINK_REMOTE_DETACH: int = _E.LINK_REMOTE_DETACH.number


@implementer(IPushProducer)
class AMQPConnection(Protocol):
    log = Logger()
    transport: Any

    def __init__(self, factory: AMQPFactory) -> None:
        self.factory = factory
        self.broker: Broker = factory.broker
        self.clock: Clock = factory.clock
        self.meter: DeliveryMeter = factory.meter
        self.limits: Limits = factory.broker.limits
        self.serial = next(factory.serials)
        self.key = f"amqp:{self.serial}"
        self.state = ConnectionState.HANDSHAKE
        self.peer = "?"
        self.container_id = ""
        self.username: str | None = None
        self.cert_user: str | None = None     # --tls-cert-as-user: its certificate's CN
        self.held_bytes = 0     # unfinished incoming messages (--amqp-max-held-bytes)
        self.identity = Identity("")
        self.connected_since = 0.0
        # Console counters: bytes per socket read/write; messages are the links'
        # own counts, plus those of links already gone (``forget_link``).
        self.bytes_in = self.bytes_out = 0
        self.last_activity = 0.0
        self._gone_in = self._gone_out = 0
        self.requests = SessionRequests(self)
        self.links: dict[Any, BrokerLink] = {}
        self.sasl = SaslServer(factory.mechanisms(), factory.anonymous_allowed())
        self.pconn: Any = None
        self.ptrans: Any = None
        self.collector: Any = None
        # The socket's buffer is full (IPushProducer): links count what they add.
        self.write_blocked = False
        self._pumping = False
        self._flush_call: DelayedCall | None = None
        self._flush_pending = False      # registered to run when the batch ends
        self._after: list[Callable[[], None]] = []
        self._timer: DelayedCall | None = None
        self._timer_deadline = 0.0
        self._handshake_timer: DelayedCall | None = None
        self._peer_closed = False           # the peer sent close (a clean end unless error)
        self._lost_reason = ""
        self._closed_by_broker = False      # close(): the console (or a takeover) ended it
        self._closing = False
        # Links the peer attached and has not detached (any kind, refused ones too:
        # proton keeps each until then); counted, not listed (a count costs nothing
        # per link).  The factory keeps the total of all connections.
        self.links_held = 0
        # Links and sessions closed at both ends, freed once this pump's output is out.
        self._free_links: list[Any] = []
        self._free_sessions: list[Any] = []
        # The connection's publish budget (None: not limited), shared by its senders.
        self.publish_rate = self.broker.gate.publish_rate()
        self._debug_timer: DelayedCall | None = None   # frames logged until it fires

    # -- Twisted ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        if not self.broker.gate.admit("AMQP", self.peer, len(self.factory.connections)):
            self.state = ConnectionState.CLOSED
            self.transport.abortConnection()
            return
        # Without SASL a peer is anonymous: allowed only where anonymous clients are.
        anonymous = self.factory.anonymous_allowed(self.peer)
        self.sasl = SaslServer(["PLAIN", "ANONYMOUS"] if anonymous else ["PLAIN"], anonymous)
        self.factory.connections.add(self)
        if plain_tcp(self.transport):
            # Output goes out once per pump, at once (``_write``): without this,
            # Nagle's algorithm holds a second small write until the peer's
            # (possibly delayed) ACK.
            self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)
        self._handshake_timer = self.clock.callLater(
            self.limits.connect_timeout, self._handshake_timed_out)

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state is _OPEN or state is _OPENING:
            self._engine_input(data)
            return
        if state is _CLOSED:
            return
        self.meter.received_bytes(len(data))
        self.bytes_in += len(data)
        if self.sasl.state is SaslState.HEADER and self.factory.cert_as_user:
            self._offer_external()
        self._sasl_steps(self.sasl.feed(data))

    def _offer_external(self) -> None:
        """--tls-cert-as-user: a client whose verified TLS certificate names a user
        is offered SASL EXTERNAL (first), as that user.  Asked when its first bytes
        arrive: the TLS handshake is over by then."""
        if self.cert_user is None:
            self.cert_user = verified_common_name(self.transport)
            if self.cert_user is not None and "EXTERNAL" not in self.sasl.mechanisms:
                self.sasl.mechanisms = ("EXTERNAL", *self.sasl.mechanisms)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.connections.discard(self)
        self.state = ConnectionState.CLOSED
        self._hold_links(-self.links_held)
        self._free_links.clear()
        self._free_sessions.clear()    # (the engine frees them with the connection)
        self._cancel_timers()
        why = self._lost_reason or ("connection lost: " + (
            reason.getErrorMessage() if reason is not None else "unknown"))
        cause = self._end_cause()
        if cause == CAUSE_PROTOCOL_ERROR:
            # One cause, one count: every connection closed for a protocol error
            # (also one that never opened, which is no disconnect) is counted here.
            self.meter.protocol_error()
        self.broker.unregister_connection(self.key, self, cause, why)
        self._end_links(brute=not self._peer_closed, reason=why)
        ptrans = self.ptrans
        if ptrans is not None:
            try:
                ptrans.close_tail()
                ptrans.close_head()
                while self.collector.peek() is not None:
                    self.collector.pop()
                ptrans.unbind()
            except Exception:
                pass  # the engine may already be closed
        self.ptrans = self.pconn = self.collector = None

    def _end_cause(self) -> str:
        """Why the connection ended, as the archive records it."""
        if self._peer_closed:
            return CAUSE_CLEAN
        why = self._lost_reason
        if why.startswith("idle time-out"):
            return CAUSE_KEEPALIVE
        if why.startswith(("transport error", "protocol error", "internal error")):
            return CAUSE_PROTOCOL_ERROR
        if why.startswith("too many"):
            return CAUSE_LIMIT
        if self._closed_by_broker:
            return CAUSE_CONSOLE   # close() from the console
        return CAUSE_LOST

    # IPushProducer: the transport's write buffer is full / drained.
    def pauseProducing(self) -> None:
        self.write_blocked = True
        self._blocked_changed()

    def resumeProducing(self) -> None:
        self.write_blocked = False
        self._blocked_changed()
        if self.state is not ConnectionState.OPEN:
            return
        try:
            for link in list(self.links.values()):
                if isinstance(link, OutgoingLink) and not link.closed:
                    link.on_writable()
        except Exception:
            self._internal_error(Failure())
            return
        self.schedule_flush()

    def stopProducing(self) -> None:
        pass

    def _blocked_changed(self) -> None:
        for link in self.links.values():
            if isinstance(link, OutgoingLink):
                link.on_blocked()

    # -- LinkHost -----------------------------------------------------------------------

    def schedule_flush(self) -> None:
        """Output is pending: write it after the current work.  Inside a batch (any
        connection's socket read) that is when the batch ends, as for MQTT;
        otherwise on the next reactor turn."""
        if (self._pumping or self._flush_pending or self._flush_call is not None
                or self.pconn is None):
            return
        if self.broker.after_batch(self._flush):
            self._flush_pending = True
            return
        self._flush_call = self.clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        self._flush_pending = False
        if self.state is not _CLOSED and self.pconn is not None:
            self._pump()

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after the current batch of events (not re-entrantly)."""
        self._after.append(fn)
        self.schedule_flush()

    def forget_link(self, link: BrokerLink) -> None:
        if self.links.pop(link.impl, None) is not None:
            if link.role == "sender":
                self._gone_out += link.delivered
            else:
                self._gone_in += link.delivered

    def send_control(self, client_id: str, data: bytes) -> bool:
        outlets = self.factory.control_outlets.get(client_id)
        if not outlets:
            return False
        outlets[-1].send(data)
        return True

    def register_control(self, outlet: ControlOutlet) -> None:
        self.factory.control_outlets.setdefault(outlet.client_id, []).append(outlet)

    def unregister_control(self, outlet: ControlOutlet) -> None:
        outlets = self.factory.control_outlets.get(outlet.client_id)
        if outlets and outlet in outlets:
            outlets.remove(outlet)
            if not outlets:
                del self.factory.control_outlets[outlet.client_id]

    def claim_will(self, link: BrokerLink) -> None:
        self.factory.will_links[link.name] = link

    def release_will(self, link: BrokerLink) -> bool:
        if self.factory.will_links.get(link.name) is link:
            del self.factory.will_links[link.name]
            return True
        return False

    @property
    def refusal_log(self) -> LogLimiter:
        """Log lines of refused links, limited per condition (``attach``)."""
        log: LogLimiter = self.factory.refusal_log
        return log

    # -- console (InspectableConnection) ------------------------------------------------

    def event_fields(self) -> EventFields:
        return (self.container_id, self.peer, self.username, None,
                int(self.factory.idle_timeout))

    def info(self) -> ConnectionInfo:
        links = [link for link in self.links.values() if not link.closed]
        sessions = [link.client_id for link in links if isinstance(link, SessionOutlet)]
        wills = tuple(link.name for link in links if isinstance(link, WillServiceLink)
                      and link.name in self.broker.wills)
        details, link_infos = amqp_details(
            self.pconn, self.ptrans, self.container_id, self.sasl.mechanism,
            [(link.plink, link.info()) for link in links])
        return ConnectionInfo(
            key=self.key, client_id=self.container_id, protocol="amqp", remote=self.peer,
            user=self.username, connected_since=self.connected_since,
            keepalive=int(self.factory.idle_timeout), clean_session=None,
            session_id=sessions[0] if sessions else None, will_owners=wills,
            links=link_infos, amqp=details,
            messages_in=self._gone_in + sum(i.delivered for i in link_infos
                                            if i.role == "receiver"),
            messages_out=self._gone_out + sum(i.delivered for i in link_infos
                                              if i.role == "sender"),
            bytes_in=self.bytes_in, bytes_out=self.bytes_out,
            last_activity=self.last_activity)

    def close(self, reason: str) -> None:
        """Closed by the broker (console): a brute end for the links, wills fire."""
        if self.state is ConnectionState.CLOSED:
            return
        self._lost_reason = reason
        self._closed_by_broker = True
        self._end_links(brute=True, reason=reason)
        self._close_engine("amqp:connection:forced", reason)

    # -- SASL ---------------------------------------------------------------------------

    def _sasl_steps(self, steps: list[SaslStep]) -> None:
        for step in steps:
            if self.state is ConnectionState.CLOSED:
                return
            if isinstance(step, SendBytes):
                self._write(step.data)
            elif isinstance(step, Authenticate):
                self.state = ConnectionState.AUTHENTICATING
                self.transport.pauseProducing()
                if step.mechanism == "EXTERNAL":
                    d = self._external(step.username)
                else:
                    creds = Credentials("", step.username, step.password, "amqp",
                                        self.peer)
                    self.username = step.username
                    d = self.broker.gate.authenticate(creds)
                d.addCallback(self._authenticated)
                d.addErrback(self._authentication_failed)
            elif isinstance(step, Refuse):
                self.meter.refused()
                self.log.warn("refused AMQP connection from {peer}: {r}", peer=self.peer,
                              r=step.reason)
                self._write(step.data)
                self._drop()
            elif isinstance(step, StartAmqp):
                self._start_engine(step.data)

    def _external(self, authzid: str | None) -> Deferred[bool]:
        """SASL EXTERNAL: the certificate is the credential (the CA decides who gets
        in, as for MQTT); an authorization identity, if given, must be its user."""
        user = self.cert_user
        if user is not None and not user.isprintable():
            self.log.warn("AMQP client from {peer}: EXTERNAL refused, its certificate's "
                          "common name holds control characters", peer=self.peer)
            return succeed(False)
        if user is None or (authzid is not None and authzid != user):
            self.log.warn("AMQP client from {peer}: EXTERNAL as {a!r} refused, its "
                          "certificate names {u!r}", peer=self.peer, a=authzid, u=user)
            return succeed(False)
        self.username = user
        self.log.info("AMQP client from {peer} is user {u!r} by its TLS client certificate "
                      "(SASL EXTERNAL)", peer=self.peer, u=user)
        return succeed(True)

    def _authenticated(self, ok: bool) -> None:
        if self.state is not ConnectionState.AUTHENTICATING:
            return  # the socket went away meanwhile
        self.state = ConnectionState.HANDSHAKE
        steps = self.sasl.outcome(bool(ok))
        self.transport.resumeProducing()
        self._sasl_steps(steps)

    def _authentication_failed(self, failure: Failure) -> None:
        self.log.failure("checking AMQP credentials from {peer} failed", failure, peer=self.peer)
        self._authenticated(False)

    # -- the engine ---------------------------------------------------------------------

    def _start_engine(self, data: bytes) -> None:
        pconn = Connection()
        ptrans = Transport(Transport.SERVER)
        collector = Collector()
        pconn.collect(collector)
        ptrans.bind(pconn)
        ptrans.idle_timeout = self.factory.idle_timeout
        ptrans.max_frame_size = max(512, min(self.limits.max_packet_size + 1024, 1 << 20))
        # A session beyond this is a framing error: proton closes the connection.
        ptrans.channel_max = max(0, self.limits.amqp_max_sessions - 1)
        self.pconn, self.ptrans, self.collector = pconn, ptrans, collector
        self.state = ConnectionState.OPENING
        if data:
            self._engine_input(data)

    def _engine_input(self, data: bytes) -> None:
        ptrans = self.ptrans
        broker = self.broker
        self.meter.received_bytes(len(data))
        self.bytes_in += len(data)
        self.last_activity = self.clock.seconds()
        # Everything one socket read causes goes to the store as one batch (one
        # hand-off to the writer thread), as for MQTT.
        broker.begin_batch()
        try:
            # The engine takes at most 8 KiB at a time (its input buffer): all of a
            # read goes in before one pump, so that its answers leave in one write
            # (a write per 8 KiB woke the peer several times per read, and a woken
            # peer on a busy machine takes the CPU from the broker mid-read).
            while data:
                capacity = ptrans.capacity()
                if capacity < 0:
                    break  # input side closed: the rest is ignored
                if capacity == 0:
                    self._pump()   # (a frame larger than the buffer: make room)
                    if self.ptrans is None or ptrans.capacity() <= 0:
                        break
                    continue
                if capacity >= len(data):
                    ptrans.push(data)
                    break
                chunk, data = data[:capacity], data[capacity:]
                ptrans.push(chunk)
            self._pump()
        except Exception:
            self._internal_error(Failure())
        finally:
            broker.end_batch()

    def _pump(self) -> None:
        if self._pumping or self.ptrans is None:
            return
        self._pumping = True
        try:
            col = self.collector._impl
            links = self.links
            while True:
                while True:
                    event = next_event(col)
                    if not event:
                        break
                    try:
                        # The per-message path: raw pointers, no wrappers.  Only a
                        # delivery event has a delivery (one proton call, not two).
                        dlv = event_delivery(event)
                        if dlv:
                            link = links.get(delivery_link(dlv))
                            if link is None or link.closed:
                                self._orphan_delivery(dlv)
                            else:
                                link.on_delivery(dlv)
                        else:
                            self._on_event(event)
                    finally:
                        pop_event(col)
                    if self.ptrans is None:
                        return
                if self._after:
                    work, self._after = self._after, []
                    for fn in work:
                        fn()
                    continue
                self._tick()
                if not next_event(col) and not self._after:
                    break
            self._write_output()
            if self._free_links or self._free_sessions:
                self._free_closed()
        except UnicodeDecodeError as exc:
            self._pumping = False
            self._undecodable(f"a string that is not valid UTF-8 ({exc.reason} at byte "
                              f"{exc.start})")
        except Exception:
            self._pumping = False
            self._internal_error(Failure())
        finally:
            self._pumping = False

    def _free_closed(self) -> None:
        """Free the links and sessions closed at both ends (their last frames are
        written): proton keeps them until the connection ends otherwise.  Links
        first: freeing a session frees the links it still has."""
        links, self._free_links = self._free_links, []
        sessions, self._free_sessions = self._free_sessions, []
        if self.pconn is None:
            return
        for impl in links:
            free_link(impl)
        for impl in sessions:
            lib.pn_session_free(impl)

    def _on_event(self, event: Any) -> None:
        """Any event but a delivery's (``_pump``)."""
        etype = event_type(event)
        if etype == EV_LINK_FLOW:
            link = self.links.get(event_link(event))
            if link is not None and not link.closed:
                link.on_flow()
        elif etype != EV_TRANSPORT:
            handler = self._handlers.get(etype)
            if handler is not None:
                # (the raw event: ``Event.wrap`` makes a wrapper of the link, session,
                # connection and transport for every event, which a link's attach
                # need not pay for)
                handler(self, event)

    def _tick(self) -> None:
        now = self.clock.seconds()
        deadline = tick(self.ptrans._impl, now)
        if deadline <= 0:
            return
        timer = self._timer
        if timer is not None and timer.active() and self._timer_deadline <= deadline:
            return  # fires no later than needed; it re-arms then
        if timer is not None and timer.active():
            timer.cancel()
        self._timer_deadline = deadline
        self._timer = self.clock.callLater(max(0.0, deadline - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.state is not _CLOSED and self.ptrans is not None:
            self._pump()

    def _write_output(self) -> None:
        """All the engine's output in one write: it hands out at most its buffer
        (8 KiB) at a time, and each write can wake the peer."""
        impl = self.ptrans._impl
        chunks: list[bytes] = []
        for _ in range(100_000):   # (bounded: each round takes what the engine made)
            data = output(impl)
            if not data:
                break
            chunks.append(data)
        if chunks:
            self._write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if data is None:
            # The engine closed its output (close sent, or a transport error).
            self._drop()

    def _write(self, data: bytes) -> None:
        send(self.transport, data)   # (at once when nothing is buffered: ``net.tcp``)
        self.bytes_out += len(data)
        self.meter.sent_bytes(len(data))

    def _drop(self) -> None:
        """Close the socket once written (the engine is done or the peer refused)."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timers()
        self.transport.loseConnection()

    def _internal_error(self, failure: Failure) -> None:
        self.log.failure("internal error on the AMQP connection of {c} ({peer}); closing it",
                         failure, c=self.container_id or "?", peer=self.peer)
        self._lost_reason = "internal error"
        try:
            self._end_links(brute=True, reason="internal error")
            self._close_engine("amqp:internal-error", "internal error in the broker")
        except Exception:
            self.log.failure("while closing after an internal error", Failure())
            self.state = ConnectionState.CLOSED
            self.transport.abortConnection()

    def _undecodable(self, what: str) -> None:
        """The peer sent a string that is not valid UTF-8 where it must be (``what``
        says which, or where it was met): closed with ``amqp:decode-error``, counted
        as a protocol error, one log line a minute for this cause however many
        connections do it."""
        self._lost_reason = f"protocol error ({what})"
        self.state = ConnectionState.CLOSED    # (what the peer sent after it is ignored)
        held = self.factory.log_limit.allow("not UTF-8")
        if held is not None:
            self.log.info("AMQP connection of {c} ({peer}) sent {what}; closing it with "
                          "amqp:decode-error{more}", c=self.container_id or "?",
                          peer=self.peer, what=what,
                          more=f" ({held} more closed for this cause since the last such "
                          "line)" if held else "")
        try:
            self._end_links(brute=True, reason=self._lost_reason)
            self._close_engine("amqp:decode-error", f"{what}")
        except Exception:
            self._internal_error(Failure())

    def _close_engine(self, condition: str, description: str) -> None:
        pconn = self.pconn
        if pconn is not None and self.ptrans is not None:
            if not (pconn.state & Endpoint.LOCAL_CLOSED):
                if not (pconn.state & Endpoint.LOCAL_ACTIVE):
                    pconn.open()
                pconn.condition = Condition(condition, description)
                pconn.close()
            self._pump()
            if self.ptrans is not None:
                self._write_output()
        self.state = ConnectionState.CLOSED
        self._drop()

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if self.state is ConnectionState.OPEN or self.state is ConnectionState.CLOSED:
            return
        self.meter.refused()
        self.log.warn("AMQP connection from {peer} did not open within {t:g}s; closing",
                      peer=self.peer, t=self.limits.connect_timeout)
        self.state = ConnectionState.CLOSED
        self._drop()

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._handshake_timer, self._flush_call):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._handshake_timer = self._flush_call = None
        if self._debug_timer is not None:
            self.stop_debug()

    # -- per-client debug logging (the console's "Debug log") ----------------------

    def start_debug(self, until: float) -> None:
        """Log every AMQP frame in and out of this connection until ``until``, through
        proton's own frame trace (off, it costs nothing)."""
        ptrans = self.ptrans
        if ptrans is None:
            return
        if self._debug_timer is not None and self._debug_timer.active():
            self._debug_timer.cancel()
        else:
            log, c, peer = self.log, self.container_id, self.peer
            budget = LineBudget()

            def trace(_transport: Any, frame: str) -> None:
                if budget.take():
                    log.info("debug {c} ({peer}): {frame}", c=c, peer=peer,
                             frame=frame[:300])
                elif budget.left == -1:
                    log.info("debug {c} ({peer}): {n} lines logged, the most for one "
                             "window; no more", c=c, peer=peer, n=MAX_DEBUG_LINES)
            ptrans.tracer = trace
            ptrans.trace(Transport.TRACE_FRM)
            self.log.info("debug logging of {c} ({peer}) on for {s:.0f}s", c=c, peer=peer,
                          s=until - self.clock.seconds())
        self._debug_timer = self.clock.callLater(max(0.0, until - self.clock.seconds()),
                                                 self.stop_debug)

    def stop_debug(self) -> None:
        timer, self._debug_timer = self._debug_timer, None
        if timer is None:
            return
        if timer.active():
            timer.cancel()
        if self.ptrans is not None:
            self.ptrans.trace(Transport.TRACE_OFF)
        self.log.info("debug logging of {c} ({peer}) ended", c=self.container_id,
                      peer=self.peer)

    def _end_links(self, brute: bool, reason: str) -> None:
        """The one place where a connection's end reaches its links (and wills)."""
        links = list(self.links.values())
        self.links.clear()
        # Receivers first (nothing more goes into a closing connection), will links last.
        links.sort(key=lambda link: (isinstance(link, IncomingLink),
                                     isinstance(link, WillServiceLink)))
        for link in links:
            try:
                link.end(brute, reason)
            except Exception:
                self.log.failure("ending link {n}", Failure(), n=link.name)
        self.requests.ended()

    # -- events -------------------------------------------------------------------------

    def _on_connection_remote_open(self, event: Any) -> None:
        pconn = self.pconn
        try:
            self.container_id = pconn.remote_container or ""
        except UnicodeDecodeError:
            self._undecodable("a container id that is not valid UTF-8")
            return
        banned = self.broker.gate.banned("AMQP", self.container_id, self.username, self.peer)
        if banned is not None:       # counted and logged (rate-limited) by the broker
            self._lost_reason = "refused: " + banned
            self._close_engine("amqp:unauthorized-access", banned)
            return
        self.identity = Identity(self.container_id, self.username, "amqp")
        pconn.container = CONTAINER_ID
        pconn.offered_capabilities = SymbolList([amqp_symbol("ANONYMOUS-RELAY")])
        pconn.open()
        if self._handshake_timer is not None and self._handshake_timer.active():
            self._handshake_timer.cancel()
        self._handshake_timer = None
        self.state = ConnectionState.OPEN
        self.connected_since = self.clock.seconds()
        self.broker.register_connection(self.key, self, "amqp")
        self.log.info("AMQP connection from {peer} (container {c}, user {u})",
                      peer=self.peer, c=self.container_id or "?", u=self.username or "anonymous")
        debug_until = self.broker.client_debug.until(self.container_id)
        if debug_until is not None:
            self.start_debug(debug_until)

    def _on_connection_remote_close(self, event: Any) -> None:
        pconn = self.pconn
        condition = describe(lib.pn_connection_remote_condition(pconn._impl))
        self._peer_closed = condition is None
        reason = ("connection closed by the peer" if condition is None else
                  f"connection closed by the peer with {condition}")
        self._lost_reason = reason
        self._end_links(brute=condition is not None, reason=reason)
        if not (pconn.state & Endpoint.LOCAL_CLOSED):
            pconn.close()

    def _on_session_remote_open(self, event: Any) -> None:
        lib.pn_session_open(lib.pn_event_session(event))

    def _on_session_remote_close(self, event: Any) -> None:
        if self.state is _CLOSED:
            return   # (the connection's end ends everything)
        simpl = lib.pn_event_session(event)
        # Its links still attached are gone with it (those detached were counted
        # out; one detached without closing stays remotely active until freed).
        gone = 0
        active = Endpoint.REMOTE_ACTIVE
        freeing = self._free_links
        plink = lib.pn_link_head(self.pconn._impl, active)
        while plink:
            if lib.pn_link_session(plink) == simpl and plink not in freeing:
                gone += 1
            plink = lib.pn_link_next(plink, active)
        self._hold_links(-gone)
        condition = describe(lib.pn_session_remote_condition(simpl))
        reason = ("session ended by the peer" if condition is None else
                  f"session ended by the peer with {condition}")
        for impl, link in list(self.links.items()):
            if lib.pn_link_session(impl) == simpl:
                del self.links[impl]
                link.end(condition is not None, reason)
                if not (lib.pn_link_state(impl) & Endpoint.LOCAL_CLOSED):
                    lib.pn_link_close(impl)
        if not (lib.pn_session_state(simpl) & Endpoint.LOCAL_CLOSED):
            lib.pn_session_close(simpl)
        # (frees the links it still has, ours and refused ones)
        self._free_sessions.append(simpl)

    def _on_link_remote_open(self, event: Any) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        plink = Link.wrap(event_link(event))  # type: ignore[no-untyped-call]
        # Refused links count too: proton keeps each until the peer detaches it.
        self._hold_links(1)
        limits = self.limits
        if self.links_held > limits.amqp_max_links:
            self.meter.limit_hit("amqp_links")
            self.log.warn("AMQP connection of {c} ({peer}) attached more than {n} links "
                          "(--amqp-max-links); closing it", c=self.container_id or "?",
                          peer=self.peer, n=limits.amqp_max_links)
            self._too_many_links(f"more than {limits.amqp_max_links} links on one "
                                 "connection")
            return
        total = self.factory.links_held
        if total > limits.amqp_max_links_total:
            self.meter.limit_hit("amqp_links_total")
            self.factory.links_full()
            if total > refusal_margin(limits):
                # Refused links are held until their peers detach them (a
                # well-behaved peer does at once, even one that sent a burst of
                # attaches): past this margin this peer is closed, not refused.
                self._too_many_links(f"more than {limits.amqp_max_links_total} links "
                                     "attached in all, and refused ones not detached")
                return
            refuse_link(self, plink, RESOURCE_LIMIT,
                        f"more than {limits.amqp_max_links_total} links attached to this "
                        "broker in all (--amqp-max-links-total)", logged=False)
            return
        attach(self, plink)

    def _too_many_links(self, description: str) -> None:
        self._lost_reason = "too many links"
        self._end_links(brute=True, reason="too many links")
        self._close_engine(RESOURCE_LIMIT, description)

    def _hold_links(self, delta: int) -> None:
        """Links held by this connection changed by ``delta`` (and so the total)."""
        if delta:
            self.links_held += delta
            self.factory.hold_links(delta)

    def _on_link_remote_close(self, event: Any) -> None:
        if self.state is _CLOSED:
            return   # (the connection's end ends everything)
        impl = event_link(event)
        self._hold_links(-1)
        link = self.links.pop(impl, None)
        condition = describe(lib.pn_link_remote_condition(impl))
        if link is not None:
            reason = ("detached by the peer" if condition is None else
                      f"detached by the peer with {condition}")
            link.end(condition is not None, reason)
        if not (lib.pn_link_state(impl) & Endpoint.LOCAL_CLOSED):
            if event_type(event) == _LINK_REMOTE_DETACH:
                lib.pn_link_detach(impl)
            else:
                lib.pn_link_close(impl)
        # Closed (or detached) at both ends: a new attach of its name is a new link.
        self._free_links.append(impl)

    def _orphan_delivery(self, dlv: Any) -> None:
        """A delivery on a link we no longer serve: consume and settle it."""
        link = delivery_link(dlv)
        if (lib.pn_link_is_receiver(link) and lib.pn_delivery_readable(dlv)
                and not lib.pn_delivery_partial(dlv)):
            lib.pn_link_advance(link)
        lib.pn_delivery_settle(dlv)

    def hold(self, delta: int) -> None:
        self.held_bytes += delta
        limit = self.limits.amqp_max_held_bytes
        if delta > 0 and self.held_bytes > limit and self.state is not ConnectionState.CLOSED:
            self.meter.limit_hit("amqp_held_bytes")
            self.log.warn("AMQP connection of {c} ({peer}) has more than {n} bytes of "
                          "unfinished messages (--amqp-max-held-bytes); closing it",
                          c=self.container_id or "?", peer=self.peer, n=limit)
            self._lost_reason = "too many bytes held"
            self._end_links(brute=True, reason="too many bytes held")
            self._close_engine("amqp:resource-limit-exceeded",
                               f"more than {limit} bytes of unfinished messages on one "
                               "connection")

    def _on_transport_error(self, event: Any) -> None:
        # (proton's own text may quote the peer's bytes: "link name already
        # attached: <them>"; ``describe`` escapes what is not UTF-8)
        what = describe(lib.pn_transport_condition(self.ptrans._impl))
        if what is not None:
            # One line per connection: the disconnect's own (idle time-out), or
            # this one (a limit, a protocol error), never both.
            if what.startswith("amqp:resource-limit-exceeded"):
                self._lost_reason = f"idle time-out ({what.partition(': ')[2]})"
            elif "channel_max" in what:
                self.meter.limit_hit("amqp_sessions")
                self._lost_reason = (f"too many sessions (more than "
                                     f"{self.limits.amqp_max_sessions}, --amqp-max-sessions)")
                self.log.warn("AMQP connection of {c} ({peer}) began more than {n} sessions "
                              "(--amqp-max-sessions); closing it",
                              c=self.container_id or "?", peer=self.peer,
                              n=self.limits.amqp_max_sessions)
            else:
                self._lost_reason = f"transport error {what}"
                # (one line per error condition a minute: a peer that keeps sending
                # the same bad frames cannot flood the log)
                held = self.factory.log_limit.allow(transport_error_cause(what))
                if held is not None:
                    self.log.info("AMQP connection of {c} ({peer}): {what}; closing{more}",
                                  c=self.container_id or "?", peer=self.peer, what=what,
                                  more=f" ({held} more closed for this cause since the "
                                  "last such line)" if held else "")

    _handlers: ClassVar[dict[int, Callable[[AMQPConnection, Any], None]]] = {
        _E.CONNECTION_REMOTE_OPEN.number: _on_connection_remote_open,
        _E.CONNECTION_REMOTE_CLOSE.number: _on_connection_remote_close,
        _E.SESSION_REMOTE_OPEN.number: _on_session_remote_open,
        _E.SESSION_REMOTE_CLOSE.number: _on_session_remote_close,
        _E.LINK_REMOTE_OPEN.number: _on_link_remote_open,
        _E.LINK_REMOTE_CLOSE.number: _on_link_remote_close,
        _E.LINK_REMOTE_DETACH.number: _on_link_remote_close,
        _E.TRANSPORT_ERROR.number: _on_transport_error,
    }

_log = Logger()


def refusal_margin(limits: Limits) -> int:
    """The most links held in all, refused ones not yet detached by their peers
    included (``--amqp-max-links-total`` and half as much again, at least one
    connection's worth); an attach beyond closes its connection."""
    total = limits.amqp_max_links_total
    return total + max(limits.amqp_max_links, total // 2)


def transport_error_cause(what: str) -> str:
    """The log limiter's key for a transport error ``name: description``: its
    condition name (``amqp:invalid-field``), so that each kind keeps its own line."""
    return "transport error " + what.partition(": ")[0]


class AMQPFactory(Factory):
    """Builds one ``AMQPConnection`` per socket; holds what connections share."""

    def __init__(self, broker: Broker, clock: Clock, idle_timeout: float | None = None
                 ) -> None:
        self.broker = broker
        self.clock = clock
        self.meter = DeliveryMeter(broker.stats)   # shared by its connections and links
        self.idle_timeout = idle_timeout if idle_timeout is not None else DEFAULT_IDLE_TIMEOUT
        self.connections: set[AMQPConnection] = set()
        self.control_outlets: dict[str, list[ControlOutlet]] = {}
        self.will_links: dict[str, BrokerLink] = {}
        self.serials = itertools.count(1)
        self.noisy = False
        self.cert_as_user = False   # --tls-cert-as-user: offer SASL EXTERNAL
        self.log_limit = LogLimiter(clock.seconds)   # log lines per cause a minute
        self.refusal_log = LogLimiter(clock.seconds, burst=REFUSALS_LOGGED)  # (attach)
        # Links held by every connection (--amqp-max-links-total), and whether the
        # bound was reached in this episode (one log line each; it ends when the
        # total is back under nine tenths of the bound).
        self.links_held = 0
        self._links_full = False

    def hold_links(self, delta: int) -> None:
        self.links_held += delta
        self.meter.links_attached(self.links_held)
        if (self._links_full and self.links_held
                < self.broker.limits.amqp_max_links_total * 0.9):
            self._links_full = False

    def links_full(self) -> None:
        """An attach found every link of ``--amqp-max-links-total`` in use."""
        if self._links_full:
            return
        self._links_full = True
        limit = self.broker.limits.amqp_max_links_total
        _log.warn("AMQP links attached in all reached {n} (--amqp-max-links-total): "
                  "further attaches are refused with amqp:resource-limit-exceeded until "
                  "links are detached (refusals counted in $SYS/broker/limits/"
                  "amqp_links_total)", n=limit)

    def anonymous_allowed(self, peer: str | None = None) -> bool:
        """ANONYMOUS is offered only while the broker accepts anonymous clients (from
        ``peer``, if given: without client users, only loopback peers unless
        ``--allow-anonymous``); the authenticator decides."""
        authenticator = self.broker.authenticator
        if not getattr(authenticator, "allows_anonymous", True):
            return False
        anonymous_from = getattr(authenticator, "anonymous_from", None)
        return peer is None or anonymous_from is None or bool(anonymous_from(peer))

    def mechanisms(self) -> list[str]:
        return ["PLAIN", "ANONYMOUS"] if self.anonymous_allowed() else ["PLAIN"]

    def buildProtocol(self, addr: Any) -> AMQPConnection:
        return AMQPConnection(self)

