"""The batch's commit as a ``CommitRound`` (``core.commits``): callbacks called once
with the outcome of the commit that holds the batch, never before it, a failure
reaching every callback whatever the first does, and the queues' appends marked
durable from it (``core.queues.durability``)."""

from __future__ import annotations

from typing import Any

import pytest
from compiled import logged_failures
from core_broker import make_broker
from fakes import ManualStore
from queue_facade import warm_member
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitBatcher, CommitRound
from mqttamqp.core.message import Message
from mqttamqp.core.persistence import Op, PutQueue
from mqttamqp.core.queues.addresses import QueueAddress


def _op(name: str) -> Op:
    return PutQueue(name, ())


class _Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, outcome: Failure | None, arg: Any) -> None:
        self.seen.append(("ok" if outcome is None else outcome.getErrorMessage(), arg))


def test_a_round_is_the_batch_commit_and_fires_only_with_it() -> None:
    """Every submission of a batch gets the same round; its callbacks wait for the
    commit holding the batch's ops, then are called once each with success."""
    store = ManualStore()
    commits = CommitBatcher(store)
    commits.begin()
    first = commits.persist_in_round([_op("a")])
    second = commits.persist_in_round([_op("b")])
    assert first is not None and first is second and first is commits.commit_round()
    assert first.count == 2
    seen = _Outcomes()
    first.when_done(seen, 1)
    first.when_done(seen, 2)
    commits.end()
    assert [ops for ops, _ in store.pending] == [[_op("a"), _op("b")]]
    assert seen.seen == [] and not first.done
    store.commit_all()
    assert seen.seen == [("ok", 1), ("ok", 2)]
    first.when_done(seen, 3)     # (known already: called at once)
    assert seen.seen[-1] == ("ok", 3)


def test_two_publishes_in_a_failed_commit_both_fail_whatever_the_first_callback_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two submissions in one batch, the commit fails: neither callback sees success,
    though the first swallows the failure and raises."""
    store = ManualStore()
    commits = CommitBatcher(store)
    logged = logged_failures(monkeypatch)
    seen = _Outcomes()

    def swallow_and_raise(outcome: Failure | None, arg: Any) -> None:
        seen(outcome, arg)
        raise RuntimeError("a publisher's bug")

    commits.begin()
    r = commits.persist_in_round([_op("a")])
    assert r is not None
    r.when_done(swallow_and_raise, 1)
    assert commits.persist_in_round([_op("b")]) is r
    r.when_done(seen, 2)
    commits.end()
    _, d = store.pending.pop()
    d.errback(Failure(OSError("disk full")))
    assert seen.seen == [("disk full", 1), ("disk full", 2)]
    assert "completing a commit's round" in logged


def test_a_later_round_succeeding_says_nothing_of_an_earlier_failed_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch has its own round: the next batch's commit succeeding does not
    complete the round of a batch whose commit fails after it."""
    store = ManualStore()
    commits = CommitBatcher(store)
    logged_failures(monkeypatch)
    rounds: list[CommitRound] = []
    seen = _Outcomes()
    for name in ("a", "b"):
        commits.begin()
        r = commits.persist_in_round([_op(name)])
        assert r is not None
        r.when_done(seen, name)
        rounds.append(r)
        commits.end()
    assert rounds[0] is not rounds[1]
    (_, first), (_, second) = store.pending
    second.callback(None)
    assert seen.seen == [("ok", "b")] and not rounds[0].done
    first.errback(Failure(OSError("disk full")))
    assert seen.seen == [("ok", "b"), ("disk full", "a")]


def test_no_round_outside_a_batch_and_none_completes_while_stopping() -> None:
    """Outside a batch there is no round (callers use ``persist``); while stopping,
    nothing is stored, so a round already handed out never completes."""
    store = ManualStore()
    commits = CommitBatcher(store)
    assert commits.commit_round() is None
    assert commits.persist_in_round([_op("a")]) is None
    assert store.pending == []
    commits.begin()
    r = commits.persist_in_round([_op("a")])
    assert r is not None
    commits.stopping = True
    commits.end()
    assert store.pending == [] and not r.done
    commits.begin()
    assert commits.commit_round() is None
    commits.end()


def test_queue_appends_in_a_failed_round_are_never_marked_durable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two confirmed publishes to one queue in one batch, the commit fails: the
    queue's durable watermark stays, both bodies stay in memory for good, and the
    publishers' rounds report the failure."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    queues = broker.queues
    queues.declare("q")
    store.commit_all()
    queue = queues.queues["q"]
    commits = queues.commits
    logged_failures(monkeypatch)
    seen = _Outcomes()
    commits.begin()
    for n in (1, 2):
        r, refusal = queues.publish(Message("$queue/q", b"m%d" % n, 1), QueueAddress("q", ""),
                                    "p", in_round=True)
        assert refusal is None and isinstance(r, CommitRound)
        r.when_done(seen, n)
    commits.end()
    durable = queue.durable
    [(_, d)] = store.pending
    store.pending.clear()
    d.errback(Failure(OSError("disk full")))
    assert seen.seen == [("disk full", 1), ("disk full", 2)]
    assert queue.durable == durable
    assert sorted(queue.unstored) == sorted(queue.log)
    assert len(queue.unstored) == 2


