"""The router: publish, subscribe and retained messages, for every protocol alike.

What it owns: the subscription trie and the retained set; the publish permission
check (one place for MQTT, AMQP and the broker's own messages); routing (trie
match, delivery QoS = min(publish, granted), one copy per session at the highest
granted QoS); which deliveries wait for their commit (QoS 2 to a persistent
session) and when a publisher may be acknowledged; which online subscribers (and
shared groups' backlogs) a publish left past their high-water mark
(``Published.congested``); shared groups' deliveries (``core.shared``: a member
with room, else kept, stored, by a persistent member, else the group's backlog, fed
to members as they have room again); the retained messages a new subscription is
owed, fed to its session as it has room (``Session.has_room``: its in-flight window
for QoS 1/2, its link's write buffer or credit for QoS 0) rather than pushed into
its bounded queue at once.  The
façade calls ``room`` whenever a session may have room again (an acknowledgement,
a drained link, a session coming online).

What it must not do: know about connections or sockets, or keep sessions (the
registry does); it receives the sessions it routes to through the trie.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.auth import AllowAll, Authorizer, Identity
from mqttamqp.core.clock import Clock
from mqttamqp.core.commits import (
    CommitBatcher,
    committed_or_acknowledged,
    fire_when_acknowledged,
)
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import (
    DeleteRetained,
    DeleteSubscription,
    Op,
    PutRetained,
    PutSubscription,
    QueuedState,
)
from mqttamqp.core.queues.addresses import Consumer, QueueAddress, Refusal, is_queue_topic
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import SUBSCRIBE, UNSUBSCRIBE, Recorder, records
from mqttamqp.core.routing.retained import RetainedStore
from mqttamqp.core.routing.shared import SHARE_PREFIX, SharedGroup, parse_share
from mqttamqp.core.sessions.flow import Congestible
from mqttamqp.core.sessions.session import NO_LOCAL, RETAIN_AS_PUBLISHED, OutEntry, Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import (
    SYS_PREFIX,
    SubscriptionTrie,
    is_sys_topic,
    topic_matches,
    validate_topic_filter,
)
from mqttamqp.records import record

__all__ = ["Gate", "Router", "Published", "SUBSCRIBE_FAILURE", "DYNAMIC_PREFIX"]

SUBSCRIBE_FAILURE = 0x80
# MQTT 5 reason codes the core gives for a refused filter (3.1.1 answers all with 0x80).
NOT_AUTHORIZED = 0x87
SHARED_NOT_SUPPORTED = 0x9E
WILDCARDS_NOT_SUPPORTED = 0xA2
# Dynamic nodes (AMQP receivers with a dynamic source): each topic under this prefix
# belongs to the one receiver that created it.  Anyone may publish to it (that is
# how replies reach it); nobody else may subscribe, and nothing there is retained.
DYNAMIC_PREFIX = "$dynamic/"

_NO_SESSIONS: tuple[Session, ...] = ()
# Retained messages fed to a session in one go before the reactor gets a turn (the
# rest follows at once, or when the session has room again).
REPLAY_SLICE = 256


class _Replay:
    """The retained messages one subscription (``filter``) is still owed: the topics
    that had one when it subscribed (each read again when its turn comes: a message
    deleted meanwhile is skipped, a replaced one goes out as it is now, and one the
    session got live meanwhile, published retained, is not sent again: ``owed``)."""

    __slots__ = ("filter", "granted", "index", "owed", "topics")

    def __init__(self, topic_filter: str, topics: list[str], granted: int) -> None:
        self.filter = topic_filter
        self.topics = topics
        self.owed = set(topics)
        self.granted = granted
        self.index = 0


class Gate:
    """The deliveries of one message routed with ``hold``: queued (and stored in
    the publish's commit) but not sent until ``open``, which the publisher's
    adapter calls once its acknowledgement (MQTT PUBREC) is out.  ``cancel`` (the
    commit failed) takes them back instead.  Whichever comes first wins."""

    __slots__ = ("_done", "_entries", "_later", "_message", "_qos0", "_undo")

    def __init__(self, message: Message) -> None:
        self._message = message
        self._entries: list[tuple[Session, OutEntry]] = []
        self._qos0: list[tuple[Session, bool]] = []
        self._later: list[Callable[[], None]] = []   # shared groups' backlogs
        self._undo: list[Callable[[], None]] = []
        self._done = False

    def later(self, call: Callable[[], None], undo: Callable[[], None]) -> None:
        """Call ``call`` at the opening (a shared group holds the message then), or
        ``undo`` if the gate is cancelled instead."""
        self._later.append(call)
        self._undo.append(undo)

    def add(self, session: Session, entry: OutEntry | None, retain: bool = False) -> None:
        """A gated QoS 1/2 ``entry`` of ``session``, or (None) a QoS 0 delivery with
        its retain flag (MQTT 5 retain as published)."""
        if entry is None:
            self._qos0.append((session, retain))
        else:
            self._entries.append((session, entry))

    def open(self) -> None:
        if self._done:
            return
        self._done = True
        for session, entry in self._entries:
            session.ungate(entry)
        message = self._message
        for session, retain in self._qos0:
            session.deliver(message, 0, retain)
        for call in self._later:
            call()
        self._entries = []
        self._qos0 = []
        self._later = []
        self._undo = []

    def cancel(self, failure: Failure) -> Failure:
        if not self._done:
            self._done = True
            for session, entry in self._entries:
                session.withdraw(entry)
            for undo in self._undo:
                undo()
            self._entries = []
            self._qos0 = []
            self._later = []
            self._undo = []
        return failure


@record
class Published:
    """What a publish did.

    ``durable``: fires once everything the publisher may be told is safe (None:
    nothing to wait for).  ``congested``: online subscribers it fed that are past
    their high-water mark (the publisher should stop being read for a while).
    ``denied``: the publisher may not publish there; nothing was routed.
    ``gate``: with ``hold``, what sends the deliveries (see ``Gate``).
    ``dropped``: deliveries refused by a subscriber's queue bound (counted only
    when asked, ``count_drops``, or while recording).
    ``refusal``: a durable queue refused the message or acknowledgement (why, and
    the MQTT 5 reason code); nothing was stored for it.
    ``blocked``: the durable queues are full on disk (``--queue-max-total-bytes``,
    ``--disk-free-limit``) or their appends wait for the writer past a bound: stop
    reading the publisher (AMQP: no more credit) and resume it through
    ``Broker.when_queues_writable``.
    """

    durable: Deferred[None] | None = None
    congested: Sequence[Congestible] = _NO_SESSIONS
    denied: bool = False
    gate: Gate | None = None
    dropped: int = 0
    refusal: Refusal | None = None
    blocked: bool = False


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
        # Shared subscriptions: the groups by "$share/<name>/<filter>", and a trie of
        # the groups by their filter (asked only while there is a group).
        self.shared: dict[str, SharedGroup[Session]] = {}
        self.shared_trie: SubscriptionTrie[SharedGroup[Session]] = SubscriptionTrie()
        self.retained = RetainedStore()
        # Sessions of AMQP topic receivers: the only ones that take messages whose
        # body has no MQTT form (``Message.amqp_only``).
        self.native: set[Session] = set()
        # Durable queues ($queue/, $dlq/): beside the trie, never in it (the broker
        # owns them; queue publishes, subscriptions and members are handed over).
        self._queues = queues
        # Shared groups holding messages (a backlog, or loans of offline members).
        self._waiting: dict[SharedGroup[Session], None] = {}
        self._leaving: Session | None = None   # (see ``member_left``)
        # Messages of groups that went away with messages still in their backlog.
        self.shared_dropped_retired = 0
        # Retained messages owed to new subscriptions, by session (``send_retained``).
        self._replays: dict[Session, deque[_Replay]] = {}
        self._feeding: set[Session] = set()   # a slice is scheduled for these
        # QoS 1/2 drops at a session's queue bound: a line per session a minute, and
        # 20 a minute in all (thousands of stuck sessions must not flood the log).
        self._drop_lines = LogLimiter(clock.seconds)
        self._drop_lines_all = LogLimiter(clock.seconds, burst=20)

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
            durable = not message.topic.startswith(SYS_PREFIX)
            if not message.payload and not message.amqp_only:
                if self.retained.delete(message.topic) and durable:
                    ops.append(DeleteRetained(message.topic))
            elif not durable or self.retained.room_for(
                    message, self.limits.max_retained_messages,
                    self.limits.max_retained_bytes):
                self.retained.put(message)
                if durable:
                    ops.append(PutRetained(message.with_retain(True)))
            else:
                # Routed all the same; only not kept for later subscribers, and the
                # topic's older message goes (it would be out of date).
                if self.retained.delete(message.topic):
                    ops.append(DeleteRetained(message.topic))
                self.stats.limit_hit("retained")
                suppressed = self._log_limit.allow("retained")
                if suppressed is not None:
                    self.log.warn(
                        "retained message on {t!r} from {c} not kept: the retained store is "
                        "full (--max-retained-messages {n}, --max-retained-bytes {b}) "
                        "({h} more since the last line)", t=message.topic,
                        c=message.publisher, n=self.limits.max_retained_messages,
                        b=self.limits.max_retained_bytes, h=suppressed)
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
        if self.shared:
            matches, share_of, dropped, congested, kept = self._add_shared(
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
                    self._lend(group, session, entry)
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
                    d.addCallback(_release_held, held)
                d.addErrback(gate.cancel)
            return Published(d, congested or _NO_SESSIONS, False, gate, dropped)
        if d is None:
            if dropped:
                return Published(None, congested or _NO_SESSIONS, dropped=dropped)
            return _ROUTED if congested is None else Published(None, congested)
        if held:
            # Only once stored: a QoS 2 entry whose commit failed must not go out
            # (the publisher got no PUBREC and will send it again).
            d.addCallback(_release_held, held)
        if qos1_entries and not held and other_ops == 0:
            if owned:
                fire_when_acknowledged(d, qos1_entries)
            else:
                d = committed_or_acknowledged(d, qos1_entries, commits.log_failure)
        return Published(d, congested if congested is not None else _NO_SESSIONS,
                         dropped=dropped)

    def _add_shared(self, message: Message, matches: dict[Session, int], gate: Gate | None
                    ) -> tuple[dict[Session, int], dict[Session, SharedGroup[Session]] | None,
                               int, list[Congestible] | None, set[Session] | None]:
        """``matches`` plus one member of each shared group whose filter matches
        (a member that is also a plain subscriber gets one copy, at the higher QoS),
        with the group of each; how many groups had to drop it (a full backlog); the
        groups whose backlog it left past the high-water mark; and the members that
        only keep it for their group (``_keeper``).  A QoS 1/2 message no member has
        room for (or that would overtake the group's backlog) is kept, stored, by a
        persistent member as a loan (the publisher's acknowledgement waits for that
        commit), or else waits in the backlog; under a ``gate`` it goes there at the
        opening (counted against the backlog's bound at once)."""
        groups = self.shared_trie.match(message.topic)
        if not groups:
            return matches, None, 0, None, None
        matches = dict(matches)
        share_of: dict[Session, SharedGroup[Session]] = {}
        kept: set[Session] | None = None
        eligible = self.native if message.amqp_only else None
        qos = message.qos
        dropped = 0
        congested: list[Congestible] | None = None
        for group in groups:
            if eligible is not None and not any(s in eligible for s in group.members):
                continue   # (no MQTT form, and no AMQP member: no taker)
            pick = None if qos and group.backlog else group.pick(
                message.publisher, qos, eligible=eligible)
            if pick is None:
                if not qos:
                    continue   # (QoS 0 with no member online: no taker)
                keeper = self._keeper(group, matches, eligible)
                if keeper is not None:
                    matches[keeper] = group.members[keeper]
                    share_of[keeper] = group
                    if kept is None:
                        kept = set()
                    kept.add(keeper)
                    continue
                if gate is not None:
                    if group.full(message):
                        group.dropped += 1
                        self._backlog_full(group, message)
                        dropped += 1
                    else:
                        # (counted now, so the group is congested and holds its
                        # publishers back; never refused at the opening: PUBREC'd)
                        group.pending += 1
                        gate.later(partial(self._hold_later, group, message),
                                   partial(self._unpromise, group))
                elif not self._hold(group, message):
                    dropped += 1
                if group.over_high_water():
                    if congested is None:
                        congested = [group]
                    else:
                        congested.append(group)
                continue
            session, granted = pick
            had = matches.get(session)
            share_of[session] = group   # (also for a plain subscriber: its options
            if had is None or granted > had:  # must know the group picked it)
                matches[session] = granted
        return matches, share_of, dropped, congested, kept

    @staticmethod
    def _keeper(group: SharedGroup[Session], taken: dict[Session, int] | None = None,
                eligible: set[Session] | None = None, exclude: Session | None = None
                ) -> Session | None:
        """The persistent member (granted QoS 1/2, not in ``taken``) that stores a
        QoS 1/2 message no member has room for, as a loan to the group (moved to a
        member with room later, ``_drain``): the one with the shortest queue, online
        ones first.  None: no such member (the group's backlog, in memory, holds it:
        no session that could keep it is lost with it)."""
        best: Session | None = None
        best_key: tuple[bool, int] = (True, 0)
        for member, granted in group.members.items():
            if (not member.persistent or not granted or member is exclude
                    or (taken is not None and member in taken)
                    or (eligible is not None and member not in eligible)):
                continue
            key = (member.link is None, len(member.queue))
            if best is None or key < best_key:
                best, best_key = member, key
        return best

    def _backlog_full(self, group: SharedGroup[Session], message: Message) -> None:
        suppressed = self._log_limit.allow("shared_backlog")
        if suppressed is not None:
            self.log.warn(
                "shared subscription {g}: a message on {t!r} dropped, the group's "
                "backlog is full (--max-queued-messages {n}, --max-queued-bytes {b}) "
                "and no member has room ({h} more since the last line; {d} in all)",
                g=group.key, t=message.topic, n=group.max_messages, b=group.max_bytes,
                h=suppressed, d=group.dropped)

    def _hold(self, group: SharedGroup[Session], message: Message,
              promised: bool = False) -> bool:
        """Keep ``message`` in ``group``'s backlog (False: full, dropped and counted),
        then give what it can to members with room."""
        if self.shared.get(group.key) is not group:
            return True   # (the group went away meanwhile: nobody to hold it for)
        if not group.hold(message, message.qos, promised):
            self._backlog_full(group, message)
            return False
        self._waiting[group] = None
        self._drain(group)
        return True

    def _hold_later(self, group: SharedGroup[Session], message: Message) -> None:
        self._hold(group, message, promised=True)

    @staticmethod
    def _unpromise(group: SharedGroup[Session]) -> None:
        group.pending -= 1

    def _lend(self, group: SharedGroup[Session], session: Session, entry: OutEntry) -> None:
        group.loans.append((session, entry))
        self._waiting[group] = None

    def room(self, session: Session) -> None:
        """``session`` may have room again (an acknowledgement, a drained link, back
        online): feed it the retained messages it is owed, and the groups it is a
        member of what they hold."""
        if session in self._replays:
            self._feed_retained(session)
        if self._waiting:
            for group in list(self._waiting):
                if session in group.members:
                    self._drain(group)

    def _drain(self, group: SharedGroup[Session]) -> None:
        """Give ``group``'s loans (oldest first), then its backlog, to members with
        room, until none has any; the moves are stored in one commit (a loan leaves
        its lender's stored queue in the commit that stores it with its taker)."""
        ops: list[Op] = []
        held: list[tuple[Session, int]] = []
        loans = group.loans
        waiting: deque[tuple[Session, OutEntry]] = deque()
        while loans:
            lender, entry = loans.popleft()
            if not lender.holds(entry) or (
                    lender.link is not None and lender is not self._leaving
                    and entry.state != QueuedState.QUEUED):
                continue  # already gone, or sent by its (online) lender
            if entry.held or entry.gated:
                waiting.append((lender, entry))   # (its commit or its PUBREC first)
                continue
            message = entry.message
            pick = group.pick(message.publisher, entry.qos, exclude=lender,
                              eligible=self.native if message.amqp_only else None)
            if pick is None or pick[0].link is None or self._give(
                    group, pick[0], message, min(entry.qos, pick[1]), ops, held) is None:
                # (nobody online has room; or no packet id left: it stays lent)
                waiting.append((lender, entry))
                break
            ops.extend(lender.take_back(entry))
        if waiting:
            waiting.extend(loans)
            loans = group.loans = waiting
        if not loans:
            backlog = group.backlog
            while backlog:
                message, qos = backlog[0]
                eligible = self.native if message.amqp_only else None
                pick = group.pick(message.publisher, qos, eligible=eligible)
                if pick is None:
                    if eligible is not None and not any(s in eligible
                                                        for s in group.members):
                        group.take()    # (no AMQP member left to take it: no taker)
                        continue
                    break
                group.take()
                target, granted = pick
                if self._give(group, target, message, min(qos, granted), ops, held) is None:
                    group.put_back(message, qos)    # (an offline member's queue is full)
                    break
        if not group.backlog and not group.loans:
            self._waiting.pop(group, None)
        d = self.commits.persist(ops)
        if d is not None:
            if held:
                d.addCallback(_release_held, held)
            self.commits.watch(d, "moving messages of shared subscription " + group.key)

    def _give(self, group: SharedGroup[Session], target: Session, message: Message,
              qos: int, ops: list[Op], held: list[tuple[Session, int]],
              lend: bool = False) -> OutEntry | None:
        """Deliver a message ``group`` held to its member ``target`` (``lend``: only
        to keep it, stored, for the group: ``_keeper``)."""
        retain = bool(message.retain
                      and target.sub_options.get(group.key, 0) & RETAIN_AS_PUBLISHED)
        entry = target.deliver(message, qos, retain)
        if target.expired_ops:
            ops.extend(target.take_expired_ops())
        if entry is None:
            return None
        entry.share = group
        if target.persistent:
            ops.append(entry.put_op(target.client_id))
            if entry.held:
                held.append((target, entry.seq))
        if target.link is None or lend:
            self._lend(group, target, entry)
        return entry

    def _queue_full(self, session: Session) -> None:
        """A QoS 1/2 delivery to ``session`` was dropped at its queue bound (counted by
        the session): one line per session a minute, with the count."""
        lines = self._drop_lines
        if not lines.ready(session.client_id):
            lines.allow(session.client_id)    # (counted, not logged)
            return
        # The global limit first: a line it refuses must not use up the session's.
        others = self._drop_lines_all.allow("queue_full")
        if others is None:
            return
        held = lines.allow(session.client_id)
        if held is None:
            return
        self.log.warn(
            "{c}: {n} QoS 1/2 message(s) dropped at its queue bound (--max-queued-messages "
            "{m}, --max-queued-bytes {b}){why}; {t} dropped in all{o}",
            c=session.client_id, n=held + 1, m=self.limits.max_queued_messages,
            b=self.limits.max_queued_bytes, t=session.dropped,
            why=(" while it made no progress" if session.stalled else
                 "" if session.link is not None else " while offline"),
            o=f" ({others} such lines of other sessions not logged)" if others else "")

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
        return bool(self._waiting) and any(
            group.over_high_water() for group in self.shared_trie.match(topic))

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

    def send_retained(self, session: Session, grants: Iterable[tuple[str, int]]) -> None:
        """After SUBACK: the retained messages of each granted filter, retain set.

        They are not pushed at once into the session's bounded queue (where all but
        a queue's worth would drop): the topics that have one now are noted, and
        the messages are fed as the session has room (``room``), each read when its
        turn comes."""
        replays = None
        for topic_filter, granted in grants:
            if granted >= SUBSCRIBE_FAILURE or topic_filter.startswith(SHARE_PREFIX):
                continue   # (never retained messages on a shared subscription)
            if is_sys_topic(topic_filter):
                with self.stats.own_messages():   # $SYS is not traffic (``stats``)
                    self._send_sys_retained(session, topic_filter)
                continue
            topics = [message.topic for message in self.retained.match(topic_filter)]
            pending = self._replays.get(session)
            if pending is not None:
                # (one replay per filter: a SUBSCRIBE again replaces what it was owed)
                for old in [r for r in pending if r.filter == topic_filter]:
                    pending.remove(old)
                if not pending and not topics:
                    del self._replays[session]
            if topics:
                if replays is None:
                    replays = self._replays.get(session)
                    if replays is None:
                        replays = self._replays[session] = deque()
                replays.append(_Replay(topic_filter, topics, granted))
        if replays is not None:
            self._feed_retained(session)

    def _feed_retained(self, session: Session) -> None:
        """Send ``session`` the retained messages it is owed while it has room (at
        most ``REPLAY_SLICE`` before the reactor's next turn).  An offline
        persistent session queues QoS 1/2 ones up to its high-water mark (QoS 0 is
        not kept for it); the rest waits until it is back."""
        replays = self._replays.get(session)
        if replays is None:
            return
        ops: list[Op] = []
        last_seq = 0
        now = self.clock.seconds()
        expired: list[str] = []
        native = session in self.native
        budget = REPLAY_SLICE
        retained = self.retained
        limits = self.limits
        while replays:
            replay = replays[0]
            topics = replay.topics
            owed = replay.owed
            index = replay.index
            while index < len(topics):
                if topics[index] not in owed:
                    index += 1     # (sent live meanwhile, published retained)
                    continue
                message = retained.get(topics[index])
                if message is None or (message.amqp_only and not native):
                    index += 1     # deleted meanwhile, or no MQTT form
                    continue
                if message.props is not None and message.expired(now):
                    expired.append(message.topic)   # MQTT 5 message expiry
                    index += 1
                    continue
                qos = min(replay.granted, message.qos)
                if session.link is None:
                    if not qos:
                        index += 1     # (QoS 0 is not kept for an offline session)
                        continue
                    if (len(session.queue) * 2 >= limits.max_queued_messages
                            or session.queued_bytes * 2 >= limits.max_queued_bytes):
                        break
                elif not session.has_room(qos):
                    break
                if not budget:
                    if session not in self._feeding:
                        self._feeding.add(session)
                        self.clock.callLater(0, self._next_slice, session)
                    break
                budget -= 1
                index += 1
                entry = session.deliver(message, qos, True)
                if session.expired_ops:
                    ops.extend(session.take_expired_ops())
                if entry is None:
                    if qos:
                        self._queue_full(session)
                elif session.persistent:
                    ops.append(entry.put_op(session.client_id))
                    last_seq = entry.seq
            replay.index = index
            if index < len(topics):
                break
            replays.popleft()
        if not replays:
            del self._replays[session]
        for topic in expired:
            if retained.delete(topic):
                ops.append(DeleteRetained(topic))
        d = self.commits.persist(ops)
        if d is not None:
            if last_seq:
                d.addCallback(_release_held, [(session, last_seq)])
            self.commits.watch(d, "queueing retained messages")

    def _next_slice(self, session: Session) -> None:
        self._feeding.discard(session)
        self._feed_retained(session)

    def _send_sys_retained(self, session: Session, topic_filter: str) -> None:
        """The broker's own retained ``$SYS`` messages: QoS 0 whatever was granted
        (never queued, never stored, never expiring)."""
        for message in self.retained.match(topic_filter):
            session.deliver(message, 0, True)

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
            return self._return_entries(session, False, ops)
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
        self._replays.pop(session, None)
        if self.shared:
            self.commits.watch(self._return_entries(session, True, []),
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
        group = self.shared.get(topic_filter)
        if group is None:
            group = SharedGroup[Session](shared[0], shared[1], self.limits.share_strategy,
                                         self.limits.max_queued_messages,
                                         self.limits.max_queued_bytes)
            self.shared[topic_filter] = group
            self.shared_trie.add(shared[1], group, 2)
        group.join(session, qos)
        if group in self._waiting:
            self._drain(group)     # (a new member may take what the group holds)

    def _unroute(self, topic_filter: str, session: Session) -> None:
        if topic_filter[:1] == "$" and is_queue_topic(topic_filter):
            self.commits.background(self._queues.unsubscribe(session, topic_filter),
                                    "leaving a queue group")
            return
        group = self.shared.get(topic_filter)
        if group is None:
            self.trie.remove(topic_filter, session)
            return
        group.leave(session)
        if not group.members:
            del self.shared[topic_filter]
            self.shared_trie.remove(group.filter, group)
            self.shared_dropped_retired += group.dropped
            if group.backlog:   # (nobody is left to take them)
                self.shared_dropped_retired += len(group.backlog)
                group.backlog.clear()
                group.backlog_bytes = 0
            group.loans.clear()
            self._waiting.pop(group, None)

    def member_left(self, session: Session) -> list[Op]:
        """``session`` goes offline (or away, ``forget_session`` follows): its shared
        QoS 1 messages, and its shared QoS 2 messages not yet sent, become loans to
        their groups, moved at once to members with room (the rest as members get
        room, or back to it if it returns first; see ``core.shared``).  Its durable
        queue deliveries go back to their groups.  The moves are stored by the
        router itself; nothing is returned for the caller's commit."""
        self._queues.member_left(session)
        if not self.shared:
            return []
        groups: dict[SharedGroup[Session], None] = {}
        for entry in session.entries():
            group = entry.share
            if (group is not None and self.shared.get(group.key) is group
                    and (entry.qos == 1 or entry.state == QueuedState.QUEUED)):
                self._lend(group, session, entry)
                groups[group] = None
        self._leaving = session   # (still attached: its loans may move all the same)
        try:
            for group in groups:
                self._drain(group)
        finally:
            self._leaving = None
        return []

    def _return_entries(self, session: Session, ending: bool,
                        ops: list[Op]) -> Deferred[None] | None:
        """Give ``session``'s shared messages back to the groups it is no longer a
        member of: when the session ends, its QoS 1 messages and its QoS 2 ones not
        sent yet (a QoS 2 message already sent never goes to another member, MQTT 5
        §4.8.2: it is dropped and counted); when it only unsubscribed, what it has
        not sent yet.  A group with a persistent member has it store them (a loan,
        in the commit that forgets them here: ``_keeper``); else they go to the
        front of its backlog.  The ops that forget them here and store them
        elsewhere are committed with ``ops`` (returned: that commit), then the
        groups give what they hold to members with room."""
        back: dict[SharedGroup[Session], list[tuple[Message, int]]] = {}
        touched: dict[SharedGroup[Session], None] = {}
        held: list[tuple[Session, int]] = []
        for entry in list(session.entries()):
            group = entry.share
            if group is None:
                continue
            if self.shared.get(group.key) is not group or session in group.members:
                continue
            if entry.state != QueuedState.QUEUED and (not ending or entry.qos == 2):
                if ending and entry.state == QueuedState.SENT:
                    group.dropped += 1   # (a QoS 2 message the client may have)
                continue
            if entry.held or entry.gated:
                continue        # (its commit or its publisher's PUBREC is still due)
            message = entry.message
            keeper = self._keeper(group, None,
                                  self.native if message.amqp_only else None, session)
            if keeper is not None and self._give(
                    group, keeper, message, min(entry.qos, group.members[keeper]), ops,
                    held, lend=True) is not None:
                ops.extend(session.take_back(entry))
                touched[group] = None
                continue
            ops.extend(session.take_back(entry))
            back.setdefault(group, []).append((message, entry.qos))
        for group, messages in back.items():
            for message, qos in reversed(messages):
                group.give_back(message, qos)
            self._waiting[group] = None
            touched[group] = None
        d = self.commits.persist(ops)
        if d is not None and held:
            d.addCallback(_release_held, held)
        for group in touched:     # (after that commit: a move deletes what it stored)
            if self.shared.get(group.key) is group:
                self._drain(group)
        return d

    def shared_held(self) -> int:
        """Messages shared groups hold in their backlogs (not yet any member's)."""
        return sum(len(group.backlog) for group in self._waiting)

    def shared_dropped(self) -> int:
        """Messages shared groups dropped: refused by a full backlog, or left in the
        backlog of a group whose last member went away."""
        return self.shared_dropped_retired + sum(g.dropped for g in self.shared.values())

    # -- retained -------------------------------------------------------------

    def restore_retained(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.retained.put(message)

    def delete_retained(self, topic: str) -> Deferred[None] | None:
        if not self.retained.delete(topic):
            return None
        return self.commits.persist([DeleteRetained(topic)])

    def delete_retained_matching(self, topic_filter: str) -> tuple[int, Deferred[None] | None]:
        matches = self.retained.match(topic_filter)
        ops: list[Op] = []
        for message in matches:
            self.retained.delete(message.topic)
            if not message.topic.startswith(SYS_PREFIX):
                ops.append(DeleteRetained(message.topic))
        return len(matches), self.commits.persist(ops)


def _release_held(result: object, held: list[tuple[Session, int]]) -> object:
    for session, seq in held:
        session.release_held(seq)
    return result


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
