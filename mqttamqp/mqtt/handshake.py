"""Accepting an MQTT connection: from CONNECT (and an MQTT 5 AUTH exchange) to CONNACK,
or to the refusal.

``ConnectHandshake`` is the part of ``protocol.MQTTProtocol`` that calls the decisions
of CONNECT and AUTH (``decisions.connect``, ``auth``, ``auth_answer``, ``accepted``)
and hands their actions to the executor (``executor.ActionExecutor``: a ``Refuse`` is
the one refusing CONNACK, an ``Arm`` the connect deadline). On the accepted path two
go without an action object (a connect storm's calls): CONNACK is sent at once when
nothing waits behind it (``_send_now``; else it joins the batch's output), and the
keepalive deadline (0 is none) is armed by the executor's ``_arm_keepalive``. Between
them, as thin steps, the calls whose answers feed the next decision: the TLS
certificate as the user, bans, authentication (at once, in the thread pool, or the
AUTH exchange of an MQTT 5 method; re-authentication too), the session's open and its
commit. The running connection (reading, writing, timers, the other packets) is
``protocol``'s. The connection's own state it uses is declared below (the protocol's
slots).
"""

from __future__ import annotations

from dataclasses import replace

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.core.auth import Credentials, Identity
from mqttamqp.core.commits import write_failed
from mqttamqp.core.message import WillMessage
from mqttamqp.core.sessions.session import Session
from mqttamqp.mqtt import decisions
from mqttamqp.mqtt.actions import Close, Refuse, Send
from mqttamqp.mqtt.connection import ConnectionState
from mqttamqp.mqtt.decisions import Connecting
from mqttamqp.mqtt.flows import ConnectedFlows
from mqttamqp.mqtt.link import CoreLink, ListenerState
from mqttamqp.mqtt.packets import (
    Auth,
    ConnackCode,
    Connect,
    Properties,
)
from mqttamqp.mqtt.v5 import message_properties, negotiate
from mqttamqp.native import NO_SLOTS, mypyc_attr
from mqttamqp.net.sending import send
from mqttamqp.net.tls import verified_common_name
from mqttamqp.security.enhanced_auth import CONTINUE, AuthExchange, AuthStep

__all__ = ["AuthInProgress", "ConnectHandshake"]

_CONNECTED = ConnectionState.CONNECTED


def _no_methods(method: str) -> AuthExchange | None:
    """No MQTT 5 enhanced authentication method is offered (0x8C)."""
    return None


class AuthInProgress:
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


