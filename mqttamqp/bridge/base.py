"""What every bridge has, whatever the remote speaks (MQTT: ``bridge``; AMQP 1.0:
``amqp``): the out session, the connect loop, the status, the ``in`` direction's
publish here.

What it owns: ``BridgeBase``, one configured bridge's life on the broker's reactor:
``out``, the broker's persistent session ``$bridge/<name>`` subscribed to the local
filters of the ``out`` rules (no-local, retain as published) with the bridge's own
backlog bound (``backlog``), claimed again on each connection (``claim_out``: what was
in flight goes first, then the queue in order) and ended when the connection goes;
the connect loop (one attempt at a time, bounded exponential back-off reset after
max(keepalive, reconnect-max) seconds connected, one log line
per state change, none per attempt failing as the one before) and Mosquitto's
``$SYS/broker/connection/<client id>/state``; the status the console, the metrics and
``$SYS`` read (state, last error, connected since, attempts, failures, counts, rates);
``take_in``, an ``in`` message published here with the bridge as publisher and
acknowledged to the remote (the ``ack`` it is given) once durable here, the remote held
while the durable queues' storage alarm holds or subscribers here it fed are behind
(``pause_reading``: an MQTT remote's socket is not read; an AMQP remote is still
read, only its credit is withheld); and the topic mapping of the rules' prefixes.

What it must not do: speak a protocol (a subclass makes its connection, ``new_client``,
and turns the remote's acknowledgements into the session's settlement), store
anything itself or bypass the broker's commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.adapter.backoff import Backoff
from mqttamqp.adapter.grace import CloseGrace
from mqttamqp.bridge.backlog import BacklogGuard
from mqttamqp.bridge.config import BridgeSettings, TopicRule
from mqttamqp.bridge.link import BridgeLink, RemoteLimits
from mqttamqp.core.auth import Identity
from mqttamqp.core.broker import Broker
from mqttamqp.core.clock import Clock
from mqttamqp.core.message import Message
from mqttamqp.core.queues.addresses import Refusal
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, Session
from mqttamqp.core.topics import topic_matches

__all__ = ["BridgeBase", "Connector", "Remote"]

PROTOCOL = "mqtt-bridge"
# Connect to the remote: called with the client to attach; fires when connected.
Connector = Callable[[Any], "Deferred[Any]"]


class Remote(Protocol):
    """What ``BridgeBase`` uses of a connection to the remote, whatever it speaks."""

    paused_for: set[str]

    def disconnect(self) -> None: ...

    def drop(self, reason: str) -> None: ...

    def pause_reading(self, why: str) -> None: ...

    def resume_reading(self, why: str) -> None: ...


def _map(topic: str, from_prefix: str, to_prefix: str) -> str:
    return to_prefix + topic[len(from_prefix):] if topic.startswith(from_prefix) else topic


class BridgeBase:
    """One configured bridge on the broker's reactor (the remote's protocol is a
    subclass's)."""

    log: ClassVar[Logger] = Logger()
    # How the remote is held, and let go, for the log (``_hold_remote``).
    holding: ClassVar[str] = "not reading the remote"
    resuming: ClassVar[str] = "reading the remote again"
    # How the remote is told of an in message refused here for good (``take_in``).
    told: ClassVar[str] = "acknowledged to the remote"

    def __init__(self, broker: Broker, clock: Clock, settings: BridgeSettings,
                 connector: Connector) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.connector = connector
        self.identity = Identity(settings.session_id, None, PROTOCOL)
        self.link: BridgeLink = self.new_link()
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
        self.refused = 0                      # out messages the remote refused
        self.refused_here = 0                 # in messages a durable queue refused here
        self.dropped_in = 0                   # ... of them for good: the remote told, dropped
        self.held = 0                         # times the remote was held (storage alarm)
        self._said_held = False               # ``holding`` logged, not undone
        self.too_large_in = 0                 # from a 3.1.1 remote: above ours, dropped
        self.refusals = LogLimiter(clock.seconds)
        # A stopped bridge's connection that does not close: cut (--close-grace),
        # counted with the broker's ($SYS/broker/limits/close_grace).
        self.close_grace = CloseGrace(clock, broker.limits.close_grace, self.log,
                                      f"bridge {settings.name}",
                                      lambda: broker.stats.limit_hit("close_grace"))
        self._retry: Any = None
        self._steady: Any = None   # resets the back-off once connected long enough
        self._client: Any = None
        self._connecting: Any = None   # the connect Deferred while TCP connects
        self._running = False

    # -- what a subclass provides ------------------------------------------

    def new_link(self) -> BridgeLink:
        """The out session's ``ClientLink``."""
        return BridgeLink(self)

    def new_client(self) -> Any:
        """A connection to the remote, not connected yet (given to the connector)."""
        raise NotImplementedError

    def sample(self, elapsed: float) -> None:
        """The rates out and in since the last sample, ``elapsed`` seconds ago."""
        sent, received = self._counted
        if elapsed > 0:
            self.rate_out = (self.sent - sent) / elapsed
            self.rate_in = (self.received - received) / elapsed
        self._counted = (self.sent, self.received)

    @property
    def client(self) -> Any:
        """The connection to the remote, while there is one (a ``Remote``)."""
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
        self._cancel_steady()
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
        client = self.new_client()
        self._client = client
        # (a connector that raises at once is a failed attempt, retried with back-off)
        d = self._connecting = maybeDeferred(self.connector, client)
        d.addBoth(self._connected, d)
        d.addErrback(self._connect_failed, client)

    def _connected(self, result: object, d: Any) -> object:
        if self._connecting is d:
            self._connecting = None
        return result

    def _connect_failed(self, failure: Failure, client: Any) -> None:
        if self._client is client:
            self._client = None
            self._lost(failure.getErrorMessage() or type(failure.value).__name__)

    def _lost(self, reason: str) -> None:
        """A connection ended or an attempt failed: wait, then try again.  One line
        when a connection is lost, one when attempts start failing or fail for
        another reason; none for an attempt that fails as the one before."""
        was_connected = self.connected_since is not None
        self._cancel_steady()
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

    def _cancel_steady(self) -> None:
        if self._steady is not None and self._steady.active():
            self._steady.cancel()
        self._steady = None

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

    # -- a connection's life (for the subclasses) ----------------------------

    def up(self, detail: str) -> None:
        """The remote accepted the connection: the back-off starts over once it has
        stayed up max(keepalive, reconnect-max) seconds (a remote that accepts, then
        ends each connection at once, is tried again with a growing delay)."""
        self._cancel_steady()
        s = self.settings
        self._steady = self.clock.callLater(max(s.keepalive, s.reconnect_max),
                                            self.backoff.reset)
        self.connected_since = self.clock.seconds()
        self._failing = None
        self._set_state("connected", detail)

    def claim_out(self, client: Any, window: int,
                  activate: Callable[[Session], None]) -> None:
        """Claim the out session for ``client``'s connection (ended if it goes now),
        at most ``window`` deliveries in flight; ``activate`` once it is durable."""
        opened = self.broker.open_session(self.link, self.settings.session_id, False,
                                          None, self.identity, None)
        session = self.session = opened.session
        self.backlog.apply(session)
        if not session.subscriptions:   # (expired meanwhile: subscribe again)
            self._subscribe_out(session)
        session.window = window
        if opened.durable is None:
            activate(session)
        else:
            opened.durable.addCallback(lambda _: activate(session))

    def remote_lost(self, client: Any, reason: str) -> None:
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

    def client_drained(self, client: Any) -> None:
        if self._client is client and self.session is not None:
            self.broker.link_drained(self.session)

    # -- the in direction ----------------------------------------------------

    def take_in(self, client: Remote, message: Message, ack: Callable[[], object] | None,
                reject: Callable[[Refusal], bool] | None = None) -> None:
        """A message of an ``in`` rule: published here; ``ack`` (None: QoS 0, nothing
        to acknowledge) once it is durable here.  One a durable queue here refuses is
        not acknowledged as taken: ``reject`` tells the remote of a refusal for good
        (``amqp.refusals.for_good``: a topic no queue takes, a message a queue can
        never take; AMQP: rejected, MQTT: acknowledged with the refusal's reason
        code) and says True, as sending it again would be refused again: dropped,
        counted (``dropped_in``), logged once a minute per reason code; a refusal
        that comes with a commit (an ``x-overflow reject-publish-dlx`` queue's dead
        letter) is told only once that commit is durable, the connection dropped if
        it fails; else (no
        ``reject``, or it says False: a full queue, too many queues, it may pass
        later) the connection is dropped, so that the remote keeps it."""
        self.received += 1
        result = self.broker.publish(message, self.identity, wait=ack is not None)
        if ack is None:
            if result.blocked or result.congested:
                self._hold_remote(client, result.blocked, result.congested)
            return
        refusal = result.refusal
        if refusal is not None:
            self.refused_here += 1
            if result.durable is None:
                self._refused(client, message, refusal, reject)
            else:
                # (an x-overflow reject-publish-dlx queue: the refusal comes with the
                # commit holding its dead letter; the remote is told once it holds)
                result.durable.addCallbacks(
                    lambda _: self._refused(client, message, refusal, reject, True),
                    lambda f: client.drop("storing a dead letter of a message from the "
                                          "remote failed"))
            return
        if result.blocked or result.congested:
            self._hold_remote(client, result.blocked, result.congested)
        if result.durable is None:
            ack()
        else:
            result.durable.addCallbacks(lambda _: ack(),
                                        lambda f: client.drop("storing a message from the "
                                                              "remote failed"))

    def _refused(self, client: Remote, message: Message, refusal: Refusal,
                 reject: Callable[[Refusal], bool] | None, lettered: bool = False) -> None:
        """``take_in``'s refused message, once what its refusal committed (a dead
        letter, ``lettered``) is durable: told to the remote and dropped if for good
        (the line says which: kept here as a dead letter, or dropped), else the
        connection dropped so that the remote keeps it."""
        if reject is not None and reject(refusal):
            self.dropped_in += 1
            self.warn(f"in-dropped {refusal.code:#04x}", "bridge {n}: a message from "
                      "the remote on {t} was refused here for good ({r}); {how}, "
                      "{fate}; {c} dropped so far", t=message.topic, r=refusal.reason,
                      how=self.told, c=self.dropped_in,
                      fate="dead-lettered here" if lettered else "dropped")
            return
        # A durable queue here refused it (full, too many queues): nothing is
        # stored, so the remote is not told it was taken; it sends it again
        # after the reconnect, with the bridge's back-off between the tries.
        self.warn("in-refused", "bridge {n}: a message from the remote on {t} was "
                  "refused here ({r}); reconnecting so that the remote keeps it",
                  t=message.topic, r=refusal.reason)
        client.drop(f"refused here: {refusal.reason}")

    def warn(self, cause: str, fmt: str, **kw: Any) -> None:
        """One line for ``cause`` a minute at most (``refusals``): ``fmt`` with
        ``{n}``, the bridge's name, and at its end how many lines were held back
        since the last one."""
        held = self.refusals.allow(cause)
        if held is not None:
            self.log.warn(fmt + "{held_back}", n=self.settings.name,
                          held_back=f" ({held} not logged)" if held else "", **kw)

    def _hold_remote(self, client: Remote, blocked: bool,
                     congested: Sequence[Any]) -> None:
        """Hold the remote (``pause_reading``: an MQTT remote's socket is not read, as
        a client's here; an AMQP remote gets no credit back, its socket still read):
        while the durable queues' storage alarm holds (``blocked``: this message was
        stored, what follows waits unacknowledged in the remote's keeping), or while
        subscribers here it fed are behind (``congested``)."""
        broker = self.broker
        if blocked:
            # Counted and logged for the storage alarm only; a writer merely behind
            # (``queues.paused`` without ``blocked``) pauses it silently.
            if "alarm" not in client.paused_for and broker.queues.blocked:
                self.held += 1
                self._said_held = True
                self.log.info("bridge {n}: {h} while the durable queues are blocked",
                              n=self.settings.name, h=self.holding)
            client.pause_reading("alarm")
            broker.when_queues_writable(id(self), lambda: self._read_again(client, "alarm"))
        if congested:
            client.pause_reading("congestion")
            broker.pause_until_drained(id(self),
                                       lambda: self._read_again(client, "congestion"),
                                       congested)

    def _read_again(self, client: Remote, why: str) -> None:
        if self._client is client:
            if why == "alarm" and why in client.paused_for and self._said_held:
                self._said_held = False
                self.log.info("bridge {n}: {r}", n=self.settings.name, r=self.resuming)
            client.resume_reading(why)

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
