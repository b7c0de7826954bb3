"""The router: publish and subscribe, for every protocol alike.

What it owns: the subscription trie; the publish permission check (one place for
MQTT, AMQP and the broker's own messages); routing (trie match, delivery QoS =
min(publish, granted), one copy per session at the highest granted QoS, MQTT 5
subscription options); which deliveries wait for their commit (QoS 2 to a
persistent session) and when a publisher may be acknowledged; which online
subscribers (and shared groups' backlogs) a publish left past their high-water
mark (``Published.congested``); subscriptions and their routes.  Its parts:
``groups.SharedGroups`` (shared groups' deliveries: a member with room, else kept,
stored, by a persistent member, else the group's backlog, fed to members as they
have room again) and ``retained_feed.RetainedFeed`` (the retained messages: kept on
publish, fed to a new subscription's session as it has room).  The port calls
``room`` whenever a session may have room again (an acknowledgement, a drained
link, a session coming online).

What it must not do: know about connections or sockets, or keep sessions (the
registry does); it receives the sessions it routes to through the trie.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.auth import AllowAll, Authorizer, Identity
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import (
    CommitBatcher,
    committed_or_acknowledged,
    fire_when_acknowledged,
)
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import DeleteSubscription, Op, PutSubscription
from mqttamqp.core.queues.addresses import Consumer, QueueAddress, is_queue_topic
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import SUBSCRIBE, UNSUBSCRIBE, Recorder, records
from mqttamqp.core.routing.groups import SharedGroups
from mqttamqp.core.routing.published import (
    SUBSCRIBE_FAILURE,
    Gate,
    Published,
    release_held,
)
from mqttamqp.core.routing.retained_feed import RetainedFeed
from mqttamqp.core.routing.shared import SHARE_PREFIX, SharedGroup, parse_share
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.flow import Congestible, QueueBoundLog
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import (
    SubscriptionTrie,
    is_sys_topic,
    topic_matches,
    validate_topic_filter,
)

__all__ = ["Router", "DYNAMIC_PREFIX"]

# MQTT 5 reason codes the core gives for a refused filter (3.1.1 answers all with 0x80).
NOT_AUTHORIZED = 0x87
SHARED_NOT_SUPPORTED = 0x9E
WILDCARDS_NOT_SUPPORTED = 0xA2
# Dynamic nodes (AMQP receivers with a dynamic source): each topic under this prefix
# belongs to the one receiver that created it.  Anyone may publish to it (that is
# how replies reach it); nobody else may subscribe, and nothing there is retained.
DYNAMIC_PREFIX = "$dynamic/"

_NO_SESSIONS: tuple[Session, ...] = ()
_ROUTED = Published()


class Router:
    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, clock: Clock, commits: CommitBatcher, stats: BrokerStats,
                 authorizer: Authorizer, recorder: Recorder,
                 limits: Limits | None = None, log_limit: LogLimiter | None = None, *,
                 queues: QueueManager) -> None:
        self.limits = limits if limits is not None else Limits()
        self._log_limit = log_limit if log_limit is not None else LogLimiter(clock.seconds)
        self.clock = clock
        self.commits = commits
        self.stats = stats
        self.authorizer = authorizer
        self.recorder = recorder
        self._recording = records(recorder)
        self.trie: SubscriptionTrie[Session] = SubscriptionTrie()
        # Sessions of AMQP topic receivers: the only ones that take messages whose
        # body has no MQTT form (``Message.amqp_only``).
        self.native: set[Session] = set()
        # Durable queues ($queue/, $dlq/): beside the trie, never in it (the broker
        # owns them; queue publishes, subscriptions and members are handed over).
        self._queues = queues
        # Shared subscriptions ($share/<name>/<filter>).
        self.groups = SharedGroups(commits, self.limits, self._log_limit, self.native)
        self._shared = self.groups.shared       # (read on every publish)
        self._waiting = self.groups.waiting     # (read on every acknowledgement)
        self._queue_full = QueueBoundLog(clock, self.limits).dropped
        # Retained messages: kept, and fed to new subscriptions.
        self.retained_feed = RetainedFeed(clock, commits, stats, self.limits,
                                          self._log_limit, self.native, self._queue_full)
        self.retained = self.retained_feed.retained
        self._replays = self.retained_feed.by_session   # (read on retained publishes)

    # -- publishing -----------------------------------------------------------

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        """The permission check of every publish; a refusal is counted and logged.
        ``$SYS`` is the broker's own: no client publishes there (as Mosquitto)."""
        if not is_sys_topic(topic) and self.authorizer.may_publish(identity, topic, retain):
            return True
        self.stats.publish_denied += 1
        if identity.protocol == "amqp":
            self.stats.publish_denied_amqp += 1
        suppressed = self._log_limit.allow("publish_denied")
        if suppressed is not None:   # one line a minute, not one per message
            self.log.warn("publish by {c} to {t!r} denied ({h} more denials since the last "
                          "line)", c=identity.client_id, t=topic, h=suppressed)
        return False

    def publish(self, message: Message, identity: Identity | None = None,
                extra_ops: Sequence[Op] = (), counted: bool = True,
                hold: bool = False, count_drops: bool = False,
                queue: QueueAddress | str | None = None) -> Published:
        """Route ``message``.

        Deliveries to clean sessions, and QoS 0/1 deliveries to persistent ones, go
        out at once; QoS 2 deliveries to persistent sessions are held until the
        commit that stores them (with their packet id).  ``extra_ops`` (e.g. the
        inbound QoS 2 id) are committed in the same batch, even when denied.

        With ``hold`` (inbound MQTT QoS 2) nothing goes out yet: every delivery is
        queued and stored as usual, in the same commit as ``extra_ops``, and sent
        when ``Published.gate`` opens, after the publisher's PUBREC.  A crash after
        the commit loses nothing: the stored copies are delivered after the
        restart, and the stored packet id stops a re-sent PUBLISH from being routed
        again.

        ``queue``: the topic parsed by ``QueueManager.address`` (a ``$queue/`` or
        ``$dlq/`` topic goes to the queues, never the trie); None: parsed here.
        """
        commits = self.commits
        if identity is not None and not self.may_publish(
                identity, message.topic, message.retain):
            return Published(commits.persist(extra_ops), _NO_SESSIONS, True)
        if counted:  # the broker's own $SYS updates are not traffic
            self.stats.messages_received += 1
        if queue is None and message.topic[:1] == "$":
            queue = self._queues.address(message.topic)
        if queue is not None:
            appended, refusal = self._queues.publish(
                message, queue, message.publisher or "(broker)", extra_ops,
                # (MQTT 5 has a negative acknowledgement: 0x97 beats waiting)
                refuse_when_blocked=message.qos > 0 and identity is not None
                and identity.protocol == "mqtt5")
            return Published(appended, refusal=refusal,
                             blocked=refusal is None and self._queues.paused)
        ops: list[Op] = list(extra_ops)
        if message.retain and not message.topic.startswith(DYNAMIC_PREFIX):
            self.retained_feed.keep(message, ops)
        other_ops = len(ops)
        held: list[tuple[Session, int]] = []
        qos1_entries: list[OutEntry] = []
        msg_qos = message.qos
        congested: list[Congestible] | None = None
        matches = self.trie.match(message.topic)
        recording = self._recording and counted and self.recorder.records_messages
        dropped = 0
        if message.amqp_only:
            native = self.native
            matches = {s: q for s, q in matches.items() if s in native}
        share_of: dict[Session, SharedGroup[Session]] | None = None
        kept: set[Session] | None = None
        gate = Gate(message) if hold else None
        if self._shared:
            matches, share_of, dropped, congested, kept = self.groups.add(
                message, matches, gate)
        replaying = message.retain and bool(self._replays)
        for session, granted in matches.items():
            qos = granted if granted < msg_qos else msg_qos
            retain = False
            if session.sub_options:
                # MQTT 5 subscription options: no local, retain as published.
                verdict = _options_verdict(
                    session, message, share_of.get(session) if share_of else None)
                if verdict is None:
                    continue
                retain = verdict
            if gate is not None:
                if qos == 0:
                    gate.add(session, None, retain)  # sent (or dropped) at the opening
                    continue
                entry = session.deliver(message, qos, retain, True)
                if entry is not None:
                    gate.add(session, entry)
                else:       # (QoS 1/2 is refused only at a bound)
                    dropped += 1
            elif recording or count_drops:
                # A QoS 1/2 delivery was refused when no entry came back (expired
                # messages it pushed out are counted by the session, not here).
                drops = session.dropped
                entry = session.deliver(message, qos, retain)
                if entry is None if qos else session.dropped != drops:
                    dropped += 1
            else:
                entry = session.deliver(message, qos, retain)
            if entry is None and qos:
                self._queue_full(session)
            elif replaying and session in self._replays:
                # (it has this topic's retained message now: not again from a replay)
                for replay in self._replays[session]:
                    replay.owed.discard(message.topic)
            if session.expired_ops:   # expired messages made room (MQTT 5)
                ops.extend(session.take_expired_ops())
            if entry is not None and share_of is not None:
                group = entry.share = share_of.get(session)
                if group is not None and (session.link is None
                                          or (kept is not None and session in kept)):
                    # (nobody online, see ``pick``; or kept for the group, ``_keeper``)
                    self.groups.lend(group, session, entry)
            if entry is not None and session.persistent:
                ops.append(entry.put_op(session.client_id))
                if qos == 1 and entry.packet_id in session.inflight:
                    qos1_entries.append(entry)
                else:
                    held.append((session, entry.seq))
            if session.link is not None and session.over_high_water():
                if congested is None:
                    congested = [session]
                else:
                    congested.append(session)
        if recording:
            self.recorder.message(
                message.timestamp, message.topic, msg_qos, message.retain, message.payload,
                message.publisher, identity.username if identity is not None else None,
                (identity.protocol or None) if identity is not None else None,
                len(matches) - dropped,
                dropped)
        # Inside a batch (or while stopping) the Deferred persist returns is ours
        # alone, so it may also be fired early, by acknowledgements.
        owned = commits.owned
        d = commits.persist(ops)
        if gate is not None:
            if d is not None:
                if held:
                    d.addCallback(release_held, held)
                d.addErrback(gate.cancel)
            return Published(d, congested or _NO_SESSIONS, False, gate, dropped)
        if d is None:
            if dropped:
                return Published(None, congested or _NO_SESSIONS, dropped=dropped)
            return _ROUTED if congested is None else Published(None, congested)
        if held:
            # Only once stored: a QoS 2 entry whose commit failed must not go out
            # (the publisher got no PUBREC and will send it again).
            d.addCallback(release_held, held)
        if qos1_entries and not held and other_ops == 0:
            if owned:
                fire_when_acknowledged(d, qos1_entries)
            else:
                d = committed_or_acknowledged(d, qos1_entries, commits.log_failure)
        return Published(d, congested if congested is not None else _NO_SESSIONS,
                         dropped=dropped)

    def room(self, session: Session) -> None:
        """``session`` may have room again (an acknowledgement, a drained link, back
        online): feed it the retained messages it is owed, and the groups it is a
        member of what they hold."""
        if session in self._replays:
            self.retained_feed.feed(session)
        if self._waiting:
            self.groups.room(session)

    def may_subscribe(self, identity: Identity, topic_filter: str) -> bool:
        """A valid filter ``identity`` may subscribe to."""
        shared = parse_share(topic_filter)
        if isinstance(shared, str):
            return False
        inner = topic_filter if shared is None else shared[1]
        return (validate_topic_filter(inner) is None
                and not inner.startswith(DYNAMIC_PREFIX)
                and self.authorizer.may_subscribe(identity, inner))

    def congested_for(self, topic: str) -> bool:
        """True if an online subscriber of ``topic`` (or a shared group's backlog) is
        past its high-water mark."""
        if any(session.over_high_water() for session in self.trie.match(topic)):
            return True
        return self.groups.congested_for(topic)

    # -- subscriptions --------------------------------------------------------

    def subscribe(self, session: Session, identity: Identity,
                  requests: Sequence[tuple[str, int]], *, native: bool = False,
                  dynamic: bool = False, options: Sequence[int] = (),
                  consumer: Consumer | None = None
                  ) -> tuple[list[int], Deferred[None] | None]:
        """Add subscriptions; returns the SUBACK codes and the commit to wait for.

        ``native``: the session is an AMQP topic receiver's.  ``dynamic``: it is the
        receiver of a dynamic node, the one subscriber its address may have.
        ``options``: per request, MQTT 5 subscription options packed as in
        ``Session.sub_options`` (0: none).  ``consumer``: how a ``$queue/`` or
        ``$dlq/`` filter joins its queue (group, mode, ...; None: the defaults).
        """
        if native:
            self.native.add(session)
        codes: list[int] = []
        ops: list[Op] = []
        for index, (topic_filter, qos) in enumerate(requests):
            packed = options[index] if options else 0
            if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
                codes.append(self._subscribe_queue(session, identity, topic_filter, qos,
                                                   consumer, ops))
                continue
            shared = parse_share(topic_filter)
            if isinstance(shared, str):
                problem: str | None = shared
            else:
                problem = validate_topic_filter(topic_filter if shared is None else shared[1])
            if problem is not None:
                self.log.warn("{c} subscribed to an invalid filter {f!r}: {p}",
                              c=session.client_id, f=topic_filter, p=problem)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            if topic_filter.startswith(DYNAMIC_PREFIX) and not dynamic:
                self.log.warn("{c} subscribed to {f!r}: dynamic addresses belong to the "
                              "receiver that created them", c=session.client_id,
                              f=topic_filter)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            inner = topic_filter if shared is None else shared[1]
            # (--no-shared/wildcard-subscriptions are about MQTT clients: AMQP receivers
            # and the console's tail are ``native``.)
            if not native and shared is not None and not self.limits.shared_subscriptions:
                codes.append(SHARED_NOT_SUPPORTED)     # --no-shared-subscriptions
                continue
            if (not native and not self.limits.wildcard_subscriptions
                    and ("+" in inner or "#" in inner)):
                codes.append(WILDCARDS_NOT_SUPPORTED)  # --no-wildcard-subscriptions
                continue
            if not self.authorizer.may_subscribe(identity, inner):
                codes.append(NOT_AUTHORIZED)
                continue
            if (topic_filter not in session.subscriptions
                    and len(session.subscriptions) >= self.limits.max_subscriptions):
                self.stats.limit_hit("subscriptions")
                suppressed = self._log_limit.allow("subscriptions")
                if suppressed is not None:
                    self.log.warn("{c} has {n} subscriptions (--max-subscriptions); {f!r} "
                                  "refused ({h} more refusals since the last line)",
                                  c=session.client_id, n=len(session.subscriptions),
                                  f=topic_filter, h=suppressed)
                codes.append(SUBSCRIBE_FAILURE)
                continue
            granted = min(qos, 2)
            session.set_subscription(topic_filter, granted)
            session.set_options(topic_filter, packed)
            self._route(topic_filter, session, granted)
            if session.persistent:
                # The options ride above the QoS bits of the stored value (old
                # values, 0-2, have none).
                ops.append(PutSubscription(session.client_id, topic_filter,
                                           granted | packed))
            codes.append(granted)
            self.recorder.event(self.clock.seconds(), SUBSCRIBE, session.client_id,
                                topic=topic_filter, qos=granted)
        return codes, self.commits.persist(ops)

    def _subscribe_queue(self, session: Session, identity: Identity, topic_filter: str,
                         qos: int, consumer: Consumer | None, ops: list[Op]) -> int:
        """Join the consumer group of a queue filter; returns the SUBACK code."""
        if not self.authorizer.may_subscribe(identity, topic_filter):
            return NOT_AUTHORIZED
        refusal, queue_ops = self._queues.subscribe(session, topic_filter, qos,
                                                   consumer or Consumer())
        ops.extend(queue_ops)
        if refusal is not None:
            return SUBSCRIBE_FAILURE
        granted = min(qos, 2)
        session.set_subscription(topic_filter, granted)
        if session.persistent:
            ops.append(PutSubscription(session.client_id, topic_filter, granted))
        self.recorder.event(self.clock.seconds(), SUBSCRIBE, session.client_id,
                            topic=topic_filter, qos=granted)
        return granted

    def unsubscribe(self, session: Session, filters: Sequence[str]) -> Deferred[None] | None:
        ops: list[Op] = []
        left = False
        for topic_filter in filters:
            session.sub_options.pop(topic_filter, None)
            if session.subscriptions.pop(topic_filter, None) is not None:
                self._unroute(topic_filter, session)
                left = left or topic_filter.startswith(SHARE_PREFIX)
                self.recorder.event(self.clock.seconds(), UNSUBSCRIBE, session.client_id,
                                    topic=topic_filter)
                if session.persistent:
                    ops.append(DeleteSubscription(session.client_id, topic_filter))
        if left:
            return self.groups.return_entries(session, False, ops)
        return self.commits.persist(ops)

    def restore_subscriptions(self, session: Session, subscriptions: dict[str, int]) -> None:
        """At start-up: the stored subscriptions of ``session``, back in the trie."""
        for topic_filter, stored in subscriptions.items():
            qos = stored & 0x03
            if stored & ~0x03:
                session.set_options(topic_filter, stored & ~0x03)
            session.set_subscription(topic_filter, qos)
            self._route(topic_filter, session, qos)

    def forget_session(self, session: Session) -> None:
        """``session`` is going away: its routes leave the trie (and its queue
        groups)."""
        self.native.discard(session)
        self.commits.background(self._queues.forget_session(session),
                                "leaving queue groups")
        for topic_filter in session.subscriptions:
            self._unroute(topic_filter, session)
        session.subscriptions.clear()
        session.sub_options.clear()
        self.retained_feed.forget(session)
        if self._shared:
            self.commits.watch(self.groups.return_entries(session, True, []),
                               "moving shared messages of " + session.client_id)

    def recheck(self, session: Session, identity: Identity) -> list[Op]:
        """Drop the subscriptions of ``session`` that ``identity`` may not have (a
        session resumed by another identity, or the ACL changed); returns the ops."""
        if isinstance(self.authorizer, AllowAll):
            return []
        refused = [f for f in session.subscriptions if not self.may_subscribe(identity, f)]
        if not refused:
            return []
        self.log.info("{c}: subscriptions no longer allowed for {u} dropped: {f}",
                      c=session.client_id, u=repr(identity.username) if identity.username
                      else "an anonymous client", f=", ".join(repr(f) for f in refused[:10]))
        ops: list[Op] = []
        for topic_filter in refused:
            del session.subscriptions[topic_filter]
            session.sub_options.pop(topic_filter, None)
            self._unroute(topic_filter, session)
            if session.persistent:
                ops.append(DeleteSubscription(session.client_id, topic_filter))
        return ops

    # -- routes: the trie, or a shared group ------------------------------------

    def _route(self, topic_filter: str, session: Session, qos: int) -> None:
        if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
            return   # (a queue membership is the queue manager's: ``member_returned``)
        shared = parse_share(topic_filter)
        if not isinstance(shared, tuple):
            self.trie.add(topic_filter, session, qos)
            return
        self.groups.join(topic_filter, shared[0], shared[1], session, qos)

    def _unroute(self, topic_filter: str, session: Session) -> None:
        if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
            self.commits.background(self._queues.unsubscribe(session, topic_filter),
                                    "leaving a queue group")
            return
        if not self.groups.leave(topic_filter, session):
            self.trie.remove(topic_filter, session)

    def member_left(self, session: Session) -> list[Op]:
        """``session`` goes offline (or away, ``forget_session`` follows): its shared
        QoS 1 messages, and its shared QoS 2 messages not yet sent, become loans to
        their groups, moved at once to members with room (the rest as members get
        room, or back to it if it returns first; see ``core.routing.shared``).  Its durable
        queue deliveries go back to their groups.  The moves are stored by the
        router itself; nothing is returned for the caller's commit."""
        self._queues.member_left(session)
        if self._shared:
            self.groups.member_left(session)
        return []


def _options_verdict(session: Session, message: Message,
                     picked_by: SharedGroup[Session] | None = None) -> bool | None:
    """MQTT 5 subscription options of ``session`` for ``message``: None when every
    filter that delivers it is "no local" and the session published it itself; else
    the retain flag to deliver with (set if such a filter is "retain as published"
    and the message was published retained).  A shared filter delivers it only when
    its group picked this session (``picked_by``)."""
    options = session.sub_options
    picked = picked_by.key if picked_by is not None else None

    def delivers(f: str) -> bool:
        if f.startswith(SHARE_PREFIX):
            return f == picked
        return topic_matches(f, message.topic)

    if message.publisher == session.client_id:
        if not any(delivers(f) for f in session.subscriptions
                   if not options.get(f, 0) & NO_LOCAL):
            return None
    if not message.retain:
        return False
    return any(packed & RETAIN_AS_PUBLISHED and delivers(f) for f, packed in options.items())
