"""The queue manager's state, as plain objects: one queue's log (``QueueLog``),
its consumer groups (``ConsumerGroup``), their members (``Member``) and pending
deliveries (``Pending``), a queue's ``Retention`` and the counters (``QueueStats``).

The rules that change this state live in the layers of ``QueueManager`` (log,
memory, dispatch, acks, membership, timers, admin); here are only the
questions a group or a log answers about itself (floor, lag, skipped offsets)."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from mqttamqp.core.commits import CommitRound
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import QueueGroupRecord
from mqttamqp.core.queues.addresses import CLASSIC, STREAM, routing_key
from mqttamqp.core.queues.priority import PriorityLevels
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.sessions.session import Session
from mqttamqp.core.topics import topic_matches
from mqttamqp.records import record

__all__ = ["Retention", "QueueStats", "QueueLog", "ConsumerGroup", "Member", "Pending",
           "StreamRead", "DeliveryEnds", "DeadLetterRoute", "ready_count"]

# (a ``round_waits`` entry's last offset)
_LAST = itemgetter(0)


@record
class Retention:
    """How long a queue keeps messages (None: no bound of that kind), and its
    priority levels (``max_priority``, None or 0: none, FIFO): the settings a
    queue gets from ``--queues``, the console or its 0.9.1 arguments, stored
    together (``PutQueue``)."""

    max_age: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None
    max_priority: int | None = None

    def as_tuple(self) -> tuple[float | int | None, ...]:
        # (three fields for a queue without priorities, as stored before them)
        if not self.max_priority:
            return (self.max_age, self.max_bytes, self.max_messages)
        return (self.max_age, self.max_bytes, self.max_messages, self.max_priority)


@dataclass
class QueueStats:
    """The queues' counters in all (the console and ``$SYS`` read them)."""

    published: int = 0
    acked: int = 0
    nacked: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    redelivered: int = 0
    expired: int = 0
    refused: int = 0


