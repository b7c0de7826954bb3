"""Shared subscription groups as the router delivers to them (``core.routing.shared``
has one group: its members, the pick, its backlog and loans).

What it owns: the groups by ``$share/<name>/<filter>`` and a trie of them by filter;
which member of each matching group takes a message (and the group's backlog or a
persistent member's loan when none has room); moving what a group holds to members
as they get room (``drain``), storing those moves; what a member's messages become
when it goes offline or away (``member_left``, ``return_entries``); the counts of
what the groups hold and dropped.

What it must not do: route plain subscriptions (the router does, and asks ``add``
for the groups' share of a publish) or keep sessions.
"""

from __future__ import annotations

from collections import deque
from functools import partial

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.commits import CommitBatcher
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, QueuedState
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.routing.published import Gate, release_held
from mqttamqp.core.routing.shared import SharedGroup
from mqttamqp.core.routing.suboptions import subscription_ids
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.flow import Congestible
from mqttamqp.core.sessions.session import RETAIN_AS_PUBLISHED, Session
from mqttamqp.core.topics import SubscriptionTrie

__all__ = ["SharedGroups"]


class SharedGroups:
    log = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, commits: CommitBatcher, limits: Limits, log_limit: LogLimiter,
                 native: set[Session]) -> None:
        self.commits = commits
        self.limits = limits
        self._log_limit = log_limit
        # Sessions of AMQP topic receivers (the router's): the only members that take
        # messages with no MQTT form.
        self.native = native
        # The groups by "$share/<name>/<filter>", and a trie of the groups by their
        # filter (asked only while there is a group).
        self.shared: dict[str, SharedGroup[Session]] = {}
        self.shared_trie: SubscriptionTrie[SharedGroup[Session]] = SubscriptionTrie()
        # Groups holding messages (a backlog, or loans of offline members).
        self.waiting: dict[SharedGroup[Session], None] = {}
        self._leaving: Session | None = None   # (see ``member_left``)
        # Messages of groups that went away with messages still in their backlog.
        self.dropped_retired = 0

    # -- membership -----------------------------------------------------------

    def join(self, topic_filter: str, name: str, inner: str, session: Session,
             qos: int) -> None:
        """``session`` subscribed to ``topic_filter`` (``$share/<name>/<inner>``)."""
        group = self.shared.get(topic_filter)
        if group is None:
            group = SharedGroup[Session](name, inner, self.limits.share_strategy,
                                         self.limits.max_queued_messages,
                                         self.limits.max_queued_bytes)
            self.shared[topic_filter] = group
            self.shared_trie.add(inner, group, 2)
        group.join(session, qos)
        if group in self.waiting:
            self.drain(group)     # (a new member may take what the group holds)

    def leave(self, topic_filter: str, session: Session) -> bool:
        """``session`` left ``topic_filter``; False if that is no group's filter."""
        group = self.shared.get(topic_filter)
        if group is None:
            return False
        group.leave(session)
        if not group.members:
            del self.shared[topic_filter]
            self.shared_trie.remove(group.filter, group)
            self.dropped_retired += group.dropped
            if group.backlog:   # (nobody is left to take them)
                self.dropped_retired += len(group.backlog)
                group.backlog.clear()
                group.backlog_bytes = 0
            group.loans.clear()
            self.waiting.pop(group, None)
        return True

    def room(self, session: Session) -> None:
        """``session`` may have room again: the groups it is a member of give it what
        they hold."""
        if self.waiting:
            for group in list(self.waiting):
                if session in group.members:
                    self.drain(group)

    def congested_for(self, topic: str) -> bool:
        """True if the backlog of a group whose filter matches ``topic`` is past its
        high-water mark."""
        return bool(self.waiting) and any(
            group.over_high_water() for group in self.shared_trie.match(topic))

    def member_left(self, session: Session) -> None:
        """``session`` goes offline (or away): its shared QoS 1 messages, and its
        shared QoS 2 messages not yet sent, become loans to their groups, moved at
        once to members with room (the rest as members get room, or back to it if it
        returns first; see ``core.routing.shared``).  The moves are stored here."""
        groups: dict[SharedGroup[Session], None] = {}
        for entry in session.entries():
            share = entry.share
            group = self.shared.get(share.key) if share is not None else None
            if (group is not None and group is share
                    and (entry.qos == 1 or entry.state == QueuedState.QUEUED)):
                self.lend(group, session, entry)
                groups[group] = None
        self._leaving = session   # (still attached: its loans may move all the same)
        try:
            for group in groups:
                self.drain(group)
        finally:
            self._leaving = None

    # -- delivery -------------------------------------------------------------

    def add(self, message: Message, matches: dict[Session, int], gate: Gate | None
                    ) -> tuple[dict[Session, int], dict[Session, SharedGroup[Session]] | None,
                               int, list[Congestible] | None, set[Session] | None]:
        """``matches`` plus one member of each shared group whose filter matches
        (a member that is also a plain subscriber gets one copy, at the higher QoS),
        with the group of each; how many groups had to drop it (a full backlog); the
        groups whose backlog it left past the high-water mark; and the members that
        only keep it for their group (``keeper``).  A QoS 1/2 message no member has
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
                keeper = self.keeper(group, matches, eligible)
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
    def keeper(group: SharedGroup[Session], taken: dict[Session, int] | None = None,
                eligible: set[Session] | None = None, exclude: Session | None = None
                ) -> Session | None:
        """The persistent member (granted QoS 1/2, not in ``taken``) that stores a
        QoS 1/2 message no member has room for, as a loan to the group (moved to a
        member with room later, ``drain``): the one with the shortest queue, online
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
        self.waiting[group] = None
        self.drain(group)
        return True

    def _hold_later(self, group: SharedGroup[Session], message: Message) -> None:
        self._hold(group, message, promised=True)

    @staticmethod
    def _unpromise(group: SharedGroup[Session]) -> None:
        group.pending -= 1

    def lend(self, group: SharedGroup[Session], session: Session, entry: OutEntry) -> None:
        group.loans.append((session, entry))
        self.waiting[group] = None

    def drain(self, group: SharedGroup[Session]) -> None:
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
            self.waiting.pop(group, None)
        d = self.commits.persist(ops)
        if d is not None:
            if held:
                d.addCallback(release_held, held)
            self.commits.watch(d, "moving messages of shared subscription " + group.key)

    def _give(self, group: SharedGroup[Session], target: Session, message: Message,
              qos: int, ops: list[Op], held: list[tuple[Session, int]],
              lend: bool = False) -> OutEntry | None:
        """Deliver a message ``group`` held to its member ``target`` (``lend``: only
        to keep it, stored, for the group: ``keeper``)."""
        retain = bool(message.retain
                      and target.sub_options.get(group.key, 0) & RETAIN_AS_PUBLISHED)
        # (not the router's match: the identifiers are found for the member now)
        entry = target.deliver(message, qos, retain,
                               subscription_ids(target, message.topic)
                               if target.sub_options else ())
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
            self.lend(group, target, entry)
        return entry

    def return_entries(self, session: Session, ending: bool,
                        ops: list[Op]) -> Deferred[None] | None:
        """Give ``session``'s shared messages back to the groups it is no longer a
        member of: when the session ends, its QoS 1 messages and its QoS 2 ones not
        sent yet (a QoS 2 message already sent never goes to another member, MQTT 5
        §4.8.2: it is dropped and counted); when it only unsubscribed, what it has
        not sent yet.  A group with a persistent member has it store them (a loan,
        in the commit that forgets them here: ``keeper``); else they go to the
        front of its backlog.  The ops that forget them here and store them
        elsewhere are committed with ``ops`` (returned: that commit), then the
        groups give what they hold to members with room."""
        back: dict[SharedGroup[Session], list[tuple[Message, int]]] = {}
        touched: dict[SharedGroup[Session], None] = {}
        held: list[tuple[Session, int]] = []
        for entry in list(session.entries()):
            share = entry.share
            if share is None:
                continue
            group = self.shared.get(share.key)
            if group is None or group is not share or session in group.members:
                continue
            if entry.state != QueuedState.QUEUED and (not ending or entry.qos == 2):
                if ending and entry.state == QueuedState.SENT:
                    group.dropped += 1   # (a QoS 2 message the client may have)
                continue
            if entry.held or entry.gated:
                continue        # (its commit or its publisher's PUBREC is still due)
            message = entry.message
            keeper = self.keeper(group, None,
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
            self.waiting[group] = None
            touched[group] = None
        d = self.commits.persist(ops)
        if d is not None and held:
            d.addCallback(release_held, held)
        for group in touched:     # (after that commit: a move deletes what it stored)
            if self.shared.get(group.key) is group:
                self.drain(group)
        return d

    def held(self) -> int:
        """Messages shared groups hold in their backlogs (not yet any member's)."""
        return sum(len(group.backlog) for group in self.waiting)

    def dropped(self) -> int:
        """Messages shared groups dropped: refused by a full backlog, or left in the
        backlog of a group whose last member went away."""
        return self.dropped_retired + sum(g.dropped for g in self.shared.values())
