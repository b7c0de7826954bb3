"""The broker's façade: the one entry point protocol adapters and the console use.

``Broker`` wires the core's parts and turns each adapter request into a command
on them; it holds no rules of its own:

* ``commits.CommitBatcher``: batches, barriers, the end-of-batch flush, stopping;
* ``registry.SessionRegistry``: sessions, takeover, expiry, live connections;
* ``wills.Wills``: wills and the grace rule after a restart;
* ``router.Router``: publish (with the permission check), subscribe, retained;
* ``flow.FlowControl``: paused publishers and the stall rule;
* ``systopics.SysTopics``: ``$SYS``;
* ``readmodel.ReadModel`` (``Broker.view``): frozen views for the console.

Commands return result values (``Published``, ``Opened``, Deferreds that fire
once a change is durable); nothing is reported through attributes read
afterwards.  The store is given at construction; ``shutdown()`` stops
everything and from then on nothing more is stored or acknowledged.

What it must not do: parse bytes, touch sockets, or wait on storage.  Adapters
never compose store operations or touch session internals: every durable change
goes through a command here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqttamqp.core.auth import (
    AllowAll,
    Authenticator,
    Authorizer,
    Credentials,
    Identity,
    peer_host,
)
from mqttamqp.core.clients.clientdebug import ClientDebug
from mqttamqp.core.clients.connections import InspectableConnection
from mqttamqp.core.clients.registry import Opened, SessionRegistry
from mqttamqp.core.clients.wills import Wills
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import CommitBatcher, all_durable
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import Op, StateStore
from mqttamqp.core.queues.addresses import Consumer, QueueAddress, Refusal, is_command
from mqttamqp.core.queues.admin import QueueMessageView, QueueView
from mqttamqp.core.queues.budget import FreeSpace
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.queues.model import Retention
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.readmodel import ReadModel, will_owners
from mqttamqp.core.recorder import (
    AUTH_FAILURE,
    CAUSE_CONSOLE,
    CAUSE_KEEPALIVE,
    CAUSE_LOST,
    CONSOLE_ACTION,
    NoRecorder,
    Recorder,
)
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.routing.router import SUBSCRIBE_FAILURE, Published, Router
from mqttamqp.core.routing.topicstats import TopicStats
from mqttamqp.core.sessions.flow import Congestible, FlowControl
from mqttamqp.core.sessions.session import ClientLink, Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.systopics import SysTopics
from mqttamqp.core.topics import SubscriptionTrie, is_sys_topic
from mqttamqp.security.admission import ConnectRate, PublishRate
from mqttamqp.security.bans import Ban, BanList

__all__ = ["Broker", "Opened", "Outcome", "Published", "SUBSCRIBE_FAILURE"]


class Outcome(Enum):
    """How an AMQP receiver settled a delivery (AMQP 1.0 §3.4)."""

    ACCEPTED = "accepted"   # done
    REJECTED = "rejected"   # dropped, counted
    RELEASED = "released"   # redeliver unchanged
    MODIFIED = "modified"   # redeliver; a failed attempt counts in delivery-count


# (an Enum member read from its class is a lookup each time: Broker.settle runs per
# AMQP delivery)
_ACCEPTED, _REJECTED = Outcome.ACCEPTED, Outcome.REJECTED
_RELEASED, _MODIFIED = Outcome.RELEASED, Outcome.MODIFIED


class Broker:
    log = Logger()

    def __init__(self, clock: Clock, store: StateStore, limits: Limits | None = None,
                 authenticator: Authenticator | None = None,
                 authorizer: Authorizer | None = None,
                 recorder: Recorder | None = None,
                 free_space: FreeSpace | None = None) -> None:
        """``free_space``: bytes free on the data directory's file system, read every
        two seconds for ``--disk-free-limit`` (None: no free-disk watermark)."""
        self.clock = clock
        self.store = store
        self.limits = limits if limits is not None else Limits()
        self.authenticator: Authenticator = authenticator or AllowAll()
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.recorder: Recorder = recorder if recorder is not None else NoRecorder()
        self.stats = BrokerStats(seconds=clock.seconds)
        self._commits = CommitBatcher(store, self.stats, clock.seconds)
        self._log_limit = LogLimiter(clock.seconds)   # one line per cause a minute
        # Durable queues ($queue/, $dlq/): beside the router, which hands them what
        # is theirs (queue publishes and subscriptions).  The console reads views
        # through them.
        self.queues = QueueManager(clock, self._commits, self.limits, self._log_limit)
        # (a store that cannot read queue messages back gets no memory budget)
        self.queues.attach_storage(getattr(store, "read_queue_messages", None), free_space)
        self._router = Router(clock, self._commits, self.stats, self.authorizer, self.recorder,
                              self.limits, self._log_limit, queues=self.queues)
        self._connect_rate = ConnectRate(clock.seconds, self.limits.max_connect_rate,
                                         self.limits.connect_burst)
        self._wills = Wills(clock, self._commits, self.stats, self.authorizer,
                            self._publish_with, self.limits.will_grace, self.recorder)
        self._flow = FlowControl(clock, self.limits.stall_timeout, self._online)
        self._registry = SessionRegistry(clock, self.limits, self._commits, self.stats,
                                         self._router, self._wills, self._flow,
                                         self.recorder)
        self._sys = SysTopics(clock, self.stats, self._router, self._registry, self._wills,
                              self.recorder, queues=self.queues)
        self.begin_batch: Callable[[], None] = self._commits.begin
        self.end_batch: Callable[[], None] = self._commits.end
        self.after_batch: Callable[[Callable[[], None]], bool] = self._commits.after_batch
        self.bans = BanList(clock.seconds)
        self.topic_stats = TopicStats()       # per-topic counts for the console
        self.view = ReadModel(self._registry, self._wills.wills, self._router, self.stats,
                              self.recorder, self.bans, self.topic_stats,
                              queues=self.queues)
        self._loops: list[LoopingCall] = []
        self.client_debug = ClientDebug(clock.seconds)

    # -- state the read model and tests look at (read-only) ---------------------

    @property
    def sessions(self) -> dict[str, Session]:
        return self._registry.sessions

    @property
    def link_subscribers(self) -> dict[str, Session]:
        return self._registry.link_subscribers

    @property
    def connections(self) -> dict[str, InspectableConnection]:
        return self._registry.connections

    @property
    def wills(self) -> dict[str, WillMessage]:
        return self._wills.wills

    @property
    def retained(self) -> RetainedStore:
        return self._router.retained

    @property
    def trie(self) -> SubscriptionTrie[Session]:
        return self._router.trie

    @property
    def wills_in_grace(self) -> int:
        """Wills restored at start whose grace period is still running."""
        return self._wills.in_grace()

    @property
    def stopping(self) -> bool:
        return self._commits.stopping

    def _online(self) -> Iterable[Session]:
        return self._registry.online()

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Rebuild from the store, arm the grace timers of orphaned wills and loops."""
        self.stats.started = self.clock.seconds()
        snap = self.store.load()
        self._router.restore_retained(snap.retained.values())
        self._registry.restore(snap.sessions)
        self._wills.restore(snap.wills.values())
        self.bans.restore(snap.bans)
        self.queues.restore(snap.queues)
        self.queues.alarm.start()
        self.log.info("loaded {r} retained message(s), {s} persistent session(s), "
                      "{q} durable queue(s)", r=len(snap.retained), s=len(snap.sessions),
                      q=len(snap.queues))
        self._start_loop(self._sys.publish, self.limits.sys_interval)
        if self.limits.session_expiry > 0:
            self._start_loop(self._registry.expire, min(60.0, self.limits.session_expiry))

    def _start_loop(self, fn: Callable[[], object], interval: float) -> None:
        if interval <= 0:
            return
        loop = LoopingCall(fn)
        loop.clock = self.clock  # type: ignore[assignment]
        loop.start(interval, now=True).addErrback(
            lambda f: self.log.failure("periodic task {fn} failed", f, fn=fn.__name__))
        self._loops.append(loop)

    def stop(self) -> None:
        """Stop the periodic tasks and every timer (grace, stall)."""
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()
        self._registry.stop_timers()
        self.queues.stop()
        self.queues.alarm.stop()
        self._wills.stop()
        self._flow.stop()

    def shutdown(self) -> None:
        """The process is stopping: from now on nothing is stored, so nothing is
        acknowledged, and connections end without firing wills (the grace rule
        decides at the next start)."""
        self._commits.stopping = True
        self.stop()

    # -- batches (one per socket read): bound in __init__, they are per-read calls --
    #    begin_batch(), end_batch(), and after_batch(flush): inside a batch, call
    #    ``flush`` when it ends and return True; outside one, return False.

    def barrier(self) -> Deferred[None]:
        """Fires once everything asked of the broker so far is durable."""
        return self._commits.barrier()

    # -- authentication and connections ----------------------------------------

    def admit(self, kind: str, peer: str, connections: int) -> bool:
        """A new socket from ``peer`` (``host:port``), with ``connections`` of its
        ``kind`` (MQTT, AMQP) open: may it go on?  A refusal is counted and logged
        (one line per cause a minute)."""
        if connections >= self.limits.max_connections:
            cause, what = "max_connections", (
                f"--max-connections ({self.limits.max_connections}) reached")
        elif not self._connect_rate.admit(peer_host(peer)):
            cause, what = "connect_rate", (
                f"more than {self.limits.max_connect_rate:g} new connections a second "
                "from that address (--max-connect-rate)")
        else:
            return True
        self.stats.connections_refused += 1
        self.stats.limit_hit(cause)
        suppressed = self._log_limit.allow(cause)
        if suppressed is not None:
            self.log.warn("refusing {kind} connection from {peer}: {what} ({n} more "
                          "refused since the last line)", kind=kind, peer=peer, what=what,
                          n=suppressed)
        return False

    def banned(self, kind: str, client_id: str | None, user: str | None, peer: str
               ) -> str | None:
        """Why a connection (MQTT CONNECT, AMQP open) is banned, or None.  A refusal
        is counted and logged (one line per cause a minute); the caller closes it
        without logging it again."""
        ban = self.bans.check(client_id, user, peer_host(peer))
        if ban is None:
            return None
        self.stats.connections_refused += 1
        self.stats.limit_hit("banned")
        suppressed = self._log_limit.allow("banned")
        if suppressed is not None:
            self.log.warn("refusing {kind} connection from {peer} (client id {c!r}): {why} "
                          "({n} more refused since the last line)", kind=kind, peer=peer,
                          c=client_id, why=ban.describe(), n=suppressed)
        return ban.describe()

    def ban(self, kind: str, value: str, until: float | None, reason: str, by: str
            ) -> tuple[Ban, Deferred[None]]:
        """Ban ``value`` (a ``kind`` of ``core.bans``); fires once durable.  Raises
        ``BanError`` for a ban that cannot be set.  Connections already open stay."""
        ban, op = self.bans.add(kind, value, until, reason, by)
        return ban, self._durable([self._commits.persist([op, *self.bans.purge()])])

    def unban(self, kind: str, value: str) -> Deferred[None] | None:
        """Lift a ban; None if there was none.  Fires once durable."""
        op = self.bans.remove(kind, value)
        if op is None:
            return None
        return self._durable([self._commits.persist([op])])

    def publish_rate(self) -> PublishRate | None:
        """A new client's publish budget, or None when no rate is limited."""
        limits = self.limits
        if limits.max_publish_rate <= 0 and limits.max_publish_byte_rate <= 0:
            return None
        return PublishRate(self.clock.seconds, limits.max_publish_rate,
                           limits.max_publish_byte_rate)

    def publish_rate_exceeded(self, kind: str, client: str, wait: float) -> None:
        """A client went over its publish rate: not read for ``wait`` seconds."""
        self.stats.limit_hit("publish_rate")
        suppressed = self._log_limit.allow("publish_rate")
        if suppressed is not None:
            self.log.info("{kind} client {c} publishes faster than --max-publish-rate / "
                          "--max-publish-byte-rate: not read for {w:.2f}s ({n} more since "
                          "the last line)", kind=kind, c=client, w=wait, n=suppressed)

    def auth_failed(self, credentials: Credentials, reason: str) -> None:
        """A failed check outside ``authenticate`` (an MQTT 5 AUTH exchange): counted
        and recorded like the others."""
        self.stats.auth_failures += 1
        self.recorder.event(self.clock.seconds(), AUTH_FAILURE, credentials.client_id or None,
                            protocol=credentials.protocol, address=credentials.peer,
                            user=credentials.username, reason=reason)

    def authenticate(self, credentials: Credentials) -> Deferred[bool]:
        """Check ``credentials``; a refusal (or a failed check) is recorded."""
        result = self.authenticate_now(credentials)
        if isinstance(result, Deferred):
            return result
        return succeed(result)

    def authenticate_now(self, credentials: Credentials) -> bool | Deferred[bool]:
        """``authenticate``, answered at once when the authenticator answers at once
        (anonymous clients, a store without users): no Deferred per MQTT CONNECT."""
        try:
            result = self.authenticator.authenticate(credentials)
        except Exception:
            failed: Deferred[bool] = fail()
            return failed.addErrback(self._auth_recorded, credentials, "error")
        if isinstance(result, Deferred):
            return result.addCallbacks(
                self._auth_recorded, self._auth_recorded, callbackArgs=(credentials, "refused"),
                errbackArgs=(credentials, "error"))
        return self._auth_recorded(result, credentials, "refused")  # type: ignore[no-any-return]

    def _auth_recorded(self, ok: Any, credentials: Credentials, reason: str) -> Any:
        if not ok or reason != "refused":
            self.stats.auth_failures += 1
            self.recorder.event(
                self.clock.seconds(), AUTH_FAILURE, credentials.client_id or None,
                protocol=credentials.protocol, address=credentials.peer,
                user=credentials.username, reason=reason)
        return ok

    def register_connection(self, key: str, connection: InspectableConnection,
                            protocol: str) -> None:
        """A connection is live (after CONNACK / AMQP open): the console lists it and
        ``$SYS`` counts it as a client (``protocol``: mqtt3.1, mqtt3.1.1 or amqp)."""
        self._registry.register_connection(key, connection, protocol)

    def unregister_connection(self, key: str, connection: InspectableConnection,
                              cause: str = CAUSE_LOST, detail: str = "") -> None:
        """The connection is gone (``cause``: one of the recorder's causes)."""
        self._registry.unregister_connection(key, connection, cause, detail)

    # -- sessions -------------------------------------------------------------

    def open_session(self, connection: ClientLink, client_id: str, clean: bool,
                     will: WillMessage | None, identity: Identity | None = None,
                     expiry: float | None = None) -> Opened:
        """Claim (open or resume) the session of ``client_id`` for ``connection``,
        taking it over from whoever holds it.  Call ``activate`` once CONNACK is out.
        ``expiry``: MQTT 5's session expiry interval (see ``SessionRegistry.open``)."""
        return self._registry.open(connection, client_id, clean, will, identity, expiry)

    def activate(self, session: Session, link: ClientLink, protocol: str) -> None:
        """CONNACK went out: deliver in-flight and queued messages to ``link``."""
        self._registry.relabel(session, protocol)
        session.protocol = protocol
        session.attach(link)
        self.queues.session_online(session)
        self._router.room(session)

    def end_session(self, connection: ClientLink, session: Session, clean: bool,
                    reason: str, cause: str = CAUSE_LOST,
                    expiry: float | None = None) -> None:
        """The connection holding ``session`` is gone (``clean``: MQTT DISCONNECT,
        the will is deleted; otherwise it is published, recorded with ``cause``).
        ``expiry``: an MQTT 5 DISCONNECT's new session expiry interval."""
        self._commits.watch(
            self._registry.end(connection, session, clean, reason, cause, expiry),
            "ending the session of " + session.client_id)

    def take_over(self, client_id: str) -> None:
        """Close whoever holds the session of ``client_id`` (its will fires)."""
        self._registry.take_over(client_id)

    def add_topic_receiver(self, key: str, topic_filter: str, identity: Identity,
                           qos: int, dynamic: bool = False,
                           consumer: Consumer | None = None) -> Session | None:
        """An AMQP receiver on a topic filter: a session of its own, subscribed (None
        if refused).  Nothing is delivered until ``start_topic_receiver``.
        ``dynamic``: the filter is the address of the receiver's dynamic node.
        ``consumer``: for a ``$queue/`` filter, its group and mode (attach
        properties); its deliveries are acknowledged by their outcomes (``settle``),
        or on send when ``qos`` is 0 (pre-settled)."""
        session = self._registry.add_link_subscriber(key)
        codes, _ = self._router.subscribe(session, identity, [(topic_filter, qos)],
                                          native=True, dynamic=dynamic, consumer=consumer)
        if codes[0] >= SUBSCRIBE_FAILURE:
            self._registry.remove_link_subscriber(key)
            return None
        return session

    def start_topic_receiver(self, session: Session, link: ClientLink) -> None:
        """Deliver ``session`` to ``link``: its filter's retained messages first."""
        self.activate(session, link, "amqp")
        self._router.send_retained(session, list(session.subscriptions.items()))

    def detach_topic_receiver(self, key: str) -> None:
        self._registry.remove_link_subscriber(key)

    def list_subscriptions(self, client_id: str, identity: Identity | None = None
                           ) -> tuple[dict[str, int], Deferred[None] | None]:
        """AMQP_LIST: the subscriptions of ``client_id``'s persistent session, which is
        opened (offline, owned by ``identity``'s user) if it has none; the Deferred is
        that session's commit."""
        session, d = self._registry.offline_session(
            client_id, identity.username if identity is not None else None)
        return (dict(session.subscriptions) if session.persistent else {}), d

    def subscribe_client(self, client_id: str, identity: Identity,
                         requests: Sequence[tuple[str, int]]
                         ) -> tuple[Session | None, list[int], Deferred[None] | None]:
        """AMQP_SUBSCRIBE: subscribe the session of ``client_id``, created offline and
        persistent if it has none (and at least one filter can be granted).  The
        Deferred (None when every filter was refused) fires once the session and its
        subscriptions are durable."""
        if client_id not in self._registry.sessions and not any(
                self._router.may_subscribe(identity, f) for f, _ in requests):
            return None, [SUBSCRIBE_FAILURE] * len(requests), None  # nothing is created
        session, created = self._registry.offline_session(client_id, identity.username)
        codes, d = self._router.subscribe(session, identity, requests)
        if d is None:
            d = created
        if all(code >= SUBSCRIBE_FAILURE for code in codes):
            self._commits.watch(d, "creating a session")
            return session, codes, None
        return session, codes, d

    def unsubscribe_client(self, client_id: str, filters: Sequence[str]
                           ) -> Deferred[None] | None:
        """AMQP_UNSUBSCRIBE: nothing to do for a client id without a session."""
        session = self._registry.sessions.get(client_id)
        if session is None:
            return None
        return self._router.unsubscribe(session, filters)

    def close_session(self, client_id: str, keep: ClientLink | None,
                      reason: str) -> Deferred[None] | None:
        """AMQP_CLOSE: remove the session of ``client_id`` (its holder is taken over;
        ``keep``, the asking FE's own receiver, just gives it up and stays)."""
        session = self._registry.sessions.get(client_id)
        if session is not None and session.connection is not None:
            holder = session.connection
            if holder is keep:
                self._commits.watch(
                    self._registry.end(holder, session, clean=False, reason=reason),
                    "ending the session of " + client_id)
            else:
                self._registry.take_over(client_id)
        return self.clear_session(client_id, reason, "amqp_close")

    # -- publishing -----------------------------------------------------------

    def may_use_session(self, identity: Identity, client_id: str) -> bool:
        """May ``identity`` act on the session of ``client_id`` from AMQP (a
        ``.publish`` receiver, the subscription service)?"""
        return (self.authorizer.may_use_session(identity, client_id)
                and self.may_claim(identity, client_id))

    def recheck_subscriptions(self) -> None:
        """The access rules changed: every session's subscriptions are checked again
        (as its owner), and those no longer allowed are dropped, durably.  (An AMQP
        topic receiver keeps what its attach was granted until it detaches.)"""
        ops: list[Op] = []
        router = self._router
        for session in list(self._registry.sessions.values()):
            identity = Identity(session.client_id, session.owner, session.protocol or "mqtt")
            ops.extend(router.recheck(session, identity))
        self._commits.watch(self._commits.persist(ops),
                            "dropping subscriptions the access rules no longer allow")

    def may_claim(self, identity: Identity, client_id: str) -> bool:
        """May ``identity`` take over (or act on) the session of ``client_id``?  Not
        when another user owns it and user names are verified (client users exist):
        a session, its subscriptions and its queue belong to the user that made it."""
        session = self._registry.sessions.get(client_id)
        owner = session.owner if session is not None else None
        if owner is None or owner == identity.username:
            return True
        verifies = getattr(self.authenticator, "has_clients", None)  # StoreAuthenticator
        if verifies is None or not verifies():
            return True
        self.log.warn("{u} may not take over the session of {c!r}: it belongs to user {o!r}",
                      u=repr(identity.username) if identity.username else "an anonymous "
                      "client", c=client_id, o=owner)
        return False

    def may_write(self, identity: Identity, topic: str) -> bool:
        """May ``identity`` publish to ``topic`` at all (an AMQP sender's attach)?
        Not counted: no message was refused."""
        return not is_sys_topic(topic) and self.authorizer.may_publish(identity, topic, False)

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        """The publish permission (counted and logged when refused)."""
        return self._router.may_publish(identity, topic, retain)

    def publish(self, message: Message, identity: Identity | None = None, *,
                wait: bool = True, counted: bool = True,
                count_drops: bool = False) -> Published:
        """Route ``message`` (checked against ``identity``'s permissions, if given).

        With ``wait`` False nobody waits for ``Published.durable``: a storage
        failure is logged here and ``durable`` is None.  ``count_drops``: say in
        ``Published.dropped`` how many subscribers' queue bounds refused it.
        """
        queue = self.queues.address(message.topic) if message.topic[:1] == "$" else None
        if queue is not None and is_command(queue, message.topic):
            return self._queue_command(message, identity, queue)
        result = self._router.publish(message, identity, (), counted,
                                      count_drops=count_drops, queue=queue)
        if counted and not result.denied:
            self.topic_stats.note(message.topic)
        if wait or result.durable is None:
            return result
        self._commits.watch(result.durable, "routing a message")
        return Published(None, result.congested, result.denied, blocked=result.blocked)

    def _queue_command(self, message: Message, identity: Identity | None,
                       address: QueueAddress | str) -> Published:
        """``$queue/<name>/$ack|$nack|$reject`` from an MQTT 5 member (user
        properties ``message-id``, ``group-id``, ``reason``): ``durable`` fires once
        the change is stored; ``refusal`` says why it was not taken."""
        client_id = identity.client_id if identity is not None else message.publisher
        session = self._registry.sessions.get(client_id or "")
        if session is None:
            return Published(refusal=Refusal(0x80, "only a consumer's session may "
                                             "acknowledge queue messages"))
        props = message.props
        durable, refusal = self.queues.command(
            session, address, message.topic,
            props.user_properties if props is not None else ())
        return Published(durable, refusal=refusal)

    def _publish_with(self, message: Message, extra_ops: Sequence[Op]) -> Published:
        self.topic_stats.note(message.topic)        # wills
        return self._router.publish(message, None, extra_ops)

    def publish_qos2(self, session: Session, message: Message, identity: Identity | None,
                     packet_id: int, count_drops: bool = False) -> Published:
        """An inbound QoS 2 PUBLISH: routed once per packet id, which is stored with
        it; ``durable`` is what PUBREC waits for (a duplicate waits behind whatever
        commit is still pending, e.g. the first copy's).  The deliveries wait too:
        the adapter opens ``Published.gate`` once PUBREC is out, so the publisher
        has its PUBREC before any subscriber (itself included) has the message."""
        if session.inbound_seen(packet_id):
            return Published(self._commits.barrier())
        queue = self.queues.address(message.topic) if message.topic[:1] == "$" else None
        if queue is not None and is_command(queue, message.topic):
            command = self._queue_command(message, identity, queue)
            if command.refusal is None:
                # Kept as any QoS 2 id, so that PUBREL finds it (PUBCOMP 0) and a
                # re-sent PUBLISH is not applied twice; a refusal ends at PUBREC.
                self._commits.background(session.inbound_add(packet_id),
                                         "recording a QoS 2 packet id")
            return command
        result = self._router.publish(message, identity, session.inbound_add(packet_id),
                                      hold=True, count_drops=count_drops, queue=queue)
        if not result.denied:
            self.topic_stats.note(message.topic)
        if result.durable is not None:
            result.durable.addErrback(_forget_inbound, session, packet_id)
        if result.refusal is not None or result.denied:
            # A refused queue publish or a denied one is not routed: its packet id
            # must not make the client's next PUBLISH with that id look like a
            # duplicate (an MQTT 5 client's exchange ends at the failing PUBREC; a
            # 3.1.1 client's PUBREL of it still gets PUBCOMP, and a re-sent copy is
            # denied again).
            self._commits.background(session.inbound_release(packet_id),
                                     "forgetting a refused QoS 2 packet id")
        return result

    def release_qos2(self, session: Session, packet_id: int) -> Deferred[None] | None:
        """PUBREL from the publisher: forget its packet id; PUBCOMP waits for this."""
        return self._commits.persist(session.inbound_release(packet_id))

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Session, identity: Identity,
                  requests: Sequence[tuple[str, int]], options: Sequence[int] = (),
                  consumer: Consumer | None = None
                  ) -> tuple[list[int], Deferred[None] | None]:
        """Add subscriptions; returns the SUBACK codes and the commit to wait for.
        ``options``: MQTT 5 subscription options per request (``Session.sub_options``).
        ``consumer``: how ``$queue/`` filters join their queue's consumer group (MQTT
        5 user properties ``consumer-group``, ``consumer-mode``, ``stream-offset``)."""
        return self._router.subscribe(session, identity, requests, options=options,
                                      consumer=consumer)

    def send_retained(self, session: Session, grants: Iterable[tuple[str, int]]) -> None:
        """After SUBACK: the retained messages of each granted filter, retain set."""
        self._router.send_retained(session, grants)

    def unsubscribe(self, session: Session, filters: Sequence[str]) -> Deferred[None] | None:
        return self._router.unsubscribe(session, filters)

    # -- outbound acknowledgements and settlement ------------------------------

    def acknowledged(self, session: Session, packet_id: int) -> None:
        """PUBACK (or Accepted on an AMQP delivery of QoS 1)."""
        self._commits.background(session.acknowledge(packet_id))
        self._router.room(session)
        self._flow.resume_paused()

    def received(self, session: Session, packet_id: int) -> None:
        """PUBREC: PUBREL goes out once the RELEASED state is durable."""
        d = self._commits.persist(session.received(packet_id))
        if d is not None:
            d.addCallback(lambda _: session.pubrel_durable(packet_id))
            self._commits.watch(d, "recording a PUBREC")

    def release_outbound(self, client_id: str, packet_id: int
                         ) -> tuple[Deferred[None] | None, Callable[[], None]]:
        """AMQP_PUBREL from an FE (it got PUBREC): mark the QoS 2 delivery released.
        Returns the commit the FE's Accepted waits for, and what to call once that
        Accepted is out: it sends the release to the session's link (the FE settles
        the original delivery when its AMQP_PUBREL is settled, so its answer goes
        first)."""
        session = self._registry.sessions.get(client_id)
        if session is None:
            return None, _nothing

        def release() -> None:
            link = session.link
            if link is not None:
                link.send_pubrel(packet_id)

        return self._commits.persist(session.mark_released(packet_id)), release

    def completed(self, session: Session, packet_id: int) -> None:
        """PUBCOMP (or the final settle of a QoS 2 delivery over AMQP)."""
        self._commits.background(session.completed(packet_id))
        self._router.room(session)
        self._flow.resume_paused()

    def rejected(self, session: Session, packet_id: int, reason: str | None = None) -> None:
        """AMQP Rejected: the delivery is dropped, counted (a durable queue's goes to
        its dead-letter queue with ``reason``)."""
        entry = session.inflight.get(packet_id)
        if entry is not None and entry.receipt is not None:
            entry.receipt.settled(session, entry, "rejected", False, reason)
            return
        self.stats.messages_rejected += 1
        session.dropped_rejected += 1
        self._commits.background(session.drop(packet_id))
        self._router.room(session)
        self._flow.resume_paused()

    def settle(self, session: Session, packet_id: int, outcome: Outcome,
               failed: bool = False, reason: str | None = None) -> None:
        """An AMQP receiver settled the delivery of ``packet_id`` with ``outcome``
        (``failed``: Modified with delivery-failed; ``reason``: Rejected's error
        description).  Accepted finishes QoS 1, and QoS 2 unless an FE released it
        through ``$mqtt.<id>.pubrel`` (then AMQP_PUBREL's settle completes it).
        On a durable queue's delivery: Accepted acknowledges, Released and Modified
        make it visible again, Rejected dead-letters it."""
        if outcome is not _ACCEPTED:
            entry = session.inflight.get(packet_id)
            if entry is not None and entry.receipt is not None:
                entry.receipt.settled(session, entry, outcome.value, failed, reason)
                return
            if outcome is _RELEASED or outcome is _MODIFIED:
                session.redeliver(packet_id, failed)
                return
        if outcome is _REJECTED:
            self.rejected(session, packet_id, reason)
        elif session.awaiting_release(packet_id) is False:
            if session.inflight[packet_id].qos == 1:
                self.acknowledged(session, packet_id)
            else:
                self.completed(session, packet_id)

    def dropped(self, session: Session, topic: str) -> None:
        """A delivery to ``session`` was dropped by its link (QoS 0 over its bound)."""
        session.drop_congested(topic)

    # -- flow control ---------------------------------------------------------

    def congested_for(self, topic: str) -> bool:
        """True if an online subscriber of ``topic`` is past its high-water mark."""
        return self._router.congested_for(topic)

    def pause_until_drained(self, key: int, resume: Callable[[], None],
                            sessions: Sequence[Congestible] | None = None) -> None:
        """Publisher ``key`` stopped reading; ``resume`` once ``sessions`` drained."""
        self._flow.pause_until_drained(key, resume, sessions)

    def forget_paused(self, key: int) -> None:
        self._flow.forget(key)
        self.queues.alarm.forget(key)

    def when_queues_writable(self, key: int, resume: Callable[[], None]) -> None:
        """Publisher ``key`` stopped (``Published.blocked``: the durable queues are
        full, on disk); ``resume`` it once they have room (``forget_paused`` drops
        it)."""
        self.queues.alarm.wait(key, resume)

    def link_drained(self, session: Session | None) -> None:
        """A congested link can take more again: send its queue, wake publishers."""
        if session is not None:
            session.pump()
            self._router.room(session)   # (retained messages owed, shared backlogs)
        self._flow.drained(session)
        if session is not None:
            self.queues.link_drained(session)

    # -- wills ----------------------------------------------------------------

    def may_set_will(self, will: WillMessage, identity: Identity | None) -> bool:
        """A valid will topic the owner may publish to."""
        return self._wills.allowed(will, identity)

    def set_will(self, will: WillMessage) -> Deferred[None] | None:
        """Store (or replace) the will of ``will.owner`` (AMQP_WILL, also mid-connection)."""
        return self._commits.persist(self._wills.put(will))

    def clear_will(self, owner: str, origin: str | None = None) -> Deferred[None] | None:
        return self._commits.persist(self._wills.pop(owner, origin))

    def fire_will(self, owner: str, reason: str, origin: str | None = None
                  ) -> Deferred[None] | None:
        """Publish the will of ``owner`` (of ``origin`` only, if given) and delete it;
        fires once durable, None if there was no such will."""
        return self._wills.fire(owner, reason, origin)

    def will_owner_returned(self, owner: str) -> None:
        """An AMQP will link named ``owner`` attached: a will of that name stored
        before a restart is not published (its grace timer stops, it is deleted)."""
        if self._wills.owner_returned(owner):
            self.log.info("{o} is back within the will grace period; its will from before "
                          "the restart is not published", o=owner)
            self._commits.watch(self.clear_will(owner), "clearing a will")

    def will_link_ended(self, owner: str, brute: bool, reason: str) -> None:
        """The AMQP will link of ``owner`` is gone: detached with an error, lost or
        timed out (``brute``) publishes its will, a clean detach deletes it."""
        if self._commits.stopping:
            return  # the grace rule decides at the next start
        if brute:
            cause = CAUSE_KEEPALIVE if "idle time-out" in reason else CAUSE_LOST
            self._commits.watch(self._wills.fire(owner, reason, "amqp", cause),
                                "publishing will of " + owner)
        else:
            self._commits.watch(self.clear_will(owner, "amqp"), "clearing a will")

    # -- operator commands (console); each answers once the change is durable --

    def disconnect_client(self, client_id: str, with_will: bool, reason: str) -> bool:
        """Close the connection holding the session of ``client_id``; its will fires
        only if asked.  False if nothing holds that session."""
        held, done = self._disconnect_holder(client_id, with_will, reason)
        self._commits.watch(done, "disconnecting " + client_id)
        return held

    def _disconnect_holder(self, client_id: str, with_will: bool, reason: str
                           ) -> tuple[bool, Deferred[None] | None]:
        """``disconnect_client``: whether something held the session, and the
        commit of its end."""
        session = self._registry.sessions.get(client_id)
        if session is None or session.connection is None:
            return False, None
        connection = session.connection
        dropped_will = None if with_will else self._commits.persist(self._wills.pop(client_id))
        ended = self._registry.end(connection, session, clean=not with_will, reason=reason,
                                   cause=CAUSE_CONSOLE)
        connection.close(reason)
        return True, all_durable([dropped_will, ended])

    def disconnect(self, key: str, with_will: bool, reason: str
                   ) -> tuple[int, Deferred[None]] | None:
        """Close the live connection ``key``: its wills fire (or are deleted first),
        the session it holds ends.  Returns how many wills were published and a
        Deferred that fires once all of it is durable (or fails if a commit did);
        None if ``key`` is not connected."""
        conn = self._registry.connections.get(key)
        if conn is None:
            return None
        info = conn.info()
        fired = 0
        commits: list[Deferred[None] | None] = []
        for owner in will_owners(self._wills.wills, info):
            if with_will:
                d = self._wills.fire(owner, reason, cause=CAUSE_CONSOLE)
                fired += d is not None
                commits.append(d)
            else:
                commits.append(self._commits.persist(self._wills.pop(owner)))
        sid = info.session_id
        session = self._registry.sessions.get(sid) if sid is not None else None
        # Only the session this very connection holds (an MQTT client): an AMQP
        # connection's session links end with the connection, and a .publish receiver
        # still waiting for its session must not close whoever holds it.
        holder: object = session.connection if session is not None else None
        if sid is not None and holder is conn:
            commits.append(self._disconnect_holder(sid, with_will, reason)[1])
        if self._registry.connections.get(key) is conn:
            conn.close(reason)
        return fired, self._durable(commits)

    def force_will(self, key: str, keep_connected: bool, reason: str
                   ) -> tuple[list[str], Deferred[None]] | None:
        """Publish the wills of connection ``key``: a copy, the client staying
        connected with its will, or for real with the client disconnected.  Returns
        the owners published and a Deferred that fires once durable; None if
        ``key`` is not connected."""
        conn = self._registry.connections.get(key)
        if conn is None:
            return None
        owners = will_owners(self._wills.wills, conn.info())
        if not owners:
            return [], self._commits.barrier()
        if keep_connected:
            return owners, self._durable(
                [self._wills.publish_copy(owner, reason) for owner in owners])
        done = self.disconnect(key, True, reason)
        assert done is not None
        return owners, done[1]

    def clear_session(self, client_id: str, reason: str, why: str = "console"
                      ) -> Deferred[None] | None:
        """Disconnect (without will) and delete subscriptions, queue and in-flight
        state (recorded as cleared for ``why``); None if there is no such session.
        The Deferred fires once all of it is durable, or fails if a commit did."""
        _, disconnected = self._disconnect_holder(client_id, False, reason)
        session = self._registry.sessions.get(client_id)
        if session is None:
            self._commits.watch(disconnected, "disconnecting " + client_id)
            return None
        return self._durable([disconnected,
                              self._commits.persist(self._registry.discard(session, why))])

    def _durable(self, commits: Sequence[Deferred[None] | None]) -> Deferred[None]:
        """Fires once ``commits`` (and everything asked before) are durable."""
        return all_durable([*commits, self._commits.barrier()]) or self._commits.barrier()

    def debug_client(self, client_id: str, duration: float) -> tuple[float, int]:
        """Log the packets of ``client_id`` for ``duration`` seconds (0 stops): its
        live connection now, and any it opens before the deadline.  Returns the
        deadline and how many live connections started (a ValueError when too many
        clients are being debugged)."""
        until = self.client_debug.enable(client_id, duration)
        on = until > self.clock.seconds()
        started = 0
        for conn in list(self._registry.connections.values()):
            if conn.info().client_id != client_id:
                continue
            # MQTT connections log their packets, AMQP ones their frames.
            if on and hasattr(conn, "start_debug"):
                conn.start_debug(until)
                started += 1
            elif not on and hasattr(conn, "stop_debug"):
                conn.stop_debug()
        return until, started

    def record_console_action(self, user: str, action: str, target: str) -> None:
        """An operator acted through the console (the archive keeps the audit trail)."""
        self.recorder.event(self.clock.seconds(), CONSOLE_ACTION, None, user=user,
                            action=action, target=target)

    # -- durable queues (the console) ------------------------------------------------

    def queue_views(self) -> list[QueueView]:
        """Every durable queue with its groups, frozen."""
        return self.queues.views()

    def browse_queue(self, name: str, start: int = 0, limit: int = 50
                     ) -> list[QueueMessageView]:
        return self.queues.browse(name, start, limit)

    def purge_queue(self, name: str) -> Deferred[None] | None:
        """Remove every message of queue ``name``; fires once durable."""
        return self.queues.purge(name)

    def delete_queue(self, name: str) -> Deferred[None] | None:
        return self.queues.delete(name)

    def requeue_dead(self, dlq_name: str, offset: int | None = None
                     ) -> tuple[int, Deferred[None] | None]:
        """Move one (``offset``) or every message of ``$dlq/<name>`` back to its
        origin queue; returns how many moved and the commit."""
        return self.queues.requeue(dlq_name, offset)

    def set_queue_retention(self, name: str, retention: Retention) -> Deferred[None] | None:
        return self.queues.set_retention(name, retention)

    def delete_retained(self, topic: str) -> Deferred[None] | None:
        return self._router.delete_retained(topic)

    def delete_retained_matching(self, topic_filter: str) -> tuple[int, Deferred[None] | None]:
        return self._router.delete_retained_matching(topic_filter)

    # -- periodic work --------------------------------------------------------

    def expire_sessions(self) -> None:
        self._registry.expire()

    def publish_sys(self) -> None:
        self._sys.publish()

    def dropped_congested(self) -> int:
        """Of ``dropped_total``: QoS 0 messages dropped for clients that did not read."""
        return self._registry.congested_total()

    def dropped_total(self) -> int:
        return self._registry.dropped_total()

    def dropped_by_protocol(self) -> dict[str, tuple[int, int, int]]:
        """(dropped, of which congested, of which rejected) by the session's protocol
        family."""
        return self._registry.dropped_by_protocol()


def _nothing() -> None:
    pass


def _forget_inbound(failure: object, session: Session, packet_id: int) -> object:
    """The commit holding a QoS 2 packet id failed: its retry must be routed again."""
    session.inbound_qos2.discard(packet_id)
    return failure