class QueueLog:
    """One queue: its log of messages by offset, its consumer groups and counters."""

    def __init__(self, name: str, retention: Retention, head: int = 0) -> None:
        self.name = name
        self.retention = retention
        self.log: dict[int, Message] = {}
        self.first = head          # lowest offset that may still be in the log
        self.next_offset = head
        self.committed = head      # offsets below this are durable: dispatchable
        self.bytes = 0
        self.groups: dict[str, ConsumerGroup] = {}
        self.published = 0
        self.acked = 0
        self.dead = 0
        self.expired = 0
        # offset -> what its publisher waits for, while it may still fire early:
        # every classic group done with it before its commit (``_trim``).
        self.waiters: dict[int, Deferred[None] | CommitRound] = {}
        # The same for the appends of commit rounds (0.9.1 confirms), one entry per
        # round, not per append: ``[last offset, round]`` in offset order, released
        # from the front once every classic group is past its last offset
        # (``_trim``); an entry holds at least its last offset's message, so there
        # are no more entries than messages in the log.
        self.round_waits: deque[list[Any]] = deque()
        # Offsets below ``next_offset`` that hold no message and never will, as
        # sorted ranges [start, end): found at a restart (``QueueManager._skip_unstored_offsets``),
        # jumped over by floors and cursors, left out of lags.
        self.skip_starts: list[int] = []
        self.skip_ends: list[int] = []
        # Messages whose body is in storage only (``log`` holds a ``stub``): offset
        # -> (payload bytes, body bytes).  Only durable messages are evicted: below
        # ``durable`` and not in ``unstored`` (appends whose commit failed).
        self.evicted: dict[int, tuple[int, int]] = {}
        self.durable = head
        self.unstored: set[int] = set()
        self.reading = False       # a read back from storage is under way
        # In memory only (AMQP 0.9.1's exclusive, auto-delete and server-named
        # queues): none of its changes becomes an ``Op`` (``QueueLogs._durable_ops``).
        self.transient = False
        # AMQP 0.9.1 queue arguments (``core.exchanges.arguments``): x-overflow
        # reject-publish refuses a publish at (max messages, max bytes) instead of
        # dropping the oldest; x-dead-letter-exchange routes dead letters (the
        # queues they go to, for a dead message and its reason) instead of $dlq/.
        self.reject_above: tuple[int | None, int | None] | None = None
        self.reject_dead = False    # (reject-publish-dlx: the refused one dead-lettered)
        self.dead_letter: DeadLetterRoute | None = None
        # A 0.9.1-declared queue without x-dead-letter-exchange: a rejected delivery
        # is dropped (counted), as RabbitMQ drops it, not kept in $dlq/.
        self.discard_rejected = False
        # Its highest priority level (0: no levels, FIFO); its classic groups hand
        # out by level (``ConsumerGroup.levels``).  Set by ``set_max_priority``.
        self.max_priority = 0


    def unwait(self, offset: int) -> None:
        """``offset`` is not consumed (dropped, dead-lettered): its publisher's
        Deferred, or the round whose ``round_waits`` entry covers it, is answered
        by its commit only, never early (the entry goes, not released)."""
        self.waiters.pop(offset, None)
        waits = self.round_waits
        if not waits or waits[-1][0] < offset:
            return   # (no entry covers it)
        if waits[0][0] >= offset:
            waits.popleft()   # (the oldest: what expiry and x-max-length drop)
        else:
            del waits[bisect_left(waits, offset, key=_LAST)]

    def consumed_below(self, upto: int, early: list[Deferred[None] | CommitRound]) -> None:
        """Every classic group is done with the offsets below ``upto``: what their
        publishers wait for (``waiters``, ``round_waits`` entries) goes to ``early``
        to be answered now."""
        waiters = self.waiters
        if waiters:
            if len(waiters) < upto - self.first:
                # (fewer waiters than offsets trimmed: walk the waiters, not the gap)
                for offset in sorted(o for o in waiters if o < upto):
                    early.append(waiters.pop(offset))
            else:
                for offset in range(self.first, upto):
                    waiter = waiters.pop(offset, None)
                    if waiter is not None:
                        early.append(waiter)
        waits = self.round_waits
        while waits and waits[0][0] < upto:
            early.append(waits.popleft()[1])

    def set_max_priority(self, top: int | None) -> None:
        """Give the queue levels 0..``top`` (None or 0: none).  Its classic groups'
        offsets to hand out move over, so that a change keeps every message."""
        top = top or 0
        if top == self.max_priority:
            return
        self.max_priority = top
        for group in self.groups.values():
            group.relevel()

    def skip(self, offset: int) -> int:
        """``offset``, or the end of the skipped range it is in."""
        starts = self.skip_starts
        if starts:
            i = bisect_right(starts, offset) - 1
            if i >= 0 and offset < self.skip_ends[i]:
                return self.skip_ends[i]
        return offset

    def skipped_between(self, low: int, high: int) -> int:
        """How many offsets in [low, high) are skipped."""
        n = 0
        for start, end in zip(self.skip_starts, self.skip_ends, strict=True):
            if start >= high:
                break
            if end > low:
                n += min(end, high) - max(start, low)
        return n

    def oldest(self) -> Message | None:
        log = self.log
        while self.first < self.next_offset and self.first not in log:
            self.first += 1
        return log.get(self.first)

    def size_of(self, offset: int) -> int:
        """The payload bytes of the message at ``offset`` (evicted or not)."""
        sizes = self.evicted.get(offset) if self.evicted else None
        return len(self.log[offset].payload) if sizes is None else sizes[0]

    def ready(self) -> tuple[int, int, Collection[int]]:
        """How many messages no consumer holds, their payload bytes, and the
        offsets held (pending on a classic group's member): what x-max-length and
        the retention bounds count."""
        pending = [g.pending.keys() for g in self.groups.values() if g.pending]
        if not pending:
            return len(self.log), self.bytes, ()
        held: Collection[int] = pending[0] if len(pending) == 1 else set().union(*pending)
        log = self.log
        held_bytes = sum(self.size_of(o) for o in held if o in log)
        held_count = sum(1 for o in held if o in log)
        return len(log) - held_count, self.bytes - held_bytes, held

    def excess(self, count: int | None, size: int | None) -> list[int]:
        """The oldest ready offsets to drop for the ready messages to be within
        ``count`` messages and ``size`` payload bytes (None: no such bound); what
        a consumer holds stays theirs."""
        log = self.log
        if not ((count is not None and len(log) > count)
                or (size is not None and self.bytes > size)):
            return []
        ready, ready_bytes, held = self.ready()
        victims: list[int] = []
        for offset in log:
            if not ((count is not None and ready > count)
                    or (size is not None and ready_bytes > size)):
                break
            if offset not in held:
                victims.append(offset)
                ready -= 1
                ready_bytes -= self.size_of(offset)
        return victims

    def refuses(self, message: Message) -> bool:
        """x-overflow reject-publish: full for ``message``.  Only ready messages
        count (RabbitMQ: unacknowledged ones do not count towards the limit)."""
        if self.reject_above is None:
            return False
        count, size = self.reject_above
        if not ((count is not None and len(self.log) >= count)
                or (size is not None and self.bytes + len(message.payload) > size)):
            return False
        ready, ready_bytes, _ = self.ready()
        return ((count is not None and ready >= count)
                or (size is not None and ready_bytes + len(message.payload) > size))

    def never_fits(self, message: Message) -> bool:
        """x-overflow reject-publish: ``message`` would be refused by this queue even
        empty (x-max-length 0, or a payload over x-max-length-bytes): refused for
        good, where ``refuses`` alone says full for now."""
        if self.reject_above is None:
            return False
        count, size = self.reject_above
        return count == 0 or (size is not None and len(message.payload) > size)


