"""The queues' timer: visibility timeouts, takeovers, retention by age, stream cursors.

One delayed call a second, armed only while something waits on time (an idle
broker has no queue timer)."""

from __future__ import annotations

from mqttamqp.core.persistence import Op, PutQueueGroup
from mqttamqp.core.queues.addresses import STREAM
from mqttamqp.core.queues.browsing import Browsing
from mqttamqp.core.queues.model import ConsumerGroup
from mqttamqp.core.sessions.session import Session

__all__ = ["QueueTimers"]

# A stream group's cursor is stored at most this often (seconds) when it moves.
_CURSOR_EVERY = 5.0


class QueueTimers(Browsing):
    """Runs the once-a-second work that waits on time, while there is any."""

    def _arm(self) -> None:
        """Tick in a second (only while something waits on time: an idle broker has
        no queue timer)."""
        if self._timer is None and not self.stopped:
            self._timer = self.clock.callLater(1.0, self._ticked)

    def _ticked(self) -> None:
        self._timer = None
        self.tick()
        if any((g.pending or (g.mode == STREAM and g.next != g.cursor_saved))
               for q in self.queues.values() for g in q.groups.values()) or any(
                   q.retention.max_age is not None and q.log for q in self.queues.values()):
            self._arm()

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def tick(self) -> None:
        """Visibility timeouts, takeovers, retention by age, stream cursors."""
        now = self.clock.seconds()
        timeout = self.limits.queue_visibility_timeout
        ops: list[Op] = []
        freed: list[Session] = []   # (sessions a delivery was taken back from)
        for queue in list(self.queues.values()):
            if queue.retention.max_age is not None:
                self._enforce_retention(queue, ops, now)
            for group in list(queue.groups.values()):
                if group.mode == STREAM:
                    if (group.next != group.cursor_saved
                            and now - group.cursor_saved_at >= _CURSOR_EVERY):
                        group.cursor_saved = group.next
                        group.cursor_saved_at = now
                        ops.append(PutQueueGroup(queue.name, group.key, group.record()))
                    continue
                if not group.pending:
                    continue
                expired = [o for o, p in group.pending.items()
                           if p.since + timeout <= now and not p.member.held and not p.tx_held]
                for offset in expired:
                    self._withdraw(group, offset, freed)
                    self._again(group, offset, ops, "not acknowledged within the "
                                f"visibility timeout ({timeout:g} s)")
                self._takeover(group, now, timeout / 2, ops, freed)
                self._pump(group)
        if ops:
            self._commit(ops, "recording queue timeouts")
        for session in dict.fromkeys(freed):   # (their windows: fed, once each)
            self._window_freed(session)

    def _withdraw(self, group: ConsumerGroup, offset: int, freed: list[Session]) -> None:
        pending = group.pending.pop(offset)
        pending.member.outstanding -= 1
        entry = pending.detach()
        if entry is not None:
            pending.member.session.take_back(entry)
            freed.append(pending.member.session)

    def _takeover(self, group: ConsumerGroup, now: float, after: float, ops: list[Op],
                  freed: list[Session]) -> None:
        """An idle member (credit, nothing pending) takes over the messages pending
        on a member that has not acknowledged for half the visibility timeout."""
        if self._next_offset(group, ops) is not None:
            return
        idle = [m for m in group.members if m.outstanding == 0 and self._credit(m)]
        if not idle:
            return
        stale = [o for o, p in group.pending.items()
                 if p.since + after <= now and p.member not in idle and not p.member.held
                 and not p.tx_held]
        log = group.queue.log
        evicted = group.queue.evicted
        stale = [o for o in stale if o not in evicted]   # (pending ones never are)
        turn = 0
        for offset in stale[: self.limits.queue_prefetch * len(idle)]:
            # (only to an idle member that still has credit and whose selector
            # takes it, as any hand-out: one taker must not pass its prefetch)
            takers = [m for m in idle if self._credit(m) and (
                m.selector is None or self._selects(m, m.selector, group, offset))]
            if not takers:
                continue
            self._withdraw(group, offset, freed)
            # (straight to the idle member: the stale one must not get it back)
            self._deliver(group, takers[turn % len(takers)], offset, log[offset], ops)
            turn += 1
        if stale:
            ops.append(PutQueueGroup(group.queue.name, group.key, group.record()))
