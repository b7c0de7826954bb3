"""The MQTT side of a gateway: one client connection served through its
``ClientChannel`` on the upstream, with no session state of its own.

Why not ``mqtt.protocol.MQTTProtocol``: its parts call the core's ``Broker`` port at
every step (about forty commands: sessions, the commit batcher, the router, flow
control, the console's views), and the session they drive lives in this process.
In a gateway every one of those answers comes from the core over AMQP, later, or
not at all; a port of that size faked over AMQP would be a second broker.  The
sans-IO parts do fit and are reused as they are: the codec (``mqtt.codec``), the
connection's states, keepalive rule, acknowledgement order and string rules
(``mqtt.connection``), and CONNECT's decision (``mqtt.decisions.connect``: protocol,
client id, strings).

What it owns: reading packets in the connection's states (packets after CONNECT
wait in the decoder until CONNACK), CONNECT → the channel's flow → CONNACK (session
present from AMQP_SUBSCRIPTIONS; "server unavailable", 3.1.1 code 3 / MQTT 5 0x88,
when no upstream connection is open or the core does not answer), PUBLISH (PUBACK /
PUBREC once the core accepted, in the order the packets came: ``AckQueue``), QoS 2's
PUBREL → PUBCOMP, SUBSCRIBE / UNSUBSCRIBE → SUBACK / UNSUBACK, (through its base
class ``deliveries.ClientDeliveries``) deliveries from the core with packet ids and
PUBACK / PUBREC / PUBCOMP of them, keepalive, takeover of a
client id on this gateway, and the one close: clean (DISCONNECT) or brute
(everything else), which the channel carries to the core's will service.

What it must not do: keep anything of a session beyond the connection (in-flight
packet ids and QoS 2 ids awaiting PUBREL are the connection's, as the core's own MQTT
adapter keeps them; so are the topic aliases a client sets), import the core's broker
or the store, or touch proton (``channel``).  MQTT 5: a PUBLISH's message properties
cross both ways; what does not yet is in docs/gateway.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer  # type: ignore[import-untyped]

from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.core.auth import Authenticator, Credentials
from mqttamqp.core.clock import Clock
from mqttamqp.core.limits import Limits
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.gateway.channel import ClientChannel, Outcome, Refused
from mqttamqp.gateway.deliveries import ClientDeliveries
from mqttamqp.gateway.frames import (
    TAKEN_OVER,
    bridge_options,
    carried_options,
    connack,
    disconnect5,
    message_props,
    publish_ack,
    publish_problem,
    suback,
    suback_v5,
    subscribe_problem,
    unsuback,
)
from mqttamqp.gateway.outbound import Outbound
from mqttamqp.gateway.timers import ClientTimer
from mqttamqp.mqtt.actions import Close, Refuse, ack_frame
from mqttamqp.mqtt.codec import Decoder, MalformedPacket, encode
from mqttamqp.mqtt.connection import (
    AckQueue,
    ConnectionRules,
    ConnectionState,
    Keepalive,
    StringRules,
)
from mqttamqp.mqtt.decisions import authenticated, subscribe5
from mqttamqp.mqtt.decisions import connect as decide_connect
from mqttamqp.mqtt.decisions import unsubscribe as decide_unsubscribe
from mqttamqp.mqtt.packets import (
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
    Subscribe,
    Unsubscribe,
)
from mqttamqp.mqtt.v5 import InboundAliases, Negotiated
from mqttamqp.net.accept import RefusedAtAccept

if TYPE_CHECKING:
    from mqttamqp.gateway.pool import UpstreamPool

__all__ = ["GatewayFactory", "GatewayProtocol"]

PINGRESP = encode(Pingresp())
_WITH_WILL = 0x04   # MQTT 5 DISCONNECT: publish the will all the same


class GatewayFactory(Factory):
    """The MQTT listeners' factory in gateway mode; the clients it serves by id."""

    log: ClassVar[Logger] = Logger()
    noisy = False

    def __init__(self, pool: UpstreamPool, clock: Clock, limits: Limits,
                 credit: int) -> None:
        self.pool = pool
        self.clock = clock
        self.limits = limits
        self.strings = StringRules(limits)
        self.credit = credit
        self.clients: dict[str, GatewayProtocol] = {}
        self.connections: set[GatewayProtocol] = set()
        self.upgrading: set[Any] = set()   # WebSocket sockets in their upgrade: counted too
        self.ratelog = LogLimiter(clock.seconds, burst=5)
        # Clients cut after --close-grace (``close_grace.cut``: the figures' count).
        self.close_grace = CloseGrace(clock, limits.close_grace, self.log,
                                      "gateway MQTT")
        self.refused_unavailable = 0      # CONNECTs refused: no upstream
        self.refused_connections = 0      # sockets closed at --max-connections
        self.reading_pauses = 0           # clients not read for a while (flow control)
        self.connected_total = 0
        self.too_large = 0                # deliveries over a client's maximum packet size
        self.held_deliveries = 0          # deliveries written after pending acknowledgements
        self.published = self.delivered = 0   # messages to the core / to clients
        self.refused: dict[int, int] = {}     # CONNECTs refused, by CONNACK code
        self.make_channel = ClientChannel   # (tests give a fake)
        # Who may connect (the broker's user store, as on a broker); None: anyone.
        self.authenticator: Authenticator | None = None

    def buildProtocol(self, addr: Any) -> Protocol:
        return RefusedAtAccept() if self.full("MQTT", addr) else GatewayProtocol(self)

    def full(self, kind: str, peer: Any) -> bool:
        """--max-connections reached (the clients and the WebSocket sockets still in
        their upgrade: ``gateway.websocket``): a socket refused, counted and logged
        in the broker's words (``core.clients.gate.ClientGate.admit``).  ``peer``:
        Twisted's address of the socket, or its ``host:port`` (formatted only for
        the log line)."""
        limit = self.limits.max_connections
        if not limit or len(self.connections) + len(self.upgrading) < limit:
            return False
        self.refused_connections += 1
        held = self.ratelog.allow("max-connections")
        if held is not None:
            if hasattr(peer, "port"):   # (Twisted's address, ``host:port`` as the broker's)
                peer = f"{peer.host}:{peer.port}"
            self.log.warn("refusing {kind} connection from {peer}: --max-connections ({n}) "
                          "reached ({held} more refused since the last line)", kind=kind,
                          peer=peer, n=limit, held=held)
        return True

    def channel_for(self, client: GatewayProtocol, credit: int, clean_start: bool
                    ) -> ClientChannel | None:
        """A new channel for ``client``; None: no upstream connection can take it.
        A client of that id is closed first (a takeover; its will is published when
        the newcomer starts clean or the old session was clean, not when the session
        is resumed, as the broker does), and the new channel goes on its connection,
        so the core sees the old links go before the new ones come."""
        old = self.clients.get(client.client_id)
        prefer = None
        if old is not None:
            prefer = old.channel.conn if old.channel is not None else None
            if old.level == 5 and old.rules.state is ConnectionState.CONNECTED:
                old.transport.write(TAKEN_OVER)
            old.abort("session taken over by a new connection",
                      brute=clean_start or old.clean)
        conn = self.pool.pick(prefer)
        if conn is None:
            self.refused_unavailable += 1
            return None
        self.clients[client.client_id] = client
        return self.make_channel(conn, client.client_id, client, self.clock, credit,
                                 self.limits.connect_timeout)

    def warn(self, cause: str, fmt: str, **kw: Any) -> None:
        """One line for ``cause``, rate-limited (``LogLimiter``)."""
        held = self.ratelog.allow(cause)
        if held is not None:
            self.log.warn(fmt + ("; {held} more not logged" if held else ""), held=held, **kw)

    def close_all(self, reason: str) -> None:
        for conn in list(self.connections):
            conn.abort(reason)
        for ws in list(self.upgrading):
            ws.transport.abortConnection()


