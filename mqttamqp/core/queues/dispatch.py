"""Dispatch: hands a queue's messages to its groups' members, with the watermark.

Round-robin over the members with credit (prefetch, the session's window, an
uncongested link); classic groups claim what they hand out (``Pending``) and store
a dispatch watermark ahead of the deliveries, so that a delivery goes out only
below a watermark already durable (a priority queue's group also one per level:
``ConsumerGroup.level_marks``); stream groups read by cursor.  Deliveries go
through ``Session.deliver`` with a receipt (``Pending``, or ``StreamRead`` for a
stream: the session's ``DeliveryReceipt``), through which the transport's
acknowledgement comes back (``transport_ack``, ``after_stream_ack``).

What this module must not do: write a session's entries (the receipt is the only
link), decide acknowledgements' outcomes (``Acknowledgements``) or timeouts
(``QueueTimers``)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from twisted.python.failure import Failure

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import DeleteQueueMessage, Op, PutQueueGroup, QueueDone
from mqttamqp.core.queues.addresses import CLASSIC, STREAM
from mqttamqp.core.queues.memory import READ_MESSAGES
from mqttamqp.core.queues.metadata import (
    COUNT_ONLY_ATTRIBUTE,
    METADATA_PROTOCOLS,
    with_metadata,
)
from mqttamqp.core.queues.model import ConsumerGroup, Member, Pending, QueueLog, StreamRead
from mqttamqp.core.queues.parking import Parking
from mqttamqp.core.queues.priority import level_of
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.session import Session

__all__ = ["Dispatch"]

# The dispatch watermark is stored this many offsets ahead of the deliveries, and
# again when they come within half of it.  Deliveries past the stored one wait for
# its commit (an fsync), so a small step throttled the queue to a step per fsync;
# a large one only means that after a crash up to that many messages never
# delivered count a delivery (they may have been: at-least-once).
_WATERMARK_STEP = 4096


class Dispatch(Parking):
    """Hands out what each group may have, to members with credit."""

    def _pump_queue(self, queue: QueueLog) -> None:
        # (``Browsing._pump_queue`` repeats this loop rather than calling it: a class
        # between the two overriding it would be passed over, which a unit test
        # guards, test_queue_short_path)
        for group in list(queue.groups.values()):
            self._pump(group)

    def _pump(self, group: ConsumerGroup) -> None:
        """Hand out what the group may have, round-robin over members with credit."""
        queue = group.queue
        if not group.members or (not group.ready and group.next >= queue.committed
                                  and (group.levels is None or group.levels.high < 0)
                                  and not (group.parked and self._parked_unseen(group))):
            return   # (nothing to hand out: most acknowledgements end here)
        ops: list[Op] = []
        mark = None
        marked = False    # (a level's watermark is to be stored)
        again = False
        refused: list[Member] | None = None   # (members whose session refused one)
        evicted = queue.evicted
        levels = group.levels
        if group.parked and self._parked_unseen(group):
            self._offer_parked(group)
        while True:
            if levels is None and not group.ready and group.next >= queue.committed:
                break   # (``_next_offset`` would find none: the usual end, without it)
            # (``_next_offset``'s answer inline for the common group: classic, no
            # levels, nothing ready again, no skipped range, a ``#`` filter)
            offset: int | None = group.next
            if (levels is not None or group.ready or queue.skip_starts
                    or group.mode != CLASSIC or group.filter != "#"
                    or offset not in queue.log or offset in group.done):
                offset = self._next_offset(group, ops)
                if offset is None:
                    break
            if evicted and offset in evicted:
                # (its body is in storage: read back, then this pump again; nothing
                # to work out while a read is under way)
                if not queue.reading:
                    self._read_back(queue, offset, None if group.levels is None
                                    else group.levels.first(READ_MESSAGES))
                break
            props = queue.log[offset].props
            if (props is not None and props.expiry_interval is not None
                    and group.mode == CLASSIC and self._expire(queue, offset, ops)):
                continue
            if group.mode == CLASSIC and offset >= group.watermark - _WATERMARK_STEP // 2:
                # Store the watermark further ahead before deliveries reach it.
                group.watermark = mark = offset + _WATERMARK_STEP
                if queue.transient:   # (nothing is stored: nothing to wait for)
                    group.safe, mark = group.watermark, None
                else:
                    ops.append(PutQueueGroup(queue.name, group.key, group.record()))
            if group.mode == CLASSIC and offset >= group.safe:
                group.held_back = True
                break   # (sent once the watermark above it is durable: ``_stored``)
            rr = group._rr
            members = group.members
            if refused is None and len(members) == 1 and members[0].selector is None:
                # (one member without a selector, the common group: ``_next_member``'s
                # answer without its rotation)
                member: Member | bool = members[0]
                one = members[0]
                session = one.session
                link = session.link
                # (``_credit``'s yes inline — within its own prefetch (0 for MQTT and
                # AMQP 1.0 members: the call at once), online, nothing queued in its
                # session, uncongested — else the call, for its no)
                if ((one.outstanding < session.queue_prefetch and link is not None
                     and not session.queue and session is not self._leaving
                     and not link.congested)
                        or self._credit(one)):
                    group._rr = 0
                else:
                    member = False
            else:
                member = (self._next_member(group, offset) if refused is None
                          else self._next_other(group, offset, refused))
            if member is False:
                break   # (no member with credit, but for those that refused)
            if member is True and refused is not None and self._wanted(group, offset,
                                                                       refused):
                # (a member that refused it in this pump takes it: not parked past
                # it, nor a stream's cursor moved past it — it waits, untaken, for
                # that member's window to free, ``queue_waiting``, or for it to leave;
                # what follows waits too: walking on past it would cost each pump the
                # whole backlog)
                break
            if levels is not None and member is not True:
                # (and its level's, once a member takes it: a lower level's offsets
                # below the group's watermark must not count a delivery after a
                # restart)
                level = level_of(queue.log[offset], levels.top)
                if offset >= group.level_marks.get(level, 0) - _WATERMARK_STEP // 2:
                    group.level_marks[level] = offset + _WATERMARK_STEP
                    if queue.transient:
                        group.level_safe[level] = offset + _WATERMARK_STEP
                    else:
                        marked = True
                        ops.append(PutQueueGroup(queue.name, group.key, group.record()))
                if offset >= group.level_safe.get(level, 0):
                    group._rr = rr   # (its turn again once the mark is durable)
                    group.held_back = True
                    break
            # (``_take``, inline)
            if levels is not None:
                levels.pop()
            elif group.ready and group.ready[0] == offset:
                heapq.heappop(group.ready)
            elif group.next == offset:
                group.next = offset + 1
            if member is True:
                # Members with credit, none whose selector takes it: it stays in the
                # queue for another member (a stream's cursor moves past it).
                if group.mode == CLASSIC:
                    self._park(group, offset)
                continue
            handed = self._deliver(group, member, offset, queue.log[offset], ops, True)
            if handed is None:
                # (refused by the member's session, its window full: visible again,
                # for the next member with credit in this pump, not for this one —
                # handed to it again and again, it would be refused for ever; its
                # window freeing, the next pump or a drained link tries again; the
                # refused member keeps its turn in the rotation)
                group._rr = rr
                if refused is None:
                    refused = [member]
                else:
                    refused.append(member)
                continue
            again = handed or again
        if again:
            ops.append(PutQueueGroup(queue.name, group.key, group.record()))
        if mark is not None or marked:
            d = self._commit(ops)
            if d is not None:
                marks = dict(group.level_marks) if marked else None
                d.addCallbacks(self._stored, self._not_stored,
                               callbackArgs=(group, mark, marks),
                               errbackArgs=(group, mark, marks))
                self.commits.watch(d, "recording a queue's dispatch watermark")
        elif ops or self._unsaved:
            self._commit(ops, "recording a queue delivery")

    def _expire(self, queue: QueueLog, offset: int, ops: list[Op]) -> bool:
        """A message past its own expiry (MQTT 5 message expiry interval, AMQP
        0.9.1 ``expiration``) reached a consumer: it leaves the queue instead
        (dead-lettered, reason ``expired``, by a dead-letter route), counted.
        False if it has not expired."""
        message = queue.log[offset]
        if not message.expired(self.clock.seconds()):
            return False
        if queue.dead_letter is not None:
            self._route_dead(queue, message, "expired", offset, "", 0, ops)
        self._forget(queue, offset)
        if not queue.transient:
            ops.append(DeleteQueueMessage(queue.name, offset))
        queue.expired += 1
        self.stats.expired += 1
        return True

    def _not_stored(self, failure: Failure, group: ConsumerGroup, mark: int | None,
                    marks: dict[int, int] | None) -> Failure:
        """The commit failed: the next pump stores the watermark again (or the
        group would wait for ``mark`` for ever); so for the levels' ``marks``."""
        if mark is not None and group.watermark == mark:
            group.watermark = group.safe
        for level, level_mark in (marks or {}).items():
            if group.level_marks.get(level) == level_mark:
                group.level_marks[level] = group.level_safe.get(level, 0)
        group.held_back = False
        return failure

    def _stored(self, result: object, group: ConsumerGroup, mark: int | None,
                marks: dict[int, int] | None) -> object:
        """The watermark ``mark`` (and the levels' ``marks``) is durable: deliveries
        below it may go out (a crash after one of them counts it one more delivery
        on restart)."""
        moved = False
        if mark is not None and mark > group.safe:
            group.safe = mark
            moved = True
        if marks:
            safe = group.level_safe
            for level, level_mark in marks.items():
                if level_mark > safe.get(level, 0):
                    safe[level] = level_mark
                    moved = True
        if moved:
            group.held_back = False
            self._pump(group)
        return result

    def _next_offset(self, group: ConsumerGroup, ops: list[Op]) -> int | None:
        """The next offset this group would hand out (not taken yet)."""
        queue = group.queue
        log = queue.log
        if group.mode == CLASSIC:
            if group.levels is not None:
                return self._next_by_priority(group, ops)
            ready = group.ready
            while ready:
                offset = ready[0]
                if offset in log and offset not in group.done:
                    return offset
                heapq.heappop(ready)
        limit = queue.committed
        skip = queue.skip if queue.skip_starts else None
        while group.next < limit:
            offset = group.next
            if skip is not None:
                past = skip(offset)
                if past != offset:
                    group.next = past
                    continue
            message = log.get(offset)
            if group.mode == STREAM:
                if message is not None and group.matches(message):
                    return offset
                group.next = offset + 1
                continue
            if offset in group.done:     # (after a restart: acknowledged before it)
                group.next = offset + 1
                continue
            # (``matches``' first test inline: most groups take every message)
            if message is not None and (group.filter == "#" or group.matches(message)):
                return offset
            group.next = offset + 1
            group.done.add(offset)       # (not for this group: done with it)
            group.advance_floor()
            ops.append(QueueDone(queue.name, group.key, (offset,)))
        return None

    def _next_by_priority(self, group: ConsumerGroup, ops: list[Op]) -> int | None:
        """A priority queue's next offset for ``group``: what was committed since
        joins its level first (a later message of a higher level goes before an
        earlier one of a lower level), then the highest level's first."""
        levels = group.levels
        assert levels is not None
        queue = group.queue
        log = queue.log
        limit = queue.committed
        if group.next < limit:
            skip = queue.skip if queue.skip_starts else None
            done = group.done
            finished: list[int] = []
            offset = group.next
            while offset < limit:
                if skip is not None:
                    past = skip(offset)
                    if past != offset:
                        offset = past
                        continue
                message = log.get(offset)
                if message is not None and offset not in done:
                    if group.matches(message):
                        levels.add(message, offset)
                    else:
                        finished.append(offset)   # (not for this group: done with it)
                        done.add(offset)
                offset += 1
            group.next = max(offset, group.next)
            levels.bound(log, done)
            if finished:
                group.advance_floor()
                ops.append(QueueDone(queue.name, group.key, tuple(finished)))
        return levels.peek(log, group.done)

    def _deliver(self, group: ConsumerGroup, member: Member, offset: int, message: Message,
                 ops: list[Op], credited: bool = False) -> bool | None:
        """Hand ``offset`` to ``member``; True when it was a classic redelivery,
        whose raised count the caller stores with the group's record (rare, so
        at once: a crash after it must not bring the message back with a lower
        count than the client has seen).  ``credited``: ``_credit`` found the
        member's link with room just now (its QoS 1 delivery may take the
        session's short path, ``send_credited``).  None: the session refused it
        (its bound), and it is visible again (a stream's: its group's cursor is
        back on it)."""
        queue = group.queue
        count = group.counts.get(offset, 0) + 1
        again = False
        if group.mode == CLASSIC:
            group.counts[offset] = count
            again = count > 1   # (counted redelivered once the session takes it)
        session = member.session
        # (MQTT 3.x clients get no properties: no metadata to build for them; nor a
        # first delivery to a 0.9.1 consumer that would read nothing of it)
        if session.protocol not in METADATA_PROTOCOLS:
            delivered = message
        else:
            seen = group.mode == STREAM or again or offset in group.uncounted
            props = message.props
            if (count == 1 and not seen and message.amqp091 is not None
                    and not message.dup and (props is None or not props.user_properties)
                    and getattr(session.link, COUNT_ONLY_ATTRIBUTE, False)):
                delivered = message
            else:
                delivered = with_metadata(message, queue.name, group.key, offset, count,
                                          seen)
        if group.mode == STREAM:
            read = StreamRead(self, group, offset, member) if member.qos else None
            entry = session.deliver(delivered, member.qos, False, receipt=read)
            member.outstanding += 1
            if self._timer is None:
                self._arm()
            if entry is None:
                member.outstanding -= 1
                if read is not None:
                    # (refused by the session's bound: the group's cursor goes back
                    # to it, read again once the window frees — not skipped)
                    group.next = offset
                    self._refused_by(session)
                    return None
            return False   # (a stream counts no redeliveries)
        # (the receipt goes with the session's entry: the queue's, durable already,
        # so a persistent session does not hold it for a commit of its own)
        pending = Pending(self, group, offset, member) if member.qos else None
        # (the short path: a QoS 1 member ``_credit`` found with room gets it sent at
        # once; anything else, or no window room, takes the session's queue)
        entry = (session.send_credited(delivered, pending) if credited
                 and pending is not None and member.qos == 1 else None)
        if entry is None:
            entry = session.deliver(delivered, member.qos, False, receipt=pending)
        member.outstanding += 1
        if self._timer is None:   # (``_arm``'s test, without the call)
            self._arm()
        if entry is None and member.qos:
            # (refused by the session's bound — it would have waited in a session
            # queue already full, or behind a full window: visible again at once,
            # neither dropped nor redelivered)
            member.outstanding -= 1
            group.counts[offset] = count - 1
            group.requeue(offset)
            self._refused_by(session)
            return None
        if again:
            group.redelivered += 1
            self.stats.redelivered += 1
        if entry is None and not member.explicit:
            # QoS 0 without explicit acknowledgements: acknowledged on send.
            member.outstanding -= 1
            self._done(group, offset)
            group.acked += 1
            queue.acked += 1
            self.stats.acked += 1
            return False   # (finished: no count to keep)
        if pending is None:
            pending = Pending(self, group, offset, member)   # (QoS 0, explicit)
        pending.since = self.clock.seconds()
        pending.entry = entry
        group.pending[offset] = pending
        return again

    def _feed_again(self, session: Session) -> None:
        for group, _member in list(self._memberships.get(session, ())):
            self._pump(group)

    def transport_ack(self, pending: Pending) -> None:
        """The transport acknowledged ``pending``'s delivery (PUBACK, PUBCOMP, AMQP
        Accepted): done, unless it is no longer its group's pending delivery."""
        if self.accepted_quietly(pending):
            self._flush_soon()
            self._pump(pending.group)

    def accepted_quietly(self, pending: Pending) -> bool:
        """``transport_ack`` without storing or pumping: the caller does both once
        for a batch (``Settlement.accept_many``; ``after_accepts``).  False if
        ``pending`` is no longer its group's pending delivery (nothing done)."""
        group = pending.group
        offset = pending.offset
        if group.pending.get(offset) is not pending:
            return False
        del group.pending[offset]
        pending.entry = None   # (``detach``: entry and receipt no longer linked)
        pending.member.outstanding -= 1
        self._done(group, offset)
        group.acked += 1
        group.queue.acked += 1
        self.stats.acked += 1
        return True

    def after_accepts(self, groups: Iterable[ConsumerGroup]) -> None:
        """A batch of ``accepted_quietly`` is over: its done records are stored at
        the end of the batch, and its ``groups`` hand out what they may now."""
        self._flush_soon()
        for group in groups:
            self._pump(group)

    def after_stream_ack(self, group: ConsumerGroup) -> None:
        self._pump(group)

    def settle(self, receipt: Pending | StreamRead, entry: OutEntry, outcome: str,
               failed: bool, reason: str | None) -> None:
        """An AMQP outcome other than Accepted on a delivery: the receipts' other
        report, which ``Acknowledgements`` decides."""
        raise NotImplementedError