# A queue's dead-letter route: (message, reason) -> the exchange and routing key it
# is dead-lettered with, and the queues that takes it to.
DeadLetterRoute = Callable[[Message, str], tuple[str, str, Sequence[str]]]


class Member:
    """A session's membership of one consumer group."""

    __slots__ = ("explicit", "held", "outstanding", "parked_seen", "qos", "selector",
                 "session", "skipped")

    def __init__(self, session: Session, qos: int, explicit: bool,
                 held: bool = False,
                 selector: Callable[[Message], bool] | None = None) -> None:
        self.session = session
        self.qos = qos
        self.explicit = explicit     # acknowledges with $ack/$nack/$reject (MQTT 5)
        # its claims last until it leaves: no visibility timeout, no takeover (0.9.1)
        self.held = held
        self.outstanding = 0         # deliveries not yet acknowledged (its credit use)
        self.selector = selector     # takes only what this is true of (None: all)
        # Offsets its selector refused (``Dispatch._selects``); empty without one.
        self.skipped: set[int] = set()
        # It has refused every parked offset whose sequence number (its group's
        # ``parked_seqs``) is below this: on credit it is offered only those parked
        # since (``Dispatch._offer_parked``).
        self.parked_seen = 0


class DeliveryEnds(Protocol):
    """Where a delivery's receipt reports how it ended (the queue manager)."""

    def transport_ack(self, pending: Pending) -> None:
        """The transport acknowledged a classic delivery (``Dispatch``)."""

    def after_stream_ack(self, group: ConsumerGroup) -> None:
        """A stream read was acknowledged: its member may take more (``Dispatch``)."""

    def settle(self, receipt: Pending | StreamRead, entry: OutEntry, outcome: str,
               failed: bool, reason: str | None) -> None:
        """An AMQP outcome other than Accepted (``Acknowledgements``)."""


