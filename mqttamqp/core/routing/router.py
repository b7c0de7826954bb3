"""The router: publish and subscribe, for every protocol alike.

What it owns: the subscription trie; the publish permission check (one place for
MQTT, AMQP and the broker's own messages); routing (trie match, delivery QoS =
min(publish, granted), one copy per session at the highest granted QoS, MQTT 5
subscription options and identifiers, found once at match time: ``suboptions``);
which deliveries wait for their commit (QoS 2 to a persistent session) and when a
publisher may be acknowledged; which online
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

from collections.abc import Callable, Sequence
from typing import ClassVar

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
from mqttamqp.core.persistence import Op
from mqttamqp.core.queues.addresses import QueueAddress
from mqttamqp.core.queues.manager import QueueManager
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.recorder import Recorder, records
from mqttamqp.core.routing.groups import SharedGroups
from mqttamqp.core.routing.published import (
    ROUTED,
    Gate,
    Published,
    release_held,
)
from mqttamqp.core.routing.retained_feed import RetainedFeed
from mqttamqp.core.routing.shared import SharedGroup
from mqttamqp.core.routing.suboptions import delivery_options
from mqttamqp.core.routing.subscriptions import DYNAMIC_PREFIX, Subscriptions
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.flow import Congestible, QueueBoundLog
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.stats import BrokerStats
from mqttamqp.core.topics import SubscriptionTrie, is_sys_topic

__all__ = ["Router"]


_NO_SESSIONS: tuple[Session, ...] = ()


class Router(Subscriptions):
    log: ClassVar[Logger] = Logger(namespace="mqttamqp.core.broker")

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
        self._matched = self.trie.cache
        # Sessions of AMQP topic receivers: the only ones that take messages whose
        # body has no MQTT form (``Message.amqp_only``).
        self.native: set[Session] = set()
        # Sessions of AMQP topic receivers with a selector: only the messages it
        # matches reach them (empty unless such a receiver is attached: read on
        # every publish).
        self.selectors: dict[Session, Callable[[Message], bool]] = {}
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
        self.retained_feed.selectors = self.selectors
        self.retained = self.retained_feed.retained
        self._replays = self.retained_feed.by_session   # (read on retained publishes)
        # The last early answer (``publish``): the plain publishes of one batch share it.
        self._early_result = ROUTED

    # -- publishing -----------------------------------------------------------

    def may_publish(self, identity: Identity, topic: str, retain: bool) -> bool:
        """The permission check of every publish; a refusal is counted and logged.
        ``$SYS`` is the broker's own: no client publishes there (as Mosquitto)."""
        if not is_sys_topic(topic) and self.authorizer.may_publish(identity, topic, retain):
            return True
        return self._denied(identity, topic)

    def _denied(self, identity: Identity, topic: str) -> bool:
        """A refused publish: counted, and logged a line a minute; False."""
        self.stats.publish_denied += 1
        if identity.protocol == "amqp":
            self.stats.publish_denied_amqp += 1
        elif identity.protocol == "amqp0-9-1":
            self.stats.publish_denied_amqp091 += 1
        suppressed = self._log_limit.allow("publish_denied")
        if suppressed is not None:   # one line a minute, not one per message
            self.log.warn("publish by {c} to {t!r} denied ({h} more denials since the last "
                          "line)", c=identity.client_id, t=topic, h=suppressed)
        return False

    def publish(self, message: Message, identity: Identity | None = None,
                extra_ops: Sequence[Op] = (), counted: bool = True,
                hold: bool = False, count_drops: bool = False,
                queue: QueueAddress | str | None = None, early: bool = False) -> Published:
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
        ``early``: the caller takes ``Published.waiter`` (the batch's, shared by its
        publishes) where a QoS 1 acknowledgement may go before the commit; no
        Deferred is made for it.
        """
        commits = self.commits
        # (the message's fields read once each: a record, each read is a lookup by
        # name in the compiled build)
        topic = message.topic
        msg_retain = message.retain
        authorizer = self.authorizer
        dollar = topic[:1] == "$"
        if identity is not None and (   # (``may_publish``, inline: every publish;
                # anonymous access, ``AllowAll``, allows every topic without the call)
                (dollar and is_sys_topic(topic))
                or (type(authorizer) is not AllowAll
                    and not authorizer.may_publish(identity, topic, msg_retain))):
            self._denied(identity, topic)
            return Published(commits.persist(extra_ops), _NO_SESSIONS, True)
        if counted:  # the broker's own $SYS updates are not traffic
            self.stats.messages_received += 1
        if queue is None and dollar:
            queue = self._queues.address(topic)
        if queue is not None:
            appended, refusal = self._queues.publish(
                message, queue, message.publisher or "(broker)", extra_ops,
                # (MQTT 5 has a negative acknowledgement: 0x97 beats waiting)
                refuse_when_blocked=message.qos > 0 and identity is not None
                and identity.protocol == "mqtt5")
            return Published(appended, refusal=refusal,
                             blocked=refusal is None and self._queues.paused)
        ops: list[Op] = list(extra_ops)
        if msg_retain and not topic.startswith(DYNAMIC_PREFIX):
            self.retained_feed.keep(message, ops)
        other_ops = len(ops)
        # (the writer may hold the put of a QoS 1 entry sent at once over a commit or
        # two, its submit and every later one waiting with it: not when the publish
        # stores more than its deliveries (a will's delete, a QoS 2 packet id, a
        # retained message), nor in a transaction, whose answers need not wait for a
        # subscriber; nor under a gate: sent only after the commit, no acknowledgement
        # can cancel its put first)
        holdable = not other_ops and not hold and not commits.atomic
        held: list[tuple[Session, int]] = []
        qos1_entries: list[OutEntry] = []
        msg_qos = message.qos
        congested: list[Congestible] | None = None
        matches = self._matched.get(topic)   # (``SubscriptionTrie.match``'s cache)
        if matches is None:
            matches = self.trie.match(topic)
        recording = self._recording and counted and self.recorder.records_messages
        dropped = 0
        if message.amqp_only:
            native = self.native
            matches = {s: q for s, q in matches.items() if s in native}
        if self.selectors:
            matches = self._selected(message, matches)
        plain = matches    # (the sessions a plain filter matched: before the groups')
        share_of: dict[Session, SharedGroup[Session]] | None = None
        kept: set[Session] | None = None
        gate = Gate(message) if hold else None
        if self._shared:
            matches, share_of, dropped, congested, kept = self.groups.add(
                message, matches, gate)
        replaying = msg_retain and bool(self._replays)
        for session, granted in matches.items():
            qos = granted if granted < msg_qos else msg_qos
            retain = False
            ids: tuple[int, ...] = ()
            if session.sub_options:
                # MQTT 5 subscription options: no local, retain as published, and
                # the identifiers of the filters that matched (sent with it).
                options = delivery_options(
                    session, message, share_of.get(session) if share_of else None,
                    session in plain)
                if options is None:
                    continue
                retain, ids = options
            if gate is not None:
                if qos == 0:
                    gate.add(session, None, retain, ids)  # sent (or dropped) at the opening
                    continue
                entry = session.deliver(message, qos, retain, ids, True)
                if entry is not None:
                    gate.add(session, entry)
                else:       # (QoS 1/2 is refused only at a bound)
                    dropped += 1
            elif recording or count_drops:
                # A QoS 1/2 delivery was refused when no entry came back (expired
                # messages it pushed out are counted by the session, not here).
                drops = session.dropped
                entry = session.deliver(message, qos, retain, ids)
                if entry is None if qos else session.dropped != drops:
                    dropped += 1
            else:
                entry = session.deliver(message, qos, retain, ids)
            if entry is None and qos:
                self._queue_full(session)
            elif replaying and session in self._replays:
                # (it has this topic's retained message now: not again from a replay)
                for replay in self._replays[session]:
                    replay.owed.discard(topic)
            if session.expired_ops:   # expired messages made room (MQTT 5)
                ops.extend(session.take_expired_ops())
            if entry is not None and share_of is not None:
                group = entry.share = share_of.get(session)
                if group is not None and (session.link is None
                                          or (kept is not None and session in kept)):
                    # (nobody online, see ``pick``; or kept for the group, ``_keeper``)
                    self.groups.lend(group, session, entry)
            if entry is not None and session.persistent:
                if qos == 1:
                    # (a new seq; sent at once, the writer may hold the put over a
                    # commit or two; sent or queued behind the window, the publish is
                    # answered once stored or every delivery acknowledged)
                    ops.append(entry.put_op(
                        session.client_id, True,
                        holdable and entry.packet_id in session.inflight))
                    qos1_entries.append(entry)
                else:   # (QoS 2: sent once stored, release_held)
                    ops.append(entry.put_op(session.client_id, True))   # (a new seq)
                    held.append((session, entry.seq))
            if ((session.queue or session.queued_bytes or session._extras is not None
                 or (session.link is not None and session.link.congested))
                    and session.over_high_water()):
                # (False while offline: no link; and without the call when nothing is
                # queued, the link is not congested and it has no backlog bound: the
                # bounds are not negative)
                if congested is None:
                    congested = [session]
                else:
                    congested.append(session)
        if recording:
            self.recorder.message(
                message.timestamp, topic, msg_qos, msg_retain, message.payload,
                message.publisher, identity.username if identity is not None else None,
                (identity.protocol or None) if identity is not None else None,
                len(matches) - dropped,
                dropped)
        if early and qos1_entries and not held and other_ops == 0 and gate is None:
            waiter = commits.persist_early(ops, qos1_entries)   # (None: not batching)
            if waiter is not None:
                if congested is None and not dropped:
                    # (one answer for the batch's plain publishes: it is a value)
                    early_result = self._early_result
                    if early_result.waiter is not waiter:
                        early_result = self._early_result = Published(waiter=waiter)
                    return early_result
                return Published(None, congested if congested is not None
                                 else _NO_SESSIONS, dropped=dropped, waiter=waiter)
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
            return ROUTED if congested is None else Published(None, congested)
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

    def congested_for(self, topic: str) -> bool:
        """True if an online subscriber of ``topic`` (or a shared group's backlog) is
        past its high-water mark."""
        if any(session.over_high_water() for session in self.trie.match(topic)):
            return True
        return self.groups.congested_for(topic)

    def _selected(self, message: Message, matches: dict[Session, int]) -> dict[Session, int]:
        """``matches`` less the selective receivers whose selector ``message`` fails."""
        selectors = self.selectors
        return {s: q for s, q in matches.items()
                if (selector := selectors.get(s)) is None or selector(message)}

    def forget_session(self, session: Session) -> None:
        """``session`` is going away: its routes leave the trie (and its queue
        groups)."""
        self.native.discard(session)
        self.selectors.pop(session, None)
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

