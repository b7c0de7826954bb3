"""Local transactions, once for every protocol: AMQP 1.0's coordinator and AMQP
0.9.1's ``tx`` class both hold their work here until commit (``Broker.transactions``).

What it owns: the open transactions of each owner (an AMQP connection, a 0.9.1
channel) and their bounds (``--max-transactions-per-connection``,
``--max-transaction-bytes``); the work a transaction holds, captured by the
adapter as callables (a publish as the adapter's own routing call, an
acknowledgement as its settle, with an undo for rollback); commit, which runs
that work in order inside ONE batch of the ``CommitBatcher`` (so its operations
reach the writer in one submission, which the store commits in one ZODB
transaction, never split) and fires once all of it is durable, the queues'
acknowledgements included (they are otherwise stored at the end of the batch,
in a submission of their own: ``flush`` stores them inside ours); rollback, which
drops the publishes and runs the undos; the counters (open, committed, rolled
back, refused, failed) and one log line per cause (``LogLimiter``).

Nothing of an open transaction touches the broker's state: a crash before commit
leaves nothing of it, and after its Deferred fires all of it survives one.

What it must not do: know a protocol (the adapters turn their frames into
``add_publish``/``add_settle`` and answer the client when ``commit`` fires), or
touch storage other than through the ``CommitBatcher``.

Before commit runs any work it asks every held action's ``check`` (a settle: its
delivery is still the one it was, claimed by the same consumer; a publish: the
queues and permissions it needs still take it): one that fails refuses the whole
commit with nothing applied (``TransactionRefused``).  A failure once the work
runs (a publish refused after all, a fault of ours) is ``PartiallyApplied``:
the adapters must not answer it as a rollback.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from enum import Enum

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitBatcher, all_durable
from mqttamqp.core.exchanges.topicspace import PublishRefused
from mqttamqp.core.ratelog import LogLimiter

__all__ = ["ACTION_OVERHEAD", "PartiallyApplied", "Transaction", "TransactionRefused",
           "TransactionState", "Transactions"]

# Bytes a held action counts for beyond its message's size: an acknowledgement
# holds no body, but it is work held all the same (--max-transaction-bytes bounds
# the number of acknowledgements too).
ACTION_OVERHEAD = 64

Publish = Callable[[], "Deferred[None] | None"]
Settle = Callable[[], None]
# Asked before a commit runs any work: why the action can no longer be carried out
# (None: it can).
Check = Callable[[], "str | None"]


class TransactionRefused(Exception):
    """Over a bound, or work on a transaction that is no longer open; ``reason`` is
    the text a client is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PartiallyApplied(Exception):
    """A commit failed after some of its work was applied (a publish refused at
    commit although its check passed, a fault of ours); ``reason`` says why.
    Not a rollback: the client must not be told nothing happened."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransactionState(Enum):
    OPEN = "open"
    COMMITTING = "committing"   # commit() ran its work; waiting for the store
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    FAILED = "failed"           # commit refused (rollback-only) or not durable


_OPEN = TransactionState.OPEN


class Transaction:
    """One transaction of one owner: the work it holds, run at commit."""

    __slots__ = ("_checks", "_doomed", "_parent", "_publishes", "_undos", "_work", "id",
                 "owner", "planned", "size", "state")

    def __init__(self, parent: Transactions, owner: object, tid: int) -> None:
        self._parent = parent
        self.owner = owner
        self.id = tid
        self.state = _OPEN
        self.size = 0                       # bytes held, ACTION_OVERHEAD per action
        # (kind, callable): "p" a publish (its Deferred waited for), "s" a settle
        self._work: list[tuple[str, Callable[[], object]]] = []
        self._undos: list[Settle] = []
        self._checks: list[Check] = []
        # While its commit asks the checks: what the publishes checked so far add to
        # each queue (``QueueManager.room_problem``), so the room is counted once.
        self.planned: dict[str, tuple[int, int]] = {}
        self._publishes = 0
        self._doomed: str | None = None     # why a commit will be refused

    @property
    def publishes(self) -> int:
        return self._publishes

    @property
    def settles(self) -> int:
        return len(self._work) - self._publishes

    @property
    def doomed(self) -> str | None:
        """Why this transaction can only roll back (None: it may commit)."""
        return self._doomed

    def _hold(self, size: int) -> None:
        if self.state is not _OPEN:
            raise TransactionRefused(f"transaction {self.id} is {self.state.value}")
        if self._doomed is not None:
            raise TransactionRefused(self._doomed)
        size += ACTION_OVERHEAD
        limit = self._parent.max_bytes
        if limit and self.size + size > limit:
            reason = (f"transaction holds more than {limit} bytes "
                      "(--max-transaction-bytes)")
            self._doomed = reason
            self._parent.refuse("bytes", reason)
            raise TransactionRefused(reason)
        self.size += size

    def add_publish(self, size: int, run: Publish, check: Check | None = None) -> None:
        """Hold a publish of ``size`` bytes (all of the message as stored): ``run``
        (the adapter's own routing call) is called at commit; its Deferred, if
        any, is waited for.  ``check`` is asked before the commit runs anything.
        Over --max-transaction-bytes the transaction can only roll back from now on
        (``TransactionRefused``)."""
        self._hold(size)
        self._work.append(("p", run))
        self._publishes += 1
        if check is not None:
            self._checks.append(check)

    def add_settle(self, run: Settle, undo: Settle | None = None,
                   check: Check | None = None) -> None:
        """Hold an acknowledgement: ``run`` applies it at commit, ``undo`` (if
        any) runs at rollback (AMQP 1.0: release the delivery); ``check`` is
        asked before the commit runs anything (the delivery is still there)."""
        self._hold(0)
        self._work.append(("s", run))
        if undo is not None:
            self._undos.append(undo)
        if check is not None:
            self._checks.append(check)

    def commit(self) -> Deferred[None]:
        """Run the held work in order in one batch; fires once all of it is durable.

        Fails (nothing run, the undos run) with ``TransactionRefused`` when the
        transaction is no longer open or can only roll back; with the store's
        failure when the commit is not durable."""
        parent = self._parent
        if self.state is not _OPEN:
            return fail(TransactionRefused(f"transaction {self.id} is {self.state.value}"))
        parent.forget(self)
        if self._doomed is not None:
            reason = self._doomed
            self._rollback_work()
            self.state = TransactionState.FAILED
            parent.failed += 1
            return fail(TransactionRefused(reason))
        refusal = self._refusal()
        if refusal is not None:
            self._rollback_work()
            self.state = TransactionState.FAILED
            parent.failed += 1
            parent.warn("check", f"transaction {self.id} refused at commit, nothing "
                        f"applied: {refusal}")
            return fail(TransactionRefused(refusal))
        self.state = TransactionState.COMMITTING
        work, self._work, self._undos, self._checks = self._work, [], [], []
        commits = parent.commits
        waits: list[Deferred[None] | None] = []
        error: Failure | None = None
        commits.begin()
        commits.atomic += 1
        try:
            for kind, run in work:
                try:
                    outcome = run()
                except Exception:   # a fault of ours: logged, and the commit fails
                    error = error or Failure()
                    parent.log.failure("transaction {t}: running its work failed",
                                       error, t=self.id)
                    continue
                if kind == "p" and isinstance(outcome, Deferred):
                    waits.append(outcome)
            for flush in parent.flushes:
                flush()
            # (inside the batch: fires when the submission holding all of the
            # above is durable)
            waits.append(commits.barrier())
        finally:
            commits.atomic -= 1
            commits.end()
        if error is not None:
            for d in waits:
                if d is not None:
                    commits.watch(d, "storing a failed transaction's work")
            self.state = TransactionState.FAILED
            parent.failed += 1
            parent.warn("partial", f"transaction {self.id} partially applied: "
                        "running its work failed")
            return fail(PartiallyApplied("running its work failed"))
        done = all_durable(waits)
        assert done is not None
        result: Deferred[None] = Deferred()
        done.addCallbacks(self._committed, self._not_durable,
                          callbackArgs=(result,), errbackArgs=(result,))
        return result

    def _committed(self, _: object, result: Deferred[None]) -> None:
        self.state = TransactionState.COMMITTED
        self._parent.committed += 1
        result.callback(None)

    def _refusal(self) -> str | None:
        """Why an action held can no longer be carried out (None: all can)."""
        self.planned = {}
        try:
            for check in self._checks:
                try:
                    reason = check()
                except Exception:   # a fault of ours: the commit must not run blind
                    self._parent.log.failure("transaction {t}: a check failed", Failure(),
                                             t=self.id)
                    reason = "an internal error checking its work"
                if reason is not None:
                    return reason
            return None
        finally:
            self.planned = {}

    def _not_durable(self, failure: Failure, result: Deferred[None]) -> None:
        self.state = TransactionState.FAILED
        parent = self._parent
        parent.failed += 1
        value = failure.value
        if isinstance(value, (TransactionRefused, PartiallyApplied, PublishRefused)):
            # (refused by what its check had passed: the rest was applied)
            why = value.reason if isinstance(value, (TransactionRefused, PartiallyApplied)
                                             ) else str(value)
            reason = f"a publish was refused at commit: {why}"
            parent.warn("partial", f"transaction {self.id} partially applied: {reason}")
            result.errback(PartiallyApplied(reason))
            return
        parent.warn("commit", f"transaction {self.id} was not stored "
                    f"({type(value).__name__}: {value})")
        result.errback(failure)

    def rollback(self) -> None:
        """Drop the held publishes, run the undos.  Nothing on a transaction that
        is not open any more."""
        if self.state is not _OPEN:
            return
        self._parent.forget(self)
        self._rollback_work()
        self.state = TransactionState.ROLLED_BACK
        self._parent.rolled_back += 1

    def _rollback_work(self) -> None:
        undos, self._undos, self._work, self._checks = self._undos, [], [], []
        for undo in undos:
            try:
                undo()
            except Exception:   # one failing undo must not keep the others
                self._parent.log.failure("transaction {t}: an undo failed", Failure(),
                                         t=self.id)


class Transactions:
    """The open transactions of every owner, their bounds and counters."""

    log = Logger(namespace="mqttamqp.core.transactions")

    def __init__(self, commits: CommitBatcher, log_limit: LogLimiter,
                 max_per_owner: int = 16, max_bytes: int = 16 << 20,
                 flushes: Iterable[Callable[[], None]] = ()) -> None:
        """``flushes``: called inside a commit's batch, after its work, so that what
        parts would store at the end of the batch (the queues' acknowledgements)
        is in the same submission."""
        self.commits = commits
        self.max_per_owner = max_per_owner      # 0: no bound
        self.max_bytes = max_bytes              # 0: no bound
        self.flushes = list(flushes)
        self._log_limit = log_limit
        self._open: dict[object, dict[int, Transaction]] = {}
        self._ids = itertools.count(1)
        # counters (metrics, console)
        self.opened = 0
        self.committed = 0
        self.rolled_back = 0
        self.refused = 0
        self.failed = 0

    @property
    def open_count(self) -> int:
        """Transactions open now, all owners."""
        return sum(len(mine) for mine in self._open.values())

    def counts(self) -> dict[str, int]:
        """The counters, for the console and metrics."""
        return {"open": self.open_count, "declared": self.opened,
                "committed": self.committed, "rolled_back": self.rolled_back,
                "refused": self.refused, "failed": self.failed}

    def open(self, owner: object) -> Transaction:
        """A new transaction of ``owner``; ``TransactionRefused`` over
        --max-transactions-per-connection."""
        mine = self._open.get(owner)
        if mine is None:
            mine = self._open[owner] = {}
        elif self.max_per_owner and len(mine) >= self.max_per_owner:
            reason = (f"too many open transactions on this connection "
                      f"({self.max_per_owner}, --max-transactions-per-connection)")
            self.refuse("open", reason)
            raise TransactionRefused(reason)
        tx = Transaction(self, owner, next(self._ids))
        mine[tx.id] = tx
        self.opened += 1
        return tx

    def find(self, owner: object, tid: int) -> Transaction | None:
        """``owner``'s open transaction ``tid`` (None: unknown or ended)."""
        mine = self._open.get(owner)
        return mine.get(tid) if mine is not None else None

    def of(self, owner: object) -> list[Transaction]:
        """``owner``'s open transactions."""
        mine = self._open.get(owner)
        return list(mine.values()) if mine else []

    def owner_gone(self, owner: object) -> None:
        """``owner`` ended (link, channel or connection): its open transactions
        roll back."""
        mine = self._open.pop(owner, None)
        if not mine:
            return
        for tx in list(mine.values()):
            tx.rollback()

    def forget(self, tx: Transaction) -> None:
        mine = self._open.get(tx.owner)
        if mine is not None and mine.pop(tx.id, None) is not None and not mine:
            del self._open[tx.owner]

    def refuse(self, cause: str, reason: str) -> None:
        """Count a refusal and log it, one line per cause a minute."""
        self.refused += 1
        self.warn(cause, "transaction refused: " + reason)

    def warn(self, cause: str, text: str) -> None:
        """Log ``text``, one line per cause a minute (adapters use it for their
        own causes: an unknown transaction id, say)."""
        held = self._log_limit.allow("tx:" + cause)
        if held is not None:
            self.log.warn("{t} ({h} more like it since the last line)", t=text, h=held)
