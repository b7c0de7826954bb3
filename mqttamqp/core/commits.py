"""Commit batching, barriers and the end-of-batch flush: how the core hands durable
changes to the ``StateStore`` and how callers learn that they are durable.

What it owns: the batch that one socket read (MQTT or AMQP) opens, so everything
that read causes costs one hand-off to the writer thread; the Deferreds callers
chain acknowledgements on; the flush hooks connections register so their output
for a batch is written once, after it (the one flush mechanism of both
protocols), and what a connection's failed write costs (``write_failed``: a
counter, a line a minute, for a batch's flush and an MQTT frame sent at once); the
``stopping`` state in which nothing more is stored, so nothing more is
acknowledged; and whether storage is failing: one log line when commits start to
fail, one when they succeed again, a counter in between (in ``BrokerStats``), however
many acknowledgements were withheld meanwhile.

The commit of one batch is a ``CommitRound`` (``commit_round``), one mechanism
for every early acknowledgement and every wait on that commit without a Deferred
of its own: the MQTT QoS 1 PUBACKs of the batch (``persist_early``: the
deliveries they stand for are its outstanding count), the queues' appends
(``persist_in_round``: the queues' durable watermark, ``when_done``, never before
the commit that holds them) and 0.9.1 publisher confirms (``when_answered``).  Its
callbacks are called once each with the outcome (None, or the commit's Failure):
``when_done`` at the commit; ``when_answered`` at the commit, or earlier once the
batch was submitted and every delivery was acknowledged and every append
consumed.  Unlike a Deferred shared by several consumers, no callback's return
value reaches the next one: a failed commit fails every callback of it.

What it must not do: decide what to store (the other core parts describe their
changes as operations) or write to sockets itself (connections flush their own
output when asked).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.persistence import Op, StateStore
from mqttamqp.core.ratelog import LogLimiter
from mqttamqp.core.sessions.entries import OutEntry
from mqttamqp.core.stats import BrokerStats

__all__ = ["CommitBatcher", "CommitRound", "Durable", "all_done", "all_durable",
           "fire_when_acknowledged", "committed_or_acknowledged", "committed_or_early"]


def _no_clock() -> float:
    """The time without a clock (a batcher built without one, in tests): none passes."""
    return 0.0


def write_failed(stats: BrokerStats, limit: LogLimiter, log: Logger,
                 failure: Failure) -> None:
    """A write to a connection's transport raised (its output is dropped): counted
    (``BrokerStats.write_failures``), and one line a minute with the traceback and
    how many more failed since.  A batch's flush (``CommitBatcher.output_failed``)
    and an MQTT frame sent at once (``MQTTProtocol._emit``, the CONNACK of
    ``handshake._send_now``) all come here."""
    stats.write_failures += 1
    held = limit.allow("writing output failed")
    if held is not None:
        log.failure("writing a connection's output failed ({n} more since the last "
                    "such line)", failure, n=held)


class CommitBatcher:
    log: ClassVar[Logger] = Logger(namespace="mqttamqp.core.broker")

    def __init__(self, store: StateStore, stats: BrokerStats | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self.stats = stats if stats is not None else BrokerStats()
        self._clock = clock
        self._failing_since = 0.0
        self._failed_while = 0      # failed commits since storage started failing
        # Set when the process shuts down: nothing more is stored, so nothing more
        # may be acknowledged (the Deferreds handed out never fire).
        self.stopping = False
        # >0 while a transaction's work runs (``core.transactions``): the router marks
        # no put of it that the writer may hold over (``PutQueued.online``), so the
        # transaction's answer never waits for a subscriber's acknowledgement.
        self.atomic = 0
        self._depth = 0
        self._ops: list[Op] = []
        self._waiters: list[Deferred[None]] = []
        self._round: CommitRound | None = None   # the batch's commit, as a round
        self._flushes: list[Callable[[], None]] = []
        # One line a minute about failed writes, not a traceback per delivery.
        self._log_limit = LogLimiter(clock if clock is not None else _no_clock)

    @property
    def owned(self) -> bool:
        """True while a Deferred that ``persist`` returns is the caller's alone (inside
        a batch, or while stopping), so it may also be fired early."""
        return bool(self._depth) or self.stopping

    def persist(self, ops: Sequence[Op]) -> Deferred[None] | None:
        """Submit ``ops``; the Deferred fires once durable (None: nothing to wait for).

        Inside a batch the ops are collected and submitted together when the
        outermost batch ends, in the same order.
        """
        if not ops:
            return None
        if self.stopping:
            return Deferred()
        if self._depth:
            self._ops.extend(ops)
            waiter: Deferred[None] = Deferred()
            self._waiters.append(waiter)
            return waiter
        return self._commit(ops)

    @property
    def batching(self) -> bool:
        """True inside a batch that will be stored (``persist_early`` may be used)."""
        return bool(self._depth) and not self.stopping

    def persist_early(self, ops: Sequence[Op],
                      entries: Sequence[OutEntry]) -> CommitRound | None:
        """Inside a batch (``batching``): submit ``ops`` with the batch, and return
        the batch's ``CommitRound`` holding ``entries``: its ``when_answered``
        succeeds once the batch is committed or once every entry (and every other
        outstanding thing of the round) has been acknowledged, whichever comes
        first, and fails if the commit fails first.  Outside a batch, or while
        stopping: None, nothing submitted (use ``persist``)."""
        if not self._depth or self.stopping:
            return None
        self._ops.extend(ops)
        r = self._round
        if r is None:
            r = self._round = CommitRound(self.log_failure)
        for entry in entries:   # (``CommitRound.hold`` inlined: once per publish)
            entry.on_done = r
        r.outstanding += len(entries)
        return r

    def commit_round(self) -> CommitRound | None:
        """Inside a batch (``batching``): the ``CommitRound`` of the commit that will
        hold everything the batch submits, before or after this call.  Outside a
        batch, or while stopping: None."""
        if not self._depth or self.stopping:
            return None
        r = self._round
        if r is None:
            r = self._round = CommitRound(self.log_failure)
        return r

    def persist_in_round(self, ops: Sequence[Op]) -> CommitRound | None:
        """Inside a batch: submit ``ops`` with it and return its ``CommitRound``
        (counted once more), no Deferred of the caller's own.  The caller counts
        in ``outstanding`` what it will release itself by calling the round (a
        queue's early-answer entry, or a hold only the commit ends).  Outside a
        batch, or while stopping: None, nothing submitted (use ``persist``)."""
        if not self._depth or self.stopping:
            return None
        self._ops.extend(ops)
        r = self._round
        if r is None:
            r = self._round = CommitRound(self.log_failure)
        r.count += 1
        return r

    def barrier(self) -> Deferred[None]:
        """Fires once everything submitted so far is durable."""
        if self.stopping:
            return Deferred()
        if self._depth:
            waiter: Deferred[None] = Deferred()
            self._waiters.append(waiter)
            return waiter
        return self._commit(())

    def background(self, ops: Sequence[Op], what: str = "recording a change") -> None:
        """Store ``ops`` with nobody waiting (a failure is logged)."""
        if not ops or self.stopping:
            return
        if self._depth:
            self._ops.extend(ops)
            return
        self._commit(ops).addErrback(self.log_failure, what)

    def watch(self, d: Deferred[None] | None, what: str) -> None:
        """Nobody waits for ``d``: log its failure, if any, as storage failing."""
        if d is not None:
            d.addErrback(self.log_failure, what)

    def log_failure(self, failure: Failure, what: str) -> None:
        """A failure nobody waits for.  A failed commit was counted and logged (once
        per failing spell) by ``_commit``; anything else is a fault of ours, logged."""
        if not getattr(failure, _COUNTED, False):
            self.log.failure("failed while {what}", failure, what=what)

    # -- storage health ----------------------------------------------------------------

    @property
    def failing(self) -> bool:
        return self.stats.storage_failing

    def _commit(self, ops: Sequence[Op]) -> Deferred[None]:
        d = self.store.submit(ops)
        if ops:
            # (An empty commit, a barrier, touches no storage: it says nothing of it.)
            self.stats.commit_batch.observe(len(ops))
            d.addCallbacks(self._committed, self._commit_failed,
                           callbackArgs=(self._now(),))
        return d

    def _now(self) -> float:
        return self._clock() if self._clock is not None else 0.0

    def _committed(self, result: None, submitted: float) -> None:
        stats = self.stats
        stats.commits += 1
        stats.commit_latency.observe(max(0.0, self._now() - submitted))
        if stats.storage_failing:
            stats.storage_failing = False
            self.log.info("storage recovered: commits succeed again after {n} failed "
                          "commit(s) in {s:.1f}s", n=self._failed_while,
                          s=max(0.0, self._now() - self._failing_since))
            self._failed_while = 0
        return result

    def _commit_failed(self, failure: Failure) -> Failure:
        setattr(failure, _COUNTED, True)   # (the same Failure goes down every chain)
        stats = self.stats
        stats.storage_failures += 1
        self._failed_while += 1
        if not stats.storage_failing:
            stats.storage_failing = True
            self._failing_since = self._now()
            stats.storage_error = _summary(failure)
            # One line for the whole spell: no traceback per message or client.
            self.log.error("storage failing ({e}): nothing durable is acknowledged until "
                           "a commit succeeds again; clients waiting for an "
                           "acknowledgement are disconnected so that they retry",
                           e=stats.storage_error)
        return failure

    # -- batches ------------------------------------------------------------------

    def begin(self) -> bool:
        """Open a batch; True when it is the outermost one (a read that is not handled
        inside another's: a WebSocket read opens one around each frame it holds)."""
        self._depth += 1
        return self._depth == 1

    def after_batch(self, flush: Callable[[], None]) -> bool:
        """Inside a batch: call ``flush`` when it ends (a connection writes what the
        batch gave it in one go) and return True; outside one, return False."""
        if not self._depth:
            return False
        self._flushes.append(flush)
        return True

    def end(self) -> None:
        """End a batch; the outermost end submits its ops, then runs the flushes.

        The ops go first, so a change a flush causes (an AMQP outcome handled
        while pumping, say) is stored after the changes it follows.  Flushes run
        inside a batch of their own, which ends the same way, until none is left.
        """
        self._depth -= 1
        if self._depth:
            return
        while True:
            if self._ops or self._waiters or self._round is not None:
                self._submit()
            if not self._flushes:
                return
            flushes, self._flushes = self._flushes, []
            self._depth = 1
            try:
                for flush in flushes:
                    try:
                        flush()
                    except Exception:  # one connection's failure must not hold up the rest
                        self.output_failed(Failure())
            finally:
                self._depth = 0

    def output_failed(self, failure: Failure) -> None:
        """Writing a connection's output at a batch's end raised: what it held is
        dropped, the other connections are served (``write_failed``)."""
        write_failed(self.stats, self._log_limit, self.log, failure)

    def _submit(self) -> None:
        ops, waiters, r = self._ops, self._waiters, self._round
        self._ops, self._waiters, self._round = [], [], None
        if self.stopping:
            # (nothing is stored: only the acknowledgements answer the round, which
            # never completes, as ``persist``'s Deferreds never fire)
            if r is not None:
                r.seal()
            return
        d = self._commit(ops)
        if r is not None:
            # sealed after the submit: a callback it answers at once (every delivery
            # already acknowledged) may start work whose ops must follow these
            r.seal()
        if waiters or r is not None:
            # (one callback pair for all: none of them sees what another returned)
            d.addCallbacks(_fire_all, _fail_all, callbackArgs=(waiters, r),
                           errbackArgs=(waiters, r, self.log_failure))
        else:
            d.addErrback(self.log_failure, "recording a batch of changes")


class CommitRound:
    """The commit of one batch, waited on without a Deferred per submission: what
    the MQTT QoS 1 PUBACKs of a batch (``persist_early``), the queues' appends
    (``persist_in_round``, ``commit_round``) and the 0.9.1 confirms wait on.

    ``count``: the submissions that joined it (``persist_in_round``).
    ``outstanding``: what may answer before the commit, not finished yet: the
    deliveries (``OutEntry``, through ``hold``: each calls the round, its
    ``on_done``, when the client acknowledges it) and the queue appends (each
    released, the round called, when every consumer finished its message).

    Two kinds of callbacks, each called once with an outcome (None, or the
    commit's Failure) and its own argument, at once if that outcome is known;
    what one returns or raises reaches no other, and a failure reaches every one:

    - ``when_done``: the commit's outcome, never before the commit that holds
      the batch (the queues' durable watermark).
    - ``when_answered`` (PUBACKs, confirms): the commit's outcome, or success
      earlier, once the batch is submitted (``seal``) and nothing is
      ``outstanding`` (every delivery acknowledged, every append consumed).  A
      commit that fails after an early answer is logged.
    """

    __slots__ = ("_answers", "_callbacks", "_log_failure", "_outcome", "_sealed",
                 "answered", "count", "done", "outstanding")

    def __init__(self, log_failure: Callable[[Failure, str], None]) -> None:
        self.count = 0
        self.outstanding = 0    # deliveries and submissions not finished
        self.done = False
        self.answered = False
        self._sealed = False    # the batch is submitted: nothing more joins
        self._outcome: Failure | None = None
        self._callbacks: list[tuple[Callable[[Failure | None, Any], object], Any]] = []
        self._answers: list[tuple[Callable[[Failure | None, Any], object], Any]] = []
        self._log_failure = log_failure

    def hold(self, entries: Sequence[OutEntry]) -> None:
        """Count ``entries``; each calls the round once acknowledged."""
        for entry in entries:
            entry.on_done = self
        self.outstanding += len(entries)

    def when_done(self, callback: Callable[[Failure | None, Any], object],
                  arg: Any) -> None:
        """Call ``callback(outcome, arg)`` once the commit's outcome is known."""
        if self.done:
            callback(self._outcome, arg)
        else:
            self._callbacks.append((callback, arg))

    def when_answered(self, callback: Callable[[Failure | None, Any], object],
                      arg: Any) -> None:
        """Call ``callback(outcome, arg)`` at the commit, or with None once nothing
        is outstanding after the batch was submitted, if that is first."""
        if self.answered:
            callback(self._outcome, arg)
        else:
            self._answers.append((callback, arg))

    def __call__(self) -> None:
        """One delivery or submission needs the commit no more (acknowledged,
        consumed): the round is an ``OutEntry.on_done``, called as it is."""
        self.outstanding -= 1
        if not self.outstanding and self._sealed and not self.answered:
            self._answer(None)

    def seal(self) -> None:
        """The batch is submitted; answer now if nothing is outstanding (and someone
        waits: an answer nobody heard must not make a later failure look late)."""
        self._sealed = True
        if not self.outstanding and self._answers and not self.answered:
            self._answer(None)

    def finish(self, outcome: Failure | None) -> None:
        """The commit succeeded (None) or failed: call every callback with that."""
        if self.done:
            return
        self.done = True
        self._outcome = outcome
        callbacks, self._callbacks = self._callbacks, []
        self._call(callbacks, outcome)
        if not self.answered:
            self._answer(outcome)
        elif outcome is not None:
            self._log_failure(outcome, "storing messages that were already acknowledged")

    def _answer(self, outcome: Failure | None) -> None:
        self.answered = True
        answers, self._answers = self._answers, []
        self._call(answers, outcome)

    def _call(self, callbacks: list[tuple[Callable[[Failure | None, Any], object], Any]],
              outcome: Failure | None) -> None:
        for callback, arg in callbacks:
            try:
                callback(outcome, arg)
            except Exception:   # one waiter's fault must not cost the others theirs
                self._log_failure(Failure(), "completing a commit's round")


# What a caller waits on for a commit: a Deferred, a batch's round, or nothing.
Durable = Deferred[None] | CommitRound | None


def round_deferred(r: CommitRound) -> Deferred[None]:
    """A Deferred that ``r``'s outcome fires (for a caller that combines it)."""
    d: Deferred[None] = Deferred()
    r.when_done(_fire_deferred, d)
    return d


def _fire_deferred(outcome: Failure | None, d: Deferred[None]) -> None:
    if outcome is None:
        d.callback(None)
    else:
        d.errback(outcome)


def all_done(ds: Sequence[Durable]) -> Durable:
    """``all_durable`` over Deferreds and rounds: one of them is returned as is."""
    pending = [d for d in ds if d is not None]
    if len(pending) == 1:
        return pending[0]
    return all_durable([round_deferred(d) if isinstance(d, CommitRound) else d
                        for d in pending])


# Marks a Failure that is a failed commit, already counted and logged.
_COUNTED = "_mqttamqp_storage_counted"


def _summary(failure: Failure) -> str:
    value = failure.value
    return f"{type(value).__name__}: {value}"[:300]


def all_durable(ds: Sequence[Deferred[None] | None]) -> Deferred[None] | None:
    """One Deferred for several commits: fires when all have, fails with the first
    failure (None if there is nothing to wait for)."""
    pending = [d for d in ds if d is not None]
    if not pending:
        return None
    if len(pending) == 1:
        return pending[0]
    done: Deferred[None] = Deferred()
    remaining = [len(pending)]

    def one(_: object) -> None:
        remaining[0] -= 1
        if remaining[0] == 0 and not done.called:
            done.callback(None)

    def failed(failure: Failure) -> None:
        if not done.called:
            done.errback(failure)

    for d in pending:
        d.addCallbacks(one, failed)
    return done


def _fire_all(_: object, waiters: list[Deferred[None]], r: CommitRound | None) -> None:
    for waiter in waiters:
        if not waiter.called:  # else fired early (fire_when_acknowledged)
            waiter.callback(None)
    if r is not None:
        r.finish(None)


def _fail_all(failure: Failure, waiters: list[Deferred[None]], r: CommitRound | None,
              log_failure: Callable[[Failure, str], None]) -> None:
    fired = False
    for waiter in waiters:
        if waiter.called:
            fired = True
        else:
            waiter.errback(failure)
    if r is not None:
        r.finish(failure)
    if fired:
        log_failure(failure, "storing messages that were already acknowledged")


def fire_when_acknowledged(waiter: Deferred[None], entries: list[OutEntry]) -> None:
    """Fire ``waiter`` as soon as every entry has been acknowledged (unless it fired
    already).  A batch waiter is used as is; otherwise ``committed_or_acknowledged``
    puts a Deferred of its own between the store's and the caller."""
    if len(entries) == 1:
        # (the usual case, one persistent subscriber: no counter, no closure)
        entries[0].on_done = partial(_fire_unless_called, waiter)
        return
    remaining = [len(entries)]

    def acknowledged() -> None:
        remaining[0] -= 1
        if remaining[0] == 0 and not waiter.called:
            waiter.callback(None)

    for entry in entries:
        entry.on_done = acknowledged


def _fire_unless_called(waiter: Deferred[None]) -> None:
    if not waiter.called:
        waiter.callback(None)


def committed_or_early(commit: Deferred[None],
                       log_failure: Callable[[Failure, str], None]) -> Deferred[None]:
    """A Deferred of the caller's own that ``commit`` fires (or fails) unless the
    caller fired it first; a failure after that is logged."""
    result: Deferred[None] = Deferred()

    def committed(_: object) -> None:
        if not result.called:
            result.callback(None)

    def failed(failure: Failure) -> None:
        if not result.called:
            result.errback(failure)
        else:
            log_failure(failure, "storing messages that were already acknowledged")

    commit.addCallbacks(committed, failed)
    return result


def committed_or_acknowledged(
        commit: Deferred[None], entries: list[OutEntry],
        log_failure: Callable[[Failure, str], None]) -> Deferred[None]:
    """Fires when ``commit`` does or when every entry has been acknowledged.

    A PUBACK promises that the message is safe: stored for its persistent
    subscribers, or already delivered to them.  When all of them acknowledge
    before the writer thread commits, the promise holds without waiting (and
    the writer skips the queue writes their deletes cancel).
    """
    result = committed_or_early(commit, log_failure)
    fire_when_acknowledged(result, entries)
    return result