@implementer(IPushProducer)
class GatewayProtocol(ClientDeliveries, Protocol):
    """One MQTT client of the gateway (its deliveries: ``ClientDeliveries``)."""

    log: ClassVar[Logger] = Logger()
    transport: Any
    factory: GatewayFactory

    def __init__(self, factory: GatewayFactory) -> None:
        self.factory = factory
        self.clock = factory.clock
        self.rules = ConnectionRules()
        self.decoder = Decoder(factory.limits.max_packet_size, 4, server=True)
        self.acks = AckQueue()
        self.level = 4
        self.client_id = ""
        self.peer = "?"
        self.clean = True            # remove the session at the end (AMQP_CLOSE)
        self.bridge = False          # Mosquitto's bridge flag: its subscriptions no-local
        self.channel: ClientChannel | None = None
        self.keepalive: Keepalive | None = None
        self.last_activity = 0.0
        self.timer = ClientTimer(self.clock)   # CONNECT deadline, then keepalive
        self._said_goodbye = False   # DISCONNECT: a clean close
        self._with_will = False
        self._assigned = False       # MQTT 5: the client id is the gateway's (CONNACK says)
        self.outbound = Outbound()            # deliveries the client has not finished
        self.awaiting_rel: set[int] = set()   # QoS 2 in: PUBREC sent, awaiting PUBREL
        # MQTT 5: the client's topic aliases (made at the first it sets)
        self.aliases: InboundAliases | None = None
        self.reading_paused = False
        self.since = self.clock.seconds()     # when the socket came (the console)

    # -- Twisted ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        self.factory.connections.add(self)
        self.transport.registerProducer(self, True)
        self.last_activity = self.clock.seconds()
        self.timer.start(self.factory.limits.connect_timeout, self._connect_deadline)

    def dataReceived(self, data: bytes) -> None:
        if self.rules.closed:
            return
        self.last_activity = self.clock.seconds()
        self.decoder.feed(data)
        self._read()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.connections.discard(self)
        if self.factory.clients.get(self.client_id) is self:
            del self.factory.clients[self.client_id]
        self.timer.cancel()
        self._end_channel(f"connection lost: {reason.getErrorMessage()}"
                          if reason is not None else "connection lost")
        self.rules.advance("close")

    def _end_channel(self, why: str) -> None:
        """The one end of the client's upstream half: clean after DISCONNECT (or a
        takeover), brute otherwise; none of it while CONNECT is unanswered (a refused
        or abandoned CONNECT leaves no will)."""
        channel, self.channel = self.channel, None
        if channel is None:
            return
        brute = (not self._said_goodbye or self._with_will) and (
            self.rules.state is not ConnectionState.CONNECTING)
        channel.close(brute, self.clean, "client sent DISCONNECT" if not brute else why)

    # IPushProducer: the client's socket buffer is full / drained: the core's
    # deliveries wait (no credit is given back on .publish).
    def pauseProducing(self) -> None:
        if self.channel is not None:
            self.channel.pause()

    def resumeProducing(self) -> None:
        if self.channel is not None:
            self.channel.resume()

    def stopProducing(self) -> None:
        pass

    # -- reading --------------------------------------------------------------------------

    def _read(self) -> None:
        rules = self.rules
        try:
            while rules.reading and not self.reading_paused:
                packet = self.decoder.next_packet()
                if packet is None:
                    return
                problem = rules.check(packet)
                if problem is not None:
                    self._violation(problem)
                    return
                self._handle(packet)
        except MalformedPacket as e:
            self._violation(f"malformed packet: {e.reason}", e.code)

    def _handle(self, packet: object) -> None:
        kind = type(packet)
        if kind is Publish:
            self._on_publish(packet)  # type: ignore[arg-type]
        elif kind is Puback:
            self._on_puback(packet.packet_id)  # type: ignore[attr-defined]
        elif kind is Pubrel:
            pid = packet.packet_id  # type: ignore[attr-defined]
            self.awaiting_rel.discard(pid)
            self.acks.add(ack_frame(0x70, pid), None, True)
            self._flush_acks()
        elif kind is Pubrec:
            self._on_pubrec(packet.packet_id,  # type: ignore[attr-defined]
                            packet.reason_code)  # type: ignore[attr-defined]
        elif kind is Pubcomp:
            self._on_pubcomp(packet.packet_id)  # type: ignore[attr-defined]
        elif kind is Subscribe:
            self._on_subscribe(packet)  # type: ignore[arg-type]
        elif kind is Unsubscribe:
            self._on_unsubscribe(packet)  # type: ignore[arg-type]
        elif kind is Pingreq:
            self.transport.write(PINGRESP)
        elif kind is Disconnect:
            self._said_goodbye = True
            self._with_will = packet.reason_code == _WITH_WILL  # type: ignore[attr-defined]
            self._end_channel("client sent DISCONNECT")
            self.rules.advance("close")
            self.timer.lose(self.transport, self.factory.close_grace, self.client_id)
        elif kind is Connect:
            self._on_connect(packet)  # type: ignore[arg-type]
        else:
            self._violation(f"unexpected {kind.__name__.upper()}")

    # -- CONNECT --------------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> None:
        factory = self.factory
        self.rules.advance("connect")
        decided = decide_connect(packet, factory.limits, factory.strings, lambda _m: None)
        if isinstance(decided, Refuse):
            self._refuse(decided.code, decided.reason)
            return
        self.level = self.outbound.level = decided.level
        self.decoder.protocol_level = decided.level
        if decided.failure is not None:
            failure = decided.failure
            if isinstance(failure, Refuse):
                self._refuse(failure.code, failure.reason)
            else:
                self._violation(failure.reason)
            return
        if decided.exchange is not None:
            self._refuse(0x8C, "enhanced authentication is not served through a gateway")
            return
        self.client_id = decided.client_id
        self.bridge = packet.bridge
        self._assigned = decided.assigned
        v5 = decided.v5
        self.outbound.max_packet = v5.client_max_packet if v5 is not None else None
        self.clean = (packet.clean_session if v5 is None
                      else v5.session_expiry == 0)
        self.keepalive = Keepalive.of(packet.keepalive) if packet.keepalive else None
        auth = factory.authenticator
        answer = True if auth is None else auth.authenticate(Credentials(
            self.client_id, packet.username, packet.password, "mqtt", self.peer))
        if isinstance(answer, Deferred):
            answer.addCallbacks(self._authenticated, self._not_opened,
                                callbackArgs=(packet, v5), errbackArgs=(None,))
        else:
            self._authenticated(answer, packet, v5)

    def _authenticated(self, ok: bool, packet: Connect, v5: Negotiated | None) -> None:
        """The authenticator's answer: refused (4 or 5), or the contract's flow."""
        if self.rules.state is not ConnectionState.CONNECTING:
            return   # (the client went meanwhile)
        refused = authenticated(ok, packet, True)   # (owners unknown here: docs/gateway.md)
        if refused is not None:
            self._refuse(refused.code, refused.reason)
            return
        factory = self.factory
        channel = factory.channel_for(self, factory.credit if v5 is None
                                      else min(factory.credit, v5.client_receive_max),
                                      packet.clean_session)
        if channel is None:
            self._refuse(ConnackCode.SERVER_UNAVAILABLE, "no upstream connection is open")
            return
        self.channel = channel
        will = packet.will
        d = Deferred.fromCoroutine(channel.open(
            packet.clean_session,
            (will.topic, will.payload, will.qos, will.retain,
             message_props(will.properties) if will.properties is not None else None)
            if will is not None else None,
            not self.clean))
        d.addCallbacks(self._accepted, self._not_opened, errbackArgs=(channel,))

    def _accepted(self, present: bool) -> None:
        if self.rules.state is not ConnectionState.CONNECTING:
            return   # (the client went meanwhile; connectionLost closed the channel)
        self.timer.cancel()
        self.rules.advance("accepted")
        self.factory.connected_total += 1
        assigned = self.client_id if self._assigned else None   # (MQTT 5: said in CONNACK)
        self.transport.write(connack(self.level, present, 0, assigned, self.factory.limits))
        if self.keepalive is not None:
            self.timer.keepalive(self.keepalive, lambda: self.last_activity,
                                 lambda r: self.abort(r, at_once=True),
                                 lambda: self.reading_paused)
        self._read()

    def _not_opened(self, failure: Failure, channel: ClientChannel | None) -> None:
        if self.rules.state is not ConnectionState.CONNECTING:
            return
        e = failure.value
        if not isinstance(e, Refused):
            self.log.failure("connecting {c} through the upstream", failure, c=self.client_id)
            e = Refused(f"internal error: {failure.getErrorMessage()}")
        self.channel = None
        if channel is not None:   # (a refused CONNECT leaves no will)
            channel.close(False, False, "CONNECT refused")
        self._refuse(ConnackCode.NOT_AUTHORIZED if e.unauthorized
                     else ConnackCode.SERVER_UNAVAILABLE, e.reason)

    def _refuse(self, code: int, reason: str) -> None:
        self._limited(f"refused-{int(code)}", "refused CONNECT from {peer} (client id "
                      "{c!r}): {r} (CONNACK {code})", r=reason, code=int(code))
        self.factory.refused[int(code)] = self.factory.refused.get(int(code), 0) + 1
        if self.factory.clients.get(self.client_id) is self:
            del self.factory.clients[self.client_id]
        self.transport.write(connack(self.level, False, code))
        self.rules.advance("close")
        self.timer.lose(self.transport, self.factory.close_grace, self.client_id)

    # -- PUBLISH from the client ----------------------------------------------------------

    def _on_publish(self, packet: Publish) -> None:
        topic, props, problem, code = publish_problem(self.factory.strings, packet,
                                                      self.aliases)
        if problem is not None:
            self._violation(problem, code)
            return
        own = packet.properties
        if own is not None and own.topic_alias is not None:
            # (a topic with its alias: set from now on)
            self.aliases = InboundAliases.of(self.aliases, packet)
        channel = self.channel
        assert channel is not None
        self.factory.published += 1
        qos = packet.qos
        if qos == 0:
            channel.publish_message(topic, packet.payload, 0, packet.retain, False, None,
                                    props)
            if channel.blocked:
                self._pause_reading()
            return
        pid = packet.packet_id
        assert pid is not None
        if qos == 2 and pid in self.awaiting_rel:
            self.acks.add(ack_frame(0x50, pid), None, True)   # (known: PUBREC again)
            self._flush_acks()
            return
        self._own_entry(topic)   # (its copy comes after this: ``deliveries``)
        entry = self.acks.add(ack_frame(0x40 if qos == 1 else 0x50, pid), None, False)
        if qos == 2:
            self.awaiting_rel.add(pid)

        def answered(outcome: Outcome) -> None:
            if not outcome.accepted and not outcome.condition:
                # Released or no answer: not acknowledged, the client sends it again.
                self.abort(f"the core did not take a QoS {qos} PUBLISH: {outcome.reason}")
                return
            if not outcome.accepted:
                self._limited("publish-refused", "{c}: the core refused a PUBLISH to {t}: "
                              "{r}", t=topic, r=outcome.reason)
                if self.level == 5:   # (3.1.1 has no way to say it: a success ack)
                    entry[1] = publish_ack(qos, pid, outcome)
                    if qos == 2:   # (the exchange ends with the failed PUBREC)
                        self.awaiting_rel.discard(pid)
            AckQueue.ready(entry)
            self._flush_acks()

        channel.publish_message(topic, packet.payload, qos, packet.retain, packet.dup,
                                answered, props)
        if self.acks.over_bound or channel.blocked:
            self._pause_reading()

    def _flush_acks(self) -> None:
        if self.rules.closed:
            return
        taken = self.acks.take()
        if taken:
            self._acks_taken(len(taken))
            self.transport.write(b"".join([frame for frame, _after in taken]))
            for _frame, after in taken:
                if after is not None:
                    after()   # (a held QoS 0 delivery: settled once written)
        self._maybe_resume()

    def _pause_reading(self) -> None:
        """Not read while acknowledgements wait beyond their bound (``AckQueue``) or
        the core gives no credit for PUBLISH."""
        if not self.reading_paused:
            self.reading_paused = True
            self.factory.reading_pauses += 1
            self.transport.pauseProducing()

    def _maybe_resume(self) -> None:
        channel = self.channel
        if (self.reading_paused and self.acks.under_resume_mark and channel is not None
                and not channel.blocked and not self.rules.closed):
            self.reading_paused = False
            self.transport.resumeProducing()
            self._read()

    def writable(self) -> None:
        self._maybe_resume()

    # -- SUBSCRIBE, UNSUBSCRIBE -----------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> None:
        problem = subscribe_problem(self.factory.strings, self.factory.limits, packet,
                                    self.level)
        if problem is not None:
            self._violation(problem)
            return
        channel = self.channel
        assert channel is not None
        if self.level == 5:   # (the broker's judgement: 0x8F for an invalid filter
            # or no local on $share/, per filter)
            plan = subscribe5(packet, self.factory.limits, self.factory.strings, ())
            self._answer_later(channel.subscribe(
                packet.packet_id, dict(plan.wanted), carried_options(packet, plan)
            ) if plan.wanted else succeed(Outcome(True)),
                lambda outcome: suback_v5(packet, plan, outcome))
            return
        self._answer_later(channel.subscribe(packet.packet_id, dict(packet.topics),
                                             bridge_options(packet) if self.bridge else None),
                           lambda outcome: suback(packet, outcome, self.level))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        if isinstance(bad := decide_unsubscribe(packet, self.factory.strings, None, ()), Close):
            self._violation(bad.reason)   # (a filter breaking the rules, as in SUBSCRIBE)
            return
        channel = self.channel
        assert channel is not None
        self._answer_later(channel.unsubscribe(packet.packet_id, list(packet.topics)),
                           lambda _outcome: unsuback(packet, self.level))

    def _answer_later(self, d: Deferred[Outcome], frame: Callable[[Outcome], bytes]
                      ) -> None:
        """``frame`` of the core's answer ``d`` in packet order, bounded (``AckQueue``)."""
        position = self._acks_written + len(self.acks)
        entry = self.acks.add(b"", None, False)
        if self.acks.over_bound:
            self._pause_reading()

        def answered(outcome: Outcome) -> None:
            entry[1] = frame(outcome)
            self._answered_in_turn(position)
            AckQueue.ready(entry)
            self._flush_acks()

        d.addCallback(answered)

    # -- time -----------------------------------------------------------------------------

    def _connect_deadline(self) -> None:
        if self.rules.state is ConnectionState.AWAITING_CONNECT:
            self._violation("no CONNECT within the connect timeout")

    # -- the one close --------------------------------------------------------------------

    def _violation(self, reason: str, code: int = 0x82) -> None:
        # (the broker's wording; limited per reason, as hostile clients repeat one)
        self._limited("violation " + reason[:80], "protocol error from {c} ({peer}): {r}; "
                      "closing the connection", r=reason)
        if self.level == 5 and self.rules.state is ConnectionState.CONNECTED:
            self.transport.write(disconnect5(reason, code))   # (MQTT 5: told why)
        self.abort(reason)

    def abort(self, reason: str, brute: bool = True, at_once: bool = False) -> None:
        """Close the client after what is written (cut after ``--close-grace``
        seconds; ``at_once``: a silent client): ``brute`` (its will goes) unless a
        takeover."""
        self._said_goodbye = self._said_goodbye or not brute
        # At once, not when the socket is gone (a turn later): a takeover's new channel
        # attaches a will link of the same name right after.
        self._end_channel(reason)
        if not self.rules.closed:
            self.rules.advance("close")
        if self.transport is not None:
            self.timer.lose(self.transport, self.factory.close_grace, self.client_id, at_once)

    def _limited(self, cause: str, fmt: str, **kw: Any) -> None:
        self.factory.warn(cause, fmt, c=self.client_id, peer=self.peer, **kw)
