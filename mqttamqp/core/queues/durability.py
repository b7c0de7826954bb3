"""How the queues' appends become durable: the accounting that follows each commit.

What it owns: the appends (per queue, the offsets ``first`` to ``upto``) and body
bytes handed to a commit, and what its outcome does to them: success raises each
queue's ``durable`` watermark (bodies below it may be evicted) and lets the
``unstored`` byte count fall (the writer is no longer behind); failure keeps
those bodies in memory for good (``QueueLog.unstored``).  Inside a batch, every
commit of the batch's queue appends is one ``CommitRound`` (``core.commits``) and
this is one callback on it, not one per append; outside one, a callback pair on
the commit's Deferred.  It also answers whether publishers to the queues are
blocked or paused (the storage alarm's state, the writer's being behind
included: ``blocked``, ``paused``).

What it must not do: decide what is appended or stored (``QueueLogs``), evict
(``MemoryBudget``, through ``_evict``) or answer publishers (their own waits).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitBatcher, CommitRound
from mqttamqp.core.queues.budget import StorageAlarm
from mqttamqp.core.queues.model import QueueLog

__all__ = ["AppendAccounting", "RoundAppends"]


class AppendAccounting:
    """The durable accounting of ``QueueLogs``' appends (a base of it)."""

    commits: CommitBatcher
    alarm: StorageAlarm
    resident: int
    budget: int
    unstored_bytes: int
    _unstored_limit: int
    _evict_above: int
    _appends: dict[QueueLog, tuple[int, int]]
    _append_bytes: int
    _round_appends: RoundAppends | None

    @property
    def blocked(self) -> bool:
        """Publishers to queues are blocked (the storage alarm is raised)."""
        return self.alarm.blocked

    @property
    def paused(self) -> bool:
        """Publishers to queues wait: blocked, or the writer is behind (the
        unstored bytes this accounts for are over their bound)."""
        return self.alarm.paused

    def _committed_bytes(self, nbytes: int) -> None:
        self.unstored_bytes -= nbytes
        if self.unstored_bytes <= self._unstored_limit // 2:
            self.alarm.set_behind(False)

    def _made_durable(self, result: object, stored: dict[QueueLog, tuple[int, int]],
                      nbytes: int) -> object:
        """Appends up to ``upto`` are durable: their bodies may be evicted."""
        for queue, (_, upto) in stored.items():
            if upto > queue.durable:
                queue.durable = upto
        self._committed_bytes(nbytes)
        if self.resident > self.budget > 0:
            if self.resident > self._evict_above:
                self._evict()
        else:
            self._evict_above = 0
        return result

    def _not_durable(self, failure: Failure, stored: dict[QueueLog, tuple[int, int]],
                     nbytes: int) -> Failure:
        """Appends whose commit failed are in memory only: never evicted."""
        self._committed_bytes(nbytes)
        for queue, (first, upto) in stored.items():
            queue.unstored.update(o for o in range(first, upto) if o in queue.log)
        return failure

    def _account(self, d: Deferred[None] | None) -> None:
        """The appends since the last commit are in ``d``'s: mark them durable once
        it is (``_made_durable``).  Inside a batch that is one callback on the
        batch's ``CommitRound`` for all of its commits, not one per commit."""
        stored = self._appends
        nbytes = self._append_bytes
        if not stored and not nbytes:
            return
        self._appends, self._append_bytes = {}, 0
        if d is None or not stored:
            self._committed_bytes(nbytes)
            return
        r = self.commits.commit_round()
        if r is None:
            d.addCallbacks(self._made_durable, self._not_durable,
                           callbackArgs=(stored, nbytes), errbackArgs=(stored, nbytes))
        else:
            self._join_round(r, stored, nbytes)

    def _account_in_round(self, r: CommitRound) -> None:
        """As ``_account``, the appends being in round ``r``'s commit."""
        stored = self._appends
        nbytes = self._append_bytes
        if not stored and not nbytes:
            return
        self._append_bytes = 0
        if not stored:
            self._committed_bytes(nbytes)
            return
        acc = self._round_appends
        if acc is not None and acc.round is r:
            # (the usual case, a publish after another of the batch: merged, and
            # the dict kept for the next append rather than a new one each; ``_merge``
            # inline: once a publish)
            acc.nbytes += nbytes
            merged = acc.stored
            for queue, (first, upto) in stored.items():
                had = merged.get(queue)
                merged[queue] = (first, upto) if had is None else (had[0], upto)
            stored.clear()
            return
        self._appends = {}
        self._join_round(r, stored, nbytes)

    def _join_round(self, r: CommitRound, stored: dict[QueueLog, tuple[int, int]],
                    nbytes: int) -> None:
        """Appends ``stored`` are in round ``r``'s commit: one ``_round_done`` per
        round for all of them, which a failure of that commit reaches (a later
        round's success says nothing of them)."""
        acc = self._round_appends
        if acc is None or acc.round is not r:
            acc = self._round_appends = RoundAppends(r, stored, nbytes)
            r.when_done(self._round_done, acc)
            return
        acc.nbytes += nbytes
        _merge(acc.stored, stored)

    def _round_done(self, outcome: Failure | None, acc: RoundAppends) -> None:
        if self._round_appends is acc:
            self._round_appends = None
        if outcome is None:
            self._made_durable(None, acc.stored, acc.nbytes)
        else:
            self._not_durable(outcome, acc.stored, acc.nbytes)

    def _evict(self) -> None:
        """Bring the bodies in memory under the budget (``MemoryBudget``)."""
        raise NotImplementedError


class RoundAppends:
    """The appends (per queue ``(first, upto)``) and body bytes of one round."""

    __slots__ = ("nbytes", "round", "stored")

    def __init__(self, r: CommitRound, stored: dict[QueueLog, tuple[int, int]],
                 nbytes: int) -> None:
        self.round = r
        self.stored = stored
        self.nbytes = nbytes


def _merge(merged: dict[QueueLog, tuple[int, int]],
           stored: dict[QueueLog, tuple[int, int]]) -> None:
    """Appends ``stored`` (per queue ``(first, upto)``) after those ``merged``."""
    for queue, (first, upto) in stored.items():
        had = merged.get(queue)
        merged[queue] = (first, upto) if had is None else (had[0], upto)
