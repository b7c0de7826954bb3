"""Consumer group membership: who reads a queue.

A subscription to ``$queue/<name>[/<filter>]`` joins the group (name, filter) as
its ``Consumer`` says; a member leaving gives its pending messages back; a
persistent session stays a member while offline (stored with the group) and takes
its memberships up again when it returns, also after a restart."""

from __future__ import annotations

import heapq

from mqttamqp.core.persistence import Op, PutQueueGroup
from mqttamqp.core.queues.acks import Acknowledgements
from mqttamqp.core.queues.addresses import (
    CLASSIC,
    QUOTA_EXCEEDED,
    STREAM,
    Consumer,
    Refusal,
    default_group,
    parse_queue_filter,
    parse_stream_offset,
)
from mqttamqp.core.queues.memory import READ_MESSAGES
from mqttamqp.core.queues.model import ConsumerGroup, Member, ready_count
from mqttamqp.core.queues.priority import level_of
from mqttamqp.core.sessions.session import Session

__all__ = ["Membership", "MAX_GROUPS_PER_QUEUE"]

# Consumer groups one queue may have (each is stored, and holds the log).
MAX_GROUPS_PER_QUEUE = 256


class Membership(Acknowledgements):
    """Joins and leaves consumer groups; feeds members that can take more."""

    def subscribe(self, session: Session, topic_filter: str, qos: int, consumer: Consumer
                  ) -> tuple[Refusal | None, list[Op]]:
        """``session`` joins the group of ``topic_filter`` (``$queue/<name>[/<filter>]``
        or ``$dlq/...``) as ``consumer`` says.  Returns a refusal, or the durable ops."""
        group, mode, stream_offset = consumer.group, consumer.mode, consumer.stream_offset
        explicit = (consumer.explicit if consumer.explicit is not None
                    else session.protocol == "mqtt5")
        address = parse_queue_filter(topic_filter)
        who = session.client_id
        if isinstance(address, str):
            return self._refuse("filter", who, topic_filter, address), []
        mode = mode or CLASSIC
        if mode not in (CLASSIC, STREAM):
            return self._refuse("mode", who, topic_filter,
                                f"consumer-mode {mode!r}: use classic or stream"), []
        start = parse_stream_offset(stream_offset)
        if isinstance(start, str):
            return self._refuse("offset", who, topic_filter, start), []
        ops: list[Op] = []
        queue = self._queue(address.queue, ops)
        if queue is None:
            return self._refuse("count", who, topic_filter,
                                f"too many queues (--queue-max-queues "
                                f"{self.limits.queue_max_queues})", QUOTA_EXCEEDED), []
        name = group or default_group(session.client_id)
        key = name if address.rest == "#" else f"{name}@{address.rest}"
        g = queue.groups.get(key)
        if g is None and len(queue.groups) >= MAX_GROUPS_PER_QUEUE:
            return self._refuse("groups", who, topic_filter,
                                f"queue {queue.name!r} has {MAX_GROUPS_PER_QUEUE} consumer "
                                "groups already",
                                QUOTA_EXCEEDED), ops
        if g is None:
            g = ConsumerGroup(queue, name, address.rest, mode)
            queue.groups[key] = g
            if mode == STREAM:
                self._position(g, start)
        elif g.mode != mode:
            return self._refuse("mode", who, topic_filter,
                                f"group {key!r} of queue {queue.name!r} is a {g.mode} group"
                                ), ops
        elif mode == STREAM and stream_offset:
            self._position(g, start)
        self._leave(session, g)   # (a repeated SUBSCRIBE replaces the membership)
        member = Member(session, min(qos, 2), explicit, consumer.held, consumer.selector)
        g.members.append(member)
        self._memberships.setdefault(session, []).append((g, member))
        if session.persistent:
            g.stored_members[session.client_id] = member.qos | (4 if explicit else 0)
            self._stored_clients.add(session.client_id)
        ops.append(PutQueueGroup(queue.name, g.key, g.record()))
        self._pump(g)
        return None, list(self._durable_ops(ops))

    def _position(self, group: ConsumerGroup, start: tuple[str, float]) -> None:
        queue = group.queue
        kind, value = start
        if kind == "first":
            queue.oldest()
            offset = queue.first
        elif kind == "last":
            offset = queue.next_offset
        elif kind == "offset":
            offset = min(max(int(value), queue.first), queue.next_offset)
        else:
            offset = queue.next_offset
            for o, message in queue.log.items():
                if message.timestamp >= value:
                    offset = o
                    break
        group.next = offset

    def unsubscribe(self, session: Session, topic_filter: str, group: str | None = None
                    ) -> list[Op]:
        address = parse_queue_filter(topic_filter)
        if isinstance(address, str):
            return []
        queue = self.queues.get(address.queue)
        if queue is None:
            return []
        ops: list[Op] = []
        for g in list(queue.groups.values()):
            if g.filter != address.rest or (group is not None and g.name != group):
                continue
            if self._leave(session, g) or session.client_id in g.stored_members:
                g.stored_members.pop(session.client_id, None)
                ops.append(PutQueueGroup(queue.name, g.key, g.record()))
        return list(self._durable_ops(ops))

    def _leave(self, session: Session, group: ConsumerGroup) -> bool:
        memberships = self._memberships.get(session)
        if not memberships:
            return False
        for index, (g, member) in enumerate(memberships):
            if g is group:
                del memberships[index]
                if not memberships:
                    del self._memberships[session]
                    session.queue_waiting = None   # (in no group: nothing to feed)
                group.members.remove(member)
                self._give_back(group, member)
                return True
        return False

    def _give_back(self, group: ConsumerGroup, member: Member) -> None:
        """``member``'s pending messages go back to its group at once, but for one
        whose outcome a transaction holds (``Pending.tx_held``; not a 0.9.1
        member's, its channel settles those): it stays claimed, out of the
        session, by a member of its own, until the transaction commits or rolls
        back (``Settlement.settle_kept``)."""
        back: list[int] = []
        freed = False
        for offset, pending in group.pending.items():
            if pending.member is not member:
                continue
            if pending.tx_held and not member.held:
                entry = pending.detach()
                if entry is not None:
                    member.session.take_back(entry)
                    freed = True
                alone = pending.member = Member(member.session, member.qos, member.explicit)
                alone.outstanding = 1
            else:
                back.append(offset)
        for offset in back:
            entry = group.pending.pop(offset).detach()
            if entry is not None:
                member.session.take_back(entry)
                freed = True
            group.requeue(offset)
        member.outstanding = 0
        # (pumped even with nothing given back: a message this member refused may
        # hold the group — a stream's cursor, ``_pump`` — for it, and it is going)
        self._pump(group)
        if freed:   # (its window: fed, unless the session is leaving)
            self._window_freed(member.session)

    def _take(self, group: ConsumerGroup, offset: int) -> None:
        """``offset``, the group's next to hand out, is taken (``take_one``; the
        pump does the same inline)."""
        levels = group.levels
        if levels is not None:
            levels.pop()
            return
        if group.ready and group.ready[0] == offset:
            heapq.heappop(group.ready)
        elif group.next == offset:
            group.next = offset + 1

    def take_one(self, name: str, session: Session, qos: int) -> tuple[bool, int] | None:
        """AMQP 0.9.1 ``basic.get``: hand ``session`` the next message of queue
        ``name``'s default group (the group named after it, made if missing), as
        a delivery of ``qos`` (0: acknowledged on send) outside the group's
        round-robin; it is settled like any delivery and goes back to the group
        when ``session`` goes.  Returns (taken, messages left), or None when the
        queue is a stream (it has no message to take); nothing is taken while
        ``session`` has no room to send it now (its in-flight window is full).
        The dispatch watermark is stored, not waited for: a crash before that
        commit leaves this one delivery uncounted."""
        queue = self.queues.get(name)
        if queue is None:
            return False, 0
        ops: list[Op] = []
        group = queue.groups.get(name)
        if group is None:
            group = queue.groups[name] = ConsumerGroup(queue, name, "#", CLASSIC)
            ops.append(PutQueueGroup(name, name, group.record()))
        elif group.mode != CLASSIC:
            return None
        if not session.has_room(min(qos, 1)):
            # (its window is full: taken now, it would wait in the session unsent
            # while the caller answered as if it had gone; the caller says empty)
            self._commit(self._durable_ops(ops), "recording a basic.get")
            return False, ready_count(queue)
        offset = self._next_offset(group, ops)
        while offset is not None and queue.log[offset].props is not None and (
                self._expire(queue, offset, ops)):
            offset = self._next_offset(group, ops)   # (expired: the next one)
        if offset is not None and queue.evicted and offset in queue.evicted:
            # (there for the next basic.get; a priority queue's next ones by level)
            if not queue.reading:
                self._read_back(queue, offset, None if group.levels is None
                                else group.levels.first(READ_MESSAGES))
            offset = None
        if offset is not None:
            bumped = offset >= group.watermark
            if bumped:
                group.watermark = offset + 1
            if group.levels is not None:   # (and its level's: ``Dispatch._pump``)
                level = level_of(queue.log[offset], group.levels.top)
                if offset >= group.level_marks.get(level, 0):
                    group.level_marks[level] = offset + 1
                    bumped = True
            if bumped:
                ops.append(PutQueueGroup(name, group.key, group.record()))
            self._take(group, offset)
            gets = self._gets.setdefault(session, [])
            member = next((m for g, m in gets if g is group), None)
            if member is None:
                member = Member(session, min(qos, 1), False, held=True)   # (basic.get)
                gets.append((group, member))
            member.qos = min(qos, 1)
            again = self._deliver(group, member, offset, queue.log[offset], ops)
            if again:
                ops.append(PutQueueGroup(name, group.key, group.record()))
        self._commit(self._durable_ops(ops), "recording a basic.get")
        return offset is not None, ready_count(queue)

    def _return_gets(self, session: Session) -> None:
        for group, member in self._gets.pop(session, ()):
            self._give_back(group, member)

    def member_left(self, session: Session) -> None:
        """``session`` goes offline: its pending messages go back to their groups
        (a persistent session stays a member, with no credit while offline, fed
        when it is online again: ``session_online``).  Its ``queue_waiting`` hook
        goes (a session → hook → session cycle, never collected for a session
        loaded before ``gc.freeze``)."""
        session.queue_waiting = None
        if self._gets:
            self._return_gets(session)
        memberships = self._memberships.get(session)
        if not memberships:
            return
        self._leaving = session
        try:
            for group, member in list(memberships):
                if session.persistent:
                    self._give_back(group, member)
                else:
                    self._leave(session, group)
        finally:
            self._leaving = None
            session.queue_waiting = None

    def forget_session(self, session: Session) -> list[Op]:
        """``session`` is gone for good: it leaves every group (its
        ``queue_waiting`` hook goes: ``member_left``)."""
        if self._gets:
            self._return_gets(session)
        ops: list[Op] = []
        self._leaving = session   # (no credit, nor fed, while it leaves)
        try:
            for group, _member in list(self._memberships.get(session, ())):
                self._leave(session, group)
                if group.stored_members.pop(session.client_id, None) is not None:
                    ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))
        finally:
            self._leaving = None
            session.queue_waiting = None
        return list(self._durable_ops(ops))

    def link_drained(self, session: Session) -> None:
        """``session`` can take more (online again, a link drained): feed it."""
        memberships = self._memberships.get(session)
        if memberships:   # (most sessions are in no group: no list made)
            for group, _member in list(memberships):
                self._pump(group)

    def feeding(self, session: Session) -> bool:
        """A group of ``session``'s has messages it will hand out once storage
        answers (the dispatch watermark's commit, bodies read back): an AMQP drain
        waits for them before it says there is nothing more."""
        for group, _member in self._memberships.get(session, ()):
            if group.held_back or group.queue.reading:
                return True
        return False

    def session_online(self, session: Session) -> None:
        """``session`` is online: a persistent one that was a member before a restart
        takes up its memberships (stored with the group), then it is fed.  (Not
        called for a session in none of ``_memberships``, ``_browsers`` and, when
        persistent, ``_stored_clients``, for which it does nothing:
        ``SessionRegistry.activate`` reads those tables first; keep the two in step.)"""
        if (session.persistent and session not in self._memberships
                and session.client_id in self._stored_clients):
            self._member_returned(session)
        self.link_drained(session)

    def _member_returned(self, session: Session) -> None:
        for queue in self.queues.values():
            for g in queue.groups.values():
                stored = g.stored_members.get(session.client_id)
                if stored is None:
                    continue
                if any(m.session is session for m in g.members):
                    continue
                member = Member(session, stored & 3, bool(stored & 4))
                g.members.append(member)
                self._memberships.setdefault(session, []).append((g, member))
