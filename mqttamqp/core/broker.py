"""The broker's port: the one entry point protocol adapters use, and the hub that
wires the core's parts.

``Broker`` builds the parts, one concern each, and hands each caller the part it
needs; it holds no rules of its own:

* ``commits.CommitBatcher``: batches, barriers, the end-of-batch flush, stopping;
* ``clients.registry.SessionRegistry`` (``Broker.registry``): sessions, takeover,
  expiry, live connections;
* ``clients.gate.ClientGate`` (``Broker.gate``): admission, bans, authentication,
  who may claim a session, the publish rate;
* ``clients.wills.Wills``: wills and the grace rule after a restart;
* ``clients.gateway.GatewaySessions`` (``Broker.gateway``): what an MQTT front end
  asks over the MQTT-over-AMQP control services;
* ``routing.router.Router`` (``Broker.router``): publish, subscribe, retained,
  shared groups; ``routing.publishing.Publishing`` (``Broker.publishing``): queue
  commands, exactly-once QoS 2, topic counts; ``routing.settlement.Settlement``:
  acknowledgements and outcomes;
* ``queues.manager.QueueManager`` (``Broker.queues``): the durable queues;
* ``exchanges.exchanges.Exchanges`` (``Broker.exchanges``): AMQP 0.9.1's exchanges,
  bindings and declared queues over the queue manager;
* ``transactions.Transactions`` (``Broker.transactions``): local transactions,
  AMQP 1.0's and 0.9.1's, held until commit;
* ``sessions.flow.FlowControl``: paused publishers and the stall rule;
* ``systopics.SysTopics`` (``Broker.sys_topics``): ``$SYS``;
* ``readmodel.ReadModel`` (``Broker.view``): frozen views for the console;
* ``commands.ConsoleCommands`` (``Broker.commands``): what the console does.

The port (the methods of ``Broker``) is what MQTT, AMQP and the coming adapters
call: connect and attach a session, publish, subscribe, settle, flow control,
wills over AMQP, disconnect.  Many are the parts' own methods, bound here under
the port's names (no extra call on the hot paths).  Commands return result
values (``Published``, ``Opened``, Deferreds that fire once a change is
durable); nothing is reported through attributes read afterwards.  The store is
given at construction; ``shutdown()`` stops everything and from then on nothing
more is stored or acknowledged.

What it must not do: parse bytes, touch sockets, or wait on storage.  Adapters
never compose store operations or touch session internals: every durable change
goes through a command of the port or of a part it hands out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mqttamqp.core.auth import AllowAll, Authenticator, Authorizer, Guards, Identity, NoBans
from mqttamqp.core.clients.clientdebug import ClientDebug
from mqttamqp.core.clients.gate import ClientGate
from mqttamqp.core.clients.gateway import GatewaySessions
from mqttamqp.core.clients.live import LiveConnections
from mqttamqp.core.clients.registry import Opened, SessionRegistry
from mqttamqp.core.clients.wills import Wills
from mqttamqp.core.clock import Clock
from mqttamqp.core.commands import ConsoleCommands
from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.exchanges.exchanges import Exchanges
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, WillMessage
from mqttamqp.core.persistence import Op, StateStore
from mqttamqp.core.queues.addresses import Consumer
from mqttamqp.core.queues.budget import FreeSpace
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.readmodel import ReadModel
from mqttamqp.core.recorder import CAUSE_LOST, NoRecorder, Recorder
from mqttamqp.core.routing.published import SUBSCRIBE_FAILURE, Published
from mqttamqp.core.routing.publishing import Publishing, TopicExchange
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.routing.router import Router
from mqttamqp.core.routing.settlement import Outcome, Settlement
from mqttamqp.core.routing.topicstats import TopicStats
from mqttamqp.core.sessions.entries import ClientLink
from mqttamqp.core.sessions.flow import FlowControl
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.systopics import SysTopics
from mqttamqp.core.topics import SubscriptionTrie
from mqttamqp.core.transactions import Transactions

__all__ = ["Broker", "Opened", "Outcome", "Published", "SUBSCRIBE_FAILURE"]


class Broker:
    log = Logger()

    def __init__(self, clock: Clock, store: StateStore, limits: Limits | None = None,
                 authenticator: Authenticator | None = None,
                 authorizer: Authorizer | None = None,
                 recorder: Recorder | None = None,
                 free_space: FreeSpace | None = None,
                 guards: Guards | None = None) -> None:
        """``free_space``: bytes free on the data directory's file system, read every
        two seconds for ``--disk-free-limit`` (None: no free-disk watermark).
        ``guards``: the ban list and rate limits (``security.admission.guards``;
        None: nobody banned, no rate limited)."""
        self.clock = clock
        self.store = store
        self.limits = limits = limits if limits is not None else Limits()
        self.authenticator: Authenticator = authenticator or AllowAll()
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.recorder: Recorder = recorder if recorder is not None else NoRecorder()
        self.stats = stats = BrokerStats(seconds=clock.seconds)
        self._commits = commits = CommitBatcher(store, stats, clock.seconds)
        log_limit = LogLimiter(clock.seconds)   # one line per cause a minute
        # Durable queues ($queue/, $dlq/): beside the router, which hands them what
        # is theirs (queue publishes and subscriptions).
        self.queues = QueueManager(clock, commits, limits, log_limit)
        # (a store that cannot read queue messages back gets no memory budget)
        self.queues.attach_storage(getattr(store, "read_queue_messages", None), free_space)
        # AMQP 0.9.1's model over those queues (the 0.9.1 adapter's entry point).
        self.exchanges = Exchanges(self.queues, log_limit, stats)
        self.router = router = Router(clock, commits, stats, self.authorizer, self.recorder,
                                      limits, log_limit, queues=self.queues)
        self.topic_stats = TopicStats()       # per-topic counts for the console
        self._flow = flow = FlowControl(clock, limits.stall_timeout, self._online)
        self._settlement = settlement = Settlement(commits, stats, router, flow, self.queues)
        self.registry = registry = SessionRegistry(
            clock, limits, commits, stats, router,
            Wills(clock, commits, stats, self.authorizer, self._publish_will,
                  limits.will_grace, self.recorder),
            flow, self.recorder, self.queues)
        self._wills = wills = registry.wills
        self.publishing = publishing = Publishing(commits, router, self.queues,
                                                   self.topic_stats, registry.sessions)
        self.exchanges.attach_topic_space(
            lambda message, identity: publishing.publish(message, identity),
            lambda topic: bool(router.trie.match(topic)
                               or router.groups.shared_trie.match(topic)),
            self._topic_bound,
            router.may_publish)
        self.sys_topics = SysTopics(clock, stats, router, registry, wills, self.recorder,
                                    queues=self.queues)
        self.client_debug = ClientDebug(clock.seconds)
        guards = guards if guards is not None else Guards(NoBans())
        self.gate = ClientGate(clock, limits, stats, self.recorder, log_limit,
                               self.authenticator, self.authorizer, guards,
                               registry.sessions)
        self.commands = ConsoleCommands(clock, commits, registry, wills, router, guards.bans,
                                        self.recorder, self.client_debug)
        self.gateway = GatewaySessions(commits, registry, router,
                                       self.commands.clear_session)
        # Local transactions (AMQP 1.0's coordinator, 0.9.1's tx): held work run in
        # one batch at commit; the queues' acknowledgements stored inside it.
        self.transactions = Transactions(commits, log_limit,
                                         limits.max_transactions_per_connection,
                                         limits.max_transaction_bytes,
                                         flushes=(self.queues.store_done_now,))
        self.view = ReadModel(registry, wills.wills, router, stats, self.recorder,
                              guards.bans, self.topic_stats, queues=self.queues)
        self._loops: list[LoopingCall] = []

        # -- state the read model, ops and tests look at (read-only) --
        self.sessions: dict[str, Session] = registry.sessions
        self.link_subscribers: dict[str, Session] = registry.link_subscribers
        self.connections: LiveConnections = registry.connections
        self.wills: dict[str, WillMessage] = wills.wills
        self.retained: RetainedStore = router.retained
        self.trie: SubscriptionTrie[Session] = router.trie

        # -- the port: the parts' own commands under the port's names --
        # batches (one per socket read): begin_batch(), end_batch(), and
        # after_batch(flush): inside a batch, call ``flush`` when it ends and
        # return True; outside one, return False.
        self.begin_batch = commits.begin
        self.end_batch = commits.end
        self.after_batch = commits.after_batch
        self.barrier = commits.barrier          # fires once all asked so far is durable
        # connections: live after CONNACK / AMQP open (the console lists them, $SYS
        # counts them), gone with a cause of the recorder's (MQTT's, by client id:
        # ``registry.register_client``)
        self.register_connection = registry.register_connection
        self.unregister_connection = registry.unregister_connection
        # sessions: claim (open or resume) the session of a client id, taking it over
        # from whoever holds it; ``activate`` once CONNACK is out
        self.open_session = registry.open
        # activate(session, link, protocol): CONNACK went out, deliver to ``link``
        self.activate = registry.activate
        self.detach_topic_receiver = registry.remove_link_subscriber
        # publishing and subscriptions
        self.may_publish = router.may_publish   # (counted and logged when refused)
        # (the MQTT 3.1.1 flows call ``publishing.publish`` itself, a direct call
        # in the compiled build: wrap ``Publishing``, not this attribute)
        self.publish = publishing.publish
        self.publish_qos2 = publishing.publish_qos2
        self.release_qos2 = publishing.release_qos2
        self.send_retained = router.retained_feed.send
        self.unsubscribe = router.unsubscribe
        # outbound acknowledgements and settlement
        self.acknowledged = settlement.acknowledged
        self.received = settlement.received
        self.completed = settlement.completed
        self.rejected = settlement.rejected
        self.settle = settlement.settle
        # (a part: outcomes a transaction holds use its hold, unhold, still_held
        # and settle_kept)
        self.settlement = settlement
        # flow control: ``Published.congested`` / ``Published.blocked`` publishers
        self.pause_until_drained = flow.pause_until_drained
        self.when_queues_writable = self.queues.alarm.wait
        # wills over AMQP (the will service)
        self.may_set_will = wills.allowed
        self.set_will = wills.store
        self.clear_will = wills.clear
        self.will_owner_returned = wills.returned
        self.will_link_ended = wills.link_ended

    @property
    def wills_in_grace(self) -> int:
        """Wills restored at start whose grace period is still running."""
        return self._wills.in_grace()

    @property
    def stopping(self) -> bool:
        return self._commits.stopping

    def _topic_bound(self, exchange: TopicExchange | None) -> None:
        self.publishing.topic_exchange = exchange

    def _online(self) -> Iterable[Session]:
        return self.registry.online()

    def _publish_will(self, message: Message, extra_ops: Sequence[Op]) -> Published:
        return self.publishing.publish_with(message, extra_ops)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Rebuild from the store, arm the grace timers of orphaned wills and loops."""
        self.stats.started = self.clock.seconds()
        snap = self.store.load()
        self.router.retained_feed.restore(snap.retained.values())
        self.registry.restore(snap.sessions)
        self._wills.restore(snap.wills.values())
        self.gate.bans.restore(snap.bans)
        self.queues.restore(snap.queues)
        self.exchanges.restore(snap)
        self.queues.alarm.start()
        self.log.info("loaded {r} retained message(s), {s} persistent session(s), "
                      "{q} durable queue(s)", r=len(snap.retained), s=len(snap.sessions),
                      q=len(snap.queues))
        self._start_loop(self.sys_topics.publish, self.limits.sys_interval)
        if self.limits.session_expiry > 0:
            self._start_loop(self.registry.expire, min(60.0, self.limits.session_expiry))

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
        self.registry.stop_timers()
        self.queues.stop()
        self.exchanges.stop()
        self.queues.alarm.stop()
        self._wills.stop()
        self._flow.stop()

    def shutdown(self) -> None:
        """The process is stopping: from now on nothing is stored, so nothing is
        acknowledged, and connections end without firing wills (the grace rule
        decides at the next start)."""
        self._commits.stopping = True
        self.stop()

    # -- sessions -------------------------------------------------------------

    def end_session(self, connection: ClientLink, session: Session, clean: bool,
                    reason: str, cause: str = CAUSE_LOST,
                    expiry: float | None = None) -> None:
        """The connection holding ``session`` is gone (``clean``: MQTT DISCONNECT,
        the will is deleted; otherwise it is published, recorded with ``cause``).
        ``expiry``: an MQTT 5 DISCONNECT's new session expiry interval."""
        self._commits.watch(
            self.registry.end(connection, session, clean, reason, cause, expiry),
            "ending the session of " + session.client_id)

    def add_topic_receiver(self, key: str, topic_filter: str, identity: Identity,
                           qos: int, dynamic: bool = False,
                           consumer: Consumer | None = None,
                           selector: Callable[[Message], bool] | None = None
                           ) -> Session | None:
        """An AMQP receiver on a topic filter: a session of its own, subscribed (None
        if refused).  Nothing is delivered until ``start_topic_receiver``.
        ``dynamic``: the filter is the address of the receiver's dynamic node.
        ``consumer``: for a ``$queue/`` filter, its group and mode (attach
        properties); its deliveries are acknowledged by their outcomes (``settle``),
        or on send when ``qos`` is 0 (pre-settled).  ``selector``: only the
        messages it is true of reach the receiver (a queue consumer's is its
        ``Consumer``'s)."""
        session = self.registry.add_link_subscriber(key)
        codes, _ = self.router.subscribe(session, identity, [(topic_filter, qos)],
                                          native=True, dynamic=dynamic, consumer=consumer)
        if codes[0] >= SUBSCRIBE_FAILURE:
            self.registry.remove_link_subscriber(key)
            return None
        if selector is not None:
            self.router.selectors[session] = selector
        return session

    def start_topic_receiver(self, session: Session, link: ClientLink) -> None:
        """Deliver ``session`` to ``link``: its filter's retained messages first."""
        self.activate(session, link, "amqp")
        self.router.retained_feed.send(session, list(session.subscriptions.items()))

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Session, identity: Identity,
                  requests: Sequence[tuple[str, int]], options: Sequence[int] = (),
                  consumer: Consumer | None = None
                  ) -> tuple[list[int], Deferred[None] | None]:
        """Add subscriptions; returns the SUBACK codes and the commit to wait for.
        ``options``: MQTT 5 subscription options per request (``Session.sub_options``).
        ``consumer``: how ``$queue/`` filters join their queue's consumer group (MQTT
        5 user properties ``consumer-group``, ``consumer-mode``, ``stream-offset``)."""
        return self.router.subscribe(session, identity, requests, options=options,
                                      consumer=consumer)

    # -- flow control ---------------------------------------------------------

    def forget_paused(self, key: int) -> None:
        self._flow.forget(key)
        self.queues.alarm.forget(key)

    def link_drained(self, session: Session | None) -> None:
        """A congested link can take more again: send its queue, wake publishers."""
        if session is not None:
            session.pump()
            self.router.room(session)   # (retained messages owed, shared backlogs)
        self._flow.drained(session)
        if session is not None:
            self.queues.link_drained(session)