class Pending:
    """A classic group's delivery awaiting its acknowledgement, and the receipt
    (``DeliveryReceipt``) its session entry (``entry``; None at QoS 0) carries.

    Only the delivery that is still its group's pending one at ``offset`` counts:
    a receipt whose delivery was acknowledged otherwise, taken back or
    redelivered is void."""

    __slots__ = ("entry", "group", "member", "offset", "owner", "since", "tx_held")

    def __init__(self, owner: DeliveryEnds, group: ConsumerGroup, offset: int,
                 member: Member) -> None:
        self.owner = owner
        self.group = group
        self.offset = offset
        self.member = member
        self.since = 0.0
        self.entry: OutEntry | None = None
        # A transaction holds its outcome (``Settlement.hold``): like a held
        # member's, no visibility timeout, no takeover, until it commits or rolls back.
        self.tx_held = False

    def detach(self) -> OutEntry | None:
        """No longer its group's pending delivery: the session entry, if any, to
        take back, and the link to it dropped (entry and receipt point at each
        other; left linked, both would wait for the cycle collector)."""
        entry, self.entry = self.entry, None
        return entry

    def acknowledged(self) -> None:
        # (an explicit member acknowledges with $ack, not with its PUBACK)
        if not self.member.explicit:
            self.owner.transport_ack(self)

    def settled(self, entry: OutEntry, outcome: str, failed: bool,
                reason: str | None) -> None:
        self.owner.settle(self, entry, outcome, failed, reason)


class StreamRead:
    """The receipt of a stream group's delivery: it claims nothing, but holds a
    unit of its member's prefetch until acknowledged."""

    __slots__ = ("group", "member", "offset", "owner")

    def __init__(self, owner: DeliveryEnds, group: ConsumerGroup, offset: int,
                 member: Member) -> None:
        self.owner = owner
        self.group = group
        self.offset = offset
        self.member = member

    def acknowledged(self) -> None:
        # (a reconnect gave the credit back already: ``_give_back``)
        member = self.member
        member.outstanding = max(0, member.outstanding - 1)
        self.owner.after_stream_ack(self.group)

    def settled(self, entry: OutEntry, outcome: str, failed: bool,
                reason: str | None) -> None:
        self.owner.settle(self, entry, outcome, failed, reason)