@mypyc_attr(allow_interpreted_subclasses=True)
class ConnectHandshake(ConnectedFlows):
    """CONNECT to CONNACK, for ``protocol.MQTTProtocol`` (a base class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    @property
    def _auth(self) -> AuthInProgress | None:
        """An MQTT 5 AUTH exchange under way (kept by ``_v5``: only an MQTT 5
        connection has one, so it is no slot of every connection's)."""
        v5 = self._v5
        return None if v5 is None else v5.auth   # type: ignore[return-value]

    @_auth.setter
    def _auth(self, value: AuthInProgress | None) -> None:
        v5 = self._v5
        if v5 is not None:
            v5.auth = value
        elif value is not None:
            raise AssertionError("an AUTH exchange without MQTT 5")

    @property
    def bridge_peer(self) -> bool:
        """The client set Mosquitto's bridge flag in CONNECT (the factory keeps the
        few that did: no slot of every connection)."""
        return self in self._factory.bridge_peers

    @bridge_peer.setter
    def bridge_peer(self, value: bool) -> None:
        if value:
            self._factory.bridge_peers.add(self)
        else:
            self._factory.bridge_peers.discard(self)

    def _on_connect(self, packet: Connect) -> None:
        if self._connect_timer is not None:   # (armed only if CONNECT took a turn)
            self._stop_connect_timer()
        factory: ListenerState = self.factory   # (not ``_factory``: a call less)
        enhanced = factory.enhanced_auth
        decided = decisions.connect(packet, self.limits, self.strings,
                                    _no_methods if enhanced is None else enhanced.start)
        if type(decided) is Refuse:
            self._carry_out(decided)
            return
        assert isinstance(decided, Connecting)
        decoder = self.decoder
        if decoder.protocol_level != decided.level:   # (3.1.1's is the one lent)
            decoder.protocol_level = decided.level
        self.version = decided.version
        self._v5 = decided.v5
        failure = decided.failure
        if failure is not None:
            self._carry_out(failure)
            return
        client_id = decided.client_id
        assigned = decided.assigned
        exchange = decided.exchange
        self.client_id = client_id
        self.username = packet.username
        # --tls-cert-as-user: a verified client certificate names the user and is
        # the credential (no password, the authenticator is not asked).
        cert_user = verified_common_name(self.transport) if factory.cert_as_user else None
        if cert_user is not None:
            problem = self.strings.text(cert_user, "client certificate common name")
            if problem is not None:
                self._carry_out(Refuse(ConnackCode.NOT_AUTHORIZED, problem))
                return
            self.username = cert_user
            self.log.info("{c} ({peer}) is user {u!r} by its TLS client certificate",
                          c=client_id, peer=self.peer, u=cert_user)
        peer = self.peer     # (made when read: once here)
        banned = self.broker.gate.banned("MQTT", client_id, self.username, peer)
        if banned is not None:       # counted and logged (rate-limited) by the broker
            self._carry_out(decisions.banned(banned, self._v5))
            return
        self.keepalive = packet.keepalive
        self.clean_session = packet.clean_session
        if packet.bridge:   # (kept by the factory for the few that set it)
            self.bridge_peer = True
        if exchange is not None and cert_user is None:
            # MQTT 5 enhanced authentication: AUTH packets until the method says
            # yes or no, bounded by the connect timeout.
            assert self._v5 is not None and self._v5.auth_method is not None
            self._auth = AuthInProgress(exchange, self._v5.auth_method, packet, assigned)
            self.advance("authenticate")
            self._carry_out(decisions.authenticating(self.limits))
            props = packet.properties
            self._auth_answer(exchange.step(props.authentication_data if props else None))
            return
        self.advance("connect")
        ok: bool | Deferred[bool] = True
        if cert_user is None:
            creds = Credentials(client_id, packet.username, packet.password, "mqtt", peer)
            ok = self.broker.gate.authenticate_now(creds)
        # (``type`` first: Deferred's isinstance goes through ABCMeta, a Python call)
        if type(ok) is not bool and isinstance(ok, Deferred):
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

    def _identified(self) -> Identity:
        """Who the accepted client is (made at its first PUBLISH or SUBSCRIBE, and
        kept: 56 bytes an idle connection does not pay)."""
        identity = self.identity = Identity(self.client_id, self.username,
                                            self.protocol_label)
        return identity

    def _authenticated(self, ok: bool, packet: Connect, assigned: bool = False
                       ) -> Deferred[None] | None:
        if self.state is not ConnectionState.CONNECTING:
            return None  # the socket went away while we checked
        may_claim = False
        identity = None
        if ok:
            # (not kept: an idle client that never publishes nor subscribes does not
            # need one; ``_identified`` makes the connection's at the first)
            identity = Identity(self.client_id, self.username, self.protocol_label)
            may_claim = self.broker.gate.may_claim(identity, self.client_id)
        if not may_claim:   # (``may_claim`` is False whenever ``ok`` is)
            refused = decisions.authenticated(ok, packet, may_claim)
            assert refused is not None
            self._carry_out(refused)
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
            auth = self._auth    # (the exchange's, before ``_v5`` is replaced)
            self._v5, connack_props = negotiate(packet, self.limits, self.client_id, assigned)
            self.keepalive = self._v5.keepalive
            expiry = float(self._v5.session_expiry)
            if auth is not None:    # the method's final data goes in CONNACK
                connack_props = replace(connack_props, authentication_method=auth.method,
                                        authentication_data=auth.final)
        # In the turn that read CONNECT (not after a password check or a commit),
        # the time it was read is now: the session's ``last_seen`` and the
        # connection's ``connected_since`` share that float (48 bytes an idle
        # connection does not hold).
        now = self._last_activity if self._in_process else None
        link: CoreLink = self   # type: ignore[assignment]   # (``_link``, a call less)
        opened = self.broker.open_session(
            link, self.client_id, packet.clean_session, will, identity, expiry, now)
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
        self.advance("accepted")
        # (the time CONNECT was read, in the turn that read it: see ``_authenticated``)
        self.connected_since = (session.last_seen if self._in_process
                                and session.last_seen is self._last_activity
                                else self.clock.seconds())
        frame = decisions.accepted(present, self.version, self._v5, connack_props).frame
        if (self._out is None and not self.decoder.buffered and not self.congested
                and not session.inflight and not session.queue):
            # Nothing of this connection's waits, no packet behind CONNECT, no
            # message of a resumed session to send after it: CONNACK goes at once
            # rather than through the batch's end (one write either way).  A WebSocket
            # read of several frames still shares one batch: a frame after CONNECT's
            # is answered in a second WebSocket message (the same bytes in order).
            # (No debug logging to bypass: ``start_debug`` swaps the class after this.)
            self._send_now(frame)
        else:
            self._write(frame)
        link: CoreLink = self   # type: ignore[assignment]   # (``_link``, a call less)
        label, broker = self.protocol_label, self.broker
        broker.activate(session, link, label)
        broker.registry.register_client(self.client_id, link, label)
        factory: ListenerState = self.factory
        factory.opened.registered(link)   # (found in the live table from now on)
        held = factory.connect_lines.allow("connect")
        if held is not None:
            self.log.info("{c} connected from {peer} (MQTT {v}, clean={cs}, keepalive={k}s)"
                          "{h}", c=self.client_id, peer=self.peer, v=self.version,
                          cs=self.clean_session, k=self.keepalive,
                          h=f" ({held} more connects not logged before it)" if held else "")
        client_debug = broker.client_debug
        if client_debug.debugged:   # (no call while no client is debugged)
            debug_until = client_debug.until(self.client_id)
            if debug_until is not None:
                self.start_debug(debug_until)
        if self.keepalive > 0:   # (0: no keepalive deadline)
            self._arm_keepalive(self.keepalive)
        if self._reading_paused_for:   # (not when it was all done at once: see above)
            self._resume_reading("connect")
        if not self._in_process:
            # (after a password check or a commit: what was read behind CONNECT; in
            # the turn that read CONNECT, the loop that called us goes on with it)
            self._process()

    def _send_now(self, frame: bytes) -> None:
        """``_write`` without the batch: ``frame`` is sent now (counted as
        ``_write`` counts it; a failure as ``_emit``'s)."""
        size = len(frame)
        self.bytes_out += size
        self.meter.stats.bytes_sent += size
        try:
            send(self.transport, frame)
        except Exception:
            write_failed(self.meter.stats, self.factory.log_limit, self.log, Failure())

    def _connect_failed(self, failure: Failure) -> None:
        self.log.failure("could not accept CONNECT from {peer}", failure, peer=self.peer)
        if self.state is ConnectionState.CONNECTING:
            self._carry_out(Refuse(ConnackCode.SERVER_UNAVAILABLE,
                                   "internal error while connecting"))

    def _on_auth(self, packet: Auth) -> None:
        """AUTH: the next step of the exchange CONNECT began, or (connected) a
        re-authentication with the same method (``decisions.auth``)."""
        auth = self._auth
        enhanced = self._factory.enhanced_auth
        step = decisions.auth(packet, self._v5, self.state is _CONNECTED,
                              None if auth is None else auth.method,
                              None if enhanced is None else enhanced.start)
        if isinstance(step, Close):
            self._carry_out(step)
            return
        data, exchange = step
        if exchange is not None:
            assert self._v5 is not None and self._v5.auth_method is not None
            auth = self._auth = AuthInProgress(exchange, self._v5.auth_method, None, False)
        assert auth is not None
        self._auth_answer(auth.exchange.step(data))

    def _auth_answer(self, step: AuthStep) -> None:
        """Carry out the method's answer: a challenge (AUTH 0x18), or the end of
        the exchange (CONNACK, or for a re-authentication AUTH 0x00 / DISCONNECT)."""
        auth = self._auth
        assert auth is not None
        reauthenticating = auth.packet is None
        answer = decisions.auth_answer(step, auth.method, reauthenticating, self.username)
        if reauthenticating or type(answer) is Send:
            if reauthenticating and step.outcome != CONTINUE:   # (it ends here)
                self._auth = None
            assert answer is not None
            self._carry_out(answer)
            return
        self._stop_connect_timer()
        if answer is not None:      # refused
            self._auth = None
            self.broker.gate.auth_failed(Credentials(self.client_id, step.username, None,
                                                     "mqtt", self.peer), step.reason or "refused")
            self._carry_out(answer)
            return
        # The name the exchange proved may be banned (the CONNECT's own user name
        # field, checked before, is whatever the client put there).
        banned = self.broker.gate.banned("MQTT", self.client_id, step.username, self.peer)
        if banned is not None:
            self._auth = None
            self._carry_out(decisions.banned(banned, self._v5))
            return
        auth.final = step.data
        self.username = step.username
        self.advance("connect")
        self._pause_reading("connect")
        packet = auth.packet
        assert packet is not None
        self._authenticated(True, packet, auth.assigned)
