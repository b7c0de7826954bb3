"""The queues' logs and their durability: the base layer of ``QueueManager``.

Owns the queues, appends and removals (with the byte counts the storage alarm and
the memory budget read), trims once every classic group is done with a message,
retention by count, size and age, and the commit plumbing: every durable change
is an ``Op`` handed to ``CommitBatcher``; appends dispatch once durable
(``_appended``); finished offsets are stored per batch (``_drain_done``), and a
publisher waiting for a message every group consumed first is answered early.

What this module must not do: deliver (``Dispatch``), evict bodies
(``MemoryBudget``) or run timers (``QueueTimers``); it calls them through the
hooks at the end of ``QueueLogs``."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.clock import Clock, DelayedCall
from mqttamqp.core.commits import CommitBatcher, CommitRound
from mqttamqp.core.limits import Limits
from mqttamqp.core.message import Message, body_size
from mqttamqp.core.persistence import (
    DeleteQueue,
    DeleteQueueGroup,
    DeleteQueueMessage,
    Op,
    PutQueue,
    PutQueueGroup,
    PutQueueMessage,
    QueueDone,
    TrimQueue,
)
from mqttamqp.core.queues.addresses import (
    CLASSIC,
    DLQ_PREFIX,
    STREAM,
    UNSPECIFIED_ERROR,
    QueueAddress,
    Refusal,
)
from mqttamqp.core.queues.budget import FreeSpace, StorageAlarm
from mqttamqp.core.queues.durability import AppendAccounting, RoundAppends
from mqttamqp.core.queues.model import (
    ConsumerGroup,
    Member,
    QueueLog,
    QueueStats,
    Retention,
)
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.session import Session

__all__ = ["QueueLogs", "BodyReader"]

# Reads a queue's message bodies back from storage (``StateStore.read_queue_messages``;
# not the store's reader thread, ``store.reading.QueueReader``).
BodyReader = Callable[[str, Sequence[int]], "Deferred[list[tuple[int, Message]]]"]


class QueueLogs(AppendAccounting):
    """The queues, their logs and the commits that make their changes durable."""

    log = Logger(namespace="mqttamqp.core.queues")

    def __init__(self, clock: Clock, commits: CommitBatcher, limits: Limits,
                 log_limit: LogLimiter, retention_rules: Sequence[tuple[str, Retention]] = ()
                 ) -> None:
        self.clock = clock
        self.commits = commits
        self.limits = limits
        self._log_limit = log_limit
        self.queues: dict[str, QueueLog] = {}
        # Names of the transient queues (``QueueLog.transient``): their ops are
        # dropped before any commit (``_durable_ops``).
        self.transient: set[str] = set()
        self.stats = QueueStats()
        # (pattern, retention) from --queues, first match wins; then the defaults.
        self.retention_rules = list(retention_rules) or [
            (rule[0], _rule_retention(rule, limits)) for rule in limits.queue_rules]
        self._memberships: dict[Session, list[tuple[ConsumerGroup, Member]]] = {}
        # Sessions holding messages taken one at a time (AMQP 0.9.1 basic.get),
        # with the member (outside the group's round-robin) they are pending on.
        self._gets: dict[Session, list[tuple[ConsumerGroup, Member]]] = {}
        # Queues appended to since the last ``_commit``, with their next offset.
        self._appended_to: dict[QueueLog, int] = {}
        # Offsets finished (acknowledged, dead) not yet in a commit, per group.
        self._unsaved: dict[ConsumerGroup, list[int]] = {}
        self._early: list[Deferred[None] | CommitRound] = []  # to answer now: ``_fire_early``
        self._parsed: dict[str, QueueAddress | str] = {}   # publish topics, parsed
        # Client ids that have (or had) a stored membership: only their sessions'
        # connects look through the groups (``session_online``, on every CONNECT).
        self._stored_clients: set[str] = set()
        # Told the name of each queue deleted (``QueueAdmin.delete``: the console, a
        # 0.9.1 queue.delete, an auto-delete or exclusive queue's end), after its
        # members have left it: the protocol adapters tell their consumers.
        self.deleted_hooks: list[Callable[[str], None]] = []
        self._flush_armed = False
        self._leaving: Session | None = None   # (no credit while it leaves)
        self._timer: DelayedCall | None = None  # the next ``tick``, while there is work
        self.stopped = False
        # Aggregate bounds.  Disk: every queue's stored payload bytes in all
        # (``total_bytes``) and the data directory's free space (``alarm``).  Memory:
        # the bodies held in memory (``resident``) against ``--queue-memory-budget``;
        # past it, durable bodies far from any consumer are evicted (only their
        # stub stays) and read back from storage (``_reader``) as consumers near.
        self.alarm = StorageAlarm(clock, limits.queue_max_total_bytes,
                                  limits.disk_free_limit)
        self.total_bytes = 0
        self.resident = 0
        self.budget = limits.queue_memory_budget
        self._reader: BodyReader | None = None
        self._appends: dict[QueueLog, tuple[int, int]] = {}  # (first, upto) this commit
        # The appends of the current batch's commit, marked durable by its round.
        self._round_appends: RoundAppends | None = None
        # Body bytes appended and not committed yet (they cannot be evicted): past
        # ``_unstored_limit`` publishers to queues wait for the writer (``paused``),
        # so that what waits for a commit does not grow past the budget.
        self._append_bytes = 0            # since the last ``_commit``
        self.unstored_bytes = 0
        self._unstored_limit = (max(8 << 20, min(64 << 20, self.budget // 4))
                                if self.budget > 0 else 0)
        # After a pass that could not get under the budget (what consumers are about
        # to take is protected), the next waits until this much more is resident:
        # not a scan of every log per commit.
        self._evict_above = 0
        self.evictions = 0      # bodies evicted (counted once each time)
        self.read_backs = 0     # bodies read back from storage

    def attach_storage(self, reader: BodyReader | None,
                       free_space: FreeSpace | None = None) -> None:
        """How bodies are read back (None: they are never evicted) and how the data
        directory's free space is read (None: no free-disk watermark)."""
        self._reader = reader
        if free_space is not None:
            self.alarm = StorageAlarm(self.clock, self.limits.queue_max_total_bytes,
                                      self.limits.disk_free_limit, free_space)
            self.alarm.check_total(self.total_bytes)

    def default_retention(self, name: str) -> Retention:
        base = name[len(DLQ_PREFIX):] if name.startswith(DLQ_PREFIX) else name
        for pattern, retention in self.retention_rules:
            if fnmatch.fnmatchcase(base, pattern) or fnmatch.fnmatchcase(name, pattern):
                return retention
        limits = self.limits
        return Retention(limits.queue_max_age or None, limits.queue_max_bytes or None,
                         limits.queue_max_messages or None)

    def _queue(self, name: str, ops: list[Op], transient: bool = False) -> QueueLog | None:
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        if len(self.queues) >= self.limits.queue_max_queues:
            return None
        queue = QueueLog(name, self.default_retention(name))
        queue.set_max_priority(queue.retention.max_priority)
        self.queues[name] = queue
        if transient:
            queue.transient = True
            self.transient.add(name)
        else:
            ops.append(PutQueue(name, queue.retention.as_tuple()))
        return queue

    def _durable_ops(self, ops: Sequence[Op]) -> Sequence[Op]:
        """``ops`` without those of transient queues (one test while there are none)."""
        if not self.transient or not ops:
            return ops
        transient = self.transient
        return [op for op in ops if _queue_of(op) not in transient]

    def _refuse(self, cause: str, who: str, topic: str, reason: str,
                code: int = UNSPECIFIED_ERROR, lasting: bool = False) -> Refusal:
        self.stats.refused += 1
        suppressed = self._log_limit.allow("queue:" + cause)
        if suppressed is not None:
            self.log.warn("{c}: {t!r} refused: {r} ({h} more refusals like it since the "
                          "last line)", c=who, t=topic, r=reason, h=suppressed)
        return Refusal(code, reason, lasting)

    def _commit(self, ops: Sequence[Op], background: str | None = None
                ) -> Deferred[None] | None:
        """Persist ``ops``; the queues appended to meanwhile dispatch their new
        messages once that commit is durable.  With ``background`` nobody waits."""
        # What a commit stores (``ops``, the finished offsets, without the transient
        # queues') and the queues to dispatch once it is durable (usually none: a
        # publish's own appends were dispatched at once)
        if self._unsaved:
            ops = [*ops, *self._drain_done()]
        if self.transient:
            ops = self._durable_ops(ops)
        appended: Mapping[QueueLog, int] = self._appended_to or _NO_APPENDS
        if appended:
            self._appended_to = {}
        d = self.commits.persist(ops)
        self._account(d)
        if self._early:
            self._fire_early()
        if d is None:
            for queue, upto in appended.items():   # (transient: nothing to wait for)
                self._appended(None, queue, upto)
            return None
        for queue, upto in appended.items():
            d.addCallback(self._appended, queue, upto)
        if background is not None:
            self.commits.watch(d, background)
            return None
        return d

    def _commit_in_round(self, ops: Sequence[Op]) -> CommitRound:
        """As ``_commit`` inside a batch, for a caller that needs no Deferred of its
        own and found ``commits.batching`` true: the batch's ``CommitRound``."""
        # (``_commit``'s hand-off, as there: once a publish with confirms)
        if self._unsaved:
            ops = [*ops, *self._drain_done()]
        if self.transient:
            ops = self._durable_ops(ops)
        appended = self._appended_to or _NO_APPENDS
        if appended:
            self._appended_to = {}
        r = self.commits.persist_in_round(ops)
        assert r is not None, "_commit_in_round outside a batch"
        self._account_in_round(r)
        if self._early:
            self._fire_early()
        for queue, upto in appended.items():
            r.when_done(self._appended_in_round, (queue, upto))
        return r

    def _appended_in_round(self, outcome: Failure | None,
                           arg: tuple[QueueLog, int]) -> None:
        if outcome is None:
            self._appended(None, *arg)

    def _fire_early(self) -> None:
        early, self._early = self._early, []
        for waiter in early:      # (consumed before stored: see ``publish``)
            if isinstance(waiter, CommitRound):
                waiter()   # (its release)
            elif not waiter.called:
                waiter.callback(None)

    def _drain_done(self) -> list[Op]:
        """The offsets finished since the last commit, one ``QueueDone`` per group,
        and the trims they allow (not an op per acknowledgement: with four
        consumers acknowledging, those were most of the queue path's cost)."""
        unsaved, self._unsaved = self._unsaved, {}
        ops: list[Op] = []
        queues: dict[str, QueueLog] = {}
        for group, offsets in unsaved.items():
            queue = group.queue
            if self.queues.get(queue.name) is not queue:
                continue   # (deleted meanwhile)
            ops.append(QueueDone(queue.name, group.key, tuple(offsets)))
            queues[queue.name] = queue
            waiters = queue.waiters
            if waiters:
                classic = [g for g in queue.groups.values() if g.mode == CLASSIC]
                for offset in offsets:
                    if offset in waiters and all(
                            offset < g.floor or offset in g.done for g in classic):
                        self._early.append(waiters.pop(offset))
        for queue in queues.values():
            self._trim(queue, ops)
        return ops

    def _flush_done(self) -> None:
        self._flush_armed = False
        if self._unsaved:
            self._commit((), "recording queue acknowledgements")

    def _flush_soon(self) -> None:
        """Store what was finished at the end of the current batch (one socket
        read), or now outside one."""
        if self._flush_armed:
            return
        if self.commits.after_batch(self._flush_done):
            self._flush_armed = True
        else:
            self._flush_done()

    def _append(self, queue: QueueLog, message: Message, ops: list[Op]) -> int:
        offset = queue.next_offset
        queue.next_offset = offset + 1
        queue.log[offset] = message
        size = len(message.payload)
        queue.bytes += size
        self.total_bytes += size
        body = body_size(message)
        self.resident += body
        queue.published += 1
        self.stats.published += 1
        if not queue.transient:
            if self._unstored_limit:
                self._append_bytes += body
                self.unstored_bytes += body
                if self.unstored_bytes > self._unstored_limit:
                    self.alarm.set_behind(True)
            stored = self._appends.get(queue)
            self._appends[queue] = (offset if stored is None else stored[0], offset + 1)
            ops.append(PutQueueMessage(queue.name, offset, message))
        self._appended_to[queue] = offset + 1
        r = queue.retention
        if r.max_age is not None and self._timer is None:
            self._arm()
        # (``_enforce_retention``'s first tests, without the call: a head old enough
        # to drop, or past the count or size bound)
        if ((r.max_age is not None and ((head := queue.log.get(queue.first)) is None
                                        or head.timestamp + r.max_age <= message.timestamp))
                or (r.max_messages is not None and len(queue.log) > r.max_messages)
                or (r.max_bytes is not None and queue.bytes > r.max_bytes)):
            self._enforce_retention(queue, ops, message.timestamp)
        alarm = self.alarm
        if alarm.max_total > 0:
            total = self.total_bytes
            if alarm.over_total or total >= alarm.max_total:
                alarm.check_total(total)
            else:
                alarm.total = total   # (``check_total`` under its bound, inline)
        return offset

    def _remove(self, queue: QueueLog, offset: int) -> Message | None:
        """Take ``offset`` out of ``queue``'s log and its bytes out of the counts."""
        message = queue.log.pop(offset, None)
        if message is None:
            return None
        sizes = queue.evicted.pop(offset, None) if queue.evicted else None
        if sizes is None:
            size = len(message.payload)
            self.resident -= body_size(message)
        else:
            size = sizes[0]
        queue.bytes -= size
        self.total_bytes -= size
        if queue.unstored:
            queue.unstored.discard(offset)
        return message

    def _removed(self) -> None:
        """Messages left the queues: the storage alarm may clear."""
        if self.alarm.blocked:
            self.alarm.check_total(self.total_bytes)

    def _appended(self, result: object, queue: QueueLog, upto: int) -> object:
        if upto > queue.committed:
            queue.committed = upto
        if self.queues.get(queue.name) is queue:
            self._pump_queue(queue)
        return result

    def _enforce_retention(self, queue: QueueLog, ops: list[Op], now: float) -> None:
        """Drop what ``queue``'s retention no longer allows: from the head what is
        too old, then the oldest ready messages past the count or size bound (as
        RabbitMQ's x-max-length, what consumers hold is neither counted nor
        dropped: ``QueueLog.excess``; their prefetch bounds it)."""
        r = queue.retention
        log = queue.log
        start = queue.first
        if r.max_age is not None:
            while log:
                message = queue.oldest()
                if message is None or message.timestamp + r.max_age > now:
                    break
                self._drop_retained(queue, queue.first, "expired", ops)
        if r.max_messages is not None or r.max_bytes is not None:
            for offset in queue.excess(r.max_messages, r.max_bytes):
                self._drop_retained(queue, offset, "maxlen", ops)
        if queue.first != start:
            ops.append(TrimQueue(queue.name, queue.first))

    def _drop_retained(self, queue: QueueLog, offset: int, reason: str, ops: list[Op]) -> None:
        """Retention drops ``offset`` (dead-lettered by a dead-letter route)."""
        queue.oldest()
        if offset != queue.first and not queue.transient:   # (the head: ``TrimQueue``)
            ops.append(DeleteQueueMessage(queue.name, offset))
        if queue.dead_letter is not None:
            self._route_dead(queue, queue.log[offset], reason, offset, "", 0, ops)
        self._forget(queue, offset)
        queue.expired += 1
        self.stats.expired += 1

    def _forget(self, queue: QueueLog, offset: int) -> None:
        message = self._remove(queue, offset)
        queue.unwait(offset)   # (dropped, not consumed: never early)
        if message is None:
            return
        self._removed()
        for group in queue.groups.values():
            if group.mode != CLASSIC or offset < group.floor or offset in group.done:
                continue
            pending = group.pending.pop(offset, None)
            if pending is not None:
                pending.member.outstanding -= 1
                entry = pending.detach()
                if entry is not None:
                    pending.member.session.take_back(entry)
            elif group.levels is not None and offset < group.next:
                group.levels.stale = True   # (it waits in its level's heap: ``lag``)
            group.counts.pop(offset, None)
            group.uncounted.discard(offset)
            if offset < group.next:
                group.done.add(offset)
                group.advance_floor()
        if offset == queue.first:
            queue.oldest()

    def _done(self, group: ConsumerGroup, offset: int) -> None:
        """``offset`` is finished for ``group`` (acknowledged or dead-lettered)."""
        group.counts.pop(offset, None)
        group.uncounted.discard(offset)
        floor = group.floor
        if (offset == floor and offset + 1 not in group.done
                and not group.queue.skip_starts):
            group.floor = offset + 1   # (``advance_floor``'s usual outcome, in place)
        elif offset >= floor:
            group.done.add(offset)
            group.advance_floor()
        # (stored by the next ``_commit``, whoever makes it: ``_drain_done``)
        unsaved = self._unsaved.get(group)
        if unsaved is None:
            self._unsaved[group] = [offset]
        else:
            unsaved.append(offset)

    def _trim(self, queue: QueueLog, ops: list[Op]) -> None:
        """Classic mode: a message leaves the log once every classic group is done
        with it (stream groups do not hold messages: retention ends them)."""
        groups = queue.groups.values()
        floors = [g.floor for g in groups if g.mode == CLASSIC]
        if not floors:
            return
        # (a stream group's cursor holds what it has not read yet too)
        upto = min(min(floors), min((g.next for g in groups if g.mode == STREAM),
                                    default=floors[0]))
        if upto <= queue.first:
            return
        if queue.waiters or queue.round_waits:
            queue.consumed_below(upto, self._early)
        for offset in range(queue.first, upto):
            self._remove(queue, offset)
        queue.first = upto
        ops.append(TrimQueue(queue.name, upto))
        self._removed()

    # -- what the layers above provide -----------------------------------------------

    def _pump_queue(self, queue: QueueLog) -> None:
        """Hand out what ``queue``'s groups may have (``Dispatch``)."""
        raise NotImplementedError

    def _arm(self) -> None:
        """Make sure the timer runs while something waits on time (``QueueTimers``)."""
        raise NotImplementedError

    def _route_dead(self, queue: QueueLog, message: Message, reason: str, offset: int,
                    group: str, count: int, ops: list[Op]) -> None:
        """Dead-letter ``message`` by ``queue``'s route (``Acknowledgements``)."""
        raise NotImplementedError


_NAMED = (PutQueue, DeleteQueue)
_NO_APPENDS: Mapping[QueueLog, int] = MappingProxyType({})


def _rule_retention(rule: tuple[str, float | None, int | None, int | None]
                    | tuple[str, float | None, int | None, int | None, int | None],
                    limits: Limits) -> Retention:
    """A ``--queues`` rule's retention and levels, the defaults where it says none."""
    return Retention(
        rule[1] if rule[1] is not None else limits.queue_max_age or None,
        rule[2] if rule[2] is not None else limits.queue_max_bytes or None,
        rule[3] if rule[3] is not None else limits.queue_max_messages or None,
        rule[4] if len(rule) > 4 else None)


def _queue_of(op: Op) -> str | None:
    """The queue an op of the queues changes (None: not a queue op)."""
    if isinstance(op, (PutQueueMessage, DeleteQueueMessage, TrimQueue, QueueDone,
                       PutQueueGroup, DeleteQueueGroup)):
        return op.queue
    if isinstance(op, _NAMED):
        return op.name
    return None

