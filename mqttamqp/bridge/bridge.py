"""One bridge: its outbound session, its connection loop and its two directions.

What it owns: ``out``, the broker's persistent session ``$bridge/<name>``, subscribed
to the local filters of the ``out`` rules, so the router queues QoS >= 1 messages in
it durably like any offline client's; while the remote is connected that session is
attached to ``BridgeLink`` (the session's ``ClientLink``), its deliveries go out with
the session's packet ids and are removed only on the remote's PUBACK (PUBCOMP for
QoS 2), and on each reconnect the session is claimed and activated again, so what was
in flight goes first (DUP) and the rest in order.  ``in``: the remote subscription of
the ``in`` rules, each message published through the broker's port with the bridge
as publisher and acknowledged to the remote once it is durable here; the remote is
not read while the durable queues' storage alarm holds or subscribers it fed here are
behind.  The connect loop: one attempt at a time, bounded exponential back-off, one log
line per state change (none per attempt failing as the one before), and Mosquitto's
``$SYS/broker/connection/<client id>/state`` (1 while connected).  How an out delivery
fits the remote's MQTT 5 limits is ``link``'s.

What it must not do: store anything itself or bypass the broker's commands, or
parse bytes (``client``).  Loops: toward Mosquitto the bridge flag (``try_private``)
stops the remote echoing our messages back; locally the ``out`` subscriptions are
no-local, so what ``in`` publishes is not sent back out by a ``both`` rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.bridge.backlog import BacklogGuard
from mqttamqp.bridge.client import LEVEL, Backoff, BridgeClient
from mqttamqp.bridge.config import BridgeSettings, TopicRule
from mqttamqp.bridge.link import BridgeLink, RemoteLimits
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.message import Message
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, Session
from mqttamqp.core.topics import topic_matches
from mqttamqp.mqtt.packets import (
    Connack,
    Connect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
)
from mqttamqp.mqtt.v5 import message_properties

__all__ = ["Bridge", "BridgeLink", "Connector"]

PROTOCOL = "mqtt-bridge"
# Connect to the remote: called with the client to attach; fires when connected.
Connector = Callable[[BridgeClient], "Deferred[Any]"]


def _map(topic: str, from_prefix: str, to_prefix: str) -> str:
    return to_prefix + topic[len(from_prefix):] if topic.startswith(from_prefix) else topic


class Bridge:
    """One configured bridge on the broker's reactor."""

    log: ClassVar[Logger] = Logger()

    def __init__(self, broker: Broker, clock: Clock, settings: BridgeSettings,
                 connector: Connector) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.connector = connector
        self.identity = Identity(settings.session_id, None, PROTOCOL)
        self.link = BridgeLink(self)
        self.backlog = BacklogGuard(settings, broker.limits)
        self.backoff = Backoff(settings.reconnect_min, settings.reconnect_max)
        self.out_rules = tuple(r for r in settings.rules if r.outbound)
        self.in_rules = tuple(r for r in settings.rules if r.inbound)
        # Topics are mapped only when a rule has a prefix (else as they are, no match).
        self._prefixed = any(r.local_prefix or r.remote_prefix for r in settings.rules)
        self.v5 = settings.protocol == "5"
        self.session: Session | None = None    # attached while connected
        self.state = "stopped"
        self.last_error: str | None = None
        self.connected_since: float | None = None
        self.attempts = 0                     # connection attempts, all told
        self.failures = 0                     # of them failed, or lost once connected
        self._failing: str | None = None      # the reason attempts fail for (logged once)
        self._announced = b""                 # the $SYS state published last
        self.sent = 0
        self.received = 0
        self.rate_out = self.rate_in = 0.0   # messages/s over the last sample (``sample``)
        self._counted = (0, 0)                # (sent, received) at the last sample
        self.refused = 0                      # MQTT 5 PUBACKs with a failure code
        self.refused_here = 0                 # in messages a durable queue refused here
        self.held = 0                         # times the remote was not read (storage alarm)
        self._said_held = False               # "not reading the remote" logged, not undone
        self.too_large_in = 0                 # from a 3.1.1 remote: above ours, dropped
        self.refusals = LogLimiter(clock.seconds)
        self._retry: Any = None
        self._client: BridgeClient | None = None
        self._connecting: Any = None   # the connect Deferred while TCP connects
        self._running = False

    def sample(self, elapsed: float) -> None:
        """The rates out and in since the last sample, ``elapsed`` seconds ago."""
        sent, received = self._counted
        if elapsed > 0:
            self.rate_out = (self.sent - sent) / elapsed
            self.rate_in = (self.received - received) / elapsed
        self._counted = (self.sent, self.received)

    @property
    def client(self) -> BridgeClient | None:
        """The connection to the remote, while there is one."""
        return self._client

    # -- life ---------------------------------------------------------------

    def start(self) -> None:
        """Subscribe the out session (it queues from now on) and connect."""
        self._running = True
        if self.out_rules:
            opened = self.broker.open_session(self.link, self.settings.session_id, False,
                                              None, self.identity, None)
            session = opened.session
            self.backlog.apply(session)
            stale = [f for f in session.subscriptions if f not in self._out_filters()]
            if stale:
                self.broker.unsubscribe(session, stale)
            self._subscribe_out(session)
            self.broker.end_session(self.link, session, True, "bridge not connected yet")
        self._set_state("connecting")
        self._attempt()

    def _out_filters(self) -> dict[str, int]:
        return {r.local_filter: r.qos for r in self.out_rules}

    def _subscribe_out(self, session: Session) -> None:
        """The out session's subscriptions: no-local (what the bridge brought in
        does not go back), retain as published (the remote's retained state follows
        the local one)."""
        wanted = self._out_filters()
        self.broker.subscribe(session, self.identity, list(wanted.items()),
                              options=[q | NO_LOCAL | RETAIN_AS_PUBLISHED
                                       for q in wanted.values()])

    def stop(self) -> None:
        """Disconnect and detach the out session; nothing for a bridge not running
        (never started, e.g. on an ``--ha`` standby, or stopped already): no
        ``$SYS`` state is published into a broker that is not serving."""
        if not self._running:
            return
        self._running = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._connecting is not None:   # (a TCP connect under way: no transport yet)
            connecting, self._connecting = self._connecting, None
            connecting.cancel()
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
        self.broker.forget_paused(id(self))
        session, self.session = self.session, None
        if session is not None:   # (detached now: a bridge started anew claims it)
            self.link.attach(None, RemoteLimits(None))
            self.broker.end_session(self.link, session, True, "bridge stopped")
        held = self.broker.sessions.get(self.settings.session_id)
        if held is not None:   # (publishers it held go on: nothing holds them now)
            self.backlog.release(held)
            self.broker.link_drained(None)
        self._set_state("stopped")

    def _attempt(self) -> None:
        self._retry = None
        if not self._running:
            return
        self.attempts += 1
        s = self.settings
        password = None if s.password is None else s.password.encode()
        if self.v5:   # persistent unless clean: the session never expires there
            connect = Connect("MQTT", 5, s.remote_client_id, s.clean_session, s.keepalive,
                              None, s.username, password,
                              Properties(session_expiry_interval=0 if s.clean_session
                                         else 0xFFFFFFFF,
                                         # (the remote keeps what we could not take)
                                         maximum_packet_size=self.broker.limits.max_packet_size))
        else:
            connect = Connect("MQTT", LEVEL, s.remote_client_id, s.clean_session,
                              s.keepalive, None, s.username, password, bridge=s.try_private)
        client = BridgeClient(self, self.clock, connect, s.connect_timeout,
                              self.broker.limits.max_packet_size, 5 if self.v5 else LEVEL)
        self._client = client
        # (a connector that raises at once is a failed attempt, retried with back-off)
        d = self._connecting = maybeDeferred(self.connector, client)
        d.addBoth(self._connected, d)
        d.addErrback(self._connect_failed, client)

    def _connected(self, result: object, d: Any) -> object:
        if self._connecting is d:
            self._connecting = None
        return result

    def _connect_failed(self, failure: Failure, client: BridgeClient) -> None:
        if self._client is client:
            self._client = None
            self._lost(failure.getErrorMessage() or type(failure.value).__name__)

    def _lost(self, reason: str) -> None:
        """A connection ended or an attempt failed: wait, then try again.  One line
        when a connection is lost, one when attempts start failing or fail for
        another reason; none for an attempt that fails as the one before."""
        was_connected = self.connected_since is not None
        self.last_error = reason
        self.connected_since = None
        if not self._running:
            return
        self.failures += 1
        delay = self.backoff.next()
        if was_connected:
            self._set_state("waiting", f"{reason}; next attempt in {delay:g} s", "lost")
        elif reason != self._failing:
            self._set_state("waiting", f"{reason}; next attempt in {delay:g} s; no other "
                            "line while attempts fail so", "failing")
        self._failing = None if was_connected else reason
        self._retry = self.clock.callLater(delay, self._attempt)

    def _set_state(self, state: str, detail: str = "", said: str | None = None) -> None:
        """Now ``state``, logged as ``said`` (else the state) with ``detail``."""
        self.state = state
        self.log.info("bridge {n} to {a}: {s}{d}", n=self.settings.name,
                      a=self.settings.address, s=said or state,
                      d=f" ({detail})" if detail else "")
        up = b"1" if state == "connected" else b"0"
        if up != self._announced:
            # Mosquitto's bridge notification (here only): retained, 1 while connected.
            self._announced = up
            message = Message(f"$SYS/broker/connection/{self.settings.remote_client_id}"
                              "/state", up, 0, True, None, self.clock.seconds())
            with self.broker.stats.own_messages():
                self.broker.publish(message, None, wait=False, counted=False)

    # -- the remote's calls (ClientOwner) -----------------------------------

    def remote_accepted(self, client: BridgeClient, connack: Connack) -> None:
        if not self._running or self._client is not client:   # (stopped meanwhile)
            client.disconnect()
            return
        self.backoff.reset()
        self.connected_since = self.clock.seconds()
        self._failing = None
        limits = RemoteLimits(connack.properties if self.v5 else None)
        fitted = limits.describe()
        self._set_state("connected", f"session present: {connack.session_present}"
                        + (f"; the remote takes {fitted}" if fitted else ""))
        if self.in_rules:
            # MQTT 5: no-local on ``both`` rules, so the remote does not send back
            # what this bridge published there.
            options = (tuple(NO_LOCAL if r.outbound else 0 for r in self.in_rules)
                       if self.v5 else ())
            client.subscribe(tuple((r.remote_filter, min(r.qos, limits.max_qos))
                                   for r in self.in_rules), options)
        if self.out_rules:
            opened = self.broker.open_session(self.link, self.settings.session_id, False,
                                              None, self.identity, None)
            self.session = opened.session   # (claimed: ended if the remote goes now)
            self.backlog.apply(opened.session)
            if not opened.session.subscriptions:   # (expired meanwhile: subscribe again)
                self._subscribe_out(opened.session)
            # MQTT 5: the remote's receive maximum bounds what is in flight (absent:
            # 65,535), on each connection anew.
            props = connack.properties
            receive_max = (props.receive_maximum if props is not None else None) or 65535
            opened.session.window = min(self.broker.limits.max_inflight, receive_max)
            if opened.durable is None:
                self._activate(None, client, opened.session, limits)
            else:
                opened.durable.addCallback(self._activate, client, opened.session, limits)

    def _activate(self, _: object, client: BridgeClient, session: Session,
                  limits: RemoteLimits) -> None:
        if self._client is not client or self.session is not session:
            return
        self.link.attach(client, limits)
        self.broker.activate(session, self.link, PROTOCOL)

    def remote_too_large(self, client: BridgeClient, topic: str, size: int, maximum: int
                         ) -> None:
        """3.1.1: a message from the remote above --max-packet-size, read past and
        acknowledged (``oversize``): dropped, counted, logged once a minute at most."""
        if self._client is not client:
            return
        self.too_large_in += 1
        held = self.refusals.allow("too-large-in")
        if held is not None:
            self.log.warn("bridge {n}: a message from the remote on {t} was dropped: {s} "
                          "bytes, above --max-packet-size {m}; {c} dropped so far{h}",
                          n=self.settings.name, t=topic, s=size, m=maximum,
                          c=self.too_large_in, h=f" ({held} not logged)" if held else "")

    def remote_lost(self, client: BridgeClient, reason: str) -> None:
        if self._client is not client:
            return
        self._client = None
        self.broker.forget_paused(id(self))
        session = self.session
        if session is not None:
            self.session = None
            self.link.attach(None, RemoteLimits(None))
            self.broker.end_session(self.link, session, True, reason)
        self._lost(reason)

    def remote_puback(self, client: BridgeClient, packet_id: int, reason_code: int = 0
                      ) -> None:
        """PUBACK: the message is done.  An MQTT 5 failure code (the remote refused it,
        e.g. 0x87 not authorized) is done too, as a client's would be: counted, and
        logged once a minute per bridge at most."""
        if self._client is not client:   # (a connection stopped or replaced)
            return
        if reason_code >= 0x80:
            self.refused += 1
            held = self.refusals.allow("puback")
            if held is not None:
                self.log.warn("bridge {n}: the remote refused a message (PUBACK 0x{c:02x}); "
                              "{r} refused so far{h}", n=self.settings.name, c=reason_code,
                              r=self.refused, h=f" ({held} not logged)" if held else "")
        session = self.session
        if session is not None:
            if packet_id in self.link.puback_is_pubrec:   # (a QoS 2 entry sent at QoS 1)
                self.link.puback_is_pubrec.discard(packet_id)
                self.broker.received(session, packet_id)
            else:
                self.broker.acknowledged(session, packet_id)

    def remote_pubrec(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client and self.session is not None:
            self.broker.received(self.session, packet_id)

    def remote_pubcomp(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client and self.session is not None:
            self.broker.completed(self.session, packet_id)

    def remote_suback(self, client: BridgeClient, codes: tuple[int, ...]) -> None:
        if self._client is not client:
            return
        refused = [r.remote_filter for r, c in zip(self.in_rules, codes, strict=False)
                   if c >= 0x80]
        if refused:
            self.log.warn("bridge {n}: the remote refused the subscriptions {f}",
                          n=self.settings.name, f=", ".join(refused))
        else:
            self.log.info("bridge {n}: subscribed on the remote to {f}", n=self.settings.name,
                          f=", ".join(r.remote_filter for r in self.in_rules))

    def client_drained(self, client: BridgeClient) -> None:
        if self._client is client and self.session is not None:
            self.broker.link_drained(self.session)

    def remote_publish(self, client: BridgeClient, packet: Publish) -> None:
        """A message of an ``in`` rule: published here, acknowledged once durable
        (QoS 2 is taken at least once: PUBREC once durable, PUBCOMP on PUBREL).
        Nothing is taken from a connection that is not the bridge's current one."""
        if self._client is not client:
            return
        self.received += 1
        message = Message(self.local_topic(packet.topic), packet.payload, packet.qos,
                          packet.retain, self.settings.session_id, self.clock.seconds(),
                          props=message_properties(packet.properties))
        result = self.broker.publish(message, self.identity, wait=packet.qos > 0)
        if packet.qos == 0 or packet.packet_id is None:
            if result.blocked or result.congested:
                self._hold_remote(client, result.blocked, result.congested)
            return
        if result.refusal is not None:
            # A durable queue here refused it (full, too many queues): nothing is
            # stored, so the remote is not told it was taken; it sends it again
            # after the reconnect, with the bridge's back-off between the tries.
            self.refused_here += 1
            held = self.refusals.allow("in-refused")
            if held is not None:
                self.log.warn("bridge {n}: a message from the remote on {t} was refused "
                              "here ({r}); reconnecting so that the remote keeps it{h}",
                              n=self.settings.name, t=message.topic,
                              r=result.refusal.reason, h=f" ({held} not logged)" if held else "")
            client.drop(f"refused here: {result.refusal.reason}")
            return
        if result.blocked or result.congested:
            self._hold_remote(client, result.blocked, result.congested)
        ack: Puback | Pubrec = (Puback(packet.packet_id) if packet.qos == 1
                                else Pubrec(packet.packet_id))
        if result.durable is None:
            client.send(ack)
        else:
            result.durable.addCallbacks(lambda _: client.send(ack),
                                        lambda f: client.drop("storing a message from the "
                                                              "remote failed"))

    def _hold_remote(self, client: BridgeClient, blocked: bool,
                     congested: Sequence[Any]) -> None:
        """Stop reading the remote, as a client's socket here is not read: while the
        durable queues' storage alarm holds (``blocked``: this message was stored,
        what follows waits unacknowledged in the remote's keeping), or while
        subscribers here it fed are behind (``congested``)."""
        broker = self.broker
        if blocked:
            # Counted and logged for the storage alarm only; a writer merely behind
            # (``queues.paused`` without ``blocked``) pauses it silently.
            if "alarm" not in client.paused_for and broker.queues.blocked:
                self.held += 1
                self._said_held = True
                self.log.info("bridge {n}: not reading the remote while the durable "
                              "queues are blocked", n=self.settings.name)
            client.pause_reading("alarm")
            broker.when_queues_writable(id(self), lambda: self._read_again(client, "alarm"))
        if congested:
            client.pause_reading("congestion")
            broker.pause_until_drained(id(self),
                                       lambda: self._read_again(client, "congestion"),
                                       congested)

    def _read_again(self, client: BridgeClient, why: str) -> None:
        if self._client is client:
            if why == "alarm" and why in client.paused_for and self._said_held:
                self._said_held = False
                self.log.info("bridge {n}: reading the remote again", n=self.settings.name)
            client.resume_reading(why)

    def remote_pubrel(self, client: BridgeClient, packet_id: int) -> None:
        if self._client is client:
            client.send(Pubcomp(packet_id))

    # -- topics -------------------------------------------------------------

    def _rule_for(self, rules: tuple[TopicRule, ...], topic: str, local: bool
                  ) -> TopicRule | None:
        for rule in rules:
            if topic_matches(rule.local_filter if local else rule.remote_filter, topic):
                return rule
        return None

    def remote_topic(self, topic: str) -> str:
        if not self._prefixed:
            return topic
        rule = self._rule_for(self.out_rules, topic, True)
        return topic if rule is None else _map(topic, rule.local_prefix, rule.remote_prefix)

    def local_topic(self, topic: str) -> str:
        if not self._prefixed:
            return topic
        rule = self._rule_for(self.in_rules, topic, False)
        return topic if rule is None else _map(topic, rule.remote_prefix, rule.local_prefix)
