"""The memory budget of queue bodies (``--queue-memory-budget``).

Past the budget, durable bodies far from any consumer are evicted (a ``stub``
stays in the log) and read back from storage in batches as consumers near them;
what each consuming group hands out next is protected (and what each queue
browser reads next: ``Browsing``).

What this module must not do: read storage itself (the reader is injected by
``attach_storage``) or decide what a consumer gets (``Dispatch``)."""

from __future__ import annotations

from twisted.python.failure import Failure

from mqttamqp.core.message import Message, body_size, stub
from mqttamqp.core.queues.log import QueueLogs
from mqttamqp.core.queues.model import QueueLog

__all__ = ["MemoryBudget", "READ_MESSAGES", "READ_BYTES"]

# The memory budget of queue bodies (``--queue-memory-budget``): a read back from
# storage takes at most this many messages and bytes (at least one message), and
# the same ahead of each consuming group's (and browser's) cursor is never evicted,
# so that what was read back is not evicted again before it goes out.
READ_MESSAGES = 64
READ_BYTES = 4 << 20


class MemoryBudget(QueueLogs):
    """Evicts durable bodies past the budget and reads them back as consumers near."""

    @property
    def evicted_messages(self) -> int:
        """How many messages' bodies are out of memory now (read back when due)."""
        return sum(len(q.evicted) for q in self.queues.values())

    def _protected(self, queue: QueueLog) -> set[int]:
        """Offsets of ``queue`` whose bodies stay in memory: pending deliveries
        (their sessions hold the body anyway) and, for each group with members or
        taken from one message at a time (AMQP 0.9.1 ``basic.get``), what it hands
        out next (up to a read-back's worth)."""
        keep: set[int] = set()
        getting = ({g for taken in self._gets.values() for g, _ in taken} if self._gets
                   else ())
        for group in queue.groups.values():
            keep.update(group.pending)
            if not group.members and group not in getting:
                continue
            if group.ready:
                keep.update(group.ready[:READ_MESSAGES])
            if group.levels is not None:   # (a priority queue: by level)
                keep.update(group.levels.first(READ_MESSAGES))
            self._keep_ahead(queue, group.next, keep)
        return keep

    @staticmethod
    def _keep_ahead(queue: QueueLog, offset: int, keep: set[int]) -> None:
        """Add to ``keep`` the offsets of ``queue`` from ``offset`` on that a cursor
        there reads next (up to a read-back's worth: ``READ_MESSAGES``,
        ``READ_BYTES``)."""
        log = queue.log
        evicted = queue.evicted
        count = size = 0
        end = queue.next_offset
        while offset < end and count < READ_MESSAGES and size < READ_BYTES:
            message = log.get(offset)
            if message is not None:
                keep.add(offset)
                count += 1
                sizes = evicted.get(offset)
                size += sizes[1] if sizes is not None else body_size(message)
            offset += 1

    def _evict(self) -> None:
        """Over the memory budget: drop durable bodies from memory, those farthest
        from any consumer first (queues nobody consumes, then each queue's newest
        messages), down to the budget less an eighth (so that eviction runs once
        per so many bytes appended, not once per message)."""
        if self._reader is None:
            return
        slack = min(self.budget // 8, 8 << 20)
        target = self.budget - slack
        queues = sorted(self.queues.values(),
                        key=lambda q: any(g.members for g in q.groups.values()))
        waiting = False    # bodies whose commit is still to come (evicted after it)
        for queue in queues:
            if self.resident <= target:
                break
            if len(queue.evicted) >= len(queue.log):
                continue
            keep = self._protected(queue)
            evicted = queue.evicted
            unstored = queue.unstored
            durable = queue.durable
            log = queue.log
            for offset in reversed(list(log)):
                if offset >= durable:
                    waiting = True
                    continue
                if offset in evicted or offset in keep or (unstored and offset in unstored):
                    continue
                message = log[offset]
                body = body_size(message)
                evicted[offset] = (len(message.payload), body)
                log[offset] = stub(message)
                self.resident -= body
                self.evictions += 1
                if self.resident <= target:
                    break
        self._evict_above = (self.resident + slack if self.resident > target and not waiting
                             else 0)

    def _read_back(self, queue: QueueLog, offset: int,
                   upcoming: list[int] | None = None) -> None:
        """Read the evicted bodies from ``offset`` on (a batch) back from storage,
        or, for a priority queue's group, those of ``upcoming`` (what it hands out
        next, in that order: ``PriorityLevels.first``); the queue's groups pump
        again once they are in memory."""
        if queue.reading or self._reader is None:
            return
        evicted = queue.evicted
        offsets: list[int] = []
        size = 0
        if upcoming is not None:
            for o in upcoming:
                sizes = evicted.get(o)
                if sizes is not None:
                    offsets.append(o)
                    size += sizes[1]
                    if len(offsets) >= READ_MESSAGES or size >= READ_BYTES:
                        break
            if offset not in offsets:
                offsets.insert(0, offset)
            offsets.sort()
        o = offset
        end = queue.next_offset
        while (upcoming is None and o < end and len(offsets) < READ_MESSAGES
               and (not offsets or size < READ_BYTES)):
            sizes = evicted.get(o)
            if sizes is not None:
                offsets.append(o)
                size += sizes[1]
            o += 1
        queue.reading = True
        d = self._reader(queue.name, offsets)
        d.addCallbacks(self._read_done, self._read_failed, callbackArgs=(queue, offsets),
                       errbackArgs=(queue,))

    def _read_done(self, found: list[tuple[int, Message]], queue: QueueLog,
                   asked: list[int]) -> None:
        queue.reading = False
        if self.queues.get(queue.name) is not queue:
            return   # (deleted meanwhile)
        self._restored(found, queue)
        evicted = queue.evicted
        # (what storage did not return: one it returned may be evicted again by now)
        returned = {o for o, _ in found}
        missing = [o for o in asked if o in evicted and o not in returned]
        if missing:
            # Storage no longer has them (it never drops a message before memory
            # does): never wait for them; their consumers go on past them.
            self.log.error("queue {q!r}: {n} message(s) not found in storage on reading "
                           "them back (offsets {a} to {b}); they are dropped",
                           q=queue.name, n=len(missing), a=missing[0], b=missing[-1])
            for offset in missing:
                self._forget(queue, offset)
        self._pump_queue(queue)

    def _read_failed(self, failure: Failure, queue: QueueLog) -> None:
        queue.reading = False
        suppressed = self._log_limit.allow("queue:read-back")
        if suppressed is not None:
            self.log.error("queue {q!r}: reading messages back from storage failed: {e} "
                           "(tried again as consumers ask; {h} more since the last line)",
                           q=queue.name, e=failure.getErrorMessage(), h=suppressed)
        if not self.stopped:
            # (again in a second: not at once, in a loop, against a failing store)
            self.clock.callLater(1.0, self._pump_queue, queue)

    def _restored(self, found: list[tuple[int, Message]], queue: QueueLog) -> None:
        """Bodies read back from storage are in memory again."""
        evicted = queue.evicted
        log = queue.log
        for offset, message in found:
            if offset in evicted and offset in log:
                del evicted[offset]
                log[offset] = message
                self.resident += body_size(message)
                self.read_backs += 1
        if found and self.resident > self.budget > 0 and self.resident > self._evict_above:
            # What was read back counts against the budget as appends do: a replay
            # (a stream from its first offset) would otherwise keep it all.  (What
            # a consumer reads next is protected; when that alone is over the
            # budget, appends still evict as before: ``_evict_above`` is theirs.)
            above = self._evict_above
            self._evict()
            if self._evict_above:
                self._evict_above = above