class ConsumerGroup:
    """A consumer group (name, filter) of one queue: its members and progress."""

    def __init__(self, queue: QueueLog, name: str, topic_filter: str, mode: str) -> None:
        self.queue = queue
        self.name = name
        self.filter = topic_filter
        self.key = name if topic_filter == "#" else f"{name}@{topic_filter}"
        self.mode = mode
        self.members: list[Member] = []
        # Persistent sessions that were members (they come back as members).
        self.stored_members: dict[str, int] = {}
        self._rr = 0
        # Classic: everything below ``floor`` is done; ``done`` holds the offsets
        # done above it; ``next`` is the next offset never dispatched.
        self.floor = queue.first
        self.next = queue.first
        self.done: set[int] = set()
        self.pending: dict[int, Pending] = {}
        self.ready: list[int] = []            # a heap: offsets visible again
        # A priority queue's classic group: every offset to hand out, by level
        # (``next`` is then past every offset taken in; ``ready`` stays empty).
        self.levels: PriorityLevels | None = (
            PriorityLevels(queue.max_priority) if queue.max_priority and mode == CLASSIC
            else None)
        # Offsets that no member with credit selected (selectors), in the order
        # they were parked, each with its sequence number (``parked_seqs``, rising;
        # ``parked_next`` is the next one): they wait here until a member that has
        # not refused them (one that joins, or one that had no credit when they were
        # parked: ``Member.parked_seen``) has credit and selects them; those go
        # through ``ready`` (or their level) again.
        self.parked: list[int] = []
        self.parked_seqs: list[int] = []
        self.parked_next = 0
        self.counts: dict[int, int] = {}      # deliveries made so far, per offset
        # Offsets delivered and given back without counting it (Released): their
        # next delivery is not the first, though their count says 1.  (Not stored:
        # after a restart their count is raised anyway.)
        self.uncounted: set[int] = set()
        self.watermark = queue.first          # dispatch watermark (being) stored
        self.safe = queue.first               # the watermark known durable
        # A priority queue's group: the watermark per level (being stored, known
        # durable), so that after a restart only what a level may have handed out
        # counts a delivery, not every lower level's message below ``watermark``.
        self.level_marks: dict[int, int] = {}
        self.level_safe: dict[int, int] = {}
        # A pump stopped at ``safe`` (or its level's) with something to hand out: it
        # goes on when the watermark's commit is done (``Dispatch._stored``); a
        # drain waits.
        self.held_back = False
        self.cursor_saved = queue.first       # stream: the stored cursor
        self.cursor_saved_at = 0.0
        self.redelivered = 0
        self.acked = 0

    def requeue(self, offset: int) -> None:
        """``offset`` is visible again (given back, released, timed out)."""
        levels = self.levels
        if levels is None:
            heapq.heappush(self.ready, offset)
        else:
            log = self.queue.log
            message = log.get(offset)
            if message is not None:
                levels.add(message, offset)
                levels.bound(log, self.done)

    def relevel(self) -> None:
        """The queue's levels changed (``QueueLog.set_max_priority``)."""
        if self.mode != CLASSIC:
            return
        old = self.levels
        waiting = [*self.ready, *(old if old is not None else ())]
        top = self.queue.max_priority
        self.ready = []
        # (levels changed: every level may have handed out what went out, which is
        # below the durable watermark, ``safe``.  Not ``watermark``: while its commit
        # is in flight, no level would store a mark past it, and none's would ever
        # become durable; from ``safe``, the next pump stores each level's own.)
        self.level_marks = ({level: self.safe for level in range(top + 1)}
                            if top and self.safe > self.floor else {})
        self.level_safe = dict(self.level_marks)
        if top:
            self.levels = levels = PriorityLevels(top)
            log = self.queue.log
            for offset in waiting:
                message = log.get(offset)
                if message is not None:
                    levels.add(message, offset)
        else:
            self.levels = None
            self.ready = sorted(set(waiting))   # (a sorted list is a heap)

    def matches(self, message: Message) -> bool:
        if self.filter == "#":
            return True
        return topic_matches(self.filter, routing_key(self.queue.name, message.topic))

    def record(self) -> QueueGroupRecord:
        # (``done`` goes to storage offset by offset: ``QueueDone``)
        return QueueGroupRecord(
            self.name, self.filter, self.mode, self.floor, self.watermark, (),
            tuple(sorted((o, c) for o, c in self.counts.items() if c > 1)),
            tuple(sorted(self.stored_members.items())),
            self.next if self.mode == STREAM else 0,
            tuple(sorted(self.level_marks.items())))

    def advance_floor(self) -> None:
        done = self.done
        floor = self.floor
        skip = self.queue.skip if self.queue.skip_starts else None
        while True:
            while floor in done:
                done.discard(floor)
                floor += 1
            if skip is not None:
                past = skip(floor)   # (offsets that never held a message)
                if past != floor:
                    floor = past
                    continue
            break
        self.floor = floor

    def lag(self) -> int:
        queue = self.queue
        levels = self.levels
        if levels is not None and levels.stale:
            # (only what is still there to hand out: offsets dropped while waiting
            # leave the heaps here, or at their level's top)
            levels.compact(queue.log, self.done)
        return (max(0, queue.next_offset - self.next) + len(self.ready) + len(self.parked)
                + (levels.count if levels is not None else 0)
                - queue.skipped_between(self.next, queue.next_offset))


def ready_count(queue: QueueLog) -> int:
    """Queue ``queue``'s ready messages, as RabbitMQ's backing queue counts them
    (``len``, which ``queue.delete``'s if-empty, delete-ok and declare-ok and
    ``basic.get-ok`` read): not those its 0.9.1 consumers' group (named after the
    queue) holds unacknowledged, nor those it has acknowledged that are still in the
    log (after one acknowledged out of order, or until the end of the socket read that
    acknowledged them: ``QueueLogs._flush_soon``), so the group's ``lag``: what it
    has not handed out, without a walk over what it holds (``basic.get`` reads it at
    every get).  Without a classic group of that name, every message in the log."""
    group = queue.groups.get(queue.name)
    if group is None or group.mode != CLASSIC:
        return len(queue.log)
    return group.lag()
