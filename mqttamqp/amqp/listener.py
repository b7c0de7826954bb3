"""The AMQP 1.0 listener: one ``AMQPConnection`` per socket, and what the
connections of a listener share (``AMQPFactory``).

What it owns: the connection's states (handshake → authenticating → opening →
open → closed), the SASL layer in front of the engine (``sasl`` decides, this
module carries out its steps: passwords are checked off the reactor thread by
the authenticator, a TLS client certificate may stand for a user with SASL
EXTERNAL), the peer's open (bans, identity, registration with the broker), the
console's view of the connection and its close, and the one place where an
unexpected exception or a string that is not valid UTF-8 closes the connection.

The connection is built in three layers, one concern each: ``pump.EnginePump``
(the proton engine under Twisted: bytes, events, timers, back-pressure),
``endpoints.SessionsAndLinks`` (sessions and links as the peer opens and closes
them, their bounds, and the end of a connection reaching its links) and
``AMQPConnection`` here.

An exception raised while handling the peer's input is logged and closes this
connection only (``amqp:internal-error``); it never reaches Twisted.  A string the
peer sent that is not valid UTF-8 is the peer's error, not ours: proton's classes
raise ``UnicodeDecodeError`` when one is read, and wherever that happens while
handling the peer's frames the connection is closed with ``amqp:decode-error`` and
one line a minute is logged for that cause (``_undecodable``); error conditions
are read through ``net.rawproton.describe``, which escapes such bytes instead.

What it must not do: decode message bodies (``codec``), hold routing rules (the
core), or block the reactor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sized
from typing import Any, ClassVar

from proton import Event, SymbolList
from proton import symbol as amqp_symbol
from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.meter import DeliveryMeter
from mqttamqp.amqp.attach import REFUSALS_LOGGED
from mqttamqp.amqp.endpoints import SessionsAndLinks
from mqttamqp.amqp.inspect import amqp_details
from mqttamqp.amqp.links import BrokerLink, ControlOutlet
from mqttamqp.amqp.pump import ConnectionState
from mqttamqp.amqp.sasl import (
    Authenticate,
    Refuse,
    SaslServer,
    SaslState,
    SaslStep,
    SendBytes,
    StartAmqp,
)
from mqttamqp.amqp.services import WillServiceLink
from mqttamqp.amqp.subscribers import SessionOutlet
from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clients.connections import ConnectionInfo, EventFields
from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import (
    CAUSE_CLEAN,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LIMIT,
    CAUSE_LOST,
    CAUSE_PROTOCOL_ERROR,
)
from mqttamqp.net.sending import plain_tcp
from mqttamqp.net.tls import verified_common_name

__all__ = ["AMQPFactory", "AMQPConnection", "DEFAULT_IDLE_TIMEOUT"]

DEFAULT_IDLE_TIMEOUT = 60.0
CONTAINER_ID = "mqttamqp"

# (an Enum member read from its class runs the metaclass's __getattr__ hook on
# Python 3.11: these are read per socket read)
_OPEN, _OPENING, _CLOSED = ConnectionState.OPEN, ConnectionState.OPENING, ConnectionState.CLOSED


class AMQPConnection(SessionsAndLinks):
    """One AMQP connection: its states, SASL, its open and the console's view."""

    def __init__(self, factory: AMQPFactory) -> None:
        super().__init__(factory.broker, factory.clock, factory.idle_timeout, factory.meter,
                         factory, next(factory.serials))
        self.factory = factory
        self.key = f"amqp:{self.serial}"
        self.username: str | None = None
        self.cert_user: str | None = None     # --tls-cert-as-user: its certificate's CN
        self.connected_since = 0.0
        self.sasl = SaslServer(factory.mechanisms(), factory.anonymous_allowed())
        self._handshake_timer: DelayedCall | None = None
        self._closed_by_broker = False      # close(): the console (or a takeover) ended it

    # -- Twisted ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        if not self.broker.gate.admit("AMQP", self.peer, len(self.factory.connections)
                                      + len(self.factory.port_sharers)):
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
                self._release_all_sessions()
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

    # -- the peer's open ----------------------------------------------------------------

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

    _handlers: ClassVar[dict[int, Callable[[Any, Any], None]]] = {
        **SessionsAndLinks._handlers,
        Event.CONNECTION_REMOTE_OPEN.number: _on_connection_remote_open,
    }

    # -- closing ------------------------------------------------------------------------

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
        timer, self._handshake_timer = self._handshake_timer, None
        if timer is not None and timer.active():
            timer.cancel()
        super()._cancel_timers()


_log = Logger()


class AMQPFactory(Factory):
    """Builds one ``AMQPConnection`` per socket; holds what connections share."""

    def __init__(self, broker: Broker, clock: Clock, idle_timeout: float | None = None
                 ) -> None:
        self.broker = broker
        self.clock = clock
        self.idle_timeout = idle_timeout if idle_timeout is not None else DEFAULT_IDLE_TIMEOUT
        self.connections: set[AMQPConnection] = set()
        self.control_outlets: dict[str, list[ControlOutlet]] = {}
        self.will_links: dict[str, BrokerLink] = {}
        self.serials = itertools.count(1)
        self.meter = DeliveryMeter(broker.stats)   # shared by its connections and links
        self.noisy = False
        self.cert_as_user = False   # --tls-cert-as-user: offer SASL EXTERNAL
        # The AMQP 0.9.1 connections on the same port: --max-connections counts both.
        self.port_sharers: Sized = ()
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