def test_queue_appends_in_a_round_are_durable_after_its_commit() -> None:
    """The appends of a batch are marked durable by its commit, not before."""
    store = ManualStore()
    broker, _, _ = make_broker(store)
    queues = broker.queues
    queues.declare("q")
    store.commit_all()
    queue = queues.queues["q"]
    commits = queues.commits
    commits.begin()
    for _ in (1, 2):
        queues.publish(Message("$queue/q", b"m", 1), QueueAddress("q", ""), "p",
                       in_round=True)
    commits.end()
    before = queue.durable
    assert before < queue.next_offset
    store.commit_all()
    assert queue.durable == queue.next_offset
    assert queues.unstored_bytes == 0


def _two_in_round(broker: Any, link: Any) -> tuple[CommitRound, list[Message]]:
    """Inside the open batch: two confirmed publishes to ``jobs`` (one round, the
    real path: an early-answer entry each member may release); the round and the
    two deliveries the member got at once."""
    queues = broker.queues
    r, _ = queues.publish(Message("$queue/jobs", b"m0", 1), QueueAddress("jobs", ""), "p",
                          in_round=True)
    again, _ = queues.publish(Message("$queue/jobs", b"m1", 1), QueueAddress("jobs", ""),
                              "p", in_round=True)
    assert isinstance(r, CommitRound) and again is r
    delivered = [p[0] for p in link.published()[-2:]]
    assert [m.payload for m in delivered] == [b"m0", b"m1"]
    return r, delivered


def test_answers_come_early_once_every_submission_is_released(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers (confirms) may precede the commit once the batch is submitted and
    every submission released (each append consumed); ``when_done`` still waits for
    the commit, and a failure after the early answer reaches it and is logged."""
    from queue_facade import ack

    store = ManualStore()
    broker, worker, link = warm_member(store)
    commits = broker.queues.commits
    logged = logged_failures(monkeypatch)
    answers, done = _Outcomes(), _Outcomes()
    commits.begin()
    r, delivered = _two_in_round(broker, link)
    r.when_answered(answers, "confirm")
    r.when_done(done, "durable")
    for message in delivered:
        ack(broker, worker, message)
    assert answers.seen == []            # (not before the batch is submitted)
    commits.end()
    assert answers.seen == [("ok", "confirm")] and done.seen == []
    [(_, d)] = store.pending            # (the acknowledgements in the same commit)
    store.pending.clear()
    d.errback(Failure(OSError("disk full")))
    assert done.seen == [("disk full", "durable")]
    assert answers.seen == [("ok", "confirm")]
    assert "storing messages that were already acknowledged" in logged


def test_no_early_answer_while_one_submission_is_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One submission not released (a message no consumer finished): the answer
    waits for the commit, and a failed commit fails it."""
    from queue_facade import ack

    store = ManualStore()
    broker, worker, link = warm_member(store)
    commits = broker.queues.commits
    logged_failures(monkeypatch)
    answers = _Outcomes()
    commits.begin()
    r, delivered = _two_in_round(broker, link)
    r.when_answered(answers, "confirm")
    ack(broker, worker, delivered[0])
    commits.end()
    assert answers.seen == []
    [(_, d)] = store.pending            # (the acknowledgements in the same commit)
    store.pending.clear()
    d.errback(Failure(OSError("disk full")))
    assert answers.seen == [("disk full", "confirm")]


def _consumed_round(reject_one: bool) -> tuple[Any, Any, _Outcomes]:
    """Three confirmed publishes to ``jobs`` in one batch, a 3.1.1 member of it
    taking each; the member acknowledges them, the second with ``$reject`` if
    ``reject_one``.  The queue, the store and the round's answers."""
    from queue_facade import ack

    store = ManualStore()
    broker, worker, link = warm_member(store)
    queues, commits = broker.queues, broker.queues.commits
    queue = queues.queues["jobs"]
    answers = _Outcomes()
    commits.begin()
    rounds = set()
    for n in range(3):
        r, _ = queues.publish(Message("$queue/jobs", b"m%d" % n, 1), QueueAddress("jobs", ""),
                              "p", in_round=True)
        assert isinstance(r, CommitRound)
        rounds.add(id(r))
    assert len(rounds) == 1 and len(queue.round_waits) == 1   # (one entry, not three)
    r.when_answered(answers, "confirm")
    commits.end()
    delivered = [p[0] for p in link.published()[-3:]]
    assert [m.payload for m in delivered] == [b"m0", b"m1", b"m2"]
    for n, message in enumerate(delivered):
        if reject_one and n == 1:
            ack(broker, worker, message, "$reject", reason="no")
        else:
            ack(broker, worker, message)
    return queue, store, answers


def test_a_round_answers_once_its_appends_to_a_queue_are_consumed() -> None:
    """A round's appends to one queue are one entry, released (the confirms answered
    before the commit) once every classic group is past the last of them."""
    queue, store, answers = _consumed_round(reject_one=False)
    assert answers.seen == [("ok", "confirm")] and store.pending
    assert not queue.round_waits


def test_a_rejected_append_keeps_its_round_waiting_for_the_commit() -> None:
    """Dead-lettered is not consumed: the round whose entry covers it answers only
    at its commit, though every append was finished."""
    queue, store, answers = _consumed_round(reject_one=True)
    assert answers.seen == [] and not queue.round_waits
    store.commit_all()
    assert answers.seen == [("ok", "confirm")]
